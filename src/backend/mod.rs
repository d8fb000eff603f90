//! The backend contract, holder metadata, and choosing a backend from a [`Target`].
//!
//! A backend does its own waiting: only it can be woken by its server (a kernel flock, BLPOP, a
//! ZooKeeper watch, GET_LOCK's server-side wait). The core never retries with sleeps; it passes a
//! deadline and an [`Interrupt`] and gets back a [`Lease`] or a typed error
//! ([`Busy`](crate::exit::Busy), [`Interrupted`](crate::exit::Interrupted)). A lease is then owned
//! by the keeper thread, which renews it and reports its loss.

// Each network backend is a Cargo feature (Cargo.toml); the file backend is always built.
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod file;
#[cfg(any(feature = "etcd", feature = "s3"))]
pub(crate) mod frame;
pub(crate) mod ground;
pub(crate) mod hosts;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod marks;
#[cfg(test)]
pub(crate) mod memory;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(any(feature = "redis", feature = "etcd", feature = "s3"))]
pub(crate) mod net;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
pub(crate) mod redlock;
#[cfg(feature = "s3")]
pub(crate) mod s3;
mod support;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

use std::time::Duration;

#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) use self::support::absolute;
#[cfg(any(feature = "zookeeper", feature = "postgres"))]
pub(crate) use self::support::async_runtime;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "s3"
))]
pub(crate) use self::support::system_roots;
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) use self::support::{SQL_EVENT_HEAD, SQL_EVENT_WHOLE, sql_event};
pub(crate) use self::support::{escape_key, hostname, unescape_key};
use crate::clock::BootInstant;
use crate::config::Target;
pub(crate) use crate::config::percent_decode;
use crate::exit::Busy;
pub(crate) use crate::history::{Begun, Stored};
use crate::model::{BackendKind, Deadline, Holder, Key, Mode, Record, Status};
use crate::signals::Interrupt;

/// Holders of one key that disagree on the mode (`--limit 3` against `--limit 5`, or a
/// semaphore against an exclusive lock): reported, never mixed. Exit 2.
pub(crate) fn mode_mismatch(key: &Key, want: Mode, theirs: &str) -> anyhow::Error {
    crate::exit::Usage(format!(
        "'{key}' is held as {theirs}, but this run asked for {}; every user of a key must use the same mode and --limit",
        want.describe()
    ))
    .into()
}

impl Record {
    /// This process, about to run `command`.
    pub(crate) fn this_process(command: &[std::ffi::OsString]) -> Record {
        let since_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .ok();
        let command = command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let command = crate::config::hide_credentials(&command);
        Record {
            host: Some(hostname()),
            pid: Some(std::process::id()),
            pidns: crate::sys::pid_namespace(),
            command: Some(command),
            since_ms,
            mode: None,
            key: None,
            reason: None,
            owner: None,
            ttl_ms: None,
        }
    }
}

/// A holder record read back from a server, as the holder `status` shows: only the fields dlock
/// writes are read ([`Record`]); `None` for bytes that are not a record.
pub(crate) fn read_record(bytes: &[u8]) -> Option<Holder> {
    serde_json::from_slice::<Record>(bytes)
        .ok()
        .map(Holder::from)
}

impl Holder {
    /// "host-a pid 4242" (or what is known of it), for messages; the host is escaped for a
    /// terminal ([`crate::report::clean`]): it came from a server or another process.
    pub(crate) fn short(&self) -> String {
        if let Some(f) = &self.foreign {
            let f = crate::report::clean(f, crate::report::MAX_FIELD);
            return match &self.session {
                Some(s) => format!(
                    "{f} (not dlock; session {})",
                    crate::report::clean(s, crate::report::MAX_FIELD)
                ),
                None => format!("{f} (not dlock)"),
            };
        }
        let host = self
            .host
            .as_deref()
            .map(|h| crate::report::clean(h, crate::report::MAX_FIELD));
        match (host, self.pid) {
            (Some(h), Some(p)) => format!("{h} pid {p}"),
            (Some(h), None) => h,
            (None, Some(p)) => format!("pid {p}"),
            (None, None) => "an unknown holder".into(),
        }
    }

