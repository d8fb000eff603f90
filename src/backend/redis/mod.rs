//! The Redis backend: one instance (or a Sentinel master, or one Cluster slot).
//!
//! Every key of one lock shares the hash tag `{KEY}`: `dlock:{KEY}` (the lock, value = a random
//! 128-bit token, with a PX TTL), `:fence` (the fencing counter, no TTL), `:owner` (holder
//! metadata, same TTL as the lock), `:signal` (the wake-up list) and `:waiters` (a sorted set
//! that lets `status` count waiters). Acquire, renew, release and break are each one Lua script,
//! so each is atomic and one round trip.
//!
//! Waiting is python-redis-lock's signal list: a release pushes one element onto `:signal` (that
//! expires after a second), and each waiter blocks in `BLPOP :signal` on its own connection, so
//! one release wakes one waiter and an idle waiter costs the server nothing. Each BLPOP is bounded
//! by the holder's remaining TTL (a wake-up can be lost when a holder dies) and by 5 s. A signal
//! (Ctrl-C) cancels a BLPOP with `CLIENT UNBLOCK` from a second connection.
//!
//! Connect and command timeouts are 2 s each, so an unreachable or black-holed server fails
//! within about 4 s (exit 69).

use std::time::Duration;

use redis::{ConnectionInfo, IntoConnectionInfo, Script};

mod conn;
pub(super) use conn::Connection;

use super::hosts::HostPort;
use super::{Backend, Holder, Lease, Mode, Reach, RenewError, Request, Status};
use crate::clock::BootInstant;
use crate::config::{BackendKind, Key, redact};
use crate::exit::{Interrupted, Unavailable, Usage};

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest single BLPOP: a waiter re-checks at least this often.
const MAX_BLOCK: Duration = Duration::from_secs(5);
/// How long cleaning up may take after a signal.
const SIGNALLED_LIMIT: Duration = Duration::from_millis(300);
/// How long a pushed wake-up waits for a waiter before it expires.
const SIGNAL_TTL_MS: u64 = 1000;

// The scripts live in lua/, one file each, with their KEYS, ARGV and replies described at the
// top. Each runs atomically in one round trip.

/// Exclusive acquire (SET NX PX, fence, owner, waiter registration).
pub(super) const ACQUIRE: &str = concat!(
    include_str!("lua/granted.lua"),
    include_str!("lua/acquire.lua")
);
/// Shared lock or semaphore slot acquire.
const ACQUIRE_SHARED: &str = concat!(
    include_str!("lua/granted.lua"),
    include_str!("lua/acquire_shared.lua")
);
/// Extends a shared holder's lease: 1, or 0 when lost.
const RENEW_SHARED: &str = include_str!("lua/renew_shared.lua");
/// Removes a shared holder and wakes one waiter.
const RELEASE_SHARED: &str = include_str!("lua/release_shared.lua");
/// The shared holders, for `status`.
const STATUS_SHARED: &str = include_str!("lua/status_shared.lua");
/// Extends the lock if the token is still ours: 1, or 0 when lost.
pub(super) const RENEW: &str = include_str!("lua/renew.lua");
/// Deletes the lock if the token is ours (any holder's for an empty token) and wakes one waiter.
const RELEASE: &str = include_str!("lua/release.lua");
/// Everything `status` shows, read atomically with the server's clock.
pub(super) const STATUS: &str = include_str!("lua/status.lua");

/// One Redis server (or one of a cluster's nodes, with others to try).
#[derive(Clone)]
pub(super) struct Node {
    pub(super) info: ConnectionInfo,
    /// More nodes of the same cluster (`redis://h1:p1,h2:p2`), tried in turn when the one
    /// before cannot be reached.
    pub(super) seeds: Vec<redis::ConnectionAddr>,
    /// Whether this process reached the server (see [`Reach`]).
    pub(super) reach: Reach,
    /// host:port (every seed's, comma-separated) or socket path, without credentials.
    pub(super) addr: String,
    /// Sentinels that name the primary (`redis-sentinel://`): every connection asks them.
    pub(super) sentinel: Option<Sentinels>,
    /// `?min-replicas=N`: replicas that must acknowledge a grant (`WAIT`) before it counts.
    pub(super) min_replicas: u32,
}

/// `url` without its `min-replicas=N` query parameter, and N (0 without it).
fn take_min_replicas(url: &str) -> Result<(String, u32), String> {
    let (head, frag) = match url.find('#') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let Some((base, query)) = head.split_once('?') else {
        return Ok((url.to_string(), 0));
    };
    let mut n = 0;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("min-replicas=") {
            Some(v) => {
                n = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| format!("min-replicas={v}: a number of replicas, 1 to 100"))?;
            }
            None => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    Ok((format!("{base}{query}{frag}"), n))
}

/// The sentinels of a primary: `info` is the primary's settings at the first sentinel's address.
#[derive(Clone)]
pub(super) struct Sentinels {
    addrs: Vec<redis::ConnectionAddr>,
    name: String,
    /// The name as messages show it: without any secret of the URL (a query misplaced after
    /// the `#`, `#acc?password=PW`, is part of the name).
    shown: String,
}

