//! `DLOCK_TRACE=stages`: where a run's time goes. With it, dlock notes the moment each stage of
//! a run ends and, just before it exits, prints one line per stage to stderr:
//!
//! ```text
//! dlock: stage start 0 us (at 31610007014)
//! dlock: stage parse 41 us (at 31610007055)
//! …
//! ```
//!
//! — the stage's name, the microseconds since the previous stage ended, and the moment on
//! `CLOCK_BOOTTIME` in microseconds (`start` is the first thing `main` does: a driver that
//! notes when it started the process gets exec and the loader's work from it, and the exit's
//! cost from `done` to its `waitpid`; `bench/stages.py` does both, over many runs). Only a
//! stage's first end counts (a connection made again, a second server of Redlock).
//!
//! Off (the default) it costs one environment lookup at start and one relaxed atomic load per
//! stage. The lines are printed at the end, not as the stages pass, so that writing them does
//! not count in the stages; a run that dies of a signal prints none.

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);
static STAGES: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

/// Reads `DLOCK_TRACE` (once) and, when it says `stages`, notes the `start` stage.
pub(crate) fn init() {
    if std::env::var_os("DLOCK_TRACE").is_some_and(|v| v == "stages") {
        ON.store(true, Ordering::Relaxed);
        // Room for every stage now: no allocation later, while the guardian shares the memory.
        STAGES.lock().unwrap_or_else(|e| e.into_inner()).reserve(16);
        stage("start");
    }
}

/// Notes that the stage `name` ends now (nothing when tracing is off).
#[inline]
pub(crate) fn stage(name: &'static str) {
    if ON.load(Ordering::Relaxed) {
        note(name);
    }
}

#[cold]
fn note(name: &'static str) {
    let at = u64::try_from(crate::sys::boottime().as_micros()).unwrap_or(u64::MAX);
    let mut stages = STAGES.lock().unwrap_or_else(|e| e.into_inner());
    if !stages.iter().any(|(n, _)| *n == name) {
        stages.push((name, at));
    }
}

/// Notes the `done` stage and prints every stage's line (nothing when tracing is off).
pub(crate) fn print() {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    note("done");
    let stages = STAGES.lock().unwrap_or_else(|e| e.into_inner());
    let mut text = String::new();
    let mut last = stages.first().map_or(0, |s| s.1);
    for (name, at) in stages.iter() {
        text.push_str(&format!(
            "dlock: stage {name} {} us (at {at})\n",
            at.saturating_sub(last)
        ));
        last = *at;
    }
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stages_first_end_counts_and_deltas_add_up() {
        ON.store(true, Ordering::Relaxed);
        // Room for every stage now: no allocation later, while the guardian shares the memory.
        STAGES.lock().unwrap_or_else(|e| e.into_inner()).reserve(16);
        stage("start");
        stage("a");
        stage("a");
        stage("b");
        let stages = STAGES.lock().unwrap().clone();
        let names: Vec<_> = stages.iter().map(|s| s.0).collect();
        assert_eq!(names, ["start", "a", "b"]);
        assert!(stages.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}
