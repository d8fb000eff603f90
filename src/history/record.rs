//! History events as written and read back, and [`merge`], which pairs them into runs. What is
//! read back is untrusted: an event over [`MAX_EVENT_BYTES`](super::MAX_EVENT_BYTES) is never
//! parsed, every string is cut, every number is checked, nothing panics (the property test
//! below feeds it arbitrary bytes).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{MAX_EVENT_BYTES, MAX_EVENTS};
use crate::model::Record;
use crate::report::MAX_FIELD;

/// One stored event: its JSON `body`, and when the backend stored it by its own clock
/// (milliseconds since the Unix epoch), where it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub at_ms: Option<u64>,
    pub body: Vec<u8>,
}

impl Stored {
    /// An event stored as one line `MS BODY` (the file backend's history file, Redis's list):
    /// split at the first space; a time that is not a number (a torn or forged line) is
    /// `None`, and a line without a space is all body. Any bytes read without panic.
    pub(crate) fn from_line(line: &[u8]) -> Stored {
        let (at, body) = match line.iter().position(|&b| b == b' ') {
            Some(i) => (
                line.get(..i).unwrap_or_default(),
                line.get(i + 1..).unwrap_or_default(),
            ),
            None => (&line[..0], line),
        };
        Stored {
            at_ms: std::str::from_utf8(at).ok().and_then(|t| t.parse().ok()),
            body: body.to_vec(),
        }
    }

    /// The line [`Stored::from_line`] reads back: `MS BODY` (no newline).
    pub(crate) fn line(at_ms: u64, body: &[u8]) -> Vec<u8> {
        let mut l = format!("{at_ms} ").into_bytes();
        l.extend_from_slice(body);
        l
    }
}

/// A start or an end event, as dlock writes it (every field optional when read back).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunEvent {
    /// The run's id (16 hex digits), shared by its start and end.
    #[serde(default)]
    pub run: String,
    /// "start" or "end".
    #[serde(default)]
    pub ev: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The effective uid: `user` comes from the environment, which anyone can set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fencing token the run held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The writing host's clock, for backends without one of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ms: Option<u64>,
    /// How the run ended (end events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ending: Option<Ending>,
}

/// How a run ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ending {
    /// dlock's exit code for the run (the command's, 128+N for a signal, 79 for a loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// The signal that killed the command, or that stopped dlock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i64>,
    /// The lock was lost while the command ran: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
    /// Anything else worth saying ("stopped by SIGTERM", "the owner exited", ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Who runs this: `$USER` (or `$LOGNAME`) when set, as login, cron, sudo and systemd set it;
/// otherwise the password database's name for the effective uid. (The lookup costs a look at
/// nsswitch.conf, nscd's socket and /etc/passwd: a tenth of an uncontended run's overhead.)
fn user() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .or_else(crate::sys::user_name)
}

impl RunEvent {
    /// The start of run `id` by `holder`.
    pub(crate) fn start(
        id: &str,
        holder: &Record,
        token: Option<u64>,
        max_command: usize,
    ) -> RunEvent {
        RunEvent {
            run: id.to_string(),
            ev: "start".into(),
            host: holder.host.clone(),
            pid: holder.pid.map(u64::from),
            user: user().map(|u| u.chars().take(MAX_FIELD).collect()),
            uid: Some(crate::sys::euid()),
            command: holder
                .command
                .as_ref()
                .map(|c| c.chars().take(max_command).collect()),
            reason: holder.reason.clone(),
            token,
            host_ms: Some(super::now_ms()),
            ending: None,
        }
    }

    /// The end of run `id`.
    pub(crate) fn end(id: &str, ending: Ending) -> RunEvent {
        RunEvent {
            run: id.to_string(),
            ev: "end".into(),
            host_ms: Some(super::now_ms()),
            ending: Some(ending),
            ..RunEvent::default()
        }
    }

