//! Run history and `--once-per` (docs/history.md): every exclusive run that held a lock leaves
//! two small events beside it on the backend — a *start* when the command is about to run and an
//! *end* when it is over — and `dlock log`/`status` read them back, pair them by run id and show
//! the runs newest first.
//!
//! Backends store events, not runs: an event is one bounded JSON object (written here, untrusted
//! when read back), with the backend's clock reading beside it ([`Stored::at_ms`]) where the
//! backend has a clock. A run killed with `kill -9` leaves a start and no end, and is shown as
//! such. How many events a key keeps ([`MAX_EVENTS`]) and how large one may be
//! ([`MAX_EVENT_BYTES`]) bounds every reader against a forged history.

pub(crate) mod record;
pub(crate) mod retention;
pub(crate) mod show;

use std::time::Duration;

use crate::model::Record;

pub(crate) use self::record::{Ending, Run, RunEvent, Stored, merge};

/// How many runs a key's history keeps, at most.
pub(crate) const MAX_RUNS: usize = 100;
/// How many events (a start and an end per run) a backend keeps and hands to a reader, at most.
pub(crate) const MAX_EVENTS: usize = 2 * MAX_RUNS;
/// The largest event dlock writes, and the largest a reader parses (a bigger one is shown as
/// unreadable, never read).
pub(crate) const MAX_EVENT_BYTES: usize = 4096;
/// The longest command line an event keeps, in characters.
const MAX_COMMAND_CHARS: usize = 1024;
/// The environment variable that switches history off, as `--no-history` does.
pub(crate) const NO_HISTORY_ENV: &str = "DLOCK_NO_HISTORY";

/// What [`Lease::begin_run`] found.
#[derive(Debug)]
pub enum Begun {
    /// The start is recorded: run the command.
    Started,
    /// A run of the key started `ago` (by the backend's clock) — less than `--once-per` ago:
    /// nothing was recorded; give the lock back and do not run.
    Skip {
        /// That run's start event.
        last: Stored,
        /// How long ago it started.
        ago: Duration,
    },
    /// The backend keeps no history.
    NotKept,
    /// The run is nested in one that holds the lock (`DLOCK_HELD`): it is part of that run,
    /// which recorded its start and passed any `--once-per`.
    Inside,
}

/// A run's start event made before its lock is taken, for the backends that record it in the
/// acquisition's own round trips (PostgreSQL, etcd, ZooKeeper, MySQL: [`Request::start`]) — one
/// key, exclusive, no `--once-per`. The body has no `token` yet: the backend learns the token in
/// the same round trip and splices it in ([`Opening::with_token`], or on the server), or its
/// reader does (etcd, ZooKeeper: the event's own revision is the lock's).
///
/// [`Request::start`]: crate::backend::Request::start
pub(crate) struct Opening {
    pub(crate) id: String,
    body: Vec<u8>,
}

/// Room kept in an [`Opening`]'s body for `,"token":N` (N up to 20 digits).
const TOKEN_ROOM: usize = 32;

impl Opening {
    pub(crate) fn new(holder: &Record) -> Opening {
        let id = new_run_id(holder);
        let body = start_body(&id, holder, None, MAX_EVENT_BYTES - TOKEN_ROOM);
        Opening { id, body }
    }

    /// The start event without its token: a JSON object (ends with `}`).
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }

    /// The start event with `token` in it.
    pub(crate) fn with_token(&self, token: Option<u64>) -> Vec<u8> {
        let Some(t) = token else {
            return self.body.clone();
        };
        let mut body = self.body.clone();
        body.pop();
        body.extend_from_slice(format!(",\"token\":{t}}}").as_bytes());
        body
    }
}

/// A start event of at most `most` bytes (the command cut to fit).
pub(crate) fn start_body(id: &str, holder: &Record, token: Option<u64>, most: usize) -> Vec<u8> {
    // Within the cap readers keep to (escaped, a character may take 6 bytes): a start over it
    // would not read as one, and `--once-per` would not see it.
    let mut chars = MAX_COMMAND_CHARS;
    loop {
        let start = RunEvent::start(id, holder, token, chars);
        let body = serde_json::to_vec(&start).unwrap_or_default();
        if body.len() <= most || chars == 0 {
            return body;
        }
        chars /= 2;
    }
}

/// Splices `token` into a start event `body` that has none (a reader's: etcd and ZooKeeper
/// record the start in the lock's own write, whose revision is the token). Other bodies come
/// back as they are.
pub(crate) fn add_token(body: Vec<u8>, token: u64) -> Vec<u8> {
    let s = Stored {
        at_ms: None,
        body: body.clone(),
    };
    match RunEvent::read(&s) {
        Some(e) if e.ev == "start" && e.token.is_none() && body.last() == Some(&b'}') => {
            let mut body = body;
            body.pop();
            body.extend_from_slice(format!(",\"token\":{token}}}").as_bytes());
            body
        }
        _ => body,
    }
}

