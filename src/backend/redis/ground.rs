//! What stands between dlock and a Redis server, on the run path: a proxy that lacks the
//! commands a lock needs (twemproxy), a replica, a `maxmemory-policy` that can evict a held
//! lock. `dlock doctor`'s fuller checks are in [`super::doctor`].
//!
//! None of it costs a round trip on the direct path: the proxy shows itself on a connection's
//! first command, which goes out behind a `CLIENT ID` ([`super::conn`]); the role and the
//! eviction policy come back with a grant, read by the acquire script (`INFO` inside it, see
//! lua/granted.lua). Only a connection that closes on that first command is looked at again.
//! `?min-replicas=N` (too few replicas acknowledging a grant) is judged here too
//! ([`RedisBackend::replicated`]).

use std::fmt;
use std::io;
use std::time::Duration;

use redis::ConnectionInfo;

use super::{COMMAND_TIMEOUT, Connection, Keys, Node, RedisBackend};
use crate::backend::Request;
use crate::backend::ground::{Finding, warn_once};
use crate::exit::Interrupted;
use crate::exit::Unsound;

/// What twemproxy lacks of what dlock needs (its `nc_redis.c` closes the connection on each).
const PROXY_LACKS: &str = "CLIENT, BLPOP, SCRIPT and INFO";

/// A server that closed the connection on `CLIENT ID` and answers `PING` on a new one: a proxy
/// that lacks the commands a lock needs. Carried inside the I/O error the request returns.
#[derive(Debug)]
pub(super) struct ProxyFound {
    /// The address dlock connected to.
    pub(super) addr: String,
}

impl ProxyFound {
    /// The one line a refused run prints.
    pub(super) fn message(&self) -> String {
        format!(
            "{} closes the connection on CLIENT ID, as twemproxy (nutcracker) does on every \
             command it lacks ({PROXY_LACKS}): dlock cannot wait for a lock or load its \
             scripts through it; point dlock at Redis itself, not at the proxy",
            self.addr
        )
    }
}

impl fmt::Display for ProxyFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for ProxyFound {}

/// A run refused because dlock's URL names a replica: exit 69 (not an outage to wait out).
#[derive(Debug)]
pub(in crate::backend) struct Replica(pub(in crate::backend) String);

impl fmt::Display for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Replica {}

/// The line for a replica at `addr`.
pub(in crate::backend) fn replica_message(addr: &str) -> String {
    format!(
        "{addr} is a replica: a lock there is not the primary's (a replica refuses writes, or \
         keeps them to itself); point dlock at the primary (or at the sentinels, \
         redis-sentinel://…#name)"
    )
}

/// Whether `e` is a connection the peer ended (closed, reset), as a proxy does on a command it
/// does not support.
pub(super) fn is_closed(e: &redis::RedisError) -> bool {
    closed(e)
}

fn closed(e: &redis::RedisError) -> bool {
    io_error(e).is_some_and(|io| {
        matches!(
            io.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        )
    })
}

/// The I/O error inside a redis-rs error, if it is one.
fn io_error(e: &redis::RedisError) -> Option<&io::Error> {
    // redis-rs keeps it as an `Arc<dyn Error>`, which `source` hands out as it is.
    let inner = std::error::Error::source(e)?;
    let arc = inner.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()?;
    (**arc).downcast_ref::<io::Error>()
}

/// The proxy inside `e`, if the first command's probe found one.
pub(super) fn proxy_in(e: &redis::RedisError) -> Option<&ProxyFound> {
    io_error(e)?.get_ref()?.downcast_ref::<ProxyFound>()
}

