//! The S3 backend's run history (docs/history.md): one object per key,
//! `PREFIX/E(KEY).history` beside the lock's `PREFIX/E(KEY).lock`, holding a JSON document
//! `{"dlock":1,"events":["MS BODY", …]}`, oldest first (`MS BODY` as [`Stored::line`]: the
//! writing host's clock in ms, then the event). Every write is a read-modify-write of the whole
//! document, conditional on the ETag read (`If-Match`, or `If-None-Match: *` to create it): a
//! 412 or 409 means another writer came in between, so the document is read again and the
//! event added to that (a bounded number of tries). A write whose outcome is unknown (a timeout,
//! a 5xx) is read back on the next try: the event is unique (a run id and a time), so finding it
//! means it landed.
//!
//! `--once-per` is decided on the document read in the same cycle as the conditional write of
//! the start: two runs that read the same version cannot both write (one gets 412, reads the
//! other's start and skips), even when one of them lost its lease in the meantime.
//!
//! The document is bounded: at most [`MAX_EVENTS`] events and [`MAX_DOC`] bytes (oldest events
//! go first); a reader gets at most the client's reply bound (4 MiB) and parses defensively —
//! anything that is not a dlock document is one unreadable record, never a panic.

use std::time::Duration;

use super::client::{Client, Cond};
use crate::clock::BootInstant;
use crate::history::{Begun, MAX_EVENT_BYTES, MAX_EVENTS, RunEvent, Stored};

/// The most a history document dlock writes may hold, in bytes: oldest events go first.
pub(crate) const MAX_DOC: usize = 256 << 10;
/// Read-modify-write cycles before giving up (each lost to another writer, or unknown).
const TRIES: usize = 10;

/// The history object of the lock object `lock` (`….lock` → `….history`).
pub(super) fn object_of(lock: &str) -> String {
    let base = lock.strip_suffix(".lock").unwrap_or(lock);
    format!("{base}.history")
}

/// A history document as read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Doc {
    /// No object yet.
    Absent,
    /// dlock's document: its entries (`MS BODY` lines), oldest first, at most [`MAX_EVENTS`].
    Events(Vec<String>),
    /// Something else at the history's name: its first bytes, shown as an unreadable record.
    Unreadable(Vec<u8>),
}

impl Doc {
    /// The document in `bytes` (untrusted: any bytes, no panic).
    pub(crate) fn parse(bytes: &[u8]) -> Doc {
        let unreadable = || Doc::Unreadable(bytes[..bytes.len().min(MAX_EVENT_BYTES + 1)].to_vec());
        let Ok(serde_json::Value::Object(mut map)) = serde_json::from_slice(bytes) else {
            return unreadable();
        };
        if map.get("dlock").and_then(serde_json::Value::as_u64) != Some(1) {
            return unreadable();
        }
        let Some(serde_json::Value::Array(events)) = map.remove("events") else {
            return unreadable();
        };
        let skip = events.len().saturating_sub(MAX_EVENTS);
        Doc::Events(
            events
                .into_iter()
                .skip(skip)
                .map(|v| match v {
                    serde_json::Value::String(s) => s,
                    // Not an event dlock writes: kept as its text (read as unreadable).
                    other => other.to_string(),
                })
                .collect(),
        )
    }

    /// The events, newest first, as [`Backend::runs`](crate::backend::Backend::runs) gives them.
    pub(crate) fn stored(&self) -> Vec<Stored> {
        match self {
            Doc::Absent => Vec::new(),
            Doc::Events(e) => e
                .iter()
                .rev()
                .map(|l| Stored::from_line(l.as_bytes()))
                .collect(),
            Doc::Unreadable(b) => vec![Stored {
                at_ms: None,
                body: b.clone(),
            }],
        }
    }
}

/// The document holding `events` (oldest first) and `new` last, cut to [`MAX_EVENTS`] events
/// and [`MAX_DOC`] bytes from the oldest.
pub(crate) fn render(events: &[String], new: &str) -> Vec<u8> {
    let mut all: Vec<&str> = events.iter().map(String::as_str).collect();
    all.push(new);
    let from = all.len().saturating_sub(MAX_EVENTS);
    let mut all = &all[from..];
    // Each entry's size as a JSON string, with its comma.
    let size = |s: &str| serde_json::to_string(s).map_or(0, |j| j.len() + 1);
    let mut total: usize = all.iter().map(|s| size(s)).sum::<usize>() + 32;
    while total > MAX_DOC && all.len() > 1 {
        total -= size(all[0]);
        all = &all[1..];
    }
    serde_json::to_vec(&serde_json::json!({ "dlock": 1, "events": all })).unwrap_or_default()
}

