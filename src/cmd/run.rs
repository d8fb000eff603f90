//! `dlock run`: take the locks, record the start, run the command under the guardian while
//! the keeper renews, then record the end with the release — or stop the command's whole tree
//! when the lock is lost.

use std::sync::mpsc;
use std::time::Instant;

use crate::config::{LockConfig, RunConfig};
use crate::exit;
use crate::history;
use crate::keeper::Keeper;
use crate::lockset;
use crate::model::{Mode, Record};
use crate::report;
use crate::session::{self, Recorder};
use crate::signals;
use crate::supervise::{self, LeaseClock, Outcome};

pub(crate) fn run(run: &RunConfig) -> u8 {
    crate::trace::stage("parse");
    let cfg = &run.lock;
    report::set_verbosity(cfg.verbosity);
    let name = cfg.target.kind.name();
    // Before any thread exists, so that every thread inherits the mask (see `signals`).
    if let Err(e) = signals::block() {
        return report::fail(
            name,
            &anyhow::Error::new(e).context("cannot block signals"),
            0,
        );
    }
    let (events, rx) = mpsc::channel();
    let reaper = supervise::Reaper::new();
    let interrupt = signals::Interrupt::new();
    // If the guardian dies, what it leaves must come here, not escape to init.
    if let Err(why) = supervise::become_subreaper() {
        report::error(format_args!("{why}"));
        return exit::UNAVAILABLE;
    }

    let started = Instant::now();
    let holder = Record {
        mode: (cfg.mode != Mode::Exclusive).then_some(cfg.mode),
        reason: cfg.reason.clone(),
        ..Record::this_process(&run.command)
    };
    crate::trace::stage("setup");
    // The start of the run, for a backend to record in the lock's own round trips.
    let opening = (cfg.history
        && cfg.once_per.is_none()
        && cfg.mode == Mode::Exclusive
        && cfg.keys.len() == 1)
        .then(|| history::Opening::new(&holder));
    let (backend, held) = match session::take_locks_with(cfg, &holder, &interrupt, opening.as_ref())
    {
        Ok(taken) => taken,
        Err(code) => return code,
    };
    crate::trace::stage("lock");
    // The command's view: keys and tokens in the order given, the first one as DLOCK_KEY.
    let tokens = held.tokens_of(&cfg.keys);
    let keys_text = cfg.keys_text();
    let claims = serde_json::to_string(&held.claims).unwrap_or_default();
    let lease = lockset::LeaseSet::join(held.parts);
    report::verbose(format_args!(
        "acquired '{keys_text}' ({}) on {name} ({}) in {:.1?}{}",
        cfg.mode.describe(),
        backend.location(),
        started.elapsed(),
        tokens[0]
            .map(|t| format!(", fencing token {t}"))
            .unwrap_or_default()
    ));
    if let Some(r) = signals::pending() {
        interrupt.fire(r.signal);
    }
    if let Some(sig) = interrupt.fired() {
        // A signal arrived as the lock was granted: do not start the command at all (a start
        // recorded with the lock gets its end).
        let code = exit::signal_code(sig);
        match &opening {
            Some(o) => {
                let log = session::RunLog::opened(o, &cfg.keys);
                let unstarted = Unstarted {
                    name,
                    keys_text: &keys_text,
                    backend: backend.as_ref(),
                    run_log: Some(&log),
                };
                return unstarted.end(lease, code, Some(sig));
            }
            None => session::release(name, &keys_text, lease),
        }
        return code;
    }
    let mut lease = lease;
    let run_log = match session::begin_history_of(
        cfg,
        lease.as_mut(),
        &holder,
        tokens[0],
        opening.as_ref(),
    ) {
        Ok(log) => log,
        Err(code) => {
            session::release(name, &keys_text, lease);
            return code;
        }
    };
    crate::trace::stage("history");
    let unstarted = Unstarted {
        name,
        keys_text: &keys_text,
        backend: backend.as_ref(),
        run_log: run_log.as_ref(),
    };
    let mut clock = LeaseClock::of(lease.as_ref(), cfg.kill_grace);
    if let Err(why) = clock.renew_if_late(lease.as_mut()) {
        report::error(format_args!(
            "{name}: lost the lock '{keys_text}' before the command started: the run's start took \
             the lease's time, and renewing it failed ({why})"
        ));
        return unstarted.end(lease, exit::LOST, None);
    }
    let env = session::command_env(cfg, &tokens, claims);
    let quiet = report::is_quiet();
    let child = match supervise::spawn(
        &run.command,
        &env,
        clock.guard_deadline(false),
        quiet,
        &reaper,
        &events,
    ) {
        Ok(c) => c,
        Err(e) => {
            report::error(format_args!("{}", e.message));
            return unstarted.end(lease, e.code, None);
        }
    };
    // The keeper's thread starts when the first renewal is due: nothing but the fork is on the
    // path from acquiring to running the command, and a short command needs no thread at all.
    let mut keeper = Keeper::new(lease, crate::events::Events(events));
    if let Some(pid) = child.pid() {
        report::verbose(format_args!("started pid {pid}"));
    }
    let ending = supervise::supervise(&child, &rx, &mut keeper, clock, cfg.kill_grace);
    crate::trace::stage("command");
    let closing = Recorder {
        backend: backend.as_ref(),
        run_log: run_log.as_ref(),
    };
    finish(cfg, &keys_text, keeper, &ending, &closing);
    crate::trace::stage("release");
    ending.code()
}