    /// The event in `s`, if it is one dlock could have written.
    pub(crate) fn read(s: &Stored) -> Option<RunEvent> {
        if s.body.len() > MAX_EVENT_BYTES {
            return None;
        }
        let e: RunEvent = serde_json::from_slice(&s.body).ok()?;
        let id_ok = !e.run.is_empty() && e.run.len() <= 64;
        (id_ok && (e.ev == "start" || e.ev == "end")).then_some(e)
    }
}

/// One run as `dlock log` shows it: a start and, if recorded, its end. Strings are cut to
/// [`MAX_FIELD`] characters (`--json` keeps them otherwise exact; text escapes them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Run {
    pub run: String,
    /// "ended", "running", "no end recorded" (killed with SIGKILL, or its host died), or
    /// "unreadable" (a stored event that is not one dlock writes).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The effective uid the run had (its `user` is what its environment said).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Start and end, in milliseconds since the Unix epoch: by the backend's clock where it has
    /// one, else by the writing host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ending: Option<Ending>,
    /// For an unreadable event: its size and its first bytes, cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

fn cut(s: Option<String>) -> Option<String> {
    s.map(|s| {
        if s.chars().count() > MAX_FIELD {
            s.chars()
                .take(MAX_FIELD)
                .chain(std::iter::once('…'))
                .collect()
        } else {
            s
        }
    })
}

fn cut_ending(e: Ending) -> Ending {
    Ending {
        lost: cut(e.lost),
        note: cut(e.note),
        ..e
    }
}

/// The runs in `stored` (newest first, as backends return them), newest first, at most `n`:
/// each start paired with the end of the same id; ends whose start was pruned are dropped; an
/// event that does not read is a run of its own, "unreadable". Looks at no more than
/// [`MAX_EVENTS`] events.
pub(crate) fn merge(stored: &[Stored], n: usize) -> Vec<Run> {
    let stored = &stored[..stored.len().min(MAX_EVENTS)];
    let events: Vec<(Option<RunEvent>, &Stored)> =
        stored.iter().map(|s| (RunEvent::read(s), s)).collect();
    let mut ends: HashMap<&str, (&RunEvent, Option<u64>)> = HashMap::new();
    for (e, s) in &events {
        if let Some(e) = e.as_ref().filter(|e| e.ev == "end") {
            // Newest first: keep the first end seen (a duplicate end is a retried write).
            ends.entry(e.run.as_str()).or_insert((e, s.at_ms));
        }
    }
    let mut runs = Vec::new();
    for (e, s) in &events {
        if runs.len() >= n {
            break;
        }
        match e {
            None => runs.push(unreadable(s)),
            Some(e) if e.ev == "start" => {
                let started = s.at_ms.or(e.host_ms);
                let end = ends.get(e.run.as_str()).copied();
                let ended = end.and_then(|(ee, at)| at.or(ee.host_ms));
                // Both by the backend's clock, else both by the hosts'.
                let duration_ms = end.and_then(|(ee, at)| match (at, s.at_ms) {
                    (Some(b), Some(a)) => b.checked_sub(a),
                    _ => ee.host_ms?.checked_sub(e.host_ms?),
                });
                runs.push(Run {
                    run: cut(Some(e.run.clone())).unwrap_or_default(),
                    state: if end.is_some() {
                        "ended"
                    } else {
                        "no end recorded"
                    },
                    host: cut(e.host.clone()),
                    pid: e.pid,
                    user: cut(e.user.clone()),
                    uid: e.uid,
                    command: cut(e.command.clone()),
                    reason: cut(e.reason.clone()),
                    token: e.token,
                    started_ms: started,
                    ended_ms: ended,
                    duration_ms,
                    ending: end.and_then(|(ee, _)| ee.ending.clone()).map(cut_ending),
                    unreadable: None,
                });
            }
            Some(_) => {}
        }
    }
    runs
}

