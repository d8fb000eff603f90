//! The S3 backend: a lock is one object, `PREFIX/E(KEY).lock`, holding a JSON record
//! ([`record::LockRecord`]), and every write to it is conditional, so the ETag is a
//! compare-and-swap.
//!
//! - Acquire: create with `If-None-Match: *`, or replace a free record with `If-Match: ETAG`;
//!   the counter in the record, +1 on each acquisition, is the fencing token.
//! - The lease is by observation: a waiter that sees the same ETag for a whole lease (the
//!   record's `ttl_ms`, on its own CLOCK_BOOTTIME, from the reply that first showed it) takes
//!   over with `If-Match`. The holder renews every ttl/3 with `If-Match` (each renewal writes a
//!   new `beat`, so a new ETag), and its deadline counts from the send time of its last renewal
//!   that succeeded: it is dead before any waiter may take over. No clock of a host or of the
//!   server decides.
//! - Release: a conditional write of a "free" record (the counter kept).
//! - 412: someone else won. 409 (a concurrent write): read again and retry. A timeout or a 5xx
//!   on a write: the outcome is unknown, read back before deciding.
//! - Before the first lock on an endpoint, [`probe`] checks that the server enforces both
//!   conditions; a server that ignores them is refused (78).
//! - Waiting polls: from 100 ms, backing off to 500 ms, with jitter.

mod client;
mod history;
mod lease;
mod probe;
mod record;
mod sign;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use self::client::{Client, Cond, Place, S3Reply};
use self::lease::S3Lease;
use self::record::{LockRecord, LockState};
use super::{Backend, BreakHow, Broken, Frees, Lease, Reach, Request};
use crate::clock::BootInstant;
use crate::exit::{Interrupted, Unavailable, Usage};
use crate::model::{BackendKind, Deadline, Holder, Key, Status};

/// One request's limit, and a renewal's.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The first poll interval of a waiter, and the most it backs off to.
const POLL_FIRST: Duration = Duration::from_millis(100);
const POLL_MOST: Duration = Duration::from_millis(500);

/// Locks in an S3 bucket.
pub(crate) struct S3Backend {
    place: Arc<Place>,
    reach: Reach,
}

impl S3Backend {
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<S3Backend> {
        let url = match urls {
            [u] => u,
            [] => {
                return Err(Usage("the s3 backend needs --url s3://BUCKET[/PREFIX]".into()).into());
            }
            _ => return Err(Usage("the s3 backend takes one --url".into()).into()),
        };
        let place = Place::parse(url)?;
        if place.tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        Ok(S3Backend {
            place: Arc::new(place),
            reach: Reach::default(),
        })
    }

    fn client(&self, timeout: Duration) -> Client {
        Client::new(self.place.clone(), self.reach.clone(), timeout)
    }

    fn object(&self, key: &Key) -> String {
        format!("{}{}.lock", self.place.prefix, super::escape_key(key))
    }

    /// The error for a transport failure.
    fn transport(&self, e: std::io::Error) -> anyhow::Error {
        if crate::backend::net::is_signalled(&e) {
            return Interrupted(libc::SIGINT).into();
        }
        self.reach
            .transport_error(format!("{}: {e}", self.place.describe()))
    }

    /// The error for an answer dlock did not expect (403 for a wrong secret, a missing bucket).
    fn refused(&self, r: &S3Reply) -> anyhow::Error {
        Unavailable(format!("{}: {}", self.place.describe(), r.error())).into()
    }

    /// The error for an unexpected status without a body.
    fn refused_status(&self, status: u16) -> anyhow::Error {
        Unavailable(format!("{}: HTTP {status}", self.place.describe())).into()
    }

    /// The lock's object now: `None` when there is none.
    fn read(&self, c: &mut Client, object: &str) -> anyhow::Result<Option<Seen>> {
        let r = c.get(object, &[]).map_err(|e| self.transport(e))?;
        Seen::of(r).map_err(|r| self.refused(&r))
    }

    fn holder_of(rec: Option<&LockRecord>) -> Holder {
        match rec {
            Some(r) => Holder {
                fencing_token: Some(r.counter),
                broken: r.broken,
                ..Holder::from(r.holder.clone().unwrap_or_default())
            },
            None => Holder {
                foreign: Some("an object that is not a dlock record".into()),
                ..Holder::default()
            },
        }
    }
}

