//! `dlock check`: a monitoring plugin (docs/monitoring.md) by the conventions of Nagios, Icinga,
//! Sensu and Zabbix agents — exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, one line on stdout
//! (`DLOCK OK - …`) with perfdata after `|`.
//!
//! It reads each key's history as `dlock log` does (bounded by the history's caps) and, only
//! when the newest run has no end, the lock's status, to tell a running run from a dead one.
//! Everything from the server is escaped ([`clean`]) and kept out of the perfdata syntax.

use std::io::Write;
use std::time::Duration;

use crate::backend::{self, Backend};
use crate::config::CheckConfig;
use crate::history::{Run, merge, show};
use crate::model::Key;
use crate::report::{MAX_FIELD, clean, short_duration};

/// The longest host name shown, in characters.
const MAX_HOST: usize = 64;

/// A plugin state; the order is "worse": CRITICAL, then UNKNOWN (a key that cannot be judged
/// may be critical: it must not look better than a WARNING), then WARNING, then OK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Ok,
    Warning,
    Unknown,
    Critical,
}

impl State {
    /// The exit code the plugin conventions give it.
    pub(crate) fn code(self) -> u8 {
        match self {
            State::Ok => 0,
            State::Warning => 1,
            State::Critical => 2,
            State::Unknown => 3,
        }
    }

    fn word(self) -> &'static str {
        match self {
            State::Ok => "OK",
            State::Warning => "WARNING",
            State::Critical => "CRITICAL",
            State::Unknown => "UNKNOWN",
        }
    }

    fn rank(self) -> u8 {
        match self {
            State::Ok => 0,
            State::Warning => 1,
            State::Unknown => 2,
            State::Critical => 3,
        }
    }
}

/// The ages a check judges against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max_age: Duration,
    pub warn_age: Option<Duration>,
}

/// One key's verdict: its state, its part of the status line, and its perfdata values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub state: State,
    pub text: String,
    /// How long ago the newest run started, in milliseconds.
    pub age_ms: Option<u64>,
    /// How long the newest run took, if it ended.
    pub duration_ms: Option<u64>,
}

/// `dlock check [BACKEND] -k KEY… --max-age D [--warn-age W]`.
pub(crate) fn check(cfg: &CheckConfig) -> u8 {
    crate::report::set_verbosity(cfg.verbosity);
    let (target, keys) = (&cfg.target, &cfg.keys);
    let limits = Limits {
        max_age: cfg.max_age,
        warn_age: cfg.warn_age,
    };
    let b = match backend::open_existing(target) {
        Ok(b) => b,
        Err(e) => return print_line(State::Unknown, &error_text(target.kind.name(), &e), ""),
    };
    let mut verdicts = Vec::with_capacity(keys.len());
    for key in keys {
        match judge_key(b.as_ref(), key) {
            Ok((run, running)) => verdicts.push(judge(
                key,
                run.as_ref(),
                running,
                crate::history::now_ms(),
                limits,
            )),
            // The backend did not answer: the next key would wait as long for the same.
            Err(e) => return print_line(State::Unknown, &e, ""),
        }
    }
    let (state, text, perf) = summary(&verdicts, keys, limits);
    print_line(state, &text, &perf)
}

/// A usage error: `DLOCK UNKNOWN - usage: …`, exit 3 (a plugin never exits 2 for its own
/// mistake: that would read as CRITICAL).
pub(crate) fn usage(message: &str) -> u8 {
    let text = crate::report::without_secrets(&crate::report::plain(message.to_string()));
    print_line(State::Unknown, &format!("usage: {text}"), "")
}

/// Prints `DLOCK STATE - text | perf` and returns the state's exit code.
fn print_line(state: State, text: &str, perf: &str) -> u8 {
    let line = status_line(state, text, perf);
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
    state.code()
}

/// `DLOCK STATE - text | perf` and a line feed.
fn status_line(state: State, text: &str, perf: &str) -> String {
    let mut line = format!("DLOCK {} - {}", state.word(), out_of_syntax(text));
    if !perf.is_empty() {
        line.push_str(" | ");
        line.push_str(perf);
    }
    line.push('\n');
    line
}

/// `text` made one line that cannot end the status text early: control characters escaped,
/// `|` (which starts the perfdata) shown as `¦`.
fn out_of_syntax(text: &str) -> String {
    clean(text, 16 * 1024).replace('|', "¦")
}

