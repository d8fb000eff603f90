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

use anyhow::Context;
use redis::{Client, Connection, Script};

use super::{Backend, Holder, Lease, RenewError, Request, Status};
use crate::clock::BootInstant;
use crate::config::{BackendKind, Key, redact};
use crate::exit::{Interrupted, Unavailable, Usage};

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest single BLPOP: a waiter re-checks at least this often.
const MAX_BLOCK: Duration = Duration::from_secs(5);
/// How long a pushed wake-up waits for a waiter before it expires.
const SIGNAL_TTL_MS: u64 = 1000;

/// SET NX PX; on success seed (from the server clock, in microseconds, so a flushed or restarted
/// server still hands out larger tokens) and INCR the fence, store the owner, leave the waiters;
/// "already mine" is success too (a retry after a lost reply). On failure register as a waiter
/// (when waiting) and return the holder's PTTL.
pub(super) const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], string.format('%d', now * 1000))
  end
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[3], 'token', ARGV[1], 'fence', fence, 'meta', ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return {1, tonumber(redis.call('HGET', KEYS[3], 'fence'))}
end
local slice = tonumber(ARGV[4])
if slice > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  redis.call('ZADD', KEYS[4], now + slice, ARGV[1])
  if redis.call('PTTL', KEYS[4]) < slice + 1000 then
    redis.call('PEXPIRE', KEYS[4], slice + 1000)
  end
end
return {0, redis.call('PTTL', KEYS[1])}
"#;

/// Extends the lock and its metadata if the token is still ours: 1, else 0.
pub(super) const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
"#;

/// Deletes the lock if the token is ours and pushes one wake-up: 1, else 0. With an empty token
/// (`break`), deletes whatever holds it.
const RELEASE: &str = r#"
local holder = redis.call('GET', KEYS[1])
if holder and (ARGV[1] == '' or holder == ARGV[1]) then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return 1
end
return 0
"#;

/// Everything `status` shows, read atomically with the server's clock.
pub(super) const STATUS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1]),
        redis.call('HGET', KEYS[2], 'meta') or '', redis.call('HGET', KEYS[2], 'fence') or '',
        redis.call('HGET', KEYS[2], 'token') or '', redis.call('ZCOUNT', KEYS[3], now, '+inf')}
"#;

/// One Redis server.
#[derive(Clone)]
pub(super) struct Node {
    pub(super) client: Client,
    /// host:port or socket path, without credentials.
    pub(super) addr: String,
}

impl Node {
    pub(super) fn parse(url: &str) -> Result<Node, Usage> {
        if url.starts_with("rediss:") {
            // redis-rs leaves the rustls crypto provider to the application (it panics without
            // one); an error here only means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = Client::open(url)
            .map_err(|e| Usage(format!("bad redis URL '{}': {e}", redact(url))))?;
        let addr = client.get_connection_info().addr().to_string();
        Ok(Node { client, addr })
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
        let con = self
            .client
            .get_connection_with_timeout(connect)
            .map_err(|e| Unavailable(format!("cannot connect to {}: {e}", self.addr)))?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(COMMAND_TIMEOUT))?;
        Ok(con)
    }
}

/// The names of one lock's keys.
pub(super) struct Keys {
    pub(super) lock: String,
    pub(super) fence: String,
    pub(super) owner: String,
    pub(super) signal: String,
    pub(super) waiters: String,
}

impl Keys {
    /// All keys start with `dlock:{KEY`, so they share a hash tag whatever KEY contains, and the
    /// suffixes end in distinct characters, so no key of one lock is a key of another.
    pub(super) fn new(key: &Key) -> Keys {
        let lock = format!("dlock:{{{key}}}");
        Keys {
            fence: format!("{lock}:fence"),
            owner: format!("{lock}:owner"),
            signal: format!("{lock}:signal"),
            waiters: format!("{lock}:waiters"),
            lock,
        }
    }
}

/// A fresh random 128-bit token, as hex.
pub(super) fn token() -> anyhow::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a lock token: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Locks on one Redis server.
pub struct RedisBackend {
    node: Node,
}

impl RedisBackend {
    /// `urls` empty: `redis://127.0.0.1:6379`; one URL: that server.
    pub fn open(urls: &[String]) -> anyhow::Result<RedisBackend> {
        let node = match urls {
            [] => Node::parse("redis://127.0.0.1:6379")?,
            [url] => Node::parse(url)?,
            _ => {
                return Err(Usage("several --url are Redlock, see backend::redlock".into()).into());
            }
        };
        Ok(RedisBackend { node })
    }

    fn holder(&self, con: &mut Connection, keys: &Keys) -> Option<Holder> {
        let meta: Option<String> = redis::cmd("HGET")
            .arg(&keys.owner)
            .arg("meta")
            .query(con)
            .ok()?;
        serde_json::from_str(&meta?).ok()
    }