/// The lock's object as read: its ETag, its record (`None` when it is not dlock's) and the
/// server's clock hints.
pub(crate) struct Seen {
    etag: String,
    record: Option<LockRecord>,
    /// The server's `Date` minus `Last-Modified`, in seconds: a hint of the record's age.
    age_hint: Option<u64>,
    /// When its reply arrived, on this host's CLOCK_BOOTTIME.
    at: BootInstant,
}

impl Seen {
    /// The object of a GET's reply; the reply back when it is an error.
    fn of(r: S3Reply) -> Result<Option<Seen>, S3Reply> {
        match r.status {
            404 => Ok(None),
            200 => match r.etag.clone() {
                Some(etag) => Ok(Some(Seen {
                    etag,
                    record: LockRecord::parse(&r.body),
                    age_hint: r
                        .date
                        .zip(r.last_modified)
                        .map(|(d, m)| d.saturating_sub(m)),
                    at: BootInstant::now(),
                })),
                None => Err(r),
            },
            _ => Err(r),
        }
    }

    fn is_free(&self) -> bool {
        self.record
            .as_ref()
            .is_some_and(|r| r.state == LockState::Free)
    }

    /// What is left of the holder's lease as the server's clock has it: the lease less the
    /// record's age (`Date − Last-Modified`, whole seconds, so up to a second short or long).
    /// Only an estimate for `status`: the lease itself is timed by observation ([`Seen::at`]).
    fn lease_left(&self) -> Option<Duration> {
        let age = Duration::from_secs(self.age_hint?);
        Some(self.lease()?.saturating_sub(age))
    }

    /// The holder's lease; `None` for an object that is not dlock's, or whose lease is none
    /// (a record written without `ttl_ms`, by hand or by another tool) or longer than any
    /// dlock takes (never taken over: cutting it short would let a waiter in while its holder
    /// may still run).
    fn lease(&self) -> Option<Duration> {
        self.record.as_ref().and_then(|r| {
            let lease = Duration::from_millis(r.ttl_ms);
            (r.ttl_ms > 0 && lease <= crate::config::MAX_DURATION).then_some(lease)
        })
    }
}

/// What one write of an acquisition came to.
enum Outcome {
    Won { etag: String, sent: BootInstant },
    Lost,
}

impl S3Backend {
    /// Writes `rec` under `cond`; `Won` only when the record is ours on the server.
    fn try_write(
        &self,
        c: &mut Client,
        object: &str,
        cond: Cond<'_>,
        rec: &LockRecord,
        owner: &str,
    ) -> anyhow::Result<Outcome> {
        let sent = BootInstant::now();
        let body = rec.to_bytes();
        match c.put(object, cond, &body) {
            Ok(r) if (200..300).contains(&r.status) => match r.etag {
                Some(etag) => Ok(Outcome::Won { etag, sent }),
                None => self.read_back(c, object, rec, owner, sent),
            },
            Ok(r) if matches!(r.status, 412 | 409) => Ok(Outcome::Lost),
            Ok(r) if r.status >= 500 => self.read_back(c, object, rec, owner, sent),
            Ok(r) => Err(self.refused(&r)),
            Err(e) if crate::backend::net::is_signalled(&e) => {
                // The write may have landed: give it back before saying so.
                let _quiet = crate::signals::giving_back();
                if let Ok(Outcome::Won { etag, .. }) = self.read_back(c, object, rec, owner, sent) {
                    let _ = c.put(object, Cond::Is(&etag), &rec.freed().to_bytes());
                }
                Err(Interrupted(libc::SIGINT).into())
            }
            Err(_) => self.read_back(c, object, rec, owner, sent),
        }
    }

    /// After a write whose outcome is unknown: ours if the object holds our record.
    fn read_back(
        &self,
        c: &mut Client,
        object: &str,
        rec: &LockRecord,
        owner: &str,
        sent: BootInstant,
    ) -> anyhow::Result<Outcome> {
        let seen = self.read(c, object)?;
        Ok(match seen {
            Some(s)
                if s.record.as_ref().is_some_and(|r| {
                    r.held_by(owner) && r.counter == rec.counter && r.beat == rec.beat
                }) =>
            {
                Outcome::Won { etag: s.etag, sent }
            }
            _ => Outcome::Lost,
        })
    }
}

