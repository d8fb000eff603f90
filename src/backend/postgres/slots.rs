//! `--limit N`: N slot locks per key, waited for in the server.
//!
//! A run tries every slot in one statement (`CASE WHEN pg_try_advisory_lock(slot 1) THEN 1
//! WHEN … END`: CASE tries them in order and stops at the first it gets). When all are taken it
//! queues on the key's gate lock (the server's queue, first come first served); the one at the
//! front tries the slots again and then waits on all of them at once, one connection per slot
//! (a session waits for one lock at a time); the first slot granted is its lease, the other
//! waits are cancelled and their connections closed (which releases a slot granted meanwhile).
//! The gate goes with the connection that queued on it. No polling anywhere.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_postgres::NoTls;

use super::{COMMAND_TIMEOUT, PgBackend, Session, cell, ground, ttl_secs};
use crate::backend::Request;
use crate::exit::Interrupted;
use crate::model::Key;

/// The largest N: the front waiter holds one connection per slot.
pub(super) const MAX_LIMIT: u32 = 64;

/// The advisory id of slot `i` (1-based) of `key`, or of its gate (`i` = 0).
pub(super) fn slot_id(key: &Key, i: u32) -> i64 {
    let name = match i {
        0 => format!("dlock-gate:{key}"),
        i => format!("dlock-slot:{i}:{key}"),
    };
    let digest = Sha256::digest(name.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(b)
}

/// `CASE WHEN pg_try_advisory_lock(slot 1) THEN 1 … ELSE 0 END`.
fn try_any(key: &Key, n: u32) -> String {
    let whens: String = (1..=n)
        .map(|i| format!("WHEN pg_try_advisory_lock({}) THEN {i} ", slot_id(key, i)))
        .collect();
    format!("CASE {whens}ELSE 0 END")
}

type Wait<'a> = Pin<Box<dyn Future<Output = anyhow::Result<(u32, Session)>> + 'a>>;

impl PgBackend {
    /// Takes a slot of `req.key`'s semaphore of `n` on `s` (or on a new session when it had to
    /// wait on every slot); returns the session that holds it and the slot's id.
    pub(super) async fn take_slot(
        &self,
        s: Session,
        req: &Request<'_>,
        n: u32,
        notify: &Notify,
        application: &str,
    ) -> anyhow::Result<(Session, i64)> {
        let got = self.first_try(&s, req, &try_any(req.key, n)).await?;
        if let Some(i) = slot(&got) {
            return Ok((s, slot_id(req.key, i)));
        }
        if req.waited_out() {
            return Err(req.busy(None));
        }
        // Queue on the gate, in the server, for at most the time left.
        let gate = slot_id(req.key, 0);
        let lock_timeout = req.deadline.remaining().map_or(0, |d| d.as_millis().max(1));
        // Only on the server session that carries the mark (super::ground).
        let queue = format!(
            "SET lock_timeout = {lock_timeout}; SELECT {}; SET lock_timeout = 0; SELECT {}",
            ground::on_ours_unheld(&s, &format!("pg_advisory_lock({gate})")),
            ground::on_ours(&s, &try_any(req.key, n))
        );
        let cancel = s.client.cancel_token();
        let sent = std::cell::Cell::new(false);
        let queued = async {
            sent.set(true);
            s.client.simple_query(&queue).await
        };
        let rows = {
            tokio::pin!(queued);
            tokio::select! {
                r = &mut queued => match r {
                    Ok(m) => super::rows::simple_rows(m),
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                        return Err(req.busy(None));
                    }
                    Err(e) => return Err(self.fail("queue for a slot", e)),
                },
                _ = overdue(req) => {
                    self.cancel(cancel).await;
                    return Err(req.busy(None));
                }
                _ = notify.notified() => {
                    if sent.get() {
                        self.cancel(cancel).await;
                    }
                    settle(&s.client, &mut queued, &sent).await;
                    return Err(interrupted(req));
                }
            }
        };
        // NULL: a statement reached another server session (a void's text is empty).
        if rows.iter().any(|r| cell(r, 0).is_none()) {
            return Err(ground::pooled(self.addr()));
        }
        let got = rows.last().and_then(|r| cell(r, 0)).unwrap_or_default();
        if let Some(i) = slot(got) {
            let unlock = format!("SELECT pg_advisory_unlock({gate})");
            self.simple(&s.client, &unlock, COMMAND_TIMEOUT, "leave the queue")
                .await?;
            return Ok((s, slot_id(req.key, i)));
        }
        // At the front of the queue and every slot taken: wait on all of them at once. `s`
        // keeps the gate until one is granted.
        let timeout = ttl_secs(req.ttl);
        let cancels = std::sync::Mutex::new(Vec::new());
        // Set when the waits are to end: a wait still connecting then sends nothing.
        let stopping = std::sync::atomic::AtomicBool::new(false);
        let mut waits: Vec<Wait<'_>> = (1..=n)
            .map(|i| {
                let (cancels, stopping) = (&cancels, &stopping);
                let id = slot_id(req.key, i);
                Box::pin(async move {
                    let w = self.connect(application).await?;
                    cancels
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((i, w.client.cancel_token()));
                    if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                        return Err(interrupted(req));
                    }
                    let sql = format!(
                        "SET idle_session_timeout = '{timeout}s'; SET lock_timeout = {lock_timeout}; \
                         SELECT {}; SET lock_timeout = 0",
                        ground::claim_anywhere(&w, &format!("pg_advisory_lock({id})"))
                    );
                    match w.client.simple_query(&sql).await {
                        Ok(m) => {
                            let rows = super::rows::simple_rows(m);
                            if rows.iter().any(|r| cell(r, 0).is_none()) {
                                Err(ground::foreign(self.addr()))
                            } else {
                                Ok((i, w))
                            }
                        }
                        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                            Err(req.busy(None))
                        }
                        Err(e) => {
                            if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                                // Cancelled: one more round trip, answered once the server has
                                // cleaned up after the wait.
                                let _ = w.client.simple_query("").await;
                            }
                            Err(self.fail("wait for a slot", e))
                        }
                    }
                }) as Wait<'_>
            })
            .collect();
        let first = std::future::poll_fn(|cx| {
            for w in waits.iter_mut() {
                if let Poll::Ready(r) = w.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
            }
            Poll::Pending
        });
        let first = tokio::select! {
            r = first => r,
            _ = overdue(req) => Some(Err(req.busy(None))),
            _ = notify.notified() => None,
        };
        if first.is_none() {
            // Interrupted: every wait is cancelled, and dlock leaves once they have ended in
            // the server (no waiter of its own is left behind).
            stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            let tokens = std::mem::take(&mut *cancels.lock().unwrap_or_else(|e| e.into_inner()));
            for (_, token) in tokens {
                self.cancel(token).await;
            }
            let mut ended = vec![false; waits.len()];
            let all = std::future::poll_fn(|cx| {
                for (w, done) in waits.iter_mut().zip(ended.iter_mut()) {
                    *done = *done || w.as_mut().poll(cx).is_ready();
                }
                if ended.iter().all(|d| *d) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            let _ = tokio::time::timeout(SETTLE, all).await;
            return Err(interrupted(req));
        }
        drop(waits); // closes every other waiting connection...
        let others: Vec<_> =
            std::mem::take(&mut *cancels.lock().unwrap_or_else(|e| e.into_inner()));
        let winner = first
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .map(|(i, _)| *i);
        for (i, token) in others {
            // ...and their waits end in the server too (a closed socket is noticed only when
            // the wait ends).
            if Some(i) != winner {
                self.cancel(token).await;
            }
        }
        drop(s); // leaves the queue
        match first {
            Some(Ok((i, w))) => Ok((w, slot_id(req.key, i))),
            Some(Err(e)) => Err(e),
            None => Err(interrupted(req)),
        }
    }

    /// Sends a cancel request for a session's running statement, briefly.
    pub(super) async fn cancel(&self, token: tokio_postgres::CancelToken) {
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), async {
            let socket =
                super::stream::Socket::connect(&self.config.target, self.config.port).await?;
            token
                .cancel_query_raw(socket, NoTls)
                .await
                .map_err(std::io::Error::other)
        })
        .await;
    }
}

