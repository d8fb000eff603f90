//! The core types every layer shares — a lock's [`Key`], the [`BackendKind`]s, how a lock is
//! held ([`Mode`]), how long to wait ([`Deadline`]), who holds it ([`Holder`], as written beside a
//! lock and read back) and what `status` shows ([`Status`]), how chatty dlock is
//! ([`Verbosity`]). A leaf: it uses no other module of dlock but the error types of `exit`, so
//! that the layers above (config, backend, report, app) import it and not each other.

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::exit::Usage;

/// Longest key, in bytes (docs/design.md, "The contract").
pub(crate) const MAX_KEY_BYTES: usize = 256;

/// A lock's name: 1-256 bytes of UTF-8 without control characters. Backends must map every such
/// key to a safe name of their own (`/`, `..`, spaces and unicode included).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);

impl Key {
    /// Checks the key rules: 1-256 bytes of UTF-8 without control characters.
    pub fn new(s: &str) -> Result<Key, Usage> {
        if s.is_empty() {
            return Err(Usage("--key must not be empty".into()));
        }
        if s.len() > MAX_KEY_BYTES {
            return Err(Usage(format!(
                "--key is {} bytes long; the limit is {MAX_KEY_BYTES}",
                s.len()
            )));
        }
        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(Usage(format!(
                "--key must not contain control characters (found {c:?})"
            )));
        }
        Ok(Key(s.to_string()))
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The backends dlock knows, as named on the command line (`--backend`, `DLOCK_BACKEND`). Every
/// list of backends or URL schemes shown to a user is made from this enum (see
/// [`BackendKind::prose`] and [`BackendKind::schemes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendKind {
    /// flock(2) on a lock file on this host
    File,
    /// Redis (single instance, Redlock with --url given 3, 5, ... times, Cluster, Sentinel)
    Redis,
    /// ZooKeeper (ephemeral sequential nodes)
    #[value(alias = "zk")]
    Zookeeper,
    /// MySQL or MariaDB (GET_LOCK)
    Mysql,
    /// PostgreSQL (session advisory locks)
    #[value(alias = "pg")]
    Postgres,
    /// etcd (the lock recipe of etcdctl lock)
    Etcd,
    /// S3 or a compatible server (conditional writes, a lease by observation)
    S3,
}

impl BackendKind {
    /// Every backend, in the order help texts name them.
    pub(crate) fn all() -> &'static [BackendKind] {
        <BackendKind as clap::ValueEnum>::value_variants()
    }

    /// The name used on the command line, in messages and in `DLOCK_BACKEND` for the child.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendKind::File => "file",
            BackendKind::Redis => "redis",
            BackendKind::Zookeeper => "zookeeper",
            BackendKind::Mysql => "mysql",
            BackendKind::Postgres => "postgres",
            BackendKind::Etcd => "etcd",
            BackendKind::S3 => "s3",
        }
    }

    /// What the backend is called in prose.
    pub(crate) fn title(self) -> &'static str {
        match self {
            BackendKind::File => "a local file",
            BackendKind::Redis => "Redis",
            BackendKind::Zookeeper => "ZooKeeper",
            BackendKind::Mysql => "MySQL/MariaDB",
            BackendKind::Postgres => "PostgreSQL",
            BackendKind::Etcd => "etcd",
            BackendKind::S3 => "S3",
        }
    }

    /// The URL schemes that name the backend, the usual one first.
    pub(crate) fn schemes(self) -> &'static [&'static str] {
        match self {
            BackendKind::File => &["file"],
            BackendKind::Redis => &[
                "redis",
                "rediss",
                "redis+unix",
                "unix",
                "redis-sentinel",
                "rediss-sentinel",
            ],
            BackendKind::Zookeeper => &["zk", "zookeeper"],
            BackendKind::Mysql => &["mysql", "mariadb"],
            BackendKind::Postgres => &["postgres", "postgresql"],
            BackendKind::Etcd => &["etcd", "etcds"],
            BackendKind::S3 => &["s3"],
        }
    }

    /// The backend a URL scheme names, if any.
    pub(crate) fn from_scheme(scheme: &str) -> Option<BackendKind> {
        let scheme = scheme.to_ascii_lowercase();
        BackendKind::all()
            .iter()
            .copied()
            .find(|k| k.schemes().contains(&scheme.as_str()))
    }

    /// Every backend in a sentence, `what` after the default one: "a local file (the default),
    /// Redis, ZooKeeper, ... or etcd".
    pub(crate) fn prose(what: &str) -> String {
        let names: Vec<String> = BackendKind::all()
            .iter()
            .map(|k| match k {
                BackendKind::File => format!("{}{what}", k.title()),
                _ => k.title().to_string(),
            })
            .collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        }
    }

    /// Every URL scheme, for an error message: "file://, redis://, ...".
    pub(crate) fn all_schemes() -> String {
        let schemes: Vec<String> = BackendKind::all()
            .iter()
            .flat_map(|k| k.schemes())
            .map(|s| match *s {
                // No authority part.
                "unix" => "unix:".to_string(),
                s => format!("{s}://"),
            })
            .collect();
        schemes.join(", ")
    }
}

