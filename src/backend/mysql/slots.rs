//! `--limit N`: N slot locks behind a gate lock. The first free slot is taken in one round trip;
//! waiters queue on the gate (the server waits), and the one at the front waits on every slot at
//! once, one connection per slot (GET_LOCK waits for one name only).

use std::time::Duration;

use mysql::Conn;
use mysql::prelude::Queryable;

use super::rows::{hex, last_value, parse_record};
use super::{COMMAND_TIMEOUT, MAX_SLICE, MysqlBackend, max_slice, slot_prefix, wait_timeout_secs};
use crate::backend::{Lease, Request};
use crate::clock::BootInstant;
use crate::exit::Interrupted;
use crate::model::Deadline;

/// SQL expression: take the first free of `slots` without waiting: its 1-based index, or 0.
fn any_slot_expr(slots: &[String]) -> String {
    let whens: Vec<String> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| format!("WHEN GET_LOCK(X'{}', 0) = 1 THEN {}", hex(s), i + 1))
        .collect();
    format!("CASE {} ELSE 0 END", whens.join(" "))
}

/// SQL: [`any_slot_expr`] as a statement.
fn any_slot_sql(slots: &[String]) -> String {
    format!("SELECT {}", any_slot_expr(slots))
}

impl MysqlBackend {
    /// A slot of a semaphore of `n`: the first free slot, without waiting, in one round trip.
    /// Else waiters queue on the gate lock (the server waits, one waiter at a time), and the one
    /// at the front waits for any slot: one connection per slot, each in GET_LOCK, the first
    /// granted wins and the others are stopped (KILL QUERY; a slot granted to a loser is released
    /// when its connection closes). GET_LOCK cannot wait for "any of N" on one connection.
    ///
    /// An application's `GET_LOCK` on the key's own name is a holder too: the run waits for it
    /// to go (in `GET_LOCK` on that name, then let go at once), and takes a slot again.
    pub(super) fn acquire_slot(&self, req: &Request<'_>, n: u32) -> anyhow::Result<Box<dyn Lease>> {
        loop {
            match self.acquire_slot_once(req, n) {
                Err(e) => match e.downcast::<super::AppHolds>() {
                    Ok(super::AppHolds(app)) => {
                        if req.waited_out() {
                            return Err(req.busy(Some(&app)));
                        }
                        (req.on_holder)(&app);
                        drop(self.get_lock(&super::lock_name(req.key), req)?);
                    }
                    Err(e) => return Err(e),
                },
                lease => return lease,
            }
        }
    }

    fn acquire_slot_once(&self, req: &Request<'_>, n: u32) -> anyhow::Result<Box<dyn Lease>> {
        let prefix = slot_prefix(req.key);
        let slots: Vec<String> = (1..=n).map(|i| format!("{prefix}{i}")).collect();
        let ttl_secs = wait_timeout_secs(req.ttl);
        let session = format!("SET SESSION wait_timeout = {ttl_secs}; ");
        let take_any = any_slot_sql(&slots);
        let mut con = self.connect(MAX_SLICE + COMMAND_TIMEOUT)?;
        let sent = BootInstant::now();
        // With the cluster's question: a node of one refuses (`?` drops `con`, and any slot).
        let got: i64 = self
            .first_take(&mut con, req.ttl, &any_slot_expr(&slots))?
            .unwrap_or(0);
        let (con, slot, sent) = if got > 0 {
            (con, got as usize - 1, sent)
        } else {
            let busy = |con: &mut Conn| {
                let holder = self
                    .holder_row(con, &slots[0])
                    .and_then(|(_, h, _)| parse_record(&h));
                req.busy(holder.as_ref())
            };
            if req.deadline == Deadline::Now {
                return Err(self.mismatch_or(&mut con, req, busy));
            }
            drop(con);
            let (mut gate, _) = self.get_lock(&format!("{prefix}gate"), req)?;
            let sent = BootInstant::now();
            let got: i64 = last_value(&mut gate, &take_any)
                .map_err(|e| self.fail(e))?
                .unwrap_or(0);
            if got > 0 {
                let _ = gate.query_drop(format!(
                    "DO RELEASE_LOCK(X'{}')",
                    hex(&format!("{prefix}gate"))
                ));
                (gate, got as usize - 1, sent)
            } else {
                match self.wait_any(&slots, req.deadline, max_slice(req.ttl), req.interrupt)? {
                    Some((mut con, slot, sent)) => {
                        drop(gate); // closing releases the gate for the next waiter
                        con.query_drop(&session).map_err(|e| self.fail(e))?;
                        (con, slot, sent)
                    }
                    None => {
                        if let Some(sig) = req.interrupt.fired() {
                            return Err(Interrupted(sig).into());
                        }
                        return Err(self.mismatch_or(&mut gate, req, busy));
                    }
                }
            }
        };
        self.lease(con, slots[slot].clone(), &prefix, req, sent)
    }

