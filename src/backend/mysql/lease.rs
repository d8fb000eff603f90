//! A held `GET_LOCK` ([`MysqlLease`]): renewals (the session's liveness, a break's mark, an
//! application's intrusion), the run history's start and end, and the release.

use super::*;
use crate::backend::{Loss, LossNotifier};
use std::os::fd::AsRawFd;

/// A held GET_LOCK: the lock lives exactly as long as `con`.
pub(super) struct MysqlLease {
    pub(super) con: Option<Conn>,
    pub(super) name: String,
    /// For a shared holder or a semaphore slot: the key's own lock name, which an application's
    /// GET_LOCK takes without seeing them.
    pub(super) watch: Option<String>,
    /// The connection seen holding `watch` without a dlock record at the last renewal.
    pub(super) intruder: Option<u64>,
    /// The key whose run history this lease writes (exclusive leases only).
    pub(super) history: Option<Key>,
    /// The run's start went in with the holder record ([`super::history::record_starting`]).
    pub(super) started: bool,
    pub(super) addr: String,
    pub(super) ttl: Duration,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    pub(super) grant: Grant,
    /// Tells the keeper at once when the connection ends ([`Lease::watch_loss`]); dropped
    /// before a clean release.
    pub(super) hangup: Option<crate::sys::HangupWatch>,
    /// The connection of a renewal that failed: never used again, but kept open until the
    /// release — closing it would free the lock on the server while the command may still run
    /// (it is stopped by the lease's deadline; the server keeps the lock until then, or until
    /// `wait_timeout`, which is longer).
    pub(super) failed: Option<Conn>,
}

impl Drop for MysqlLease {
    /// The watch first: the connection's own close is no loss.
    fn drop(&mut self) {
        self.hangup = None;
    }
}

impl Lease for MysqlLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let Some(con) = self.con.as_mut() else {
            return Err(RenewError::Lost("the lock's connection is gone".into()));
        };
        // The watched name's holder, unless it is a dlock exclusive run (its record names its
        // connection) or nobody.
        let intruder = match &self.watch {
            Some(main) => format!(
                "IF(EXISTS(SELECT 1 FROM {TABLE} WHERE name = X'{m}' \
                 AND connection_id = IS_USED_LOCK(X'{m}')), NULL, IS_USED_LOCK(X'{m}'))",
                m = hex(main)
            ),
            None => "NULL".into(),
        };
        // One round trip: whether this connection still holds the lock, the intruder, and
        // whether a `dlock break` put its mark on this connection (broken.rs).
        let row: mysql::Result<Option<mysql::Row>> = con.query_first(format!(
            "SELECT IS_USED_LOCK(X'{}') = CONNECTION_ID(), {intruder}, \
             IS_USED_LOCK({}) IS NOT NULL",
            hex(&self.name),
            broken::mark_sql("CONNECTION_ID()")
        ));
        // Read without the driver's panicking conversions: a value of another type is none.
        let mine = row.map(|r| {
            r.map(|r| {
                let int = |i: usize| {
                    r.get_opt::<Option<i64>, usize>(i)
                        .and_then(Result::ok)
                        .flatten()
                };
                (int(0), int(1).and_then(|v| u64::try_from(v).ok()), int(2))
            })
        });
        match mine {
            Ok(Some((Some(1), _, Some(1)))) => Err(RenewError::Lost(format!(
                "dlock break told it to stop ({}: a break holds the mark on this connection)",
                self.addr
            ))),
            Ok(Some((Some(1), intruder, _))) => {
                // A shared holder registering holds the key's name for a moment without a
                // record; one that holds it over two renewals (ttl/3 apart) is an application.
                if let (Some(id), Some(main)) = (intruder, &self.watch)
                    && self.intruder == Some(id)
                {
                    return Err(RenewError::Lost(format!(
                        "{}: connection {id} holds {main} with GET_LOCK without a dlock record \
                         (an application's lock); it does not see dlock's --shared and \
                         --limit holders, so it holds too",
                        self.addr
                    )));
                }
                self.intruder = intruder;
                Ok(())
            }
            Ok(_) => Err(RenewError::Lost(format!(
                "{}: lock {} is no longer held by this connection",
                self.addr, self.name
            ))),
            Err(e) => {
                // The connection is the lease: once it fails it cannot be trusted again, and
                // reconnecting cannot get the lock back. It stays open (not used) until the
                // release: closing it now would free the lock while the command still runs.
                self.failed = self.con.take();
                Err(RenewError::Lost(format!(
                    "{}: the lock's connection failed: {}",
                    self.addr,
                    err_text(&e)
                )))
            }
        }
    }

    fn begin_run(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<crate::history::Begun> {
        self.begin_history(start, once_per)
    }

    /// The lock is let go first, then the end is written on the same connection: an INSERT
    /// held up by a table's metadata lock (an `ALTER`, a backup's `FLUSH TABLES WITH READ
    /// LOCK`) must delay only this dlock's exit, never the next holder. Both go in one round
    /// trip (two statements, run in order); if the end's failed (no table yet), it is written
    /// again the way `begin_run` writes a start, which creates the table.
    fn release_with_end(mut self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        self.hangup = None;
        let release = format!("DO RELEASE_LOCK(X'{}')", hex(&self.name));
        let both = self
            .history
            .as_ref()
            .map(|key| format!("{release}; {}", history::insert_end_sql(key, end)));
        let wrote = match (self.con.as_mut(), both) {
            (Some(con), Some(both)) => match con.query_drop(&both) {
                Ok(()) => true,
                Err(_) => {
                    // The release went first; a failed one is retried (harmless: a lock not
                    // held is not released).
                    let _ = con.query_drop(&release);
                    self.write_end(end)
                }
            },
            (Some(con), None) => {
                let _ = con.query_drop(&release);
                false
            }
            (None, _) => false,
        };
        self.release().map(|()| wrote)
    }

    /// The connection is the lock: its end — a reset by a proxy or firewall, the server
    /// killing the session — frees it on the server at once, so the keeper hears of it at
    /// once (a thread polls the socket for its hang-up), not at its next check, ttl/3 later.
    fn watch_loss(&mut self, lost: LossNotifier) {
        let Some(con) = &self.con else {
            return;
        };
        let what = format!(
            "{}: the lock's connection ended (the server, or something between, closed it)",
            self.addr
        );
        let on_end = Box::new(move || lost(Loss::Freed(what)));
        // Without the watch (no thread could start), the next check still finds the loss.
        self.hangup = crate::sys::HangupWatch::start(con.as_raw_fd(), on_end).ok();
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        self.hangup = None;
        if let Some(mut con) = self.con.take() {
            let _ = con.query_drop(format!("DO RELEASE_LOCK(X'{}')", hex(&self.name)));
            // Closing the connection releases it in any case.
        }
        Ok(())
    }
}