/// A connection at `info` closed on its first command and the `CLIENT ID` probe before it (see
/// [`super::conn`]): was it a proxy that lacks `CLIENT`, or a server that went away? A new
/// connection tells: a proxy answers `PING` and closes again on `CLIENT ID`. Returns `e` when
/// it was not a proxy (or cannot be told), else an error carrying [`ProxyFound`].
pub(super) fn closed_on_probe(
    info: &ConnectionInfo,
    connect: Duration,
    e: redis::RedisError,
) -> redis::RedisError {
    if !closed(&e) {
        return e;
    }
    let limit = connect.min(Duration::from_secs(1));
    let Ok(mut con) = Connection::open(info, limit, limit) else {
        return e;
    };
    let pong = con.request_plain(&redis::cmd("PING"));
    if !matches!(&pong, Ok(redis::Value::SimpleString(s)) if s == "PONG") {
        return e;
    }
    match con.request_plain(redis::cmd("CLIENT").arg("ID")) {
        Err(again) if closed(&again) => io::Error::new(
            io::ErrorKind::Unsupported,
            ProxyFound {
                addr: info.addr().to_string(),
            },
        )
        .into(),
        _ => e,
    }
}

/// The run's refusal for `e` from `node`, if `e` says what stands there: a proxy (78), or a
/// replica answering READONLY to a plain URL that never reached a primary in this process (69;
/// once reached, READONLY is a failover, an outage to wait out).
pub(in crate::backend) fn refusal(node: &Node, e: &redis::RedisError) -> Option<anyhow::Error> {
    if let Some(p) = proxy_in(e) {
        return Some(Unsound(p.message()).into());
    }
    let replica = e.code() == Some("READONLY")
        && node.sentinel.is_none()
        && node.seeds.is_empty()
        && !node.reach.was_reached();
    replica.then(|| Replica(replica_message(&node.addr)).into())
}

/// Whether `e` refuses the run for what stands between (see [`refusal`]).
pub(in crate::backend) fn is_refusal(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Unsound>() || c.is::<Replica>())
}

/// What a grant's reply says of the server besides the grant, read by the acquire script in
/// the same round trip (lua/granted.lua); each `None` where `INFO` is denied or silent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::backend) struct Seen {
    /// `uptime_in_seconds`, for the hold-back after a restart.
    pub(in crate::backend) up: Option<u64>,
    /// `maxmemory_policy`.
    pub(in crate::backend) policy: Option<String>,
    /// `role`: "master" or "slave".
    pub(in crate::backend) role: Option<String>,
}

impl Seen {
    /// A writable replica granted the lock (a read-only one refuses the write): the lock is
    /// the replica's alone.
    pub(in crate::backend) fn is_replica(&self) -> bool {
        self.role.as_deref() == Some("slave")
    }
}

/// Whether `policy` can evict a key with a TTL: every policy but `noeviction` (dlock's keys
/// all have TTLs, so `volatile-*` reaches them as `allkeys-*` does).
pub(in crate::backend) fn evicts(policy: &str) -> bool {
    policy != "noeviction"
}

/// The finding for `policy` at `addr` (`maxmemory` appended where known).
pub(in crate::backend) fn policy_finding(
    addr: &str,
    policy: &str,
    maxmemory: Option<u64>,
) -> Finding {
    let policy = crate::report::clean(policy, 40);
    let limit = match maxmemory {
        Some(0) => ", maxmemory 0 (no limit yet)",
        _ => "",
    };
    if evicts(&policy) {
        Finding::warn(
            "maxmemory-policy",
            format!("{addr}: {policy}{limit}: Redis may evict a held lock's keys"),
            "set maxmemory-policy noeviction on a server that holds locks",
        )
    } else {
        Finding::ok("maxmemory-policy", format!("{addr}: {policy}"))
    }
}

/// The run path's part: a replica's grant is refused (the caller gives the lock back first);
/// an evicting policy is said once per run. Nothing when the script could not read `INFO`.
pub(in crate::backend) fn judge_grant(addr: &str, seen: &Seen) -> anyhow::Result<()> {
    if seen.is_replica() {
        return Err(Replica(replica_message(addr)).into());
    }
    if let Some(policy) = seen.policy.as_deref().filter(|p| evicts(p)) {
        warn_once(&policy_finding(addr, policy, None));
    }
    Ok(())
}