/// An event that does not read: its size (or that it is over the cap: backends may cut one
/// that is, on the server, to bound the reply) and its first bytes.
fn unreadable(s: &Stored) -> Run {
    let head = &s.body[..s.body.len().min(MAX_FIELD)];
    let size = if s.body.len() > MAX_EVENT_BYTES {
        format!("over the {MAX_EVENT_BYTES}-byte cap")
    } else {
        format!("{} bytes", s.body.len())
    };
    Run {
        state: "unreadable",
        started_ms: s.at_ms,
        unreadable: Some(format!(
            "{size}: {}",
            cut(Some(String::from_utf8_lossy(head).into_owned())).unwrap_or_default()
        )),
        ..Run::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn any_line_reads_without_panic(line in proptest::collection::vec(proptest::num::u8::ANY, 0..96)) {
            let s = Stored::from_line(&line);
            proptest::prop_assert!(s.body.len() <= line.len());
        }

        #[test]
        fn a_written_line_reads_back(at in proptest::num::u64::ANY, body in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let s = Stored::from_line(&Stored::line(at, &body));
            proptest::prop_assert_eq!(s.at_ms, Some(at));
            proptest::prop_assert_eq!(s.body, body);
        }
    }

    #[test]
    fn lines_split_at_the_first_space() {
        let s = Stored::from_line(b"1700000000000 {\"run\":\"a b\"}");
        assert_eq!(s.at_ms, Some(1_700_000_000_000));
        assert_eq!(s.body, b"{\"run\":\"a b\"}");
        let s = Stored::from_line(b"nonsense");
        assert_eq!((s.at_ms, s.body.as_slice()), (None, &b"nonsense"[..]));
        assert_eq!(Stored::from_line(b"-5 x").at_ms, None);
    }

    fn stored(at: u64, body: &str) -> Stored {
        Stored {
            at_ms: Some(at),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn starts_pair_with_their_ends_newest_first() {
        let events = [
            stored(300, r#"{"run":"b","ev":"start","host":"h2","pid":2}"#),
            stored(250, r#"{"run":"a","ev":"end","ending":{"code":3}}"#),
            stored(100, r#"{"run":"a","ev":"start","host":"h1","pid":1}"#),
        ];
        let runs = merge(&events, 10);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].run, "b");
        assert_eq!(runs[0].state, "no end recorded");
        assert_eq!(runs[1].state, "ended");
        assert_eq!(runs[1].duration_ms, Some(150));
        assert_eq!(runs[1].ending.as_ref().unwrap().code, Some(3));
        assert_eq!(merge(&events, 1).len(), 1);
    }

    #[test]
    fn oversized_and_foreign_events_are_unreadable_not_read() {
        let big = format!(
            r#"{{"run":"x","ev":"start","host":"{}"}}"#,
            "h".repeat(5000)
        );
        let runs = merge(&[stored(1, &big), stored(2, "\x1b[2Jnot json")], 10);
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().all(|r| r.state == "unreadable"));
        assert!(
            runs[0]
                .unreadable
                .as_ref()
                .unwrap()
                .starts_with("over the 4096-byte cap: {")
        );
        assert!(runs[0].unreadable.as_ref().unwrap().chars().count() < 300);
    }

    proptest::proptest! {
        #[test]
        fn any_stored_bytes_merge_without_panic(
            events in proptest::collection::vec(
                (proptest::option::of(proptest::num::u64::ANY),
                 proptest::collection::vec(proptest::num::u8::ANY, 0..200)), 0..20),
            starts in proptest::collection::vec(
                (proptest::option::of(proptest::num::u64::ANY), "[ab]", "start|end",
                 proptest::option::of(proptest::num::u64::ANY), "\\PC{0,300}"), 0..20),
        ) {
            let mut all: Vec<Stored> = events
                .into_iter()
                .map(|(at_ms, body)| Stored { at_ms, body })
                .collect();
            for (at_ms, run, ev, host_ms, host) in starts {
                let body = serde_json::json!({"run": run, "ev": ev, "host_ms": host_ms, "host": host,
                    "ending": {"code": host_ms, "lost": host}});
                all.push(Stored { at_ms, body: body.to_string().into_bytes() });
            }
            for r in merge(&all, 50) {
                let text = super::super::show::line(&r, None);
                proptest::prop_assert!(!text.chars().any(|c| c.is_control()));
                proptest::prop_assert!(text.chars().count() < 8 * MAX_FIELD);
            }
        }
    }
}