impl Sentinels {
    /// How to reach the sentinel `at`: the primary's TLS settings, without its credentials and
    /// database (they are the primary's).
    fn info(&self, primary: &ConnectionInfo, at: &redis::ConnectionAddr) -> ConnectionInfo {
        primary
            .clone()
            .set_addr(at.clone())
            .set_redis_settings(redis::RedisConnectionInfo::default())
    }

    /// The primary a sentinel names now.
    fn named(&self, sentinel: &mut Connection) -> redis::RedisResult<Option<(String, u16)>> {
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.name)
            .query(sentinel)
    }

    /// The address of the primary a sentinel names now, reached like `like` (TLS or not);
    /// `None` if it does not answer or names none.
    fn named_addr(
        &self,
        sentinel: &mut Connection,
        like: &redis::ConnectionAddr,
    ) -> Option<redis::ConnectionAddr> {
        let (host, port) = self.named(sentinel).ok().flatten()?;
        conn::addr_like(like, &format!("{host}:{port}"))
    }

    /// The primary other than `addr` that a sentinel answering within `limit` names, if any:
    /// a failover moved the primary (its old self may still accept writes for a while).
    fn moved_from(
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

/// `redis-sentinel://[user:pass@]host[:26379][,host…][/db]#primary` (`rediss-sentinel://`: TLS
/// to the sentinels and the primary): the `redis://` URL of the first sentinel, the others and
/// the primary's name; `None` for another scheme.
fn parse_sentinel(url: &str) -> Result<Option<(String, Vec<HostPort>, String)>, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let plain = match scheme.to_ascii_lowercase().as_str() {
        "redis-sentinel" => "redis",
        "rediss-sentinel" => "rediss",
        _ => return Ok(None),
    };
    let (rest, name) = rest.rsplit_once('#').unwrap_or((rest, ""));
    let (first, others) = split_seeds(&format!("{plain}://{rest}"), 26379)?;
    Ok(Some((first, others, name.to_string())))
}

/// `redis://[auth@]h1[:p1],h2[:p2]…[/db]` (or `rediss://`): the URL of the first host, its port
/// written out, and the others (see [`hosts`](crate::backend::hosts)). Other schemes (a Unix
/// socket) take one server: the URL as it is.
fn split_seeds(url: &str, default_port: u16) -> Result<(String, Vec<HostPort>), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_string(), Vec::new()));
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "redis" | "rediss") {
        return Ok((url.to_string(), Vec::new()));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), authority),
    };
    let mut hosts = crate::backend::hosts::parse(hosts, default_port)?.into_iter();
    let first = hosts.next().ok_or("no host")?;
    Ok((format!("{scheme}://{auth}{first}{tail}"), hosts.collect()))
}

impl Node {
    pub(super) fn parse(full: &str) -> Result<Node, Usage> {
        let bad = |e: redis::RedisError| Usage(format!("bad redis URL '{}': {e}", redact(full)));
        let (url, min_replicas) = take_min_replicas(full)
            .map_err(|why| Usage(format!("bad redis URL '{}': {why}", redact(full))))?;
        let url = url.as_str();
        let why = |why: String| Usage(format!("bad redis URL '{}': {why}", redact(url)));
        let sentinel = parse_sentinel(url).map_err(why)?;
        let (first, others) = match &sentinel {
            Some((first, others, name)) => {
                if name.is_empty() {
                    return Err(Usage(format!(
                        "bad redis URL '{}': a Sentinel URL names its primary after '#' \
                         (redis-sentinel://host:26379#mymaster)",
                        redact(url)
                    )));
                }
                (first.clone(), others.clone())
            }
            None => split_seeds(url, 6379).map_err(why)?,
        };
        let info = first.as_str().into_connection_info().map_err(bad)?;
        let mut seeds = others
            .iter()
            .map(|h| conn::addr_like(info.addr(), &h.to_string()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| why("several hosts, and the first is not TCP".into()))?;
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            return Err(Usage(format!(
                "bad redis URL '{}': dlock does not skip certificate checks (#insecure); trust \
                 the server's CA with SSL_CERT_FILE instead",
                redact(url)
            )));
        }
        let mut addr = std::iter::once(info.addr())
            .chain(&seeds)
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let sentinel = sentinel.map(|(_, _, name)| {
            let shown = crate::report::clean(&crate::report::without_secrets(&name), 200);
            addr = format!("sentinel {addr} #{shown}");
            Sentinels {
                shown,
                addrs: std::iter::once(info.addr().clone())
                    .chain(std::mem::take(&mut seeds))
                    .collect(),
                name,
            }
        });
        Ok(Node {
            info,
            seeds,
            addr,
            reach: Reach::default(),
            sentinel,
            min_replicas,
        })
    }