/// A run whose locks are held and whose command never started (a signal as the lock came, a
/// start that took the lease's time, a command that could not be spawned).
struct Unstarted<'a> {
    name: &'a str,
    keys_text: &'a str,
    backend: &'a dyn crate::backend::Backend,
    run_log: Option<&'a session::RunLog>,
}

impl Unstarted<'_> {
    /// Records the run's end (its start is already recorded, with the lock), releases the
    /// locks, and returns `code`, dlock's exit status.
    fn end(&self, lease: Box<dyn crate::backend::Lease>, code: u8, signal: Option<i32>) -> u8 {
        let ending = history::Ending {
            code: Some(code.into()),
            signal: signal.map(i64::from),
            note: Some("the command did not start".into()),
            ..history::Ending::default()
        };
        session::release_run(
            self.name,
            self.keys_text,
            lease,
            self.backend,
            self.run_log,
            ending,
        );
        code
    }
}

/// How a `dlock run` ended, for its history.
fn run_ending(ending: &Outcome) -> history::Ending {
    use std::os::unix::process::ExitStatusExt;
    let mut e = history::Ending {
        code: Some(ending.code().into()),
        ..history::Ending::default()
    };
    match ending {
        Outcome::Exited(status) => e.signal = status.signal().map(i64::from),
        Outcome::Signalled(sig) => {
            e.signal = Some((*sig).into());
            e.note = Some(format!("dlock was stopped by {}", exit::signal_name(*sig)));
        }
        Outcome::Lost(reason) => e.lost = Some(reason.clone()),
        Outcome::GuardianDied { status, .. } => {
            e.signal = status.signal().map(i64::from);
            e.note = Some("dlock's guardian process died".into());
        }
    }
    e
}

/// After the command: report a loss, or release (and say how it went).
fn finish(
    cfg: &LockConfig,
    keys_text: &str,
    keeper: Keeper,
    ending: &Outcome,
    closing: &Recorder<'_>,
) {
    let name = cfg.target.kind.name();
    let release_started = Instant::now();
    let recorded = run_ending(ending);
    let released = match ending {
        Outcome::Lost(reason) => {
            report::error(format_args!(
                "{name}: lost the lock '{keys_text}' while the command ran: {reason}; the command was terminated"
            ));
            // The other keys are still ours, and a broken one is its holder's until it lets go:
            // free them for their waiters while the end is recorded, but do not let a server
            // that stopped answering hold up the exit.
            let released = keeper.release_in_background();
            closing.record_lost(&cfg.target, recorded);
            let bound = if cfg.keys.len() > 1 {
                LOST_RELEASE_BOUND
            } else {
                session::LOST_END_BOUND
            };
            let _ = released.recv_timeout(bound.saturating_sub(release_started.elapsed()));
            return;
        }
        Outcome::Signalled(sig) => {
            report::verbose(format_args!("stopped by {}", exit::signal_name(*sig)));
            closing.release(keeper, recorded)
        }
        Outcome::Exited(_) => closing.release(keeper, recorded),
        Outcome::GuardianDied {
            pid,
            status,
            started,
        } => {
            let status = exit::describe_status(*status);
            if *started {
                report::error(format_args!(
                    "{name}: the guardian process (pid {pid}) died while the command ran ({status}); the command and everything it started were killed"
                ));
            } else {
                report::error(format_args!(
                    "{name}: the guardian process (pid {pid}) died ({status}) before it could say whether the command started; whatever it started was killed"
                ));
            }
            closing.release(keeper, recorded)
        }
    };
    match released {
        Ok(()) => report::verbose(format_args!(
            "released '{keys_text}' in {:.1?}",
            release_started.elapsed()
        )),
        Err(e) => report::warn(format_args!(
            "{name}: release of '{keys_text}' failed (it expires by itself): {e:#}"
        )),
    }
}

/// How long a run that lost one of several keys spends releasing the others before it exits.
const LOST_RELEASE_BOUND: std::time::Duration = std::time::Duration::from_secs(2);