    /// "host-a pid 4242 for 3m: deploy v1.4": [`Holder::short`], how long it has held the lock
    /// and its `--reason`, where known; for "busy" messages.
    pub(crate) fn described(&self) -> String {
        let mut text = self.short();
        if self.foreign.is_none() {
            if let Some(d) = self.held_for() {
                text.push_str(&format!(" for {}", crate::report::short_duration(d)));
            }
            if let Some(r) = &self.reason {
                text.push_str(&format!(
                    ": {}",
                    crate::report::clean(r, crate::report::MAX_FIELD)
                ));
            }
        }
        text
    }

    /// How long it has held the lock, if known.
    pub(crate) fn held_for(&self) -> Option<Duration> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        Some(now.saturating_sub(Duration::from_millis(self.since_ms?)))
    }
}

/// One acquisition request.
pub(crate) struct Request<'a> {
    /// The lock.
    pub key: &'a Key,
    /// Exclusive, shared or a semaphore slot; only modes the backend [supports](Backend::unsupported).
    pub mode: Mode,
    /// Lease length on the server.
    pub ttl: Duration,
    /// When to give up waiting.
    pub deadline: Deadline,
    /// Metadata to store beside the lock.
    pub holder: &'a Record,
    /// Fired by a signal that ends dlock (SIGINT, SIGTERM, SIGHUP, ...: see `signals`): stop
    /// waiting, leave nothing behind, return
    /// [`Interrupted`](crate::exit::Interrupted).
    pub interrupt: &'a Interrupt,
    /// Told who holds the lock whenever the backend learns it while waiting (for the progress
    /// line); called on the waiting thread.
    pub on_holder: &'a dyn Fn(&Holder),
    /// The run's start event, to record in the acquisition's own round trips where the backend
    /// can ([`crate::history::Opening`]); its lease's [`Lease::begin_run`] then answers
    /// [`Begun::Started`] without another. Only for one exclusive key without `--once-per`;
    /// a backend that cannot ignores it (`begin_run` writes the start then).
    pub start: Option<&'a crate::history::Opening>,
}

impl Request<'_> {
    /// The signal that interrupted this request, if any, including one that a network wait on
    /// this thread took (see [`crate::signals::interrupts_network_waits`]).
    pub(crate) fn interrupted(&self) -> Option<i32> {
        if let Some(r) = crate::signals::pending() {
            self.interrupt.fire(r.signal);
        }
        self.interrupt.fired()
    }

    /// Whether the wait is over: a `--no-wait` try, or a `--wait` that ran out.
    pub(crate) fn waited_out(&self) -> bool {
        self.deadline.remaining().is_some_and(|d| d.is_zero())
    }

    /// The error for a lock still busy when the wait is over, naming the holder if known.
    pub(crate) fn busy(&self, holder: Option<&Holder>) -> anyhow::Error {
        let waited = self.deadline != Deadline::Now;
        Busy {
            holder: holder.map(Holder::described),
            waited,
            why: None,
        }
        .into()
    }
}

pub(crate) use crate::clock::{hold_back_span, hold_back_until, ttl_secs_up};

/// How many candidate keys `dlock status` without `--key` looks at, at most; when a backend
/// has more, the list says it was cut. Backends hand over only keys held or waited for where
/// they can tell (stale lock files, fence counters and records are not candidates).
pub(crate) const MAX_LISTED: usize = 10_000;