    /// Waits until one of `slots` is granted, on one connection per slot; `None` when the
    /// deadline passed or the interrupt fired first.
    fn wait_any(
        &self,
        slots: &[String],
        deadline: Deadline,
        max_slice: Duration,
        interrupt: &crate::signals::Interrupt,
    ) -> anyhow::Result<Option<(Conn, usize, BootInstant)>> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let mut cons = Vec::with_capacity(slots.len());
        for _ in slots {
            cons.push(self.connect(MAX_SLICE + COMMAND_TIMEOUT)?);
        }
        let ids: Vec<u32> = cons.iter().map(|c| c.connection_id()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let winner: Mutex<Option<(Conn, usize, BootInstant)>> = Mutex::new(None);
        let failed: Mutex<Option<mysql::Error>> = Mutex::new(None);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let opts = self.clone_for_waker();
        let kill_all = {
            let ids = ids.clone();
            let killer = Mutex::new(None::<Conn>);
            move || {
                let mut c = killer.lock().unwrap_or_else(|e| e.into_inner());
                if c.is_none() {
                    *c = Conn::new(opts.clone()).ok();
                }
                if let Some(c) = c.as_mut() {
                    for id in &ids {
                        let _ = c.query_drop(format!("KILL QUERY {id}"));
                    }
                }
            }
        };
        let kill_all = Arc::new(kill_all);
        let (waker_stop, waker_kill) = (stop.clone(), kill_all.clone());
        let _guard = interrupt.on_fire(move || {
            waker_stop.store(true, Ordering::SeqCst);
            waker_kill();
        })?;
        std::thread::scope(|s| {
            for (i, mut con) in cons.into_iter().enumerate() {
                let (stop, winner, failed, done) = (&stop, &winner, &failed, done_tx.clone());
                let name = hex(&slots[i]);
                s.spawn(move || {
                    while !stop.load(Ordering::SeqCst) && interrupt.fired().is_none() {
                        let slice = match deadline.remaining() {
                            Some(d) if d.is_zero() => break,
                            Some(d) => d.min(max_slice),
                            None => max_slice,
                        };
                        let sent = BootInstant::now();
                        let got: mysql::Result<Option<Option<i64>>> = last_value(
                            &mut con,
                            &format!("SELECT GET_LOCK(X'{name}', {:.3})", slice.as_secs_f64()),
                        );
                        match got {
                            Ok(Some(Some(1))) => {
                                let mut w = winner.lock().unwrap_or_else(|e| e.into_inner());
                                if w.is_none() && !stop.swap(true, Ordering::SeqCst) {
                                    *w = Some((con, i, sent));
                                }
                                break; // a loser's connection closes: its slot goes back
                            }
                            Ok(_) => {}
                            Err(e) => {
                                // This slot's connection is gone: the wait cannot go on.
                                failed
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .get_or_insert(e);
                                stop.store(true, Ordering::SeqCst);
                                break;
                            }
                        }
                    }
                    let _ = done.send(());
                });
            }
            drop(done_tx);
            // Until every thread is out: once one has won (or the wait is over), keep stopping
            // the others' GET_LOCKs (a KILL QUERY that lands before a query starts is lost).
            loop {
                let stopping = stop.load(Ordering::SeqCst)
                    || interrupt.fired().is_some()
                    || deadline.remaining().is_some_and(|d| d.is_zero());
                if stopping {
                    stop.store(true, Ordering::SeqCst);
                    kill_all();
                }
                let wait = if stopping {
                    Duration::from_millis(20)
                } else {
                    deadline.remaining().unwrap_or(max_slice).min(max_slice)
                };
                if let Err(std::sync::mpsc::RecvTimeoutError::Disconnected) =
                    done_rx.recv_timeout(wait)
                {
                    break;
                }
            }
        });
        let winner = winner.into_inner().unwrap_or_else(|e| e.into_inner());
        match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) if winner.is_none() && interrupt.fired().is_none() => Err(self.fail(e)),
            _ => Ok(winner),
        }
    }
}