/// The document at `object` now, and its ETag.
pub(super) fn read(
    c: &mut Client,
    object: &str,
) -> std::io::Result<Result<(Doc, Option<String>), super::client::S3Reply>> {
    let r = c.get(object, &[])?;
    Ok(match r.status {
        404 => Ok((Doc::Absent, None)),
        200 if r.etag.is_some() => Ok((Doc::parse(&r.body), r.etag.clone())),
        _ => Err(r),
    })
}

/// Why an append did not happen.
pub(super) enum Failed {
    Transport(std::io::Error),
    Refused(super::client::S3Reply),
    Other(String),
}

/// The error for a [`Failed`] append on `place`.
pub(super) fn failed(place: &super::client::Place, f: Failed) -> anyhow::Error {
    match f {
        Failed::Transport(e) if crate::backend::net::is_signalled(&e) => {
            crate::exit::Interrupted(libc::SIGINT).into()
        }
        Failed::Transport(e) => {
            crate::exit::Unavailable(format!("{}: {e}", place.describe())).into()
        }
        Failed::Refused(r) => {
            crate::exit::Unavailable(format!("{}: {}", place.describe(), r.error())).into()
        }
        Failed::Other(m) => anyhow::anyhow!("{}: {m}", place.describe()),
    }
}

/// Adds the event `body` (at this host's `now_ms`) to the history at `object`. With
/// `once_per`, first looks for a start younger than that (by the hosts' clocks) in the very
/// version it then writes over: if there is one, adds nothing and returns it. No request
/// starts after `until` (a start must leave the lease time to be renewed before the command
/// starts).
pub(super) fn append(
    c: &mut Client,
    object: &str,
    body: &[u8],
    once_per: Option<Duration>,
    until: Option<BootInstant>,
) -> Result<Begun, Failed> {
    let now = crate::history::now_ms();
    let line = String::from_utf8_lossy(&Stored::line(now, body)).into_owned();
    let late = || {
        until.is_some_and(|u| u.remaining().is_zero()).then(|| {
            Failed::Other(format!(
                "the history object {object} took too long to write"
            ))
        })
    };
    for tried in 0..TRIES {
        if tried > 0 {
            pause(tried, until);
        }
        if let Some(f) = late() {
            return Err(f);
        }
        let (doc, etag) = read(c, object)
            .map_err(Failed::Transport)?
            .map_err(Failed::Refused)?;
        let events = match doc {
            // A write of ours whose outcome was unknown landed.
            Doc::Events(e) if e.contains(&line) => return Ok(Begun::Started),
            Doc::Events(e) => e,
            Doc::Absent => Vec::new(),
            Doc::Unreadable(_) if once_per.is_some() => {
                return Err(Failed::Other(format!(
                    "the history object {object} is not dlock's: --once-per cannot tell"
                )));
            }
            // Replaced by a document of dlock's (what was there is not a history).
            Doc::Unreadable(_) => Vec::new(),
        };
        if let Some(d) = once_per
            && let Some((last, ago)) = newest_start(&events, crate::history::now_ms(), d)
            && ago < d
        {
            return Ok(Begun::Skip { last, ago });
        }
        let doc = render(&events, &line);
        if let Some(f) = late() {
            return Err(f);
        }
        let cond = match &etag {
            Some(e) => Cond::Is(e),
            None => Cond::Absent,
        };
        match c.put(object, cond, &doc) {
            Ok(r) if (200..300).contains(&r.status) => return Ok(Begun::Started),
            // Another writer came in between (412, 409), or the outcome is unknown (5xx, a
            // transport failure): read again, and find ours there or try again.
            Ok(r) if matches!(r.status, 409 | 412) || r.status >= 500 => {}
            Ok(r) => return Err(Failed::Refused(r)),
            Err(e) if crate::backend::net::is_signalled(&e) => return Err(Failed::Transport(e)),
            Err(_) => {}
        }
    }
    Err(Failed::Other(format!(
        "the history object {object} kept changing under {TRIES} tries"
    )))
}

/// Before try number `tried` (from 1) of a write that met another writer or an unknown
/// outcome: a jittered pause that doubles from 5–15 ms up to 80–240 ms, so that writers who
/// collided, and a server that answered 5xx, are not met again at once; never past `until`.
fn pause(tried: usize, until: Option<BootInstant>) {
    let base = 10u64 << tried.saturating_sub(1).min(4);
    let nap = Duration::from_millis(crate::backend::support::jitter_ms(base / 2, base * 3 / 2));
    let nap = until.map_or(nap, |u| nap.min(u.remaining()));
    std::thread::sleep(nap);
}