/// A lock backend. Implementations are used from the main thread only; a held lock lives on as a
/// [`Lease`] on the keeper thread.
pub(crate) trait Backend {
    /// Keys that may be held or waited for now (a superset: `dlock status` without `--key`
    /// asks [`Backend::status`] of each and keeps the busy ones), at most [`MAX_LISTED`].
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        Err(crate::exit::Usage(format!(
            "the {} backend cannot list its locks; give --key",
            self.kind().name()
        ))
        .into())
    }

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Where the locks live, without credentials ("/var/tmp/dlock-1000", "redis 10.0.0.5:6379").
    fn location(&self) -> String;

    /// Why this backend cannot hold a lock in `mode`, `None` if it can. The core refuses the
    /// run (exit 2) before acquiring anything.
    fn unsupported(&self, mode: Mode) -> Option<String> {
        match mode {
            Mode::Exclusive => None,
            m => Some(format!(
                "{} locks are not supported by the {} backend",
                m.name(),
                self.kind().name()
            )),
        }
    }

    /// Acquires the lock, waiting (by the backend's own notification, never by polling) until
    /// `req.deadline`. Errors: [`Busy`](crate::exit::Busy) when not acquired in time,
    /// [`Interrupted`](crate::exit::Interrupted) when `req.interrupt` fired, anything else is a
    /// backend failure. No error path may leave the lock held.
    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>>;

    /// Who holds `key` now. Takes no lock and changes nothing.
    fn status(&self, key: &Key) -> anyhow::Result<Status>;

    /// Removes every trace of a free `key` (lock file, fencing counter, metadata), for keys that
    /// will never be used again (`dlock bench`'s own). Forgetting the counter of a key that is
    /// used again would restart its fencing tokens. Default: nothing to remove.
    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let _ = key;
        Ok(())
    }

    /// Retention ([`crate::history::retention`]): removes the traces of at most `most` keys
    /// untouched for `older_than` — never a key held or waited for, and never so that a key
    /// used again gets a smaller fencing token. Returns how many keys it removed. Default:
    /// nothing stays behind (or the server expires it).
    fn prune(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        let _ = (older_than, most);
        Ok(0)
    }

    /// `dlock break` ([`BreakHow`]): a safe break tells `key`'s dlock holders to stop and
    /// removes nothing before they have (or before their leases have run out); a forced one
    /// removes the lock at once. Returns the status just before. Idempotent: a free lock is not
    /// an error. Holders that are not dlock (`foreign`) are the caller's to refuse first.
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken>;

    /// After a safe break: blocks until none of `broken`'s holders holds `key` any more (the
    /// lock is free, or held by someone else), or until `deadline`; `Ok(false)` when the
    /// deadline came first. The default asks [`Backend::status`] every [`BREAK_LOOK_EVERY`]:
    /// `break` is an operator's command, not a waiter in the lock's queue.
    fn await_broken(&self, key: &Key, broken: &Broken, deadline: Deadline) -> anyhow::Result<bool> {
        loop {
            let now = self.status(key)?;
            if !broken.still_held(&now) {
                return Ok(true);
            }
            match deadline.remaining() {
                Some(left) if left.is_zero() => return Ok(false),
                Some(left) => std::thread::sleep(left.min(BREAK_LOOK_EVERY)),
                None => std::thread::sleep(BREAK_LOOK_EVERY),
            }
        }
    }

    /// `key`'s run history ([`crate::history`]): the stored events, newest first, at most
    /// [`MAX_EVENTS`](crate::history::MAX_EVENTS). Empty where the backend keeps none.
    fn runs(&self, key: &Key) -> anyhow::Result<Vec<Stored>> {
        let _ = key;
        Ok(Vec::new())
    }

    /// Keys that have a run history on the backend (`dlock metrics` without `--key`), at most
    /// [`MAX_LISTED`]. Default: the backend cannot list them.
    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        Err(crate::exit::Usage(format!(
            "the {} backend cannot list the keys with a run history; give --key",
            self.kind().name()
        ))
        .into())
    }

    /// `dlock doctor`'s checks of the server and what stands between ([`ground`]), judged for
    /// leases of `ttl`. An error means the server could not be asked at all (exit 69).
    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<ground::Finding>> {
        let _ = ttl;
        Ok(Vec::new())
    }

    /// Adds the end event `end` to `key`'s history, for a run whose release could not write it
    /// ([`Lease::release_with_end`]). Whether the lock is still held does not matter.
    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let _ = (key, end);
        Ok(())
    }
}