/// How chatty dlock is on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verbosity {
    /// Errors only (`-q`).
    Quiet,
    /// Errors, warnings and the waiting line on a terminal.
    Normal,
    /// Also acquire/renew/release events with timings (`-v`).
    Verbose,
}

/// When to stop waiting for a busy lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// Try once.
    Now,
    /// Wait until this instant.
    At(Instant),
    /// Wait until acquired or interrupted.
    Never,
}

impl Deadline {
    /// Time left, `None` for [`Deadline::Never`].
    pub(crate) fn remaining(self) -> Option<Duration> {
        match self {
            Deadline::Now => Some(Duration::ZERO),
            Deadline::At(t) => Some(t.saturating_duration_since(Instant::now())),
            Deadline::Never => None,
        }
    }
}

/// How a lock is held: one exclusive holder, many shared holders (readers; an exclusive holder
/// is the writer), or up to N holders of a semaphore. `--limit 1` is [`Mode::Exclusive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// One holder; waits for every shared holder, and new shared holders wait for it.
    Exclusive,
    /// Many shared holders at once, none while an exclusive holder holds or waits.
    Shared,
    /// Up to this many holders (at least 2) at once.
    Limit(u32),
}

impl Mode {
    /// "exclusive", "shared" or "limit".
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Limit(_) => "limit",
        }
    }

    /// The semaphore's size, `None` for the other modes.
    pub(crate) fn limit(self) -> Option<u32> {
        match self {
            Mode::Limit(n) => Some(n),
            _ => None,
        }
    }

    /// How the mode reads in messages: "exclusive", "shared", "--limit 3".
    pub(crate) fn describe(self) -> String {
        match self {
            Mode::Limit(n) => format!("--limit {n}"),
            m => m.name().to_string(),
        }
    }

    /// Whether a holder in this mode may let a nested run use the lock as `want`: an exclusive
    /// holder covers everything, a shared one covers shared, a semaphore slot covers a slot of
    /// the same semaphore.
    pub(crate) fn covers(self, want: Mode) -> bool {
        self == Mode::Exclusive || self == want
    }
}

/// What dlock writes beside a lock it holds (docs/design.md, "Holder records"), and all it
/// reads back from one: who holds, since when, how. Anything else a server's copy carries is
/// not read (a forged record cannot pass for an application's lock or name a session).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct Record {
    /// The key this record belongs to: lets `dlock status` without `--key` name a lock stored
    /// under a hashed name (a long key's file, a MySQL lock name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Host name of the holder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Process id of the holding dlock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The PID namespace `pid` is in (see [`crate::sys::pid_namespace`]): what ties a nested
    /// run's claim to this holder (lockset/nested.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pidns: Option<u64>,
    /// The command it runs, arguments joined by spaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// When the lock was acquired, in milliseconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// How it holds (or waits for) the lock; absent means exclusive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Why the lock is taken (`--reason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Set when the lock is held by `dlock acquire`'s holder process (whose pid is `pid`) for
    /// an owner, rather than by a `dlock run` for its command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerRecord>,
    /// The lease length (`--ttl`) the holder asked for, in milliseconds: with the server's
    /// uptime, it tells `status` whether a young server still holds the lock back
    /// ([`crate::clock::hold_back_until`]), so that its command has not started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// Whom an acquire-held lock is held for, as stored beside the lock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct OwnerRecord {
    /// The owner's pid; absent for `--owner none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The owner's command line, arguments joined by spaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `--max-hold`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hold_ms: Option<u64>,
}