/// The newest start in `events` with a time that counts for a window of `d`
/// ([`crate::history::age`]), and its age at `now`.
fn newest_start(events: &[String], now: u64, d: Duration) -> Option<(Stored, Duration)> {
    events
        .iter()
        .map(|l| Stored::from_line(l.as_bytes()))
        .filter(|s| RunEvent::read(s).is_some_and(|e| e.ev == "start"))
        .filter_map(|s| {
            let ago = crate::history::age(now, s.at_ms?, d)?;
            Some((s, ago))
        })
        .min_by_key(|(_, ago)| *ago)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn start(run: &str) -> Vec<u8> {
        format!(r#"{{"run":"{run}","ev":"start","pid":1}}"#).into_bytes()
    }

    #[test]
    fn documents_round_trip_newest_first() {
        let a = String::from_utf8(Stored::line(1, &start("a"))).unwrap();
        let b = String::from_utf8(Stored::line(2, &start("b"))).unwrap();
        let doc = Doc::parse(&render(std::slice::from_ref(&a), &b));
        assert_eq!(doc, Doc::Events(vec![a, b]));
        let s = doc.stored();
        assert_eq!((s[0].at_ms, s[1].at_ms), (Some(2), Some(1)));
        assert_eq!(Doc::Absent.stored(), vec![]);
        assert_eq!(object_of("p/k.lock"), "p/k.history");
    }

    #[test]
    fn documents_are_bounded_in_count_and_bytes() {
        let many: Vec<String> = (0..300).map(|i| format!("{i} x")).collect();
        let Doc::Events(e) = Doc::parse(&render(&many, "new")) else {
            panic!()
        };
        assert_eq!(e.len(), MAX_EVENTS);
        assert_eq!(e.last().map(String::as_str), Some("new"));
        let big: Vec<String> = (0..200)
            .map(|i| format!("{i} {}", "\"".repeat(4000)))
            .collect();
        let doc = render(&big, "new");
        assert!(doc.len() <= MAX_DOC, "{}", doc.len());
        assert!(matches!(Doc::parse(&doc), Doc::Events(e) if e.len() > 10));
    }

    #[test]
    fn a_start_within_the_window_is_found_by_time() {
        let d = Duration::from_secs(10);
        let lines: Vec<String> = [(5_000, "a"), (9_000, "b"), (1_000, "c")]
            .iter()
            .map(|(t, r)| String::from_utf8(Stored::line(*t, &start(r))).unwrap())
            .collect();
        let (s, ago) = newest_start(&lines, 10_000, d).unwrap();
        assert_eq!((s.at_ms, ago), (Some(9_000), Duration::from_secs(1)));
        // Far in the future: does not count; no time: does not count.
        let odd = vec![
            String::from_utf8(Stored::line(99_000, &start("f"))).unwrap(),
            format!("x {}", String::from_utf8(start("n")).unwrap()),
        ];
        assert!(newest_start(&odd, 10_000, d).is_none());
    }

    #[test]
    fn other_objects_are_unreadable_records() {
        assert!(matches!(Doc::parse(b"not json"), Doc::Unreadable(_)));
        assert!(matches!(
            Doc::parse(br#"{"dlock":2,"events":[]}"#),
            Doc::Unreadable(_)
        ));
        assert!(matches!(
            Doc::parse(br#"{"dlock":1,"events":{}}"#),
            Doc::Unreadable(_)
        ));
        let Doc::Events(e) = Doc::parse(br#"{"dlock":1,"events":["1 {}",7,null]}"#) else {
            panic!()
        };
        assert_eq!(e, ["1 {}", "7", "null"]);
        let Doc::Unreadable(b) = Doc::parse(&vec![b'x'; 100_000]) else {
            panic!()
        };
        assert_eq!(b.len(), MAX_EVENT_BYTES + 1);
    }

    proptest! {
        #[test]
        fn server_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024), text in "\\PC{0,300}") {
            for b in [bytes.clone(), text.clone().into_bytes(), format!(r#"{{"dlock":1,"events":["{text}",{text}]}}"#).into_bytes()] {
                let doc = Doc::parse(&b);
                let stored = doc.stored();
                if let Doc::Events(e) = &doc {
                    let _ = newest_start(e, u64::MAX, Duration::MAX);
                    let _ = newest_start(e, 0, Duration::ZERO);
                    let _ = render(e, &text);
                }
                for s in &stored {
                    let _ = RunEvent::read(s);
                }
            }
        }
    }
}