/// How often [`Backend::await_broken`] looks by default.
pub(crate) const BREAK_LOOK_EVERY: Duration = Duration::from_millis(200);

/// How `dlock break` ends a lock's holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BreakHow {
    /// Tell the holders to stop; the lock passes on only when they have (or when their leases
    /// have run out): the next holder's command never runs beside the broken one's.
    Safe,
    /// `--force`: remove the lock now. The broken holder's command may run on until its dlock
    /// notices (up to a renewal interval and the kill grace) while the next one starts.
    Force,
}

/// When a broken lock is free again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frees {
    /// Now: forced, or nothing was held.
    Now,
    /// When the broken holders have stopped their commands and let go, at the latest after
    /// this long (their leases run out then, renewed by no one).
    Within(Duration),
    /// When the broken holders have stopped their commands and let go; they see the break
    /// within this long (a renewal interval) and then stop as on any loss. A holder that is
    /// stuck keeps the lock: only `--force` takes it from it.
    WhenStopped(Duration),
}

/// What a `dlock break` did ([`Backend::break_lock`]).
pub(crate) struct Broken {
    /// The lock just before.
    pub status: Status,
    /// When it is free again.
    pub frees: Frees,
    /// What must live until the broken holders are gone (a server session whose lock is the
    /// mark they see); `break` then waits for them before it exits.
    pub keep: Option<Box<dyn std::any::Any>>,
}

impl Broken {
    /// A break that found nothing held, or removed the lock at once.
    pub(crate) fn now(status: Status) -> Broken {
        Broken {
            status,
            frees: Frees::Now,
            keep: None,
        }
    }

    /// Whether any holder this break broke still holds the lock in `now`.
    pub(crate) fn still_held(&self, now: &Status) -> bool {
        now.holders
            .iter()
            .any(|h| self.status.holders.iter().any(|b| same_holder(b, h)))
    }
}

/// Whether two views of holders are the same holder: the same server session, or the same
/// process (host, pid namespace, pid, start) with the same token.
fn same_holder(a: &Holder, b: &Holder) -> bool {
    let same_process = a.foreign == b.foreign
        && a.host == b.host
        && a.pid == b.pid
        && a.pidns == b.pidns
        && a.since_ms == b.since_ms;
    if let (Some(x), Some(y)) = (&a.session, &b.session) {
        // A server session can pass to another client (a PostgreSQL backend behind a session
        // pooler): the same session with another dlock's record is another holder.
        return x == y && (a.since_ms.is_none() || b.since_ms.is_none() || same_process);
    }
    same_process && a.fencing_token == b.fencing_token
}

/// Why a renewal failed.
#[derive(Debug)]
pub enum RenewError {
    /// The backend says the lock is no longer ours (expired, deleted, broken, session gone).
    Lost(String),
    /// The backend could not be asked; the lease may still be ours until its deadline.
    Failed(anyhow::Error),
}

/// A held lock. Created on the main thread by [`Backend::acquire`], then moved to the keeper
/// thread, which alone calls `renew` and `release`.
pub trait Lease: Send {
    /// What the grant said (the same on every backend): the accessors below read it.
    fn grant(&self) -> Grant;

    /// The fencing token for the child, `None` where the backend cannot guarantee one.
    fn fencing_token(&self) -> Option<u64> {
        self.grant().fence
    }

    /// When the request that acquired the lock was sent: the lease deadline counts from here.
    fn acquired_at(&self) -> BootInstant {
        self.grant().acquired_at
    }

    /// Lease length on the server, `None` if the lease never expires by itself (a kernel lock
    /// lives exactly as long as this process). Each lease's own: it is what its renewals ask
    /// for (ZooKeeper's is the session timeout the server negotiated).
    fn ttl(&self) -> Option<Duration>;