/// A run's id: 16 hex digits from the holder, the time and the boot clock. Unique enough that
/// two runs of one key never share one (they differ in pid or in time). Hashed with std's
/// SipHash, not SHA-256: an id needs no cryptography, and sha2's first use asks the CPU for
/// its features (`cpuid`, a trap to the hypervisor on a VM: ~20 µs of every run here).
pub(crate) fn new_run_id(holder: &Record) -> String {
    use std::hash::{Hash, Hasher};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut h = std::hash::DefaultHasher::new();
    holder.host.as_deref().unwrap_or("").hash(&mut h);
    holder.pid.unwrap_or(0).hash(&mut h);
    now.as_nanos().hash(&mut h);
    crate::sys::boottime().as_nanos().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// How long before `now_ms` a start stored at `at_ms` was (same clock), for `--once-per DUR`:
/// a start in the future counts as just now when it is at most DUR ahead, and not at all
/// (`None`) when it is farther — a clock that went back would otherwise skip every run until
/// it caught up.
pub(crate) fn age(now_ms: u64, at_ms: u64, within: Duration) -> Option<Duration> {
    age_of(i128::from(now_ms) - i128::from(at_ms), within)
}

/// [`age`] of a start `ago_ms` milliseconds ago as a backend's server computed it (negative:
/// in the future), the same rule.
pub(crate) fn age_of(ago_ms: impl Into<i128>, within: Duration) -> Option<Duration> {
    let ago_ms: i128 = ago_ms.into();
    let ms = |v: i128| Duration::from_millis(u64::try_from(v.unsigned_abs()).unwrap_or(u64::MAX));
    if ago_ms >= 0 {
        Some(ms(ago_ms))
    } else if ms(ago_ms) <= within {
        Some(Duration::ZERO)
    } else {
        None
    }
}

/// This host's clock, in milliseconds since the Unix epoch (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_in_the_future_counts_as_now_within_the_window_only() {
        let d = Duration::from_secs(10);
        assert_eq!(age(5_000, 1_000, d), Some(Duration::from_secs(4)));
        assert_eq!(age(1_000, 5_000, d), Some(Duration::ZERO));
        assert_eq!(age(1_000, 20_000, d), None);
        assert_eq!(age(0, u64::MAX, d), None);
        assert_eq!(age(u64::MAX, 0, d), Some(Duration::from_millis(u64::MAX)));
        assert_eq!(age_of(-10_000i64, d), Some(Duration::ZERO));
        assert_eq!(age_of(-10_001i64, d), None);
        assert_eq!(age_of(i64::MIN, d), None);
        assert_eq!(age_of(7i64, d), Some(Duration::from_millis(7)));
    }

    fn holder(command: &str) -> Record {
        Record {
            host: Some("h".into()),
            pid: Some(7),
            command: Some(command.into()),
            ..Record::default()
        }
    }

    #[test]
    fn an_opening_takes_its_token_where_it_is_recorded() {
        let o = Opening::new(&holder("make all"));
        let read = |b: &[u8]| {
            RunEvent::read(&Stored {
                at_ms: None,
                body: b.to_vec(),
            })
        };
        let bare = read(o.body()).expect("a start without its token reads");
        assert_eq!((bare.ev.as_str(), bare.token), ("start", None));
        let with = read(&o.with_token(Some(u64::MAX))).expect("with its token");
        assert_eq!((with.run, with.token), (bare.run.clone(), Some(u64::MAX)));
        assert_eq!(o.with_token(None), o.body());
        // A reader's splice (etcd, ZooKeeper): only into a start that has no token.
        let added = read(&add_token(o.body().to_vec(), 42)).unwrap();
        assert_eq!(added.token, Some(42));
        let kept = o.with_token(Some(5));
        assert_eq!(add_token(kept.clone(), 42), kept);
        let end = serde_json::to_vec(&RunEvent::end("r", Ending::default())).unwrap();
        assert_eq!(add_token(end.clone(), 42), end);
        assert_eq!(add_token(b"junk".to_vec(), 42), b"junk");
    }

    #[test]
    fn an_opening_keeps_room_for_its_token() {
        let o = Opening::new(&holder(&"\u{1}".repeat(5000)));
        assert!(o.with_token(Some(u64::MAX)).len() <= MAX_EVENT_BYTES);
    }
}
