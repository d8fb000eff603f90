//! How runs are shown: `dlock log`'s lines, `status`'s last run, the `--once-per` skip line.
//! Everything read from a backend goes through [`clean`] before a terminal.

use std::time::Duration;

use super::record::{Ending, Run, RunEvent, Stored};
use crate::model::{Holder, Key};
use crate::report::{MAX_FIELD, clean, short_duration, since_text};

/// "skipped: 'report' started 1.8s ago on web-2 pid 4242 (once per 50m)".
pub(crate) fn skip_line(key: &Key, last: &Stored, ago: Duration, once_per: Duration) -> String {
    let by = RunEvent::read(last)
        .map(|e| {
            let host = e.host.as_deref().map(|h| clean(h, MAX_FIELD));
            match (host, e.pid) {
                (Some(h), Some(p)) => format!(" on {h} pid {p}"),
                (Some(h), None) => format!(" on {h}"),
                (None, Some(p)) => format!(" by pid {p}"),
                (None, None) => String::new(),
            }
        })
        .unwrap_or_default();
    format!(
        "skipped: '{}' started {} ago{by} (once per {})",
        clean(key.as_str(), MAX_FIELD),
        ago_text(ago),
        humantime::format_duration(once_per)
    )
}

/// "1.8s", "340ms", "12m05s".
fn ago_text(d: Duration) -> String {
    if d >= Duration::from_secs(1) && d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        short_duration(d)
    }
}

/// How a run ended, in a few words: "exit 0", "exit 143 (SIGTERM)", "lost (exit 79): ...".
pub(crate) fn ending_text(e: &Ending) -> String {
    let code = e
        .code
        .map_or_else(|| "exit ?".to_string(), |c| format!("exit {c}"));
    let mut text = match (&e.lost, e.signal) {
        (Some(why), _) => format!("lock lost ({code}): {}", clean(why, MAX_FIELD)),
        (None, Some(sig)) => {
            let name = i32::try_from(sig)
                .ok()
                .filter(|s| (1..=64).contains(s))
                .map_or_else(|| format!("signal {sig}"), crate::exit::signal_name);
            format!("{code} (killed by {name})")
        }
        (None, None) => code,
    };
    if let Some(note) = &e.note {
        text.push_str(&format!(", {}", clean(note, MAX_FIELD)));
    }
    text
}

/// The state of `run`, taking the current holder into account: a run without an end whose
/// process holds the lock now is running, not dead.
fn state_text(run: &Run, holder: Option<&Holder>) -> String {
    match (run.state, &run.ending) {
        ("ended", Some(e)) => ending_text(e),
        ("ended", None) => "ended (how not recorded)".into(),
        ("no end recorded", _) if is_running(run, holder) => "running".into(),
        (state, _) => state.into(),
    }
}

/// Whether `run` is the run of `holder`, the lock's current holder. On this host, its process
/// must also be alive: after `kill -9` of dlock a lease lives on until it runs out, and the run
/// is over.
pub(crate) fn is_running(run: &Run, holder: Option<&Holder>) -> bool {
    let Some(h) = holder else { return false };
    let same = run.state == "no end recorded"
        && run.pid.is_some()
        && run.pid == h.pid.map(u64::from)
        && run.host.as_deref() == h.host.as_deref();
    if !same || run.host.as_deref() != Some(crate::sys::hostname().as_str()) {
        return same;
    }
    run.pid
        .and_then(|p| libc::pid_t::try_from(p).ok())
        .and_then(crate::procs::Proc::of)
        .is_some_and(|p| p.is_running())
}

/// One run on one line: start, where, how long, how it ended, token, command, reason.
pub(crate) fn line(run: &Run, holder: Option<&Holder>) -> String {
    if let Some(u) = &run.unreadable {
        let at = run.started_ms.map(since_text).unwrap_or_else(|| "-".into());
        return format!("{at}  unreadable record ({})", clean(u, MAX_FIELD));
    }
    let at = run.started_ms.map(since_text).unwrap_or_else(|| "-".into());
    let mut who = run
        .host
        .as_deref()
        .map(|h| clean(h, MAX_FIELD))
        .unwrap_or_else(|| "?".into());
    if let Some(p) = run.pid {
        who.push_str(&format!(" pid {p}"));
    }
    if let Some(u) = &run.user {
        who.push_str(&format!(" ({})", clean(u, MAX_FIELD)));
    }
    let took = run
        .duration_ms
        .map(|ms| short_duration(Duration::from_millis(ms)))
        .unwrap_or_else(|| "-".into());
    let mut text = format!("{at}  {who}  {took}  {}", state_text(run, holder));
    if let Some(t) = run.token {
        text.push_str(&format!("  token {t}"));
    }
    if let Some(c) = &run.command {
        text.push_str(&format!("  {}", clean(c, MAX_FIELD)));
    }
    if let Some(r) = &run.reason {
        text.push_str(&format!("  ({})", clean(r, MAX_FIELD)));
    }
    text
}

/// `dlock log` for humans.
pub(crate) fn log_text(key: &Key, location: &str, runs: &[Run], holder: Option<&Holder>) -> String {
    let key = clean(key.as_str(), MAX_FIELD);
    if runs.is_empty() {
        return format!("no run of '{key}' recorded on {location}\n");
    }
    let mut out = format!("runs of '{key}' on {location}, newest first:\n");
    for r in runs {
        out.push_str("  ");
        out.push_str(&line(r, holder));
        out.push('\n');
    }
    out
}

/// The last run, for `status`'s list: "exit 0, 3m ago", "running", "-".
pub(crate) fn last_run_cell(run: Option<&Run>, holder: Option<&Holder>) -> String {
    let Some(run) = run else { return "-".into() };
    let state = state_text(run, holder);
    let state = state.split(':').next().unwrap_or_default().to_string();
    match run.ended_ms.or(run.started_ms) {
        Some(ms) => {
            let ago = super::now_ms().saturating_sub(ms);
            format!(
                "{state}, {} ago",
                short_duration(Duration::from_millis(ago))
            )
        }
        None => state,
    }
}