    /// How often the keeper renews (or, without a TTL, checks) the lease: ttl/3 by default
    /// (docs/design.md, "The lease"), which leaves two more chances before the lease runs out.
    fn renew_every(&self) -> Duration {
        self.ttl().map_or(Duration::from_secs(1), |ttl| ttl / 3)
    }

    /// Whether the lease stays alive without [`renew`](Lease::renew) calls (a kernel lock, a
    /// ZooKeeper session its client keeps alive): then nothing needs renewing while the run
    /// waits for another of its keys.
    fn lives_unattended(&self) -> bool {
        self.ttl().is_none()
    }

    /// Extends the lease by its TTL (or checks it is still ours). Must return within a bounded
    /// time (socket timeouts), since the lease may be running out.
    fn renew(&mut self) -> Result<(), RenewError>;

    /// Releases the lock if it is still ours, and wakes one waiter. Consumes the lease.
    fn release(self: Box<Self>) -> anyhow::Result<()>;

    /// Adds the start event `start` to the key's run history ([`crate::history`]) while the
    /// lock is held, before the command starts. With `once_per`, first looks for a start less
    /// than that old by the backend's clock: if there is one, adds nothing and returns it
    /// ([`Begun::Skip`]). [`Begun::NotKept`] where the backend keeps no history.
    fn begin_run(&mut self, start: &[u8], once_per: Option<Duration>) -> anyhow::Result<Begun> {
        let _ = (start, once_per);
        Ok(Begun::NotKept)
    }

    /// [`release`](Lease::release), adding the end event `end` to the history in the same round
    /// trip where the backend can: `Ok(true)` if it did, `Ok(false)` if the caller must write
    /// it ([`Backend::end_run`]).
    fn release_with_end(self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        let _ = end;
        self.release().map(|()| false)
    }

    /// For backends whose server tells them at once that a lease is gone (a ZooKeeper session
    /// expiring, the lock node deleted): call `lost` with the reason when that happens, from any
    /// thread, until the lease is released. Others are only checked by `renew`.
    fn watch_loss(&mut self, lost: LossNotifier) {
        let _ = lost;
    }

    /// Set for a lock granted by a server that has been up for less than the TTL and may have
    /// forgotten a holder in a restart ([`hold_back_until`]): the lock is kept, and renewed, but
    /// the command must not start before this instant.
    fn held_back_until(&self) -> Option<BootInstant> {
        self.grant().held_back_until
    }
}

/// What a grant says on every backend, kept by each [`Lease`] and read by its accessors.
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    /// The fencing token for the command, `None` where the backend cannot guarantee one.
    pub fence: Option<u64>,
    /// When the request that acquired the lock was sent.
    pub acquired_at: BootInstant,
    /// Until when a young server's grant holds the command back ([`hold_back_until`]).
    pub held_back_until: Option<BootInstant>,
}

/// Whether this process has reached a backend's server, to tell a failure to connect at all
/// ([`Unavailable`](crate::exit::Unavailable): exit 69 at once) from an outage after contact
/// ([`Outage`](crate::exit::Outage): a waiting run reconnects). Shared by a backend's clones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reach(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Reach {
    /// The server answered this process (a handshake or a request completed): from now on a
    /// transport failure is an outage.
    pub(crate) fn connected(&self) {
        crate::trace::stage("connect");
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a connection to the server ever succeeded.
    pub(crate) fn was_reached(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The error for a transport failure (refused, reset, timed out): an [`Outage`] once the
    /// server was reached, else [`Unavailable`].
    ///
    /// [`Outage`]: crate::exit::Outage
    /// [`Unavailable`]: crate::exit::Unavailable
    pub(crate) fn transport_error(&self, message: String) -> anyhow::Error {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            crate::exit::Outage(message).into()
        } else {
            crate::exit::Unavailable(message).into()
        }
    }
}

/// Told why a lease was lost; see [`Lease::watch_loss`].
pub(crate) type LossNotifier = Box<dyn Fn(Loss) + Send + Sync>;