    /// A connection to the primary the sentinels name now, checked with `ROLE` (a sentinel
    /// that has not seen a failover yet names the old one, now a replica).
    fn primary(
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

    /// This server's settings (credentials, TLS, database) at another address: where a
    /// cluster's redirection led a connection.
    pub(super) fn at(&self, addr: &redis::ConnectionAddr) -> Node {
        Node {
            info: self.info.clone().set_addr(addr.clone()),
            seeds: Vec::new(),
            reach: self.reach.clone(),
            addr: addr.to_string(),
            sentinel: None,
            min_replicas: self.min_replicas,
        }
    }

    /// A new connection whose commands time out after `timeout`.
    pub(super) fn connect(&self, timeout: Duration) -> anyhow::Result<Connection> {
        self.connect_within(CONNECT_TIMEOUT, timeout)
    }

    /// A new connection made within `connect`, whose commands time out after `timeout`.
    pub(super) fn connect_within(
        &self,
        connect: Duration,
        timeout: Duration,
    ) -> anyhow::Result<Connection> {
        if let Some(s) = &self.sentinel {
            return Ok(self.primary(s, connect, timeout)?.0);
        }
        if self.seeds.is_empty() {
            return Connection::open(&self.info, connect, timeout)
                .map_err(|e| self.error(format!("cannot connect to {}", self.addr), e));
        }
        // Seeds of a cluster: the first that answers, and it must be a cluster node (two
        // standalone servers would be two independent locks).
        let mut last = None;
        for addr in std::iter::once(self.info.addr()).chain(&self.seeds) {
            let info = self.info.clone().set_addr(addr.clone());
            match Connection::open(&info, connect, timeout) {
                Ok(mut con) => {
                    let id: redis::RedisResult<String> =
                        redis::cmd("CLUSTER").arg("MYID").query(&mut con);
                    return match id {
                        Ok(_) => Ok(con),
                        Err(e) if e.kind() == redis::ErrorKind::Io => {
                            Err(self.error(format!("cannot connect to {addr}"), e))
                        }
                        Err(_) => Err(Unavailable(format!(
                            "{addr} is not in cluster mode: several hosts in one redis:// URL \
                             are seed nodes of one Redis Cluster (independent servers are \
                             Redlock: one --url each)"
                        ))
                        .into()),
                    };
                }
                Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() => {
                    last = Some((addr, e));
                }
                Err(e) => return Err(self.error(format!("cannot connect to {addr}"), e)),
            }
        }
        let (addr, e) = last.expect("one seed at least");
        Err(self.error(
            format!("cannot connect to {addr} (nor to the seeds before it)"),
            e,
        ))
    }
}

impl Node {
    /// `doing: e`, as an [`Outage`](crate::exit::Outage) when the connection broke or timed out
    /// after the server had answered this process, else [`Unavailable`]. (Answered, not just
    /// connected: a TCP connect succeeds against a TLS port given a plain `redis://` URL, and
    /// that misconfiguration must fail, not be retried forever.)
    pub(super) fn error(&self, doing: String, e: redis::RedisError) -> anyhow::Error {
        // A primary demoted by a failover answers writes READONLY and ends blocked commands
        // UNBLOCKED; a cluster or replica in transition says so too: all pass, like an outage.
        let failover = matches!(
            e.code(),
            Some("READONLY" | "UNBLOCKED" | "MASTERDOWN" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN")
        );
        if failover {
            // The server answered: this is not an address that never worked.
            self.reach.connected();
        }
        let transport = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || failover;
        if transport {
            self.reach.transport_error(format!("{doing}: {e}"))
        } else {
            Unavailable(format!("{doing}: {e}")).into()
        }
    }
}

/// The lock keys named by `dlock:{KEY}…` Redis keys on `con` (SCAN: the server is never
/// blocked), at most [`super::MAX_LISTED`].
pub(super) fn scan_keys(con: &mut Connection) -> redis::RedisResult<Vec<Key>> {
    // The keys that exist only while the lock is held or waited for (the fence counter and the
    // records stay after use, and are not candidates).
    const SUFFIXES: [&str; 4] = ["}", "}:waiters", "}:holders", "}:wwait"];
    let mut keys = std::collections::BTreeSet::new();
    let mut cursor = 0u64;
    loop {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("dlock:{*")
            .arg("COUNT")
            .arg(1000)
            .query(con)?;
        for name in names {
            let Some(rest) = name.strip_prefix("dlock:{") else {
                continue;
            };
            let key = SUFFIXES
                .iter()
                .find_map(|s| rest.strip_suffix(s))
                .and_then(untag)
                .and_then(|k| Key::new(&k).ok());
            keys.extend(key);
        }
        if next == 0 || keys.len() >= super::MAX_LISTED {
            return Ok(keys.into_iter().take(super::MAX_LISTED).collect());
        }
        cursor = next;
    }
}

/// Whether the server says it is a primary (`ROLE`).
fn is_primary(con: &mut Connection) -> bool {
    let role: redis::RedisResult<redis::Value> = redis::cmd("ROLE").query(con);
    matches!(role, Ok(redis::Value::Array(v))
        if matches!(v.first(), Some(redis::Value::BulkString(r)) if r == b"master"))
}

/// `host:port` of each primary that serves slots, from `CLUSTER NODES` (`id host:port@bus[,name]
/// flags master-id ping pong epoch state slots…`).
fn cluster_primaries(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            let flags = f.get(2)?;
            let serving = f.len() > 8 && f[7] == "connected";
            let primary = flags.split(',').any(|x| x == "master")
                && !flags.split(',').any(|x| x == "fail" || x == "noaddr");
            let addr = f.get(1)?.split(['@', ',']).next()?;
            (serving && primary).then(|| addr.to_string())
        })
        .collect()
}