/// An error as one line, without secrets or error numbers.
fn error_text(backend: &str, e: &anyhow::Error) -> String {
    crate::report::without_secrets(&crate::report::plain(format!("{backend}: {e:#}")))
}

/// `key`'s newest run and whether it is running (its process holds the lock now: asked only
/// for a run without an end), or why they could not be read.
fn judge_key(b: &dyn Backend, key: &Key) -> Result<(Option<Run>, bool), String> {
    let failed = |what: &str, e: &anyhow::Error| {
        format!(
            "cannot read {what} of {}: {}",
            quoted(key),
            error_text(b.kind().name(), e)
        )
    };
    let newest = match b.runs(key) {
        Ok(stored) => merge(&stored, 1).pop(),
        Err(e) => return Err(failed("the run history", &e)),
    };
    let running = match &newest {
        Some(r) if r.state == "no end recorded" => match b.status(key) {
            Ok(s) => show::is_running(r, s.holders.first()),
            Err(e) => return Err(failed("the lock's status", &e)),
        },
        _ => false,
    };
    Ok((newest, running))
}

/// `'key'`, escaped.
fn quoted(key: &Key) -> String {
    format!("'{}'", clean(key.as_str(), MAX_FIELD))
}

/// The verdict on `key` whose newest run is `run` (`running`: its process holds the lock now),
/// at `now_ms` by this host's clock.
pub(crate) fn judge(
    key: &Key,
    run: Option<&Run>,
    running: bool,
    now_ms: u64,
    limits: Limits,
) -> Verdict {
    let name = quoted(key);
    let verdict = |state, text: String| Verdict {
        state,
        text,
        age_ms: None,
        duration_ms: None,
    };
    let Some(run) = run else {
        return verdict(
            State::Critical,
            format!("{name} never ran (no run recorded)"),
        );
    };
    if let Some(u) = &run.unreadable {
        return verdict(
            State::Unknown,
            format!(
                "{name}: the newest history record is unreadable ({})",
                clean(u, MAX_FIELD)
            ),
        );
    }
    let Some(started) = run.started_ms else {
        return verdict(
            State::Unknown,
            format!("{name}: the newest run has no start time"),
        );
    };
    // A start ahead of this host's clock by less than --max-age is a skew: just now. Farther
    // ahead, it cannot be judged by age, and a forged one must not silence the check.
    let Some(age) = crate::history::age(now_ms, started, limits.max_age) else {
        let ahead = Duration::from_millis(started.saturating_sub(now_ms));
        return verdict(
            State::Critical,
            format!(
                "{name}'s newest run started {} in the future (the clocks disagree?)",
                short_duration(ahead)
            ),
        );
    };
    let ago = short_duration(age);
    let host = run
        .host
        .as_deref()
        .map(|h| format!(" on {}", clean(h, MAX_HOST)))
        .unwrap_or_default();
    let took = run
        .duration_ms
        .map(|ms| format!(" after {}", short_duration(Duration::from_millis(ms))))
        .unwrap_or_default();
    let (mut state, mut text) = match (run.state, &run.ending) {
        ("no end recorded", _) if running => (
            State::Ok,
            format!("{name} is running{host}, started {ago} ago"),
        ),
        ("no end recorded", _) => (
            State::Critical,
            format!(
                "{name} started {ago} ago{host} and no end was recorded (killed, or its host \
                 died); it no longer holds the lock"
            ),
        ),
        ("ended", Some(e)) if succeeded(e) => (
            State::Ok,
            format!("{name} ran {ago} ago{host} (exit 0{took})"),
        ),
        ("ended", Some(e)) => (
            State::Critical,
            format!(
                "{name} failed {ago} ago{host} ({}{took})",
                show::ending_text(e)
            ),
        ),
        _ => (
            State::Critical,
            format!("{name} ended {ago} ago{host}, how was not recorded"),
        ),
    };
    if age > limits.max_age {
        state = State::Critical;
        text.push_str(&format!(
            ", longer ago than {}",
            humantime::format_duration(limits.max_age)
        ));
    } else if let Some(w) = limits.warn_age.filter(|w| age > *w)
        && state == State::Ok
    {
        state = State::Warning;
        text.push_str(&format!(
            ", longer ago than {}",
            humantime::format_duration(w)
        ));
    }
    Verdict {
        state,
        text,
        age_ms: Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
        duration_ms: run.duration_ms.filter(|_| run.state == "ended"),
    }
}

