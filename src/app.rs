//! The commands, end to end: parse, validate, then `run` (acquire, keep, supervise, release),
//! `status`, `break` and `completions`. Errors are printed here, once, as one `dlock: …` line.

use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Instant;

use crate::backend;
use crate::cli::{Cli, Command};
use crate::config::{KeyConfig, LockConfig, RunConfig, Wait};
use crate::exit;
use crate::history;
use crate::keeper::Keeper;
use crate::lockset;
use crate::model::{Deadline, Mode, Record};
use crate::report;
use crate::signals;
use crate::supervise::{self, Ending, LeaseClock};

/// dlock's `main`, for a program started by Rust's runtime.
pub fn main() -> ExitCode {
    ExitCode::from(exit_code())
}

/// The `main` the C library calls in the `dlock` binary (`no_main`, see src/main.rs): Rust's
/// runtime start-up did not run, so this does the part of it dlock needs — SIGPIPE ignored
/// (a write to a closed pipe fails with EPIPE instead of killing dlock), descriptors 0-2 open
/// (`/dev/null` for a closed one, so that no file dlock opens becomes its stderr) — and, at the
/// end, what its clean-up would: flushing stdout.
pub fn start() -> i32 {
    crate::sys::start_like_std();
    let code = exit_code();
    let _ = std::io::stdout().flush();
    i32::from(code)
}

fn exit_code() -> u8 {
    // A guardian executing itself anew (see `guard`) never gets past this.
    crate::guard::resume_if_asked();
    crate::trace::init();
    let code = command_code();
    crate::trace::print();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    crate::hold::fail_the_eval(&args, code);
    code
}

fn command_code() -> u8 {
    let cli = match Cli::parse_args() {
        Ok(cli) => cli,
        Err(e) => return clap_error(&e),
    };
    match cli.command {
        Command::Run(args) => match RunConfig::from_args(args) {
            Ok(cfg) => run(&cfg),
            Err(e) => report::usage(&e),
        },
        Command::Acquire(a) => match crate::config::AcquireConfig::from_args(&a) {
            Ok(cfg) => crate::hold::acquire(&cfg),
            Err(e) => report::usage(&e),
        },
        Command::Release(a) => crate::hold::release(&a),
        Command::Status(a) => match &a.key {
            Some(key) => match KeyConfig::new(&a.backend, key, &a.output) {
                Ok(cfg) => status(&cfg, a.json),
                Err(e) => report::usage(&e),
            },
            None => match crate::config::Target::from_args(&a.backend) {
                Ok(target) => list(&target, crate::model::Verbosity::from(&a.output), a.json),
                Err(e) => report::usage(&e),
            },
        },
        Command::Log(a) => match KeyConfig::new(&a.backend, &a.key, &a.output) {
            Ok(cfg) => {
                if a.runs_n.is_some() {
                    report::warn(format_args!(
                        "'log -n N' is now 'log -r N' (--runs): -n is --no-wait in run and \
                         acquire; -n will stop working in a later release"
                    ));
                }
                history::cmd::log(&cfg, a.runs_n.unwrap_or(a.runs) as usize, a.json)
            }
            Err(e) => report::usage(&e),
        },
        Command::Break(a) => match KeyConfig::new(&a.backend, &a.key, &a.output) {
            Ok(cfg) => crate::cmd::break_lock::run(&cfg, a.force, a.wait),
            Err(e) => report::usage(&e),
        },
        Command::Bench(a) => match crate::config::BenchConfig::from_args(&a) {
            Ok(cfg) => crate::bench::run(&cfg),
            Err(e) => report::usage(&e),
        },
        Command::Doctor(a) => {
            let mut which = a.backend;
            if a.which.is_some() {
                which.backend = a.which;
            }
            match crate::config::Target::from_args(&which) {
                Ok(target) => crate::doctor::run(&target, a.ttl, a.json),
                Err(e) => report::usage(&e),
            }
        }
        Command::Prune(a) => match crate::config::Target::from_args(&a.backend) {
            Ok(target) => match backend::open_existing(&target) {
                Ok(b) => {
                    report::set_verbosity(crate::model::Verbosity::from(&a.output));
                    history::retention::prune_all(b.as_ref(), a.older_than, a.output.quiet)
                }
                Err(e) => report::fail(target.kind.name(), &e, exit::DEFAULT_CONFLICT),
            },
            Err(e) => report::usage(&e),
        },
        Command::Completions(a) => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&crate::generate::completion(a.shell));
            0
        }
    }
}

/// Help and version go to stdout as clap renders them; errors become one `dlock:` line, exit 2.
fn clap_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return 0;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            use clap::CommandFactory;
            let names: Vec<String> = Cli::command()
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name().to_string())
                .collect();
            let list = match names.split_last() {
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => String::new(),
            };
            report::error(format_args!("missing subcommand: {list} (see --help)"));
            return exit::USAGE;
        }
        _ => {}
    }
    // clap's message is "error: what\n  detail\n\nUsage: ...": keep the first paragraph on one line.
    let text = e.render().to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let mut line = first.join(" ");
    // clap's suggestion ("tip: a similar argument exists: '--key'") comes in a later paragraph;
    // it misses a transposition in a short word (`--kye`), which `did_you_mean` finds.
    if let Some(tip) = did_you_mean(e).or_else(|| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("tip: "))
            .map(str::to_string)
    }) {
        line = format!("{line}; {tip}");
    }
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    report::usage_error(format_args!("{line} (see --help)"));
    exit::USAGE
}