/// A holder (or waiter) as `status` shows it: dlock's [`Record`] where there is one, and what
/// only the server knows. Never written to a server, never read from one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Holder {
    /// What the holder wrote (empty for an application's lock).
    #[serde(flatten)]
    pub record: Record,
    /// The fencing token handed to the command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
    /// Lease time left on the server, in milliseconds; absent where the lease does not expire.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_left_ms: Option<u64>,
    /// The server-side session or connection that holds (or waits), where the backend has one
    /// ("0x1000004e2a90003" for a ZooKeeper session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Set when the holder (or waiter) is not dlock but an application's own lock on the same
    /// name: what the server shows of it ("kazoo Lock", "GET_LOCK").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreign: Option<String>,
    /// The server's name for this holder's entry, where it has one (a ZooKeeper lock node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Set when a `dlock break` told this holder to stop: it keeps the lock until it has
    /// stopped its command (or, on a backend with leases, until its lease runs out).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub broken: bool,
    /// Set while a young server holds this holder's lock back: how long, in milliseconds,
    /// before its command may start ([`crate::clock::hold_back_until`]). Its command has not
    /// started yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_back_ms: Option<u64>,
}

impl From<Record> for Holder {
    fn from(record: Record) -> Holder {
        Holder {
            record,
            ..Holder::default()
        }
    }
}

/// A holder's record fields read (and filled in) as its own.
impl std::ops::Deref for Holder {
    type Target = Record;
    fn deref(&self) -> &Record {
        &self.record
    }
}

impl std::ops::DerefMut for Holder {
    fn deref_mut(&mut self) -> &mut Record {
        &mut self.record
    }
}

/// A status's mode as its name (`limit`'s size is a field of its own).
fn mode_name<S: serde::Serializer>(mode: &Option<Mode>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(mode.map_or("", |m| m.name()))
}

/// What `dlock status` reports, and what `dlock break` removed.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Status {
    /// The key asked about.
    pub key: String,
    /// The backend's name.
    pub backend: &'static str,
    /// Where the lock lives (credentials removed).
    pub location: String,
    /// The name the server knows the lock by, for an application that takes the same lock:
    /// the lock file's path, the Redis key, the ZooKeeper path, the `GET_LOCK` name, the
    /// PostgreSQL advisory key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Whether anyone holds the lock now.
    pub held: bool,
    /// How the holders hold it, shown as "exclusive", "shared" or "limit" (absent when free).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "mode_name")]
    pub mode: Option<Mode>,
    /// The semaphore's size, for mode "limit".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Every current holder (one for an exclusive lock).
    pub holders: Vec<Holder>,
    /// How many wait, where the backend can tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiters: Option<u64>,
    /// The waiters in the order they will get the lock, where the backend keeps a queue.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<Holder>,
    /// How long the server has been up, in seconds, where a holder is held back (see
    /// [`Holder::held_back_ms`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_up_s: Option<u64>,
    /// Backend-specific remarks (e.g. why there is no fencing token).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Status {
    /// Nobody holds `key` (and nothing else is known yet): backends fill in what they learn.
    pub(crate) fn new(key: &Key, backend: BackendKind, location: String) -> Status {
        Status {
            key: key.to_string(),
            backend: backend.name(),
            location,
            server_name: None,
            held: false,
            mode: None,
            limit: None,
            holders: Vec::new(),
            waiters: None,
            queue: Vec::new(),
            server_up_s: None,
            notes: Vec::new(),
        }
    }

    /// Marks the holders that a server up for `uptime_s` seconds still holds back (see
    /// [`crate::clock::hold_back_until`]): each by its own `--ttl`, as its run counted it. The
    /// server started after every holder it knows of was granted, so a holder whose hold-back
    /// from the server's start has not ended has not started its command. Holders whose record
    /// has no TTL (older dlocks, an application's lock) are left as they are.
    pub(crate) fn mark_held_back(&mut self, uptime_s: u64) {
        for h in &mut self.holders {
            let Some(ttl) = h.ttl_ms.map(Duration::from_millis) else {
                continue;
            };
            if let Some(until) = crate::clock::hold_back_until(uptime_s, ttl) {
                h.held_back_ms = Some(until.remaining().as_millis() as u64);
                self.server_up_s = Some(uptime_s);
            }
        }
    }
}

impl Status {
    /// Fills in `mode` and `limit` from the holders' metadata, where the backend did not.
    pub(crate) fn with_mode(mut self) -> Status {
        if self.held && self.mode.is_none() {
            let mode = self
                .holders
                .iter()
                .find_map(|h| h.mode)
                .unwrap_or(Mode::Exclusive);
            self.mode = Some(mode);
            self.limit = self.limit.or(mode.limit());
        }
        self
    }
}