/// A run that ended well: exit 0, no signal, the lock kept.
fn succeeded(e: &crate::history::Ending) -> bool {
    e.code == Some(0) && e.signal.is_none() && e.lost.is_none()
}

/// The worst state, the status text (worst keys first) and the perfdata.
pub(crate) fn summary(
    verdicts: &[Verdict],
    keys: &[Key],
    limits: Limits,
) -> (State, String, String) {
    let state = verdicts
        .iter()
        .map(|v| v.state)
        .max_by_key(|s| s.rank())
        .unwrap_or(State::Unknown);
    let mut order: Vec<usize> = (0..verdicts.len()).collect();
    // Stable: among equals, the keys in the order given.
    order.sort_by_key(|&i| std::cmp::Reverse(verdicts[i].state.rank()));
    let text: Vec<&str> = order.iter().map(|&i| verdicts[i].text.as_str()).collect();
    let mut perf = Vec::new();
    let thresholds = format!(
        ";{};{};0",
        limits
            .warn_age
            .map(|w| seconds(ms_of(w)))
            .unwrap_or_default(),
        seconds(ms_of(limits.max_age))
    );
    for (v, key) in verdicts.iter().zip(keys) {
        let label = |what: &str| {
            if keys.len() == 1 {
                what.to_string()
            } else {
                perf_label(&format!("{} {what}", key.as_str()))
            }
        };
        if let Some(age) = v.age_ms {
            perf.push(format!("{}={}s{thresholds}", label("age"), seconds(age)));
        }
        if let Some(d) = v.duration_ms {
            perf.push(format!("{}={}s;;;0", label("duration"), seconds(d)));
        }
    }
    (state, text.join("; "), perf.join(" "))
}

fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds as seconds, exactly: "42", "0.012", "1.5".
pub(crate) fn seconds(ms: u64) -> String {
    let (s, frac) = (ms / 1000, ms % 1000);
    if frac == 0 {
        s.to_string()
    } else {
        format!("{s}.{frac:03}").trim_end_matches('0').to_string()
    }
}

