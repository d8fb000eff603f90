//! What `dlock run` and the acquire holder share between taking their locks and letting go:
//! opening the backend and taking every key, recording the run's start in the history, the
//! command's environment, and recording the end with the release. Below the commands, above
//! the backends, the lock set and the history's records.

use std::sync::mpsc;
use std::time::Instant;

use crate::backend;
use crate::config::{LockConfig, Wait};
use crate::exit;
use crate::history;
use crate::keeper::Keeper;
use crate::lockset;
use crate::model::{Deadline, Record};
use crate::report;
use crate::signals;

mod prune;
mod runlog;

pub(crate) use self::prune::{after_run, prune_all};
pub(crate) use self::runlog::{NotBegun, RunLog};

/// Records the run's start in the history (unless it is off): `Ok(None)` when none is kept;
/// `Err(code)` when the run must not start — skipped by `--once-per` (the line is printed), or
/// the history that `--once-per` needs could not be read.
pub(crate) fn begin_history(
    cfg: &LockConfig,
    lease: &mut dyn backend::Lease,
    holder: &Record,
    token: Option<u64>,
) -> Result<Option<RunLog>, u8> {
    begin_history_of(cfg, lease, holder, token, None)
}

/// [`begin_history`] of a run whose start was made before its lock was taken (and may be
/// recorded already: [`history::Opening`]).
pub(crate) fn begin_history_of(
    cfg: &LockConfig,
    lease: &mut dyn backend::Lease,
    holder: &Record,
    token: Option<u64>,
    opening: Option<&history::Opening>,
) -> Result<Option<RunLog>, u8> {
    if !cfg.history {
        return Ok(None);
    }
    match RunLog::begin(lease, &cfg.keys, holder, token, cfg.once_per, opening) {
        Ok(log) => Ok(log),
        Err(NotBegun::Skipped(line)) => {
            // An expected skip: `-q` hides it, and `-E 0` makes it a quiet success.
            if cfg.conflict_code != 0 {
                report::notice(format_args!("{line}"));
            }
            Err(cfg.conflict_code)
        }
        Err(NotBegun::Failed(e)) => {
            Err(report::fail(cfg.target.kind.name(), &e, cfg.conflict_code))
        }
    }
}

/// What the end of a run is recorded with.
pub(crate) struct Recorder<'a> {
    pub backend: &'a dyn backend::Backend,
    pub run_log: Option<&'a RunLog>,
}

impl Recorder<'_> {
    /// Releases through `keeper`, recording `ending` (with the release where the backend can).
    pub(crate) fn release(&self, keeper: Keeper, ending: history::Ending) -> anyhow::Result<()> {
        let Some(log) = self.run_log else {
            return keeper.release();
        };
        let end = log.end(ending);
        let wrote = keeper.release_with_end(end.clone());
        if !matches!(wrote, Ok(true)) {
            log.write_end(self.backend, &end);
        }
        after_run(self.backend);
        wrote.map(|_| ())
    }

    /// For a lease that is lost: records `ending` through a new connection, waiting at most
    /// [`LOST_END_BOUND`] — a loss is often a server that stopped answering, and dlock exits
    /// at once after a loss (the run shows "no end recorded" then).
    pub(crate) fn record_lost(&self, target: &crate::config::Target, ending: history::Ending) {
        if let Some(log) = self.run_log {
            log.write_end_within(target, log.end(ending), LOST_END_BOUND);
        }
    }
}

/// Opens the backend and takes every key (waiting as configured), writing `holder` beside each;
/// on failure prints the error and returns the exit code, with nothing held.
pub(crate) fn take_locks(
    cfg: &LockConfig,
    holder: &Record,
    interrupt: &signals::Interrupt,
) -> Result<(Box<dyn backend::Backend>, lockset::Held), u8> {
    take_locks_with(cfg, holder, interrupt, None)
}

