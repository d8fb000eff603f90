//! The Redis backend: one instance (or a Sentinel master, or one Cluster slot).
//!
//! Every key of one lock shares the hash tag `{KEY}`: `dlock:{KEY}` (the lock, value = a random
//! 128-bit token, with a PX TTL), `:fence` (the fencing counter, expiring the retention after its last use: `history::retention`), `:owner` (holder
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

use redis::{ConnectionInfo, Script};

mod cluster;
mod conn;
mod doctor;
pub(super) mod ground;
pub(super) mod history;
mod lease;
mod names;
mod scripts;
mod sentinel;
mod url;
mod waiter;

use self::cluster::cluster_primaries;
pub(super) use self::cluster::{scan_history_keys, scan_keys};
pub(super) use self::conn::Connection;
pub(super) use self::doctor::redlock as doctor_redlock;
use self::lease::RedisLease;
pub(super) use self::names::{Keys, token};

pub(super) use self::scripts::{
    BROKEN, BROKEN_PREFIX, RENEW, STATUS, acquire_reply, acquire_starting, break_script,
    granted_entry, release_script, script,
};
use self::scripts::{STATUS_SHARED, mismatch, release_for, release_shared_script};
use self::sentinel::Sentinels;
use self::waiter::{Waiter, forget_waiter};

use super::{Backend, BreakHow, Broken, Lease, Reach, Request};
use crate::backend::Grant;
use crate::clock::BootInstant;
use crate::exit::{Interrupted, Unavailable, Usage};
use crate::model::{BackendKind, Key};
use crate::model::{Holder, Mode, Status};

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest single BLPOP: a waiter re-checks at least this often.
const MAX_BLOCK: Duration = Duration::from_secs(5);
/// How long cleaning up may take after a signal.
const SIGNALLED_LIMIT: Duration = Duration::from_millis(300);
/// How long a pushed wake-up waits for a waiter before it expires.
const SIGNAL_TTL_MS: u64 = 1000;

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

impl Node {
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
        // A proxy in the way, or a replica: said as such, and not waited out.
        if let Some(refused) = ground::refusal(self, &e) {
            return refused;
        }
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
            self.reach
                .transport_error(format!("{doing}: {}", conn::words(&e)))
        } else {
            Unavailable(format!("{doing}: {}", conn::words(&e))).into()
        }
    }
}

/// `uptime_in_seconds` of an `INFO server` reply.
pub(super) fn uptime(info: &str) -> Option<u64> {
    doctor::field(info, "uptime_in_seconds")?.parse().ok()
}

/// Locks on one Redis server.
pub(crate) struct RedisBackend {
    node: Node,
}

impl RedisBackend {
    /// The keys `scan` finds on the server, or on each primary of a cluster.
    fn keys_by(
        &self,
        scan: fn(&mut Connection) -> redis::RedisResult<Vec<Key>>,
    ) -> anyhow::Result<Vec<Key>> {
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        // A cluster's locks are spread over its primaries: scan each (a server that is not a
        // cluster refuses CLUSTER NODES).
        let nodes: redis::RedisResult<String> = redis::cmd("CLUSTER").arg("NODES").query(&mut con);
        // A proxy closes the connection on CLUSTER: said as such.
        if let Some(refused) = nodes
            .as_ref()
            .err()
            .and_then(|e| ground::refusal(&self.node, e))
        {
            return Err(refused);
        }
        let Ok(nodes) = nodes else {
            return scan(&mut con).map_err(|e| self.node.error(self.node.addr.clone(), e));
        };
        let mut keys = std::collections::BTreeSet::new();
        for primary in cluster_primaries(&nodes) {
            let Some(addr) = conn::addr_like(self.node.info.addr(), &primary) else {
                continue;
            };
            let node = self.node.at(&addr);
            let mut con = node.connect(COMMAND_TIMEOUT)?;
            keys.extend(scan(&mut con).map_err(|e| node.error(node.addr.clone(), e))?);
        }
        Ok(keys.into_iter().take(super::MAX_LISTED).collect())
    }

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