/// A perfdata label by the plugin guidelines: in single quotes, a quote doubled; `=` (which
/// ends a label) and `|` as `_`; cut to 128 characters.
pub(crate) fn perf_label(text: &str) -> String {
    let inner: String = clean(text, 128)
        .chars()
        .map(|c| match c {
            '=' | '|' => '_',
            c => c,
        })
        .collect();
    format!("'{}'", inner.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Ending;

    const NOW: u64 = 1_800_000_000_000;

    fn limits() -> Limits {
        Limits {
            max_age: Duration::from_secs(3600),
            warn_age: Some(Duration::from_secs(600)),
        }
    }

    fn run(ago_s: u64, ending: Option<Ending>) -> Run {
        Run {
            run: "r".into(),
            state: if ending.is_some() {
                "ended"
            } else {
                "no end recorded"
            },
            host: Some("web-2|x".into()),
            started_ms: Some(NOW - ago_s * 1000),
            duration_ms: ending.as_ref().map(|_| 42_000),
            ending,
            ..Run::default()
        }
    }

    fn exit(code: i64) -> Option<Ending> {
        Some(Ending {
            code: Some(code),
            ..Ending::default()
        })
    }

    fn key(k: &str) -> Key {
        Key::new(k).unwrap()
    }

    #[test]
    fn each_state_by_its_rule() {
        let k = key("nightly");
        let j = |r: Option<&Run>, running| judge(&k, r, running, NOW, limits());
        let ok = j(Some(&run(60, exit(0))), false);
        assert_eq!(ok.state, State::Ok, "{ok:?}");
        assert_eq!(
            ok.text,
            "'nightly' ran 1m00s ago on web-2|x (exit 0 after 42s)"
        );
        assert_eq!((ok.age_ms, ok.duration_ms), (Some(60_000), Some(42_000)));
        assert_eq!(j(Some(&run(700, exit(0))), false).state, State::Warning);
        assert_eq!(j(Some(&run(3601, exit(0))), false).state, State::Critical);
        let failed = j(Some(&run(60, exit(3))), false);
        assert_eq!(failed.state, State::Critical);
        assert!(failed.text.contains("failed") && failed.text.contains("exit 3"));
        assert_eq!(j(None, false).state, State::Critical);
        // No end: running counts by its start; dead is critical.
        assert_eq!(j(Some(&run(60, None)), true).state, State::Ok);
        assert_eq!(j(Some(&run(700, None)), true).state, State::Warning);
        assert_eq!(j(Some(&run(4000, None)), true).state, State::Critical);
        let dead = j(Some(&run(60, None)), false);
        assert_eq!(dead.state, State::Critical);
        assert!(dead.text.contains("no end was recorded"), "{dead:?}");
        // A signal or a loss is a failure whatever the code says.
        let mut signalled = run(60, exit(0));
        signalled.ending.as_mut().unwrap().signal = Some(9);
        assert_eq!(j(Some(&signalled), false).state, State::Critical);
        let mut lost = run(60, exit(0));
        lost.ending.as_mut().unwrap().lost = Some("expired".into());
        assert_eq!(j(Some(&lost), false).state, State::Critical);
        // A start far in the future is critical; a little ahead is a skew.
        let mut ahead = run(0, exit(0));
        ahead.started_ms = Some(NOW + 4_000_000);
        assert_eq!(j(Some(&ahead), false).state, State::Critical);
        ahead.started_ms = Some(NOW + 5_000);
        assert_eq!(j(Some(&ahead), false).state, State::Ok);
        let unreadable = Run {
            state: "unreadable",
            unreadable: Some("3 bytes: x".into()),
            ..Run::default()
        };
        assert_eq!(j(Some(&unreadable), false).state, State::Unknown);
    }

    #[test]
    fn the_worst_state_wins_and_perfdata_follows_the_guidelines() {
        let keys = [key("a b"), key("it's=1|2")];
        let v = [
            judge(&keys[0], Some(&run(60, exit(0))), false, NOW, limits()),
            judge(&keys[1], None, false, NOW, limits()),
        ];
        let (state, text, perf) = summary(&v, &keys, limits());
        assert_eq!(state, State::Critical);
        assert!(text.starts_with("'it's=1|2' never ran"), "{text}");
        assert_eq!(perf, "'a b age'=60s;600;3600;0 'a b duration'=42s;;;0");
        let (_, _, one) = summary(&v[..1], &keys[..1], limits());
        assert_eq!(one, "age=60s;600;3600;0 duration=42s;;;0");
        assert_eq!(perf_label("it's=1|2 age"), "'it''s_1_2 age'");
        // CRITICAL outranks UNKNOWN, which outranks WARNING.
        let mut w = v[0].clone();
        w.state = State::Warning;
        let mut u = v[0].clone();
        u.state = State::Unknown;
        assert_eq!(summary(&[w.clone(), u], &keys, limits()).0, State::Unknown);
        assert_eq!(
            summary(&[w, v[1].clone()], &keys, limits()).0,
            State::Critical
        );
        assert_eq!(out_of_syntax("a|b\nc"), "a¦b\\nc");
        assert_eq!(
            (seconds(42_000), seconds(12), seconds(1_500)),
            ("42".into(), "0.012".into(), "1.5".into())
        );
    }

    proptest::proptest! {
        #[test]
        fn any_key_host_or_ending_gives_one_line_with_its_perfdata_after_one_bar(
            keys in proptest::collection::vec("[^\\p{Cc}]{1,40}", 1..4),
            host in proptest::option::of("(?s).{0,300}"),
            lost in proptest::option::of("(?s).{0,300}"),
            code in proptest::option::of(proptest::num::i64::ANY),
            started in proptest::option::of(proptest::num::u64::ANY),
            duration in proptest::option::of(proptest::num::u64::ANY),
        ) {
            let keys: Vec<Key> = keys.iter().filter_map(|k| Key::new(k).ok()).collect();
            let mut r = run(0, Some(Ending { code, lost, ..Ending::default() }));
            r.host = host;
            r.started_ms = started;
            r.duration_ms = duration;
            let v: Vec<Verdict> =
                keys.iter().map(|k| judge(k, Some(&r), false, NOW, limits())).collect();
            let (state, text, perf) = summary(&v, &keys, limits());
            let line = status_line(state, &text, &perf);
            proptest::prop_assert_eq!(line.matches('\n').count(), 1);
            proptest::prop_assert!(line.ends_with('\n'));
            proptest::prop_assert!(line.matches('|').count() <= 1, "{}", line);
            proptest::prop_assert!(!line.chars().any(|c| c.is_control() && c != '\n'));
        }
    }
}