    /// Best effort, after a lost reply: if the lock is ours after all, give it back.
    fn release_token(&self, keys: &Keys, token: &str) {
        if let Ok(mut con) = self.node.connect(COMMAND_TIMEOUT) {
            let _: redis::RedisResult<i64> = release_script(keys, token).invoke(&mut con);
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

pub(super) fn script(cell: &'static std::sync::OnceLock<Script>, src: &str) -> &'static Script {
    cell.get_or_init(|| Script::new(src))
}

impl Backend for RedisBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Redis
    }

    fn location(&self) -> String {
        self.node.addr.clone()
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        static ACQ: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let keys = Keys::new(req.key);
        let token = token()?;
        let meta = serde_json::to_string(req.holder)?;
        let ttl_ms = req.ttl.as_millis() as u64;
        let mut con = self.node.connect(COMMAND_TIMEOUT.min(req.ttl / 3))?;
        let mut waiter: Option<Waiter> = None;
        let mut told_holder = false;
        loop {
            if let Some(sig) = req.interrupt.fired() {
                let _: redis::RedisResult<i64> = redis::cmd("ZREM")
                    .arg(&keys.waiters)
                    .arg(&token)
                    .query(&mut con);
                return Err(Interrupted(sig).into());
            }
            let slice = match req.deadline.remaining() {
                Some(d) => d.min(MAX_BLOCK),
                None => MAX_BLOCK,
            };
            let sent = BootInstant::now();
            let reply: redis::RedisResult<(i64, i64)> = script(&ACQ, ACQUIRE)
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.owner)
                .key(&keys.waiters)
                .arg(&token)
                .arg(ttl_ms)
                .arg(&meta)
                .arg(slice.as_millis() as u64)
                .invoke(&mut con);
            let (acquired, value) = match reply {
                Ok(r) => r,
                Err(e) => {
                    // The outcome is unknown: the lock may be ours. Give it back before failing.
                    self.release_token(&keys, &token);
                    return Err(Unavailable(format!("{}: {e}", self.node.addr)).into());
                }
            };
            if acquired == 1 {
                return Ok(Box::new(RedisLease {
                    node: self.node.clone(),
                    con: Some(con),
                    keys,
                    token,
                    ttl: req.ttl,
                    fence: u64::try_from(value).ok(),
                    acquired_at: sent,
                }));
            }
            if req.waited_out() {
                let holder = self.holder(&mut con, &keys);
                let _: redis::RedisResult<i64> = redis::cmd("ZREM")
                    .arg(&keys.waiters)
                    .arg(&token)
                    .query(&mut con);
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
                waiter = Some(Waiter::new(&self.node)?);
            }
            let w = waiter.as_mut().expect("set above");
            let node = self.node.clone();
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
            result.with_context(|| format!("waiting on {}", self.node.addr))?;
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
            ..Status::new(key, self.kind(), self.node.addr.clone())
        };
        if status.held {
            let mut h: Holder = serde_json::from_str(&meta).unwrap_or_default();
            h.fencing_token = fence.parse().ok();
            h.lease_left_ms = u64::try_from(pttl).ok();
            status.holders.push(h);
        }
        Ok(status)
    }

    fn break_lock(&self, key: &Key) -> anyhow::Result<Status> {
        let status = self.status(key)?;
        let keys = Keys::new(key);
        let mut con = self.node.connect(COMMAND_TIMEOUT)?;
        let _: i64 = release_script(&keys, "")
            .invoke(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", self.node.addr)))?;
        Ok(status)
    }
}

/// The connection a waiter blocks on (never the lock's own connection).
struct Waiter {
    con: Connection,
    /// `CLIENT ID`, for `CLIENT UNBLOCK`.
    id: i64,
}

impl Waiter {
    fn new(node: &Node) -> anyhow::Result<Waiter> {
        let mut con = node.connect(COMMAND_TIMEOUT)?;
        let id = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut con)
            .map_err(|e| Unavailable(format!("{}: {e}", node.addr)))?;
        Ok(Waiter { con, id })
    }

    /// BLPOP the wake-up list for at most `d`.
    fn block(&mut self, signal: &str, d: Duration) -> anyhow::Result<()> {
        // The socket must outwait the server-side timeout, or the reply is lost.
        self.con.set_read_timeout(Some(d + COMMAND_TIMEOUT))?;
        let secs = (d.as_secs_f64() * 1000.0).ceil() / 1000.0;
        let _: Option<(String, String)> = redis::cmd("BLPOP")
            .arg(signal)
            .arg(secs.max(0.001))
            .query(&mut self.con)?;
        Ok(())
    }
}

/// A held Redis lock.
struct RedisLease {
    node: Node,
    /// The lock's connection; `None` after a transport error (reconnected on the next call).
    con: Option<Connection>,
    keys: Keys,
    token: String,
    ttl: Duration,
    fence: Option<u64>,
    acquired_at: BootInstant,
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

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn acquired_at(&self) -> BootInstant {
        self.acquired_at
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        static RN: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let (lock, owner, token, ttl_ms) = (
            self.keys.lock.clone(),
            self.keys.owner.clone(),
            self.token.clone(),
            self.ttl.as_millis() as u64,
        );
        let addr = self.node.addr.clone();
        let con = self.con().map_err(RenewError::Failed)?;
        let reply: redis::RedisResult<i64> = script(&RN, RENEW)
            .key(lock)
            .key(owner)
            .arg(token)
            .arg(ttl_ms)
            .invoke(con);
        match reply {
            Ok(1) => Ok(()),
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
        let inv = release_script(&self.keys, &self.token);
        let addr = self.node.addr.clone();
        let con = self.con()?;
        let _: i64 = inv
            .invoke(con)
            .map_err(|e| anyhow::anyhow!("{addr}: {e}"))?;
        Ok(())
    }
}
