//! A held Redis lock: renewal and release by script, on the lock's own connection.

use redis::Script;

use super::COMMAND_TIMEOUT;
use super::scripts::{RENEW, RENEW_SHARED, release_for, script};
use super::sentinel::is_primary;
use crate::backend::Grant;
use std::time::Duration;

use super::{Connection, Keys, Node};
use crate::backend::{Lease, RenewError};
use crate::model::Mode;

/// A held Redis lock.
pub(super) struct RedisLease {
    pub(super) node: Node,
    /// The lock's connection; `None` after a transport error (reconnected on the next call).
    pub(super) con: Option<Connection>,
    pub(super) keys: Keys,
    pub(super) token: String,
    /// Exclusive (the lock key) or shared/semaphore (an entry in `:holders`).
    pub(super) mode: Mode,
    pub(super) ttl: Duration,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    pub(super) grant: Grant,
    /// The acquire script recorded the run's start with the lock (lua/start.lua); with
    /// `?min-replicas=N` its WAIT covered the start too.
    pub(super) started: bool,
}

impl RedisLease {
    fn con(&mut self) -> anyhow::Result<&mut Connection> {
        if self.con.is_none() {
            self.con = Some(self.node.connect(COMMAND_TIMEOUT.min(self.ttl / 3))?);
        }
        Ok(self.con.as_mut().expect("set above"))
    }
}

impl Lease for RedisLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        static RN: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        static RN_SHARED: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let mut inv = if self.mode == Mode::Exclusive {
            let mut inv = script(&RN, RENEW).prepare_invoke();
            inv.key(&self.keys.lock).key(&self.keys.owner);
            inv
        } else {
            let mut inv = script(&RN_SHARED, RENEW_SHARED).prepare_invoke();
            inv.key(&self.keys.holders)
                .key(&self.keys.hmeta)
                .key(&self.keys.lock);
            inv
        };
        inv.arg(&self.token).arg(self.ttl.as_millis() as u64);
        let addr = self.node.addr.clone();
        if let (Some(s), Some(con)) = (&self.node.sentinel, &self.con) {
            // A failover moved the primary: renew on the one a sentinel names now (never back
            // on the old one), which keeps the lock only if it has this holder's token
            // (replicated before the switch).
            let limit = (self.ttl / 6).min(COMMAND_TIMEOUT);
            if let Some(new) = s.moved_from(&self.node.info, con.addr(), limit) {
                self.con = None;
                let node = self.node.at(&new);
                let mut c = node
                    .connect(COMMAND_TIMEOUT.min(self.ttl / 3))
                    .map_err(RenewError::Failed)?;
                if !is_primary(&mut c) {
                    return Err(RenewError::Failed(anyhow::anyhow!(
                        "{new}, named by a sentinel, is not a primary yet"
                    )));
                }
                self.con = Some(c);
            }
        }
        let con = self.con().map_err(RenewError::Failed)?;
        let reply: redis::RedisResult<i64> = inv.invoke(con);
        match reply {
            Ok(1) => Ok(()),
            Ok(-1) => Err(RenewError::Lost(format!(
                "{addr}: a client that is not dlock (a redis-py Lock?) set {} while this {} \
                 holder held; it does not see dlock's shared and --limit holders, so it holds too",
                crate::report::clean(&self.keys.lock, crate::report::MAX_FIELD),
                self.mode.describe()
            ))),
            Ok(super::scripts::BROKEN) => Err(RenewError::Lost(format!(
                "dlock break told it to stop (on {addr})"
            ))),
            Ok(_) => Err(RenewError::Lost(format!(
                "the lock key on {addr} expired or was deleted (dlock break --force?) or taken over"
            ))),
            Err(e) => {
                self.con = None;
                Err(RenewError::Failed(anyhow::anyhow!(
                    "{addr}: {}",
                    super::conn::words(&e)
                )))
            }
        }
    }

    fn begin_run(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<crate::history::Begun> {
        if self.mode != Mode::Exclusive {
            return Ok(crate::history::Begun::NotKept);
        }
        if std::mem::take(&mut self.started) && once_per.is_none() {
            return Ok(crate::history::Begun::Started);
        }
        let addr = self.node.addr.clone();
        let keys = self.keys.clone();
        let want = self.node.min_replicas;
        let limit = (self.ttl / 3).min(Duration::from_secs(1));
        let read_timeout = COMMAND_TIMEOUT.min(self.ttl / 3);
        let con = self.con()?;
        let mut begun = super::history::begin(con, &keys, start, once_per);
        // `?min-replicas=N`: the start must survive a failover as the lock does, or a late
        // host would find no start on the new primary and run again in the same window.
        if want > 0 && matches!(begun, Ok(crate::history::Begun::Started)) {
            con.set_read_timeout(Some(limit + COMMAND_TIMEOUT))?;
            let acked: redis::RedisResult<u32> = redis::cmd("WAIT")
                .arg(want)
                .arg(limit.as_millis().max(1) as u64)
                .query(con);
            con.set_read_timeout(Some(read_timeout))?;
            begun = match acked {
                Ok(n) if n >= want => begun,
                Ok(n) => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the run's start was not replicated",
                    format!(
                        "only {n} of the {want} replicas required (min-replicas) acknowledged it"
                    ),
                ))),
                Err(e) => Err(e),
            };
        }
        if begun.is_err() {
            // The connection may be broken (a reply over the bound ends it): the release
            // reconnects.
            self.con = None;
        }
        begun.map_err(|e| anyhow::anyhow!("{addr}: {}", super::conn::words(&e)))
    }

    /// The end goes out in the release's script: one round trip for both.
    fn release_with_end(mut self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        if self.mode != Mode::Exclusive {
            return self.release().map(|()| false);
        }
        let addr = self.node.addr.clone();
        let keys = self.keys.clone();
        let token = self.token.clone();
        let con = self.con()?;
        super::history::release_end(con, &keys, &token, end)
            .map_err(|e| anyhow::anyhow!("{addr}: {}", super::conn::words(&e)))?;
        Ok(true)
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let inv = release_for(&self.keys, &self.token, self.mode);
        let addr = self.node.addr.clone();
        let con = self.con()?;
        let _: i64 = inv
            .invoke(con)
            .map_err(|e| anyhow::anyhow!("{addr}: {}", super::conn::words(&e)))?;
        Ok(())
    }
}