/// The names of one lock's keys.
pub(super) struct Keys {
    pub(super) lock: String,
    pub(super) fence: String,
    pub(super) owner: String,
    pub(super) signal: String,
    pub(super) waiters: String,
    /// Shared holders and semaphore slot holders: token -> lease end (server ms).
    pub(super) holders: String,
    /// Their metadata and fencing tokens, and `~mode` (0 shared, else the semaphore's n).
    pub(super) hmeta: String,
    /// Waiting exclusive runs: token -> registration end; new shared holders wait for them.
    pub(super) wwait: String,
}

impl Keys {
    /// All keys start with `dlock:{TAG}`, so they hash to one Cluster slot, and the suffixes
    /// end in distinct characters, so no key of one lock is a key of another. TAG is KEY when
    /// it has no `}` and no `%` (then the lock is `dlock:{KEY}`, the name applications use);
    /// otherwise KEY with `%` written `%25` and `}` written `%7D` (see [`tag`]).
    pub(super) fn new(key: &Key) -> Keys {
        let lock = format!("dlock:{{{}}}", tag(key.as_str()));
        Keys {
            fence: format!("{lock}:fence"),
            owner: format!("{lock}:owner"),
            signal: format!("{lock}:signal"),
            waiters: format!("{lock}:waiters"),
            holders: format!("{lock}:holders"),
            hmeta: format!("{lock}:hmeta"),
            wwait: format!("{lock}:wwait"),
            lock,
        }
    }

    /// `DEL` of every key of the lock (for [`Backend::purge`]).
    pub(super) fn del_all(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&self.lock)
            .arg(&self.fence)
            .arg(&self.owner)
            .arg(&self.signal)
            .arg(&self.waiters)
            .arg(&self.holders)
            .arg(&self.hmeta)
            .arg(&self.wwait);
        cmd
    }
}

/// The hash tag of a key: the key itself unless it holds `}` (which would end the tag early:
/// `}x` would leave an empty tag, and Redis would hash each of the lock's keys whole, to
/// different slots) or `%`; then %-escaped. Escaped tags always hold a `%` and plain ones never
/// do, so no two keys share a tag; the tag is never empty (a key is not).
pub(super) fn tag(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.contains(['}', '%']) {
        return key.into();
    }
    key.replace('%', "%25").replace('}', "%7D").into()
}

/// The key of a hash tag (see [`tag`]); `None` for a tag no key has.
pub(super) fn untag(tag: &str) -> Option<String> {
    if !tag.contains('%') {
        return Some(tag.to_string());
    }
    let mut key = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        let c = match rest.get(at + 1..at + 3)? {
            "25" => '%',
            "7D" => '}',
            _ => return None,
        };
        key.push(c);
        rest = &rest[at + 3..];
    }
    key.push_str(rest);
    Some(key)
}

/// A fresh random 128-bit token, as hex.
pub(super) fn token() -> anyhow::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a lock token: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Locks on one Redis server.
pub(crate) struct RedisBackend {
    node: Node,
}

impl RedisBackend {
    /// `urls` empty: `redis://127.0.0.1:6379`; one URL: that server.
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<RedisBackend> {
        let node = match urls {
            [] => Node::parse("redis://127.0.0.1:6379")?,
            [url] => Node::parse(url)?,
            _ => {
                return Err(Usage("several --url are Redlock, see backend::redlock".into()).into());
            }
        };
        Ok(RedisBackend { node })
    }

    /// The exclusive holder, else one shared holder, for messages.
    fn holder(&self, con: &mut Connection, keys: &Keys) -> Option<Holder> {
        let meta: Option<String> = redis::cmd("HGET")
            .arg(&keys.owner)
            .arg("meta")
            .query(con)
            .ok()?;
        if let Some(h) = meta.and_then(|m| serde_json::from_str(&m).ok()) {
            return Some(h);
        }
        let first: Vec<String> = redis::cmd("ZRANGE")
            .arg(&keys.holders)
            .arg(0)
            .arg(0)
            .query(con)
            .ok()?;
        let meta: Option<String> = redis::cmd("HGET")
            .arg(&keys.hmeta)
            .arg(first.first()?)
            .query(con)
            .ok()?;
        serde_json::from_str(&meta?).ok()
    }

    /// `?min-replicas=N`: waits (`WAIT N`, at most a third of the TTL and 1 s) until N replicas
    /// have the grant; if fewer do, gives the lock back and fails as an outage (a waiting run
    /// tries again within --wait; with --no-wait, exit 69).
    fn replicated(
        &self,
        con: &mut Connection,
        keys: &Keys,
        token: &str,
        req: &Request<'_>,
    ) -> anyhow::Result<()> {
        let want = self.node.min_replicas;
        let limit = (req.ttl / 3).min(Duration::from_secs(1));
        con.set_read_timeout(Some(limit + COMMAND_TIMEOUT))?;
        let acked: redis::RedisResult<u32> = redis::cmd("WAIT")
            .arg(want)
            .arg(limit.as_millis().max(1) as u64)
            .query(con);
        con.set_read_timeout(Some(COMMAND_TIMEOUT.min(req.ttl / 3)))?;
        let why = match acked {
            Ok(n) if n >= want => return Ok(()),
            Ok(n) => format!(
                "only {n} of the {want} replicas required (min-replicas) acknowledged the lock \
                 within {}ms; gave it back",
                limit.as_millis()
            ),
            Err(e) => format!("WAIT: {e}"),
        };
        let _: redis::RedisResult<i64> = release_for(keys, token, req.mode).invoke(con);
        Err(crate::exit::Outage(format!("{}: {why}", self.node.addr)).into())
    }