/// What a lease's loss watch reports ([`Lease::watch_loss`]).
#[derive(Debug)]
pub enum Loss {
    /// The lease is gone or must be given up (a break's mark, an intruder): what runs under it
    /// is stopped as on any loss — SIGTERM, SIGKILL after the grace, never past the lease's
    /// deadline.
    Ended(String),
    /// The lock is already free on the server: its connection ended, and a session lock
    /// (MySQL's `GET_LOCK`, PostgreSQL's advisory locks) ends with it. Another holder may have
    /// it now, so what runs under it is SIGKILLed at once, without a grace.
    Freed(String),
}

impl Loss {
    /// The same loss, its reason passed through `f`.
    pub(crate) fn map(self, f: impl FnOnce(String) -> String) -> Loss {
        match self {
            Loss::Ended(why) => Loss::Ended(f(why)),
            Loss::Freed(why) => Loss::Freed(f(why)),
        }
    }
}

/// Opens the backend a target names. Parses the backend's URL: a bad one is a [`Usage`](crate::exit::Usage) error.
/// A backend left out of this build (its Cargo feature off) is a usage error naming the feature.
pub(crate) fn open(target: &Target) -> anyhow::Result<Box<dyn Backend>> {
    open_as(target, true)
}

/// Like [`open`], for a command that only reads or removes what is there (`status`, `log`,
/// `break`): a file backend's directory is not created (a mistyped `file://` path is said in
/// one line, exit 69, rather than made).
pub(crate) fn open_existing(target: &Target) -> anyhow::Result<Box<dyn Backend>> {
    open_as(target, false)
}

fn open_as(target: &Target, create: bool) -> anyhow::Result<Box<dyn Backend>> {
    match target.kind {
        BackendKind::File => Ok(Box::new(file::FileBackend::open(&target.urls, create)?)),
        #[cfg(feature = "redis")]
        BackendKind::Redis if target.urls.len() > 1 => {
            Ok(Box::new(redlock::Redlock::open(&target.urls)?))
        }
        #[cfg(feature = "redis")]
        BackendKind::Redis => Ok(Box::new(redis::RedisBackend::open(&target.urls)?)),
        #[cfg(feature = "mysql")]
        BackendKind::Mysql => Ok(Box::new(mysql::MysqlBackend::open(&target.urls)?)),
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => Ok(Box::new(postgres::PgBackend::open(&target.urls)?)),
        #[cfg(feature = "zookeeper")]
        BackendKind::Zookeeper => Ok(Box::new(zookeeper::ZkBackend::open(&target.urls)?)),
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => Ok(Box::new(etcd::EtcdBackend::open(&target.urls)?)),
        #[cfg(feature = "s3")]
        BackendKind::S3 => Ok(Box::new(s3::S3Backend::open(&target.urls)?)),
        #[allow(unreachable_patterns)]
        missing => Err(crate::exit::Usage(format!(
            "this dlock was built without the {} backend: build it with `--features {}`",
            missing.name(),
            missing.name()
        ))
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a lock granted now by a server reporting `uptime_s` is held back, to 10 ms.
    fn held_ms(uptime_s: u64, ttl: Duration) -> Option<u128> {
        hold_back_until(uptime_s, ttl).map(|t| (t.remaining().as_millis() + 5) / 10 * 10)
    }

    #[test]
    fn hold_back_covers_the_ttl_and_the_uptimes_rounding() {
        let ttl = Duration::from_secs(3);
        // "Up 1 s" may be 0.01 s: the old holder may run for almost 3 s more.
        assert_eq!(held_ms(0, ttl), Some(4000));
        assert_eq!(held_ms(1, ttl), Some(3000));
        assert_eq!(held_ms(3, ttl), Some(1000));
        assert_eq!(held_ms(4, ttl), None);
        // A TTL with a fraction counts as the next whole second.
        assert_eq!(held_ms(2, Duration::from_millis(2500)), Some(2000));
        assert_eq!(held_ms(4, Duration::from_millis(2500)), None);
    }
}