/// [`take_locks`], handing the backend the run's start to record with the lock where it can.
pub(crate) fn take_locks_with(
    cfg: &LockConfig,
    holder: &Record,
    interrupt: &signals::Interrupt,
    start: Option<&history::Opening>,
) -> Result<(Box<dyn backend::Backend>, lockset::Held), u8> {
    let name = cfg.target.kind.name();
    if cfg.implicit_backend && cfg.once_per.is_some() {
        report::warn(format_args!(
            "--once-per on the default file backend sees the runs of this host and user only; \
             set DLOCK_URL (in the crontab too: cron does not read a login shell's exports) to \
             a server every host shares"
        ));
    }
    let backend =
        backend::open(&cfg.target).map_err(|e| report::fail(name, &e, cfg.conflict_code))?;
    if let Some(why) = backend.unsupported(cfg.mode) {
        report::error(format_args!("{why}"));
        return Err(exit::USAGE);
    }
    let deadline = match cfg.wait {
        Wait::No => Deadline::Now,
        // A wait too long to represent is a wait forever.
        Wait::For(d) => Instant::now()
            .checked_add(d)
            .map_or(Deadline::Never, Deadline::At),
        Wait::Forever => Deadline::Never,
    };
    let want = lockset::Want {
        keys: lockset::canonical(&cfg.keys),
        mode: cfg.mode,
        ttl: cfg.ttl,
        deadline,
        holder,
        interrupt,
        look_up: Some(&cfg.target),
        start,
    };
    match lockset::acquire(backend.as_ref(), &want) {
        Ok(held) => Ok((backend, held)),
        Err(e) if expected_skip(cfg, &e) => Err(cfg.conflict_code),
        Err(e) => {
            let e = if cfg.keys.len() == 1 {
                e.context(format!("cannot acquire '{}'", cfg.keys[0]))
            } else {
                e
            };
            Err(report::fail(name, &e, cfg.conflict_code))
        }
    }
}

/// Whether `e` is a skip the caller expects and asked not to hear of: the lock is busy and
/// `-E 0` makes that a success, or it was busy at once (`--no-wait`) under `-q`. A `--wait` that
/// ran out is still said under `-q`: the caller waited for the lock and did not get it.
pub(crate) fn expected_skip(cfg: &LockConfig, e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|c| c.downcast_ref::<exit::Busy>())
        .is_some_and(|busy| cfg.conflict_code == 0 || (!busy.waited && report::is_quiet()))
}

/// What the command sees: `DLOCK_KEY`, `DLOCK_BACKEND`, `DLOCK_HELD`, the fencing token (when
/// the backend has one) and, for several keys, `DLOCK_KEYS` and `DLOCK_FENCING_TOKENS`.
pub(crate) fn command_env(
    cfg: &LockConfig,
    tokens: &[Option<u64>],
    claims: String,
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("DLOCK_KEY", cfg.keys[0].to_string()),
        ("DLOCK_BACKEND", cfg.target.kind.name().to_string()),
        (lockset::HELD_ENV, claims),
    ];
    if let Some(t) = tokens[0] {
        env.push(("DLOCK_FENCING_TOKEN", t.to_string()));
    }
    if cfg.keys.len() > 1 {
        let lines = |v: Vec<String>| v.join("\n");
        env.push((
            "DLOCK_KEYS",
            lines(cfg.keys.iter().map(|k| k.to_string()).collect()),
        ));
        env.push((
            "DLOCK_FENCING_TOKENS",
            lines(
                tokens
                    .iter()
                    .map(|t| t.map(|t| t.to_string()).unwrap_or_default())
                    .collect(),
            ),
        ));
    }
    env
}

/// How long a run that lost its lock waits for its end to be recorded (through a new
/// connection) and for its release before it exits: the exit 79 comes at once
/// (docs/failures.md), and a lock is most often lost to a server that stopped answering, which
/// would hold it for the whole bound. A server that answers (after `dlock break`, whose mark
/// stays until the holder lets go) takes a few milliseconds.
pub(crate) const LOST_END_BOUND: std::time::Duration = std::time::Duration::from_millis(200);

/// Releases a lease that never reached the keeper, recording `ending` for its run.
pub(crate) fn release_run(
    name: &str,
    key: &str,
    lease: Box<dyn backend::Lease>,
    backend: &dyn backend::Backend,
    run_log: Option<&RunLog>,
    ending: history::Ending,
) {
    let closing = Recorder { backend, run_log };
    let keeper = Keeper::new(lease, crate::events::Events(mpsc::channel().0));
    if let Err(e) = closing.release(keeper, ending) {
        report::warn(format_args!(
            "{name}: release of '{key}' failed (it expires by itself): {e:#}"
        ));
    }
}

/// Releases a lease that never reached the keeper.
pub(crate) fn release(name: &str, key: &str, lease: Box<dyn backend::Lease>) {
    if let Err(e) = lease.release() {
        report::warn(format_args!(
            "{name}: release of '{key}' failed (it expires by itself): {e:#}"
        ));
    }
}