    /// Best effort, after a lost reply: if the lock is ours after all, give it back.
    /// Gives back whatever an acquire whose reply was lost may have taken with `token`: the lock
    /// (or a shared or slot entry, by `mode`), and its place in the waiter lists. After a signal,
    /// briefly: a server that answers releases in a millisecond, and one that does not must not
    /// hold up the exit. (It once gave back only an exclusive lock and left the waiter entry, so
    /// `status` counted a waiter that had given up on Ctrl-C.)
    fn release_token(&self, keys: &Keys, token: &str, mode: Mode, signalled: bool) {
        if let Ok(mut con) = self.cleanup_connection(signalled) {
            let _: redis::RedisResult<i64> = release_for(keys, token, mode).invoke(&mut con);
            let _ = forget_waiter(&mut con, keys, token);
        }
    }

    /// Takes a waiter that gives up off the waiter lists: on `con`, or on a new connection if
    /// `con` failed (a request a signal ended leaves it closed).
    fn forget(&self, con: &mut Connection, keys: &Keys, token: &str, signalled: bool) {
        if forget_waiter(con, keys, token).is_ok() {
            return;
        }
        if let Ok(mut fresh) = self.cleanup_connection(signalled) {
            let _ = forget_waiter(&mut fresh, keys, token);
        }
    }

    /// A connection for giving something back: within [`SIGNALLED_LIMIT`] after a signal.
    fn cleanup_connection(&self, signalled: bool) -> anyhow::Result<Connection> {
        if signalled {
            self.node.connect_within(SIGNALLED_LIMIT, SIGNALLED_LIMIT)
        } else {
            self.node.connect_within(CONNECT_TIMEOUT, COMMAND_TIMEOUT)
        }
    }
}

pub(super) fn release_script(keys: &Keys, token: &str) -> redis::ScriptInvocation<'static> {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = SCRIPT.get_or_init(|| Script::new(RELEASE)).prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.owner)
        .key(&keys.signal)
        .arg(token)
        .arg(SIGNAL_TTL_MS);
    inv
}

/// The release of what `token` holds in `mode`: the lock key, or a shared/slot entry.
fn release_for(keys: &Keys, token: &str, mode: Mode) -> redis::ScriptInvocation<'static> {
    if mode == Mode::Exclusive {
        release_script(keys, token)
    } else {
        release_shared_script(keys, token, mode)
    }
}

fn release_shared_script(keys: &Keys, token: &str, mode: Mode) -> redis::ScriptInvocation<'static> {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = script(&SCRIPT, RELEASE_SHARED).prepare_invoke();
    inv.key(&keys.holders)
        .key(&keys.hmeta)
        .key(&keys.signal)
        .arg(token)
        .arg(SIGNAL_TTL_MS)
        .arg(mode.limit().unwrap_or(0));
    inv
}

pub(super) fn script(cell: &'static std::sync::OnceLock<Script>, src: &str) -> &'static Script {
    cell.get_or_init(|| Script::new(src))
}

/// One acquire attempt for `mode` (ACQUIRE or ACQUIRE_SHARED with their keys); `slice_ms` > 0
/// registers a waiter for that long.
pub(super) fn acquire_script(
    keys: &Keys,
    mode: Mode,
    token: &str,
    ttl_ms: u64,
    meta: &str,
    slice_ms: u64,
) -> redis::ScriptInvocation<'static> {
    static ACQ: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    static ACQ_SHARED: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = match mode {
        Mode::Exclusive => {
            let mut inv = script(&ACQ, ACQUIRE).prepare_invoke();
            inv.key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.owner)
                .key(&keys.waiters)
                .key(&keys.holders)
                .key(&keys.wwait)
                .key(&keys.hmeta);
            inv
        }
        Mode::Shared | Mode::Limit(_) => {
            let mut inv = script(&ACQ_SHARED, ACQUIRE_SHARED).prepare_invoke();
            inv.key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.hmeta)
                .key(&keys.waiters)
                .key(&keys.holders)
                .key(&keys.wwait)
                .key(&keys.signal)
                .key(&keys.owner);
            inv
        }
    };
    inv.arg(token).arg(ttl_ms).arg(meta).arg(slice_ms);
    if mode != Mode::Exclusive {
        inv.arg(mode.limit().unwrap_or(0)).arg(SIGNAL_TTL_MS);
    }
    inv
}

/// The error for ACQUIRE's `{-1, m}` reply.
pub(super) fn mismatch(req: &Request<'_>, theirs: i64) -> anyhow::Error {
    let theirs = match theirs {
        -1 => "exclusive".to_string(),
        0 => "shared".to_string(),
        n => format!("--limit {n}"),
    };
    super::mode_mismatch(req.key, req.mode, &theirs)
}

