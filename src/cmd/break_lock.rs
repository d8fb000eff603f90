//! `dlock break`: stop a lock's holder, and let the lock pass on only once it has stopped.
//!
//! A safe break ([`BreakHow::Safe`]) removes nothing a waiter could take at once: each backend
//! tells its dlock holders to stop (a mark they see at their next renewal, or a tombstone in
//! place of their lease that lives as long as the lease would have), and the lock is free when
//! they have stopped their commands and let go, or when their leases have run out, renewed by no
//! one. A holder stops its command before its lease can run out (the lifetime rules), so the
//! next holder's command never starts beside the broken one. A holder that is not dlock cannot
//! be told anything: a safe break refuses it. `--force` is the old removal, at once and unsafe.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::backend::{self, BreakHow, Broken, Frees};
use crate::config::KeyConfig;
use crate::model::{Deadline, Verbosity};
use crate::{exit, report};

/// How long a break waits for holders that only let go once they have stopped (a backend whose
/// mark lives in break's own session) when no `--wait DURATION` says otherwise: a renewal
/// interval and a kill grace of the defaults, several times over.
pub(crate) const STAY_AT_MOST: Duration = Duration::from_secs(120);

/// Exit status of a `break` whose holder is not dlock (it cannot be told to stop).
const NOT_DLOCK: u8 = 1;

/// `dlock break [--force] [--wait [D]]`.
pub(crate) fn run(cfg: &KeyConfig, force: bool, wait: Option<Option<Duration>>) -> u8 {
    report::set_verbosity(cfg.verbosity);
    let name = cfg.target.kind.name();
    let fail = |e: anyhow::Error, code: u8| {
        report::fail(
            name,
            &e.context(format!("cannot break '{}'", cfg.key)),
            code,
        )
    };
    let b = match backend::open_existing(&cfg.target) {
        Ok(b) => b,
        Err(e) => return fail(e, 0),
    };
    let how = if force {
        BreakHow::Force
    } else {
        BreakHow::Safe
    };
    if how == BreakHow::Safe {
        match b.status(&cfg.key) {
            Ok(s) => {
                if let Some(h) = s.holders.iter().find(|h| h.foreign.is_some()) {
                    report::error(format_args!(
                        "{name}: cannot break '{}': it is held by {}, which cannot be told to \
                         stop; stop that holder, or remove the lock with --force (unsafe: it may \
                         go on as if it held the lock)",
                        cfg.key,
                        h.short()
                    ));
                    return NOT_DLOCK;
                }
            }
            Err(e) => return fail(e, 0),
        }
    }
    let started = Instant::now();
    let broken = match b.break_lock(&cfg.key, how) {
        Ok(broken) => broken,
        Err(e) => return fail(e, 0),
    };
    say(
        cfg,
        &report::broke_text(&broken.status, verb(how), &then(&broken, how)),
    );
    if !broken.status.held || broken.frees == Frees::Now {
        return 0;
    }
    let deadline = match (wait, broken.keep.is_some()) {
        (None, false) => return 0,
        (Some(None), _) => Deadline::Never,
        (Some(Some(d)), _) => Deadline::At(started + d),
        (None, true) => Deadline::At(started + STAY_AT_MOST),
    };
    match b.await_broken(&cfg.key, &broken, deadline) {
        Ok(true) => {
            say(
                cfg,
                &format!(
                    "'{}' is free of the broken holder after {}\n",
                    cfg.key,
                    report::short_duration(started.elapsed())
                ),
            );
            0
        }
        Ok(false) => {
            report::error(format_args!(
                "{name}: '{}' is still held by the broken holder after {}: it did not stop (a \
                 dlock that is stuck, or a process that is not dlock); --force removes the lock \
                 (unsafe)",
                cfg.key,
                report::short_duration(started.elapsed())
            ));
            exit::DEFAULT_CONFLICT
        }
        Err(e) => fail(e, 0),
    }
}

fn say(cfg: &KeyConfig, text: &str) {
    if cfg.verbosity > Verbosity::Quiet {
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
    }
}

fn verb(how: BreakHow) -> &'static str {
    match how {
        BreakHow::Safe => "broke",
        BreakHow::Force => "removed",
    }
}

/// When the lock is free, in the command's own words.
fn then(broken: &Broken, how: BreakHow) -> String {
    match (how, broken.frees) {
        (BreakHow::Force, _) | (_, Frees::Now) => {
            "; forced: its command may run on until its dlock notices".into()
        }
        (_, Frees::Within(d)) => format!(
            ": it stops its command, and the lock passes on once it has, at the latest in {}",
            report::short_duration(d)
        ),
        (_, Frees::WhenStopped(d)) => format!(
            ": it sees this within {} and stops its command; the lock passes on once it has{}",
            report::short_duration(d),
            if broken.keep.is_some() {
                " (this break waits for it: the mark it sees lives as long as this command)"
            } else {
                ""
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_break_says_it_is_unsafe() {
        let key = crate::model::Key::new("k").unwrap();
        let s = crate::model::Status::new(&key, crate::model::BackendKind::File, "d".into());
        let b = Broken::now(s);
        assert!(then(&b, BreakHow::Force).contains("forced"));
    }
}