/// How long an interrupted run waits for its cancelled waits to end in the server (a cancel
/// request is answered at once by a server that runs; one that does not is not waited for).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits, at most [`SETTLE`], for a cancelled statement on `client` to end, then for one more
/// round trip: the server answers that once it has cleaned up after the cancelled lock wait, so
/// the wait is gone from `pg_locks`. Nothing when `sent` says the statement never went out (a
/// signal seen before its first poll): a cancel would find the session idle, and polling the
/// statement here would send it.
pub(super) async fn settle(
    client: &tokio_postgres::Client,
    statement: impl Future,
    sent: &std::cell::Cell<bool>,
) {
    if !sent.get() {
        return;
    }
    let _ = tokio::time::timeout(SETTLE, async {
        statement.await;
        let _ = client.simple_query("").await;
    })
    .await;
}

/// How much longer than `--wait` the client gives the server's own `lock_timeout` to end a
/// wait before it ends the wait itself (a cancel request, then exit 75).
const DEADLINE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Resolves once `req`'s deadline and [`DEADLINE_GRACE`] have passed (never, without one): a
/// server that never answers the waiting statement must not hold dlock past `--wait`.
pub(super) async fn overdue(req: &Request<'_>) {
    match req.deadline.remaining() {
        Some(d) => tokio::time::sleep(d + DEADLINE_GRACE).await,
        None => std::future::pending().await,
    }
}

/// The slot number a try gave, if any.
fn slot(got: &str) -> Option<u32> {
    got.parse().ok().filter(|&i| i > 0)
}

fn interrupted(req: &Request<'_>) -> anyhow::Error {
    Interrupted(req.interrupt.fired().unwrap_or(libc::SIGINT)).into()
}