/// For an unknown `--flag`: the subcommand's long flag one edit away (a transposition counts
/// as one), as "did you mean '--key'?".
fn did_you_mean(e: &clap::Error) -> Option<String> {
    use clap::CommandFactory;
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(given)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let given = given.strip_prefix("--")?.split('=').next()?;
    let sub = std::env::args_os().nth(1)?.into_string().ok()?;
    let cli = Cli::command();
    let cmd = cli.find_subcommand(&sub)?;
    cmd.get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|long| strsim::osa_distance(given, long) == 1)
        .min()
        .map(|long| format!("did you mean '--{long}'?"))
}

fn run(run: &RunConfig) -> u8 {
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
    let (backend, held) = match take_locks_with(cfg, &holder, &interrupt, opening.as_ref()) {
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
                let ending = history::Ending {
                    code: Some(code.into()),
                    signal: Some(sig.into()),
                    note: Some("the command did not start".into()),
                    ..history::Ending::default()
                };
                let log = history::RunLog::opened(o, &cfg.keys);
                release_run(
                    name,
                    &keys_text,
                    lease,
                    backend.as_ref(),
                    Some(&log),
                    ending,
                );
            }
            None => release(name, &keys_text, lease),
        }
        return code;
    }
    let mut lease = lease;
    let run_log = match begin_history_of(cfg, lease.as_mut(), &holder, tokens[0], opening.as_ref())
    {
        Ok(log) => log,
        Err(code) => {
            release(name, &keys_text, lease);
            return code;
        }
    };
    crate::trace::stage("history");
    let clock = LeaseClock::of(lease.as_ref(), cfg.kill_grace);
    let env = command_env(cfg, &tokens, claims);
    let quiet = report::is_quiet();
    let child = match supervise::spawn(&run.command, &env, clock.deadline, quiet, &reaper, &events)
    {
        Ok(c) => c,
        Err(e) => {
            report::error(format_args!("{}", e.message));
            let ending = history::Ending {
                code: Some(e.code.into()),
                note: Some("the command did not start".into()),
                ..history::Ending::default()
            };
            release_run(
                name,
                &keys_text,
                lease,
                backend.as_ref(),
                run_log.as_ref(),
                ending,
            );
            return e.code;
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
    let closing = Closing {
        backend: backend.as_ref(),
        run_log: run_log.as_ref(),
    };
    finish(cfg, &keys_text, keeper, &ending, &closing);
    crate::trace::stage("release");
    ending.code()
}

/// Records the run's start in the history (unless it is off): `Ok(None)` when none is kept;
/// `Err(code)` when the run must not start — skipped by `--once-per` (the line is printed), or
/// the history that `--once-per` needs could not be read.
pub(crate) fn begin_history(
    cfg: &LockConfig,
    lease: &mut dyn backend::Lease,
    holder: &Record,
    token: Option<u64>,
) -> Result<Option<history::RunLog>, u8> {
    begin_history_of(cfg, lease, holder, token, None)
}

/// [`begin_history`] of a run whose start was made before its lock was taken (and may be
/// recorded already: [`history::Opening`]).
fn begin_history_of(
    cfg: &LockConfig,
    lease: &mut dyn backend::Lease,
    holder: &Record,
    token: Option<u64>,
    opening: Option<&history::Opening>,
) -> Result<Option<history::RunLog>, u8> {
    if !cfg.history {
        return Ok(None);
    }
    match history::RunLog::begin(lease, &cfg.keys, holder, token, cfg.once_per, opening) {
        Ok(log) => Ok(log),
        Err(history::NotBegun::Skipped(line)) => {
            // An expected skip: `-q` hides it, and `-E 0` makes it a quiet success.
            if cfg.conflict_code != 0 {
                report::notice(format_args!("{line}"));
            }
            Err(cfg.conflict_code)
        }
        Err(history::NotBegun::Failed(e)) => {
            Err(report::fail(cfg.target.kind.name(), &e, cfg.conflict_code))
        }
    }
}

/// What the end of a run is recorded with.
pub(crate) struct Closing<'a> {
    pub backend: &'a dyn backend::Backend,
    pub run_log: Option<&'a history::RunLog>,
}

impl Closing<'_> {
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
        history::retention::after_run(self.backend);
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

