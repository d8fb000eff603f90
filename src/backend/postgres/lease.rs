//! A held advisory lock ([`PgLease`]): checked every ttl/3 on its own session, released by
//! unlocking on that session, lost when the session ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use super::rows::{self, cell};
use super::{COMMAND_TIMEOUT, Session, db_text, ground};
use crate::backend::{Grant, Lease, Loss, LossNotifier, RenewError};
use crate::model::Key;

/// A held advisory lock: it lives exactly as long as its session.
pub(super) struct PgLease {
    pub(super) session: Option<Session>,
    /// The key whose run history this lease writes (exclusive leases only).
    pub(super) history: Option<Key>,
    pub(super) rt: Arc<Runtime>,
    pub(super) addr: String,
    /// Counts the lock among this session's granted locks (1 while held; NULL where a guarded
    /// session's statement reached another server session, [`ground::on_ours`]), and the
    /// break marks on this session ([`super::broken`]).
    pub(super) check: String,
    pub(super) ttl: Duration,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    pub(super) grant: Grant,
    /// Set before releasing: the session's end is then expected, not a loss.
    pub(super) releasing: Arc<std::sync::atomic::AtomicBool>,
    /// The run's start went in with the holder record ([`super::history::start_ctes`]).
    pub(super) started: bool,
}

impl Lease for PgLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let Some(s) = &self.session else {
            return Err(RenewError::Lost("the session is gone".into()));
        };
        let limit = COMMAND_TIMEOUT.min(self.ttl / 3);
        let result = self.rt.block_on(async {
            tokio::time::timeout(limit, s.client.simple_query(&self.check)).await
        });
        match result {
            Ok(Ok(messages)) => {
                let rows = rows::simple_rows(messages);
                let row = rows.first();
                match (row.and_then(|r| cell(r, 0)), row.and_then(|r| cell(r, 1))) {
                    (Some("1"), Some("0")) => Ok(()),
                    (Some("1"), _) => Err(RenewError::Lost(format!(
                        "dlock break told it to stop ({}: a break holds the mark on this session)",
                        self.addr
                    ))),
                    (None, _) => Err(RenewError::Lost(ground::moved_loss(&self.addr))),
                    _ => Err(RenewError::Lost(format!(
                        "{}: the session no longer holds the lock",
                        self.addr
                    ))),
                }
            }
            Ok(Err(e)) if e.is_closed() || e.as_db_error().is_some() => Err(RenewError::Lost(
                format!("{}: the session ended: {}", self.addr, db_text(&e)),
            )),
            Ok(Err(e)) => Err(RenewError::Failed(anyhow::anyhow!("{}: {e}", self.addr))),
            Err(_) => Err(RenewError::Failed(anyhow::anyhow!(
                "{}: no answer within {limit:?}",
                self.addr
            ))),
        }
    }

    fn begin_run(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<crate::backend::Begun> {
        self.begin_history(start, once_per)
    }

    fn release_with_end(self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        self.release_writing(end)
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        self.releasing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let Some(s) = self.session.take() else {
            return Ok(());
        };
        // Unlock explicitly, so that the next holder can start before this session's backend
        // has exited; closing the connection would release it too. Only on the server session
        // that carries this session's mark: elsewhere the locks are another client's.
        let release = match ground::is_ours(&s) {
            Some(ours) => format!(
                "SELECT pg_advisory_unlock_all() WHERE {ours}; \
                 DELETE FROM dlock_holders WHERE pid = pg_backend_pid() AND {ours}"
            ),
            None => "SELECT pg_advisory_unlock_all(); \
                     DELETE FROM dlock_holders WHERE pid = pg_backend_pid()"
                .to_string(),
        };
        let r = self.rt.block_on(async {
            tokio::time::timeout(COMMAND_TIMEOUT, s.client.simple_query(&release)).await
        });
        drop(s);
        match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(anyhow::anyhow!("{}: {e}", self.addr)),
            Err(_) => Err(anyhow::anyhow!("{}: no answer to the release", self.addr)),
        }
    }

    fn watch_loss(&mut self, lost: LossNotifier) {
        let Some(s) = &self.session else {
            return;
        };
        let mut ended = s.ended.clone();
        let releasing = self.releasing.clone();
        let addr = self.addr.clone();
        self.rt.spawn(async move {
            while !*ended.borrow() {
                if ended.changed().await.is_err() {
                    break;
                }
            }
            if !releasing.load(std::sync::atomic::Ordering::SeqCst) {
                lost(Loss::Freed(format!("{addr}: the session's connection ended (the server, or something between, closed it)")));
            }
        });
    }
}