impl RedisBackend {
    /// `?min-replicas=N`: waits (`WAIT N`, at most a third of the TTL and 1 s) until N replicas
    /// have the grant; if fewer do, gives the lock back and fails as [`Unreplicated`] (a waiting
    /// run tries again within --wait; with --no-wait, exit 69). Every way out but success gives
    /// the lock back, on a fresh connection: a signal ends the WAIT's read (see
    /// [`crate::signals::interrupts_network_waits`]) and leaves `con` mid-reply, so a release on
    /// it failed and Ctrl-C left the key held by a dead process for the rest of its TTL.
    ///
    /// A start the acquire script recorded with the grant (`entry`) is taken back first.
    ///
    /// [`Unreplicated`]: crate::exit::Unreplicated
    pub(super) fn replicated(
        &self,
        con: &mut Connection,
        keys: &Keys,
        token: &str,
        req: &Request<'_>,
        entry: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        let want = self.node.min_replicas;
        let limit = (req.ttl / 3).min(Duration::from_secs(1));
        let acked = con
            .set_read_timeout(Some(limit + COMMAND_TIMEOUT))
            .and_then(|()| {
                redis::cmd("WAIT")
                    .arg(want)
                    .arg(limit.as_millis().max(1) as u64)
                    .query::<u32>(con)
            })
            .and_then(|n| {
                con.set_read_timeout(Some(COMMAND_TIMEOUT.min(req.ttl / 3)))?;
                Ok(n)
            });
        if matches!(acked, Ok(n) if n >= want) {
            return Ok(());
        }
        let signalled = req.interrupted();
        if let Some(e) = entry
            && let Ok(mut c) = self.node.connect(COMMAND_TIMEOUT.min(req.ttl / 3))
        {
            let _ = super::history::undo(&mut c, keys, e);
        }
        self.release_token(keys, token, req.mode, signalled.is_some());
        if let Some(sig) = signalled {
            return Err(Interrupted(sig).into());
        }
        let plural = if want == 1 { "replica" } else { "replicas" };
        match acked {
            Ok(n) => Err(crate::exit::Unreplicated(format!(
                "{}: {n} of the {want} {plural} that ?min-replicas requires acknowledged the lock \
                 within {}ms; it was given back (`INFO replication` lists the server's replicas)",
                self.node.addr,
                limit.as_millis()
            ))
            .into()),
            Err(e) => Err(self
                .node
                .error(format!("waiting for replicas on {}", self.node.addr), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_keeps_keys_with_a_ttl() {
        for p in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "some-future-policy",
        ] {
            assert!(evicts(p), "{p}");
        }
        assert!(!evicts("noeviction"));
    }

    #[test]
    fn a_proxy_travels_inside_a_redis_error() {
        let e: redis::RedisError = io::Error::new(
            io::ErrorKind::Unsupported,
            ProxyFound {
                addr: "127.0.0.1:22121".into(),
            },
        )
        .into();
        let found = proxy_in(&e).expect("found");
        assert!(found.message().contains("twemproxy"));
        assert!(found.message().starts_with("127.0.0.1:22121 "));
        let eof: redis::RedisError = io::Error::from(io::ErrorKind::UnexpectedEof).into();
        assert!(closed(&eof));
        assert!(proxy_in(&eof).is_none());
        let server: redis::RedisError = (redis::ErrorKind::Io, "x").into();
        assert!(!closed(&server));
    }

    #[test]
    fn the_policy_finding_names_the_policy_and_escapes_it() {
        let f = policy_finding("h:1", "allkeys-lru", Some(0));
        assert_eq!(f.verdict, crate::backend::ground::Verdict::Warn);
        assert!(
            f.sentence()
                .starts_with("maxmemory-policy: h:1: allkeys-lru, maxmemory 0")
        );
        let f = policy_finding("h:1", "noeviction", Some(100));
        assert_eq!(f.verdict, crate::backend::ground::Verdict::Ok);
        let f = policy_finding("h:1", "x\x1b[2J", None);
        assert!(!f.found.contains('\x1b'));
    }
}
