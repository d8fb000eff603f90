//! Sentinel: the primary the sentinels name now, checked with `ROLE`, and followed through a
//! failover.

use std::time::Duration;

use redis::ConnectionInfo;

use super::{Connection, Node, conn};

/// The sentinels of a primary: `info` is the primary's settings at the first sentinel's address.
#[derive(Clone)]
pub(in crate::backend) struct Sentinels {
    pub(super) addrs: Vec<redis::ConnectionAddr>,
    pub(super) name: String,
    /// The name as messages show it: without any secret of the URL (a query misplaced after
    /// the `#`, `#acc?password=PW`, is part of the name).
    pub(super) shown: String,
}

impl Sentinels {
    /// How to reach the sentinel `at`: the primary's TLS settings, without its credentials and
    /// database (they are the primary's).
    pub(super) fn info(
        &self,
        primary: &ConnectionInfo,
        at: &redis::ConnectionAddr,
    ) -> ConnectionInfo {
        primary
            .clone()
            .set_addr(at.clone())
            .set_redis_settings(redis::RedisConnectionInfo::default())
    }

    /// The primary a sentinel names now.
    pub(super) fn named(
        &self,
        sentinel: &mut Connection,
    ) -> redis::RedisResult<Option<(String, u16)>> {
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.name)
            .query(sentinel)
    }

    /// The address of the primary a sentinel names now, reached like `like` (TLS or not);
    /// `None` if it does not answer or names none.
    pub(super) fn named_addr(
        &self,
        sentinel: &mut Connection,
        like: &redis::ConnectionAddr,
    ) -> Option<redis::ConnectionAddr> {
        let (host, port) = self.named(sentinel).ok().flatten()?;
        conn::addr_like(like, &format!("{host}:{port}"))
    }

    /// The primary other than `addr` that a sentinel answering within `limit` names, if any:
    /// a failover moved the primary (its old self may still accept writes for a while).
    pub(super) fn moved_from(
        &self,
        primary: &ConnectionInfo,
        addr: &redis::ConnectionAddr,
        limit: Duration,
    ) -> Option<redis::ConnectionAddr> {
        let here = addr.to_string();
        self.addrs.iter().find_map(|at| {
            Connection::open(&self.info(primary, at), limit, limit)
                .ok()
                .and_then(|mut c| self.named_addr(&mut c, addr))
                .filter(|named| named.to_string() != here)
        })
    }
}

impl Node {
    /// A connection to the primary the sentinels name now, checked with `ROLE` (a sentinel
    /// that has not seen a failover yet names the old one, now a replica).
    pub(in crate::backend) fn primary(
        &self,
        s: &Sentinels,
        connect: Duration,
        timeout: Duration,
    ) -> anyhow::Result<(Connection, Connection)> {
        let mut why = String::new();
        for at in &s.addrs {
            let named = Connection::open(&s.info(&self.info, at), connect, timeout)
                .and_then(|mut c| Ok((s.named(&mut c)?, c)));
            let ((host, port), sentinel) = match named {
                Ok((Some(hp), c)) => (hp, c),
                Ok((None, _)) => {
                    why = format!("sentinel {at} does not know a primary named '{}'", s.shown);
                    continue;
                }
                Err(e) => {
                    why = format!("sentinel {at}: {e}");
                    continue;
                }
            };
            let Some(primary) = conn::addr_like(self.info.addr(), &format!("{host}:{port}")) else {
                continue;
            };
            let mut con = match Connection::open(
                &self.info.clone().set_addr(primary.clone()),
                connect,
                timeout,
            ) {
                Ok(c) => c,
                Err(e) => {
                    why = format!("primary {primary} (from sentinel {at}): {e}");
                    continue;
                }
            };
            if is_primary(&mut con) {
                return Ok((con, sentinel));
            }
            why = format!(
                "{primary}, named by sentinel {at}, is not a primary (a failover under way?)"
            );
        }
        let e = redis::RedisError::from(std::io::Error::other(why));
        Err(self.error(format!("no primary '{}' through {}", s.shown, self.addr), e))
    }
}

/// Whether the server says it is a primary (`ROLE`).
pub(super) fn is_primary(con: &mut Connection) -> bool {
    let role: redis::RedisResult<redis::Value> = redis::cmd("ROLE").query(con);
    matches!(role, Ok(redis::Value::Array(v))
        if matches!(v.first(), Some(redis::Value::BulkString(r)) if r == b"master"))
}