    /// A failed request of `status`, `break` or `purge`: what stands between if that is what
    /// failed (a proxy, a replica), else the server's error as it is.
    fn fail(&self, e: redis::RedisError) -> anyhow::Error {
        ground::refusal(&self.node, &e).unwrap_or_else(|| {
            Unavailable(format!("{}: {}", self.node.addr, conn::words(&e))).into()
        })
    }

    /// The exclusive holder, else one shared holder, for messages.
    fn holder(&self, con: &mut Connection, keys: &Keys) -> Option<Holder> {
        let meta: Option<String> = redis::cmd("HGET")
            .arg(&keys.owner)
            .arg("meta")
            .query(con)
            .ok()?;
        if let Some(h) = meta.and_then(|m| super::read_record(m.as_bytes())) {
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
        super::read_record(meta?.as_bytes())
    }

    /// Best effort, after a lost reply: if the lock is ours after all, give it back.
    /// Gives back whatever an acquire whose reply was lost may have taken with `token`: the lock
    /// (or a shared or slot entry, by `mode`), and its place in the waiter lists. After a signal,
    /// briefly: a server that answers releases in a millisecond, and one that does not must not
    /// hold up the exit. (It once gave back only an exclusive lock and left the waiter entry, so
    /// `status` counted a waiter that had given up on Ctrl-C.)
    fn release_token(&self, keys: &Keys, token: &str, mode: Mode, signalled: bool) {
        let _quiet = signalled.then(crate::signals::giving_back);
        if let Ok(mut con) = self.cleanup_connection(signalled) {
            let _: redis::RedisResult<i64> = release_for(keys, token, mode).invoke(&mut con);
            let _ = forget_waiter(&mut con, keys, token);
        }
    }

    /// Gives back what an acquire whose reply was lost may have taken: the start of run
    /// `start` its script may have recorded (first, while the lock keeps others' starts out),
    /// then the lock. One connection: a server that does not answer the first costs one
    /// command's timeout, not one per step (the lock's own TTL ends it then).
    fn give_back(
        &self,
        keys: &Keys,
        token: &str,
        mode: Mode,
        start: Option<&str>,
        signalled: bool,
    ) {
        let _quiet = signalled.then(crate::signals::giving_back);
        let Ok(mut con) = self.cleanup_connection(signalled) else {
            return;
        };
        if let Some(id) = start
            && history::undo_run(&mut con, keys, id)
                .is_err_and(|e| e.is_timeout() || e.is_io_error())
        {
            return;
        }
        let _: redis::RedisResult<i64> = release_for(keys, token, mode).invoke(&mut con);
        let _ = forget_waiter(&mut con, keys, token);
    }

    /// Takes a waiter that gives up off the waiter lists: on `con`, or on a new connection if
    /// `con` failed (a request a signal ended leaves it closed).
    fn forget(&self, con: &mut Connection, keys: &Keys, token: &str, signalled: bool) {
        if forget_waiter(con, keys, token).is_ok() {
            return;
        }
        let _quiet = signalled.then(crate::signals::giving_back);
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

impl Backend for RedisBackend {
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_by(scan_keys)
    }

    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_by(scan_history_keys)
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
        // The run's start, recorded by the acquire script when it takes the lock.
        let start = req
            .start
            .filter(|_| req.mode == Mode::Exclusive)
            .map(|o| (o.body(), true));
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
            let mut entry = None;
            let reply = acquire_starting(
                &keys,
                req.mode,
                &token,
                ttl_ms,
                &meta,
                slice.as_millis() as u64,
                start,
            )
            .invoke::<redis::Value>(&mut con)
            .and_then(|v| {
                entry = granted_entry(&v);
                acquire_reply(v)
            });
            let (acquired, value, seen) = match reply {
                Ok(r) => {
                    // The server answered: a later transport failure is an outage.
                    self.node.reach.connected();
                    r
                }
                Err(e) => {
                    // The outcome is unknown: the lock may be ours, and with it the run's start.
                    // Give both back before failing (the start first, while the lock keeps
                    // others' starts out).
                    let signalled = req.interrupted().is_some();
                    let ours = req.start.filter(|_| start.is_some()).map(|o| o.id.as_str());
                    self.give_back(&keys, &token, req.mode, ours, signalled);
                    return Err(self.node.error(self.node.addr.clone(), e));
                }
            };
            if acquired == -1 {
                self.forget(&mut con, &keys, &token, false);
                return Err(mismatch(req, value));
            }
            if acquired == 1 {
                // A grant given back below takes the start it recorded back first.
                let undo = |con: &mut Connection| {
                    if let Some(e) = &entry {
                        let _ = history::undo(con, &keys, e);
                    }
                };
                if let (Some(s), Some(sc)) = (&self.node.sentinel, sentinel.as_mut()) {
                    let here = con.addr().clone();
                    let named = s.named_addr(sc, &here);
                    if named.is_none_or(|n| n.to_string() != here.to_string()) {
                        undo(&mut con);
                        let _: redis::RedisResult<i64> =
                            release_for(&keys, &token, req.mode).invoke(&mut con);
                        return Err(crate::exit::Outage(format!(
                            "{}: the sentinels no longer name {here} the primary (a failover)",
                            self.node.addr
                        ))
                        .into());
                    }
                }
                if let Err(e) = ground::judge_grant(&self.node.addr, &seen) {
                    undo(&mut con);
                    let _: redis::RedisResult<i64> =
                        release_for(&keys, &token, req.mode).invoke(&mut con);
                    return Err(e);
                }
                if self.node.min_replicas > 0 {
                    self.replicated(&mut con, &keys, &token, req, entry.as_deref())?;
                }
                let held_back_until = seen.up.and_then(|up| super::hold_back_until(up, req.ttl));
                return Ok(Box::new(RedisLease {
                    node: self.node.clone(),
                    con: Some(con),
                    keys,
                    token,
                    mode: req.mode,
                    ttl: req.ttl,
                    grant: Grant {
                        fence: u64::try_from(value).ok(),
                        acquired_at: sent,
                        held_back_until,
                    },
                    started: entry.is_some(),
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
            let blocked = crate::signals::Blocked::new();
            // On the main thread the BLPOP's own read ends at a forwarded signal (the
            // connection polls the signal descriptor too: `conn.rs`), so nothing else is
            // needed there — and a watcher thread would cost its stop on the hand-off's path:
            // woken, this thread waited for it to exit before sending the acquire (0.4 ms a
            // hand-off in `bench/README.md`'s contended runs). Elsewhere (`dlock bench`'s
            // worker) a waker on the watcher thread ends the BLPOP with CLIENT UNBLOCK.
            // A SIGUSR1 from another process ends it too, as the watcher's did: no thread of
            // this process sends the main thread wake-ups before the lock is held. Taken first:
            // the descriptor asked about below is then the one the BLPOP's read polls.
            let usr1 = crate::signals::waiting_for_server();
            let _guard = match crate::signals::interrupts_network_waits() {
                Some(_) => None,
                None => {
                    let (node, id) = (w.node.clone(), w.id);
                    let unblocker = std::sync::Mutex::new(None::<Connection>);
                    Some(req.interrupt.on_fire(blocked.waker(move || {
                        // Runs on the signal watcher thread while this thread is blocked in BLPOP.
                        let mut c = unblocker.lock().unwrap_or_else(|e| e.into_inner());
                        if c.is_none() {
                            *c = node.connect(Duration::from_secs(1)).ok();
                        }
                        if let Some(c) = c.as_mut() {
                            let _: redis::RedisResult<i64> =
                                redis::cmd("CLIENT").arg("UNBLOCK").arg(id).query(c);
                        }
                    }))?)
                }
            };
            if req.interrupt.fired().is_some() {
                blocked.done();
                continue; // the top of the loop cleans up
            }
            let result = w.block(&keys.signal, block);
            drop(usr1);
            blocked.done();
            if result.is_err() && req.interrupted().is_some() {
                // Closed now: the server forgets the BLPOP before the clean-up's round trip, so
                // a release meanwhile cannot pop its wake-up for nobody.
                waiter = None;
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
            .map_err(|e| self.fail(e))?;
        let mut status = Status {
            held: !lock.is_empty(),
            waiters: Some(waiters),
            server_name: Some(keys.lock.clone()),
            ..Status::new(key, self.kind(), self.node.addr.clone())
        };
        if status.held {
            // dlock writes its record in the script that sets the key: a key without one was
            // set by another client (a redis-py Lock).
            let mut h = super::read_record(meta.as_bytes()).unwrap_or_else(|| Holder {
                foreign: Some("a client that is not dlock (no holder record)".into()),
                ..Holder::default()
            });
            h.broken = lock.starts_with(BROKEN_PREFIX);
            h.fencing_token = fence.parse().ok();
            h.lease_left_ms = u64::try_from(pttl).ok();
            status.holders.push(h);
        }
        static ST_SHARED: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let shared: Vec<String> = script(&ST_SHARED, STATUS_SHARED)
            .key(&keys.holders)
            .key(&keys.hmeta)
            .invoke(&mut con)
            .map_err(|e| self.fail(e))?;
        if let Some((mode, rest)) = shared.split_first() {
            for entry in rest.chunks_exact(4) {
                let mut h = super::read_record(entry[2].as_bytes()).unwrap_or_default();
                h.broken = entry[0].starts_with(BROKEN_PREFIX);
                h.lease_left_ms = entry[1].parse().ok();
                h.fencing_token = entry[3].parse().ok();
                status.holders.push(h);
            }
            if rest.len() >= 4 {
                status.held = true;
                let n: u32 = mode.parse().unwrap_or(0);
                status.mode = Some(if n > 0 { Mode::Limit(n) } else { Mode::Shared });
                status.limit = (n > 0).then_some(n);
            }
        }
        // A young server holds a grant back: `status` says so rather than show a command that
        // has not started (best effort: a server that denies INFO shows the holders as they are).
        if status.holders.iter().any(|h| h.ttl_ms.is_some()) {
            let info: redis::RedisResult<String> = redis::cmd("INFO").arg("server").query(&mut con);
            if let Some(up) = info.ok().as_deref().and_then(uptime) {
                status.mark_held_back(up);
            }
        }
        Ok(status)
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        let _: i64 = Keys::new(key)
            .del_all()
            .query(&mut con)
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<super::ground::Finding>> {
        doctor::single(&self.node, ttl)
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        history::read(&mut con, &Keys::new(key))
            .map_err(|e| self.node.error(self.node.addr.clone(), e))
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        history::end(&mut con, &Keys::new(key), end)
            .map_err(|e| self.node.error(self.node.addr.clone(), e))
    }

    /// Safe: every holder's token becomes its tombstone with the lease it had left
    /// (lua/break.lua); the holders' renewals fail, they stop, and their releases delete the
    /// tombstones. Forced: the lock and the shared holders are deleted at once.
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        let status = self.status(key)?;
        let keys = Keys::new(key);
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        if how == BreakHow::Force {
            let _: i64 = release_script(&keys, "")
                .invoke(&mut con)
                .map_err(|e| self.fail(e))?;
            let _: i64 = release_shared_script(&keys, "", Mode::Shared)
                .invoke(&mut con)
                .map_err(|e| self.fail(e))?;
            return Ok(Broken::now(status));
        }
        let left: i64 = break_script(&keys)
            .invoke(&mut con)
            .map_err(|e| self.fail(e))?;
        if left <= 0 && !self.status(key)?.held {
            // Let go between the status and the script: nothing to break.
            return Ok(Broken::now(status));
        }
        broken_by_tombstones(status, left)
    }
}

/// What a safe break by tombstones did (here and on Redlock): free at the latest when the
/// longest lease left (`left_ms`, as the server counted it) has run out.
pub(in crate::backend) fn broken_by_tombstones(
    mut status: Status,
    left_ms: i64,
) -> anyhow::Result<Broken> {
    if !status.held {
        return Ok(Broken::now(status));
    }
    if left_ms <= 0 {
        // Held with no lease (a client that is not dlock set the key without an expiry):
        // nothing was changed, and nothing would ever tell that holder to stop.
        anyhow::bail!(
            "{} is held by a client that is not dlock (no lease, or no dlock record): it \
             cannot be told to stop; --force removes it (unsafe)",
            status.server_name.as_deref().unwrap_or("the key")
        );
    }
    for h in &mut status.holders {
        h.broken = true;
    }
    Ok(Broken {
        status,
        frees: super::Frees::Within(Duration::from_millis(left_ms.unsigned_abs())),
        keep: None,
    })
}