/// How a `dlock run` ended, for its history.
fn run_ending(ending: &Ending) -> history::Ending {
    use std::os::unix::process::ExitStatusExt;
    let mut e = history::Ending {
        code: Some(ending.code().into()),
        ..history::Ending::default()
    };
    match ending {
        Ending::Exited(status) => e.signal = status.signal().map(i64::from),
        Ending::Signalled(sig) => {
            e.signal = Some((*sig).into());
            e.note = Some(format!("dlock was stopped by {}", exit::signal_name(*sig)));
        }
        Ending::Lost(reason) => e.lost = Some(reason.clone()),
        Ending::GuardianDied { status, .. } => {
            e.signal = status.signal().map(i64::from);
            e.note = Some("dlock's guardian process died".into());
        }
    }
    e
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
fn take_locks_with(
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
fn expected_skip(cfg: &LockConfig, e: &anyhow::Error) -> bool {
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

/// After the command: report a loss, or release (and say how it went).
fn finish(
    cfg: &LockConfig,
    keys_text: &str,
    keeper: Keeper,
    ending: &Ending,
    closing: &Closing<'_>,
) {
    let name = cfg.target.kind.name();
    let release_started = Instant::now();
    let recorded = run_ending(ending);
    let released = match ending {
        Ending::Lost(reason) => {
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
                LOST_END_BOUND
            };
            let _ = released.recv_timeout(bound.saturating_sub(release_started.elapsed()));
            return;
        }
        Ending::Signalled(sig) => {
            report::verbose(format_args!("stopped by {}", exit::signal_name(*sig)));
            closing.release(keeper, recorded)
        }
        Ending::Exited(_) => closing.release(keeper, recorded),
        Ending::GuardianDied {
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

/// How long a run that lost its lock waits for its end to be recorded (through a new
/// connection) and for its release before it exits: the exit 79 comes at once
/// (docs/failures.md), and a lock is most often lost to a server that stopped answering, which
/// would hold it for the whole bound. A server that answers (after `dlock break`, whose mark
/// stays until the holder lets go) takes a few milliseconds.
pub(crate) const LOST_END_BOUND: std::time::Duration = std::time::Duration::from_millis(200);

/// Releases a lease that never reached the keeper, recording `ending` for its run.
fn release_run(
    name: &str,
    key: &str,
    lease: Box<dyn backend::Lease>,
    backend: &dyn backend::Backend,
    run_log: Option<&history::RunLog>,
    ending: history::Ending,
) {
    let closing = Closing { backend, run_log };
    let keeper = Keeper::new(lease, crate::events::Events(mpsc::channel().0));
    if let Err(e) = closing.release(keeper, ending) {
        report::warn(format_args!(
            "{name}: release of '{key}' failed (it expires by itself): {e:#}"
        ));
    }
}

/// Releases a lease that never reached the keeper.
fn release(name: &str, key: &str, lease: Box<dyn backend::Lease>) {
    if let Err(e) = lease.release() {
        report::warn(format_args!(
            "{name}: release of '{key}' failed (it expires by itself): {e:#}"
        ));
    }
}

fn status(cfg: &KeyConfig, json: bool) -> u8 {
    report::set_verbosity(cfg.verbosity);
    let name = cfg.target.kind.name();
    let result = backend::open_existing(&cfg.target).and_then(|b| {
        let s = b.status(&cfg.key)?;
        Ok((s, history::cmd::last_run(b.as_ref(), &cfg.key)))
    });
    match result {
        Ok((s, last)) => {
            let s = s.with_mode();
            let text = if json {
                history::cmd::status_json(&s, last)
            } else {
                report::status_text(&s)
                    + &history::cmd::status_line(last.as_ref(), s.holders.first())
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(e) => report::fail(
            name,
            &e.context(format!("cannot read the status of '{}'", cfg.key)),
            0,
        ),
    }
}

/// `dlock status` without `--key`: every lock held or waited for, as a table or a JSON array.
fn list(target: &crate::config::Target, verbosity: crate::model::Verbosity, json: bool) -> u8 {
    report::set_verbosity(verbosity);
    let name = target.kind.name();
    let found = backend::open_existing(target).and_then(|b| {
        let mut busy = Vec::new();
        let keys = b.list_keys()?;
        if keys.len() >= backend::MAX_LISTED {
            report::warn(format_args!(
                "the list stops at {} keys held or waited for: there may be more; give --key \
                 for one past them",
                backend::MAX_LISTED
            ));
        }
        for key in keys {
            let s = b.status(&key)?;
            if s.held || s.waiters.is_some_and(|w| w > 0) || !s.queue.is_empty() {
                let last = history::cmd::last_run(b.as_ref(), &key);
                busy.push((s.with_mode(), last));
            }
        }
        busy.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        Ok((b.location(), busy))
    });
    match found {
        Ok((location, busy)) => {
            let text = if json {
                let all: Vec<String> = busy
                    .into_iter()
                    .map(|(s, last)| history::cmd::status_json(&s, last).trim_end().to_string())
                    .collect();
                format!("[{}]\n", all.join(","))
            } else {
                let lasts: Vec<String> = busy
                    .iter()
                    .map(|(s, last)| history::show::last_run_cell(last.as_ref(), s.holders.first()))
                    .collect();
                let locks: Vec<crate::model::Status> = busy.into_iter().map(|(s, _)| s).collect();
                report::list_text(name, &location, &locks, &lasts)
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(e) => report::fail(name, &e.context("cannot list the locks"), 0),
    }
}