impl Backend for RedisBackend {
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        // A cluster's locks are spread over its primaries: scan each (a server that is not a
        // cluster refuses CLUSTER NODES).
        let nodes: redis::RedisResult<String> = redis::cmd("CLUSTER").arg("NODES").query(&mut con);
        let Ok(nodes) = nodes else {
            return scan_keys(&mut con).map_err(|e| self.node.error(self.node.addr.clone(), e));
        };
        let mut keys = std::collections::BTreeSet::new();
        for primary in cluster_primaries(&nodes) {
            let Some(addr) = conn::addr_like(self.node.info.addr(), &primary) else {
                continue;
            };
            let node = self.node.at(&addr);
            let mut con = node.connect(COMMAND_TIMEOUT)?;
            keys.extend(scan_keys(&mut con).map_err(|e| node.error(node.addr.clone(), e))?);
        }
        Ok(keys.into_iter().take(super::MAX_LISTED).collect())
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Redis
    }

    fn location(&self) -> String {
        self.node.addr.clone()
    }

    fn unsupported(&self, _mode: Mode) -> Option<String> {
        None
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let keys = Keys::new(req.key);
        let token = token()?;
        let meta = serde_json::to_string(req.holder)?;
        let ttl_ms = req.ttl.as_millis() as u64;
        let timeout = COMMAND_TIMEOUT.min(req.ttl / 3);
        // Through Sentinel, the sentinel that named the primary is asked again once the lock is
        // granted: if it names another one now, a failover is under way and the old primary's
        // grant is worth nothing (the new one may grant the lock to someone else).
        let (mut con, mut sentinel) = match &self.node.sentinel {
            Some(s) => {
                let (c, s) = self.node.primary(s, CONNECT_TIMEOUT, timeout)?;
                (c, Some(s))
            }
            None => (self.node.connect(timeout)?, None),
        };
        let mut waiter: Option<Waiter> = None;
        let mut told_holder = false;
        loop {
            if let Some(sig) = req.interrupted() {
                self.forget(&mut con, &keys, &token, true);
                return Err(Interrupted(sig).into());
            }
            let slice = match req.deadline.remaining() {
                Some(d) => d.min(MAX_BLOCK),
                None => MAX_BLOCK,
            };
            let sent = BootInstant::now();
            let reply = acquire_script(
                &keys,
                req.mode,
                &token,
                ttl_ms,
                &meta,
                slice.as_millis() as u64,
            )
            .invoke(&mut con)
            .and_then(acquire_reply);
            let (acquired, value, young) = match reply {
                Ok(r) => {
                    // The server answered: a later transport failure is an outage.
                    self.node.reach.connected();
                    r
                }
                Err(e) => {
                    // The outcome is unknown: the lock may be ours. Give it back before failing.
                    self.release_token(&keys, &token, req.mode, req.interrupted().is_some());
                    return Err(self.node.error(self.node.addr.clone(), e));
                }
            };
            if acquired == -1 {
                self.forget(&mut con, &keys, &token, false);
                return Err(mismatch(req, value));
            }
            if acquired == 1 {
                if let (Some(s), Some(sc)) = (&self.node.sentinel, sentinel.as_mut()) {
                    let here = con.addr().clone();
                    let named = s.named_addr(sc, &here);
                    if named.is_none_or(|n| n.to_string() != here.to_string()) {
                        let _: redis::RedisResult<i64> =
                            release_for(&keys, &token, req.mode).invoke(&mut con);
                        return Err(crate::exit::Outage(format!(
                            "{}: the sentinels no longer name {here} the primary (a failover)",
                            self.node.addr
                        ))
                        .into());
                    }
                }
                if self.node.min_replicas > 0 {
                    self.replicated(&mut con, &keys, &token, req)?;
                }
                let held_back_until = young.and_then(|up| super::hold_back_until(up, req.ttl));
                return Ok(Box::new(RedisLease {
                    node: self.node.clone(),
                    con: Some(con),
                    keys,
                    token,
                    mode: req.mode,
                    ttl: req.ttl,
                    fence: u64::try_from(value).ok(),
                    acquired_at: sent,
                    held_back_until,
                }));
            }
            if req.waited_out() {
                let holder = self.holder(&mut con, &keys);
                self.forget(&mut con, &keys, &token, false);
                return Err(req.busy(holder.as_ref()));
            }
            if !told_holder {
                if let Some(h) = self.holder(&mut con, &keys) {
                    (req.on_holder)(&h);
                }
                told_holder = true;
            }
            // value = the holder's PTTL in ms (-2: gone meanwhile, -1: no TTL, which dlock never sets).
            if value == -2 {
                continue;
            }
            let jitter = Duration::from_millis(u64::from(std::process::id() % 50));
            let mut block = slice;
            if value >= 0 {
                block = block.min(Duration::from_millis(value as u64) + jitter);
            }
            if waiter.is_none() {
                // On the server that answered the acquire (a cluster's slot owner): the
                // wake-up list is there, and so must be CLIENT UNBLOCK.
                match Waiter::new(&self.node.at(con.addr())) {
                    Ok(w) => waiter = Some(w),
                    Err(e) => {
                        self.forget(&mut con, &keys, &token, req.interrupted().is_some());
                        return Err(e);
                    }
                }
            }
            let w = waiter.as_mut().expect("set above");
            let node = w.node.clone();
            let id = w.id;
            let blocked = crate::signals::Blocked::new();
            let unblocker = std::sync::Mutex::new(None::<Connection>);
            let _guard = req.interrupt.on_fire(blocked.waker(move || {
                // Runs on the signal watcher thread while this thread is blocked in BLPOP.
                let mut c = unblocker.lock().unwrap_or_else(|e| e.into_inner());
                if c.is_none() {
                    *c = node.connect(Duration::from_secs(1)).ok();
                }
                if let Some(c) = c.as_mut() {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("CLIENT").arg("UNBLOCK").arg(id).query(c);
                }
            }))?;
            if req.interrupt.fired().is_some() {
                blocked.done();
                continue; // the top of the loop cleans up
            }
            let result = w.block(&keys.signal, block);
            blocked.done();
            if result.is_err() && req.interrupted().is_some() {
                continue; // the top of the loop cleans up
            }
            if let Err(e) = result {
                self.forget(&mut con, &keys, &token, false);
                return Err(self.node.error(format!("waiting on {}", self.node.addr), e));
            }
        }
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        static ST: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let keys = Keys::new(key);
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        let (lock, pttl, meta, fence, _owner_token, waiters): (
            String,
            i64,
            String,
            String,
            String,
            u64,
        ) = script(&ST, STATUS)
            .key(&keys.lock)
            .key(&keys.owner)
            .key(&keys.waiters)
            .invoke(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", self.node.addr)))?;
        let mut status = Status {
            held: !lock.is_empty(),
            waiters: Some(waiters),
            server_name: Some(keys.lock.clone()),
            ..Status::new(key, self.kind(), self.node.addr.clone())
        };
        if status.held {
            let mut h: Holder = serde_json::from_str(&meta).unwrap_or_default();
            h.fencing_token = fence.parse().ok();
            h.lease_left_ms = u64::try_from(pttl).ok();
            status.holders.push(h);
        }
        static ST_SHARED: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let shared: Vec<String> = script(&ST_SHARED, STATUS_SHARED)
            .key(&keys.holders)
            .key(&keys.hmeta)
            .invoke(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", self.node.addr)))?;
        if let Some((mode, rest)) = shared.split_first() {
            for entry in rest.chunks_exact(4) {
                let mut h: Holder = serde_json::from_str(&entry[2]).unwrap_or_default();
                h.lease_left_ms = entry[1].parse().ok();
                h.fencing_token = entry[3].parse().ok();
                status.holders.push(h);
            }
            if rest.len() >= 4 {
                status.held = true;
                let n: u32 = mode.parse().unwrap_or(0);
                status.mode = Some(if n > 0 { "limit" } else { "shared" });
                status.limit = (n > 0).then_some(n);
            }
        }
        Ok(status)
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        let _: i64 = Keys::new(key)
            .del_all()
            .query(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", self.node.addr)))?;
        Ok(())
    }

    fn break_lock(&self, key: &Key) -> anyhow::Result<Status> {
        let status = self.status(key)?;
        let keys = Keys::new(key);
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        let _: i64 = release_script(&keys, "")
            .invoke(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", self.node.addr)))?;
        let _: i64 = release_shared_script(&keys, "", Mode::Shared)
            .invoke(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", self.node.addr)))?;
        Ok(status)
    }
}

/// Takes a waiter that gives up off the waiter lists (for `status`, and so that a writer that
/// stopped waiting no longer keeps shared holders out).
fn forget_waiter(con: &mut Connection, keys: &Keys, token: &str) -> redis::RedisResult<()> {
    redis::pipe()
        .cmd("ZREM")
        .arg(&keys.waiters)
        .arg(token)
        .ignore()
        .cmd("ZREM")
        .arg(&keys.wwait)
        .arg(token)
        .ignore()
        .query(con)
}

/// The connection a waiter blocks on (never the lock's own connection).
struct Waiter {
    con: Connection,
    /// The server it is connected to.
    node: Node,
    /// `CLIENT ID` there, for `CLIENT UNBLOCK`.
    id: i64,
}

impl Waiter {
    fn new(node: &Node) -> anyhow::Result<Waiter> {
        let mut con = node.connect(COMMAND_TIMEOUT)?;
        let id = client_id(&mut con).map_err(|e| node.error(node.addr.clone(), e))?;
        Ok(Waiter {
            con,
            node: node.clone(),
            id,
        })
    }

    /// BLPOP the wake-up list for at most `d`.
    fn block(&mut self, signal: &str, d: Duration) -> redis::RedisResult<()> {
        // The socket must outwait the server-side timeout, or the reply is lost.
        self.con.set_read_timeout(Some(d + COMMAND_TIMEOUT))?;
        let secs = (d.as_secs_f64() * 1000.0).ceil() / 1000.0;
        let _: Option<(String, String)> = redis::cmd("BLPOP")
            .arg(signal)
            .arg(secs.max(0.001))
            .query(&mut self.con)?;
        if self.con.addr().to_string() != self.node.addr {
            // The slot moved and the BLPOP followed it: CLIENT UNBLOCK must go there now.
            self.node = self.node.at(self.con.addr());
            self.con.set_read_timeout(Some(COMMAND_TIMEOUT))?;
            self.id = client_id(&mut self.con)?;
        }
        Ok(())
    }
}

fn client_id(con: &mut Connection) -> redis::RedisResult<i64> {
    redis::cmd("CLIENT").arg("ID").query(con)
}

/// A held Redis lock.
struct RedisLease {
    node: Node,
    /// The lock's connection; `None` after a transport error (reconnected on the next call).
    con: Option<Connection>,
    keys: Keys,
    token: String,
    /// Exclusive (the lock key) or shared/semaphore (an entry in `:holders`).
    mode: Mode,
    ttl: Duration,
    fence: Option<u64>,
    acquired_at: BootInstant,
    held_back_until: Option<BootInstant>,
}

/// An acquire script's reply: granted or not (or a mode mismatch), its value, and the server's
/// uptime in seconds when a grant could read it.
pub(super) fn acquire_reply(reply: Vec<i64>) -> redis::RedisResult<(i64, i64, Option<u64>)> {
    match reply[..] {
        [acquired, value] => Ok((acquired, value, None)),
        [acquired, value, up] => Ok((acquired, value, u64::try_from(up).ok())),
        _ => Err((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the acquire script",
        )
            .into()),
    }
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
    fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    fn held_back_until(&self) -> Option<BootInstant> {
        self.held_back_until
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn acquired_at(&self) -> BootInstant {
        self.acquired_at
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
            Ok(_) => Err(RenewError::Lost(format!(
                "the lock key on {addr} expired or was deleted (dlock break?) or taken over"
            ))),
            Err(e) => {
                self.con = None;
                Err(RenewError::Failed(anyhow::anyhow!("{addr}: {e}")))
            }
        }
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let inv = release_for(&self.keys, &self.token, self.mode);
        let addr = self.node.addr.clone();
        let con = self.con()?;
        let _: i64 = inv
            .invoke(con)
            .map_err(|e| anyhow::anyhow!("{addr}: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_a_nonempty_tag_of_its_own() {
        for key in [
            "job", "}x", "{}", "a}b{c", "%", "a%7Db", "%}", "%257D", "{", "x{y",
        ] {
            let t = tag(key);
            assert!(!t.is_empty() && !t.contains('}'), "{key}: {t}");
            assert_eq!(untag(&t).as_deref(), Some(key), "{key}");
        }
        assert_eq!(tag("job"), "job");
        assert_eq!(tag("}x"), "%7Dx");
        assert_eq!(tag("a%7Db"), "a%257Db");
        assert_ne!(tag("}"), tag("%7D"));
        assert_eq!(untag("%zz"), None);
    }

    #[test]
    fn several_hosts_are_seeds() {
        let (first, others) = split_seeds("redis://u:p@a:1,b:2,c/3", 6379).unwrap();
        assert_eq!(first, "redis://u:p@a:1/3");
        let others: Vec<String> = others.iter().map(ToString::to_string).collect();
        assert_eq!(others, ["b:2", "c:6379"]);
        assert_eq!(
            split_seeds("rediss://a", 6379),
            Ok(("rediss://a:6379".into(), vec![]))
        );
        assert_eq!(
            split_seeds("unix:///a,b", 6379),
            Ok(("unix:///a,b".into(), vec![]))
        );
        for bad in [
            "redis://a,,b",
            "redis://a:0",
            "redis://a b",
            "redis://::1,b",
        ] {
            assert!(Node::parse(bad).is_err(), "{bad}");
        }
        let n = Node::parse("redis://:pw@127.0.0.1:7000,127.0.0.1:7001,localhost").unwrap();
        assert_eq!(n.addr, "127.0.0.1:7000,127.0.0.1:7001,localhost:6379");
        assert!(Node::parse("redis://a:1,b:x").is_err());
    }

    #[test]
    fn min_replicas_is_dlocks_parameter() {
        assert_eq!(
            take_min_replicas("redis://h/1?min-replicas=2#x"),
            Ok(("redis://h/1#x".to_string(), 2))
        );
        assert_eq!(
            take_min_replicas("redis://h?protocol=resp3&min-replicas=1"),
            Ok(("redis://h?protocol=resp3".to_string(), 1))
        );
        assert_eq!(take_min_replicas("redis://h"), Ok(("redis://h".into(), 0)));
        assert!(take_min_replicas("redis://h?min-replicas=0").is_err());
        assert!(take_min_replicas("redis://h?min-replicas=x").is_err());
        assert_eq!(
            Node::parse("redis://h?min-replicas=3")
                .unwrap()
                .min_replicas,
            3
        );
    }

    #[test]
    fn sentinel_urls() {
        let n = Node::parse("redis-sentinel://:pw@s1,s2:26380/2#prim").unwrap();
        assert_eq!(n.addr, "sentinel s1:26379,s2:26380 #prim");
        let s = n.sentinel.as_ref().unwrap();
        assert_eq!((s.addrs.len(), s.name.as_str()), (2, "prim"));
        assert!(n.seeds.is_empty());
        assert_eq!(n.info.redis_settings().db(), 2);
        assert_eq!(n.info.redis_settings().password(), Some("pw"));
        assert!(
            Node::parse("redis-sentinel://s1:26379").is_err(),
            "no primary name"
        );
        let t = Node::parse("rediss-sentinel://s1:1#p").unwrap();
        assert!(matches!(
            t.info.addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ));
    }
}