impl S3Backend {
    /// The keys whose objects' names (less the prefix) `base` turns into an escaped key: a
    /// paginated LIST of the prefix, at most 20 pages and [`super::MAX_LISTED`] keys.
    fn list_names(&self, base: impl Fn(&str) -> Option<&str>) -> anyhow::Result<Vec<Key>> {
        let mut c = self.client(REQUEST_TIMEOUT);
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..20 {
            let mut query = vec![("list-type", "2".to_string())];
            query.push(("prefix", self.place.prefix.clone()));
            if let Some(t) = &token {
                query.push(("continuation-token", t.clone()));
            }
            let r = c.get("", &query).map_err(|e| self.transport(e))?;
            if r.status != 200 {
                return Err(self.refused(&r));
            }
            for name in record::xml_values(&r.body, "Key") {
                let Some(rest) = name.strip_prefix(&self.place.prefix) else {
                    continue;
                };
                // Only a name dlock would make for the key it decodes to (`sub/x.lock` or
                // `a b.lock` decode, but stand for no key's object).
                let base = base(rest);
                if let Some(k) = base
                    .and_then(super::unescape_key)
                    .filter(|k| base == Some(super::escape_key(k).as_str()))
                    && keys.len() < super::MAX_LISTED
                    && !keys.contains(&k)
                {
                    keys.push(k);
                }
            }
            token = record::xml_values(&r.body, "NextContinuationToken")
                .into_iter()
                .next();
            let truncated = record::xml_values(&r.body, "IsTruncated")
                .first()
                .is_some_and(|t| t == "true");
            if !truncated || token.is_none() || keys.len() >= super::MAX_LISTED {
                break;
            }
        }
        Ok(keys)
    }
}

/// A random id for this holder.
fn owner_id() -> anyhow::Result<String> {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a holder id: {e}"))?;
    Ok(sign::hex(&b))
}

/// The next poll interval: ×1.5 up to [`POLL_MOST`], with ±20% jitter.
fn next_poll(now: Duration) -> (Duration, Duration) {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    let jitter = 0.8 + 0.4 * f64::from(b[0]) / 255.0;
    let next = now.mul_f64(1.5).min(POLL_MOST);
    (now.mul_f64(jitter), next)
}

impl S3Backend {
    /// [`Backend::acquire`]'s loop: reads, writes when the lock is free or its lease was
    /// watched out, and polls otherwise (leaving a waiter's `mark`).
    fn acquire_as(
        &self,
        req: &Request<'_>,
        c: &mut Client,
        object: &str,
        owner: &str,
        mark: &mut waiting::Mark,
    ) -> anyhow::Result<Box<dyn Lease>> {
        let mut poll = POLL_FIRST;
        let ttl_ms = u64::try_from(req.ttl.as_millis()).unwrap_or(u64::MAX);
        let mine = |counter: u64| LockRecord {
            dlock: 1,
            state: LockState::Held,
            counter,
            beat: 0,
            ttl_ms,
            owner: Some(owner.to_string()),
            broken: false,
            holder: Some(crate::model::Record {
                key: Some(req.key.as_str().to_string()),
                ttl_ms: Some(ttl_ms),
                ..req.holder.clone()
            }),
        };
        // The ETag seen and when it was first seen; and, for --no-wait, how long to watch.
        let mut watched: Option<(String, BootInstant)> = None;
        let mut watch_until: Option<BootInstant> = None;
        loop {
            if let Some(sig) = req.interrupted() {
                return Err(Interrupted(sig).into());
            }
            let seen = self.read(c, object)?;
            let attempt = match &seen {
                None => Some((Cond::Absent, mine(1))),
                Some(s) if s.is_free() => {
                    let counter = s.record.as_ref().map_or(0, |r| r.counter);
                    Some((Cond::Is(&s.etag), mine(counter.saturating_add(1))))
                }
                Some(s) => {
                    if watched.as_ref().is_none_or(|(e, _)| *e != s.etag) {
                        watched = Some((s.etag.clone(), s.at));
                        (req.on_holder)(&Self::holder_of(s.record.as_ref()));
                        if watch_until.is_some() {
                            // The holder renewed while --no-wait watched: it is alive.
                            return Err(req.busy(Some(&Self::holder_of(s.record.as_ref()))));
                        }
                    }
                    let since = watched.as_ref().map_or(s.at, |(_, t)| *t);
                    let margin = |l: Duration| l + crate::clock::drift_margin(l);
                    let expired = s
                        .lease()
                        .is_some_and(|l| s.at.saturating_duration_since(since) >= margin(l));
                    if expired {
                        let counter = s.record.as_ref().map_or(0, |r| r.counter);
                        Some((Cond::Is(&s.etag), mine(counter.saturating_add(1))))
                    } else {
                        if req.deadline == Deadline::Now && watch_until.is_none() {
                            // The server's clock is a hint only: a fresh record fails at
                            // once; a stale one is watched for a whole lease on our clock.
                            let stale = match (s.age_hint, s.lease()) {
                                (Some(age), Some(l)) => age > l.as_secs() + 1,
                                _ => false,
                            };
                            if !stale {
                                return Err(req.busy(Some(&Self::holder_of(s.record.as_ref()))));
                            }
                            watch_until = s.lease().map(|l| since + margin(l) + POLL_MOST);
                        } else if req.deadline != Deadline::Now && req.waited_out() {
                            return Err(req.busy(Some(&Self::holder_of(s.record.as_ref()))));
                        }
                        if watch_until.is_some_and(|t| t.remaining().is_zero()) {
                            return Err(req.busy(Some(&Self::holder_of(s.record.as_ref()))));
                        }
                        None
                    }
                }
            };
            if let Some((cond, rec)) = attempt {
                match self.try_write(c, object, cond, &rec, owner)? {
                    Outcome::Won { etag, sent } => {
                        return Ok(Box::new(S3Lease::new(
                            self.client(lease::renew_timeout(req.ttl)),
                            object.to_string(),
                            etag,
                            rec,
                            req.ttl,
                            sent,
                        )));
                    }
                    Outcome::Lost => {
                        // Someone else wrote: read again at once.
                        if req.deadline == Deadline::Now && watch_until.is_none() {
                            let s = self.read(c, object)?;
                            let h = s.as_ref().map(|s| Self::holder_of(s.record.as_ref()));
                            return Err(req.busy(h.as_ref()));
                        }
                        continue;
                    }
                }
            }
            let (nap, next) = next_poll(poll);
            poll = next;
            let nap = match req.deadline.remaining() {
                Some(left) if req.deadline != Deadline::Now => nap.min(left),
                _ => nap,
            };
            mark.keep(c);
            let _ = req.interrupt.nap(nap);
        }
    }
}

impl Backend for S3Backend {
    fn kind(&self) -> BackendKind {
        BackendKind::S3
    }

    fn location(&self) -> String {
        self.place.describe()
    }

    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        // A lock's object, or a waiter's mark beside it.
        self.list_names(|rest| match rest.split_once(".lock.w/") {
            Some((k, _)) => Some(k),
            None => rest.strip_suffix(".lock"),
        })
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let mut c = self.client(REQUEST_TIMEOUT);
        probe::ensure(self, &mut c)?;
        let object = self.object(req.key);
        let owner = owner_id()?;
        let mut mark = waiting::Mark::new(
            &object,
            &owner,
            serde_json::to_vec(req.holder).unwrap_or_default(),
        );
        let result = self.acquire_as(req, &mut c, &object, &owner, &mut mark);
        // After a signal: not ended by the signal itself (its wait took it).
        let _quiet = result
            .as_ref()
            .err()
            .is_some_and(|e| e.is::<Interrupted>())
            .then(crate::signals::giving_back);
        mark.leave(&mut c);
        result
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let mut c = self.client(REQUEST_TIMEOUT);
        let object = self.object(key);
        let seen = self.read(&mut c, &object)?;
        let mut status = Status {
            server_name: Some(format!("s3://{}/{object}", self.place.bucket)),
            ..Status::new(key, self.kind(), self.place.describe())
        };
        if let Some(s) = seen.filter(|s| !s.is_free()) {
            status.held = true;
            let mut holder = Self::holder_of(s.record.as_ref());
            holder.lease_left_ms = s
                .lease_left()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            status.holders.push(holder);
        }
        let r = c
            .get(
                "",
                &[
                    ("list-type", "2".into()),
                    ("prefix", waiting::marks(&object)),
                ],
            )
            .map_err(|e| self.transport(e))?;
        if r.status == 200 {
            status.waiters = Some(waiting::count_fresh(&r.body, r.date));
        }
        Ok(status.with_mode())
    }
    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let mut c = self.client(REQUEST_TIMEOUT);
        let object = self.object(key);
        for o in [history::object_of(&object), object] {
            let r = c.delete(&o).map_err(|e| self.transport(e))?;
            if !(200..300).contains(&r.status) && r.status != 404 {
                return Err(self.refused(&r));
            }
        }
        Ok(())
    }

    /// Safe: marks the record broken with `If-Match` (a new ETag: waiters start watching
    /// again); the holder sees it at its next renewal, stops, and frees the lock. Forced: writes
    /// a free record with `If-Match` at once.
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        let mut c = self.client(REQUEST_TIMEOUT);
        let object = self.object(key);
        for _ in 0..10 {
            let status = self.status(key)?;
            let Some(s) = self.read(&mut c, &object)? else {
                return Ok(Broken::now(status));
            };
            let Some(rec) = s.record.as_ref().filter(|r| r.state == LockState::Held) else {
                return Ok(Broken::now(status));
            };
            let (new, frees) = match how {
                BreakHow::Force => (rec.freed(), Frees::Now),
                BreakHow::Safe => (
                    LockRecord {
                        broken: true,
                        ..rec.clone()
                    },
                    Frees::Within(s.lease().unwrap_or_default()),
                ),
            };
            let r = c
                .put(&object, Cond::Is(&s.etag), &new.to_bytes())
                .map_err(|e| self.transport(e))?;
            match r.status {
                200..=299 => {
                    return Ok(Broken {
                        status,
                        frees,
                        keep: None,
                    });
                }
                409 | 412 => continue,
                _ => return Err(self.refused(&r)),
            }
        }
        anyhow::bail!(
            "{}: the lock changed under every try to break it",
            self.place.describe()
        )
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        let mut c = self.client(REQUEST_TIMEOUT);
        let object = history::object_of(&self.object(key));
        match history::read(&mut c, &object).map_err(|e| self.transport(e))? {
            Ok((doc, _)) => Ok(doc.stored()),
            Err(r) => Err(self.refused(&r)),
        }
    }

    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.list_names(|rest| rest.strip_suffix(".history"))
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let mut c = self.client(REQUEST_TIMEOUT);
        let object = history::object_of(&self.object(key));
        let until = BootInstant::now() + REQUEST_TIMEOUT;
        history::append(&mut c, &object, end, None, Some(until))
            .map(|_| ())
            .map_err(|f| history::failed(&self.place, f))
    }

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<crate::backend::ground::Finding>> {
        let _ = ttl;
        probe::findings(self, &mut self.client(REQUEST_TIMEOUT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(ttl_ms: u64) -> Seen {
        Seen {
            etag: "\"e\"".into(),
            record: Some(LockRecord {
                dlock: 1,
                state: LockState::Held,
                counter: 1,
                beat: 0,
                ttl_ms,
                owner: Some("h".into()),
                broken: false,
                holder: None,
            }),
            age_hint: None,
            at: BootInstant::now(),
        }
    }

    /// A waiter must not watch a shorter lease than the holder's: `--ttl` takes up to 7 days
    /// (the holder's deadline is its last renewal + ttl), and a script may pick its own
    /// `ttl_ms`.
    #[test]
    fn a_waiter_watches_the_holders_whole_lease_however_long() {
        for ttl in [Duration::from_secs(2), Duration::from_secs(48 * 3600)] {
            let ms = u64::try_from(ttl.as_millis()).unwrap();
            assert!(seen(ms).lease().is_some_and(|l| l >= ttl), "{ttl:?}");
        }
        let week = u64::try_from(crate::config::MAX_DURATION.as_millis()).unwrap();
        assert_eq!(seen(week).lease(), Some(crate::config::MAX_DURATION));
        // Longer than dlock ever takes: never taken over (and no arithmetic can overflow).
        assert_eq!(seen(week + 1).lease(), None);
        assert_eq!(seen(u64::MAX).lease(), None);
        // A record without a lease (written by hand, by another tool): never taken over.
        assert_eq!(seen(0).lease(), None);
    }

    /// `status`'s lease left: the lease less the server's age of the record, never below
    /// zero, and none where either is unknown, whatever the server's clock says.
    #[test]
    fn the_lease_left_is_the_lease_less_the_servers_age() {
        let aged = |ttl_ms, age| Seen {
            age_hint: age,
            ..seen(ttl_ms)
        };
        assert_eq!(
            aged(30_000, Some(12)).lease_left(),
            Some(Duration::from_secs(18))
        );
        assert_eq!(aged(30_000, Some(31)).lease_left(), Some(Duration::ZERO));
        assert_eq!(
            aged(30_000, Some(u64::MAX)).lease_left(),
            Some(Duration::ZERO)
        );
        assert_eq!(aged(30_000, None).lease_left(), None);
        assert_eq!(aged(0, Some(1)).lease_left(), None);
        assert_eq!(aged(u64::MAX, Some(0)).lease_left(), None);
    }
}
