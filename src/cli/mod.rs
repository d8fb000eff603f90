//! The command line, as clap types and nothing else: the one source of `--help`, the shell
//! completions and the man pages. [`crate::config`] turns these into a checked configuration;
//! no other module sees clap.

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueHint};

use crate::model::BackendKind;

mod help;

pub(crate) use self::help::{
    ACQUIRE_EXIT_STATUS, CHECK_EXIT_STATUS, DOCTOR_EXIT_STATUS, EXAMPLES, EXIT_STATUS,
    RELEASE_EXIT_STATUS, environment,
};
use self::help::{HELP_WIDTH, about, after_long_help, long_about, table};

/// The largest `--limit`.
pub(crate) const MAX_LIMIT: u32 = 256;

/// dlock: run a command while holding a named lock.
#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    about = about(),
    long_about = long_about(),
    after_long_help = after_long_help(),
    propagate_version = true,
    // Help fits 80 columns (a pager, a narrow terminal) on a wider terminal too, and when
    // piped: clap's own width there was 100, and `less` in 80 columns broke lines mid-word.
    max_term_width = HELP_WIDTH
)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line, parsed. `dlock run …`, the one on every run's path, is parsed by the
    /// `run` subcommand's arguments alone: building the whole command (every subcommand, and
    /// the help texts and tables, made eagerly) cost ~0.2 ms of a 2 ms run. Anything that
    /// parser does not accept — an error, `--help`, `--version`, another subcommand — goes to
    /// the whole [`Cli`], so every message is the one it gives.
    pub(crate) fn parse_args() -> Result<Cli, clap::Error> {
        use clap::{Args, FromArgMatches};
        if std::env::args_os().nth(1).is_some_and(|a| a == "run") {
            let run = RunArgs::augment_args(clap::Command::new("run"));
            if let Ok(m) = run.try_get_matches_from(std::env::args_os().skip(1))
                && let Ok(args) = RunArgs::from_arg_matches(&m)
            {
                return Ok(Cli {
                    command: Command::Run(args),
                });
            }
        }
        Cli::try_parse()
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run COMMAND while holding the lock KEY
    #[command(
        long_about = "Acquire the lock KEY (waiting for it unless --no-wait or --wait), run COMMAND \
with the lock held, release it when COMMAND exits. COMMAND is executed directly, not through a \
shell; everything after `--` belongs to it. The lock covers everything COMMAND starts: what it \
leaves running when it exits is stopped (SIGTERM, SIGKILL after --kill-grace) before the lock is \
released, and if dlock itself is killed (kill -9, the OOM killer), its guardian process kills \
COMMAND's whole process tree before the lock can pass on.",
        after_long_help = table("Exit status", EXIT_STATUS)
    )]
    Run(RunArgs),
    /// Take the lock KEY and keep it in the background until `dlock release`
    #[command(
        long_about = "Acquire the lock KEY (waiting like `run`), leave a holder process in the \
background that keeps the lease alive, and print a handle and the DLOCK_* variables for the \
caller (--format). The lock is held for an owner, by default the process that ran `dlock \
acquire` (the shell): it is released when the owner exits (what is left of a process group the \
owner leads is stopped first), and if it is lost the owner, what it started and its process group \
(when it leads one) get SIGTERM, SIGKILL after --kill-grace, before the lease can run out. \
A holder killed with SIGKILL leaves its watchdog to stop them first; processes that left both \
the owner's tree and its group run on, and a holder killed together with its watchdog stops \
nobody: `dlock run` is the strict form.",
        after_long_help = table("Exit status", ACQUIRE_EXIT_STATUS)
    )]
    Acquire(AcquireArgs),
    /// Give back a lock taken with `dlock acquire`; say whether it was held throughout
    #[command(
        long_about = "End the holder process of DLOCK_HANDLE (or --handle) and give the lock \
back. Exits 0 when the lock was held throughout, 79 when it was lost or given up on the way (one \
line says when and why), 2 for a handle that is malformed, another user's, or already released.",
        after_long_help = table("Exit status", RELEASE_EXIT_STATUS)
    )]
    Release(ReleaseArgs),
    /// Show who holds KEY, since when, and who waits
    Status(StatusArgs),
    /// Show the last runs under KEY: where, when, how long, how they ended
    #[command(
        long_about = "Show the last runs that held the lock KEY, newest first: start (by the \
backend's clock where it has one), host, pid and user, duration, how the run ended (exit code, \
signal, lock lost), fencing token, command and reason. A run killed with SIGKILL, or whose host \
died, shows \"no end recorded\". At most 100 runs are kept per key."
    )]
    Log(LogArgs),
    /// Stop the holder of KEY and free the lock once it has stopped
    #[command(
        name = "break",
        long_about = "Tell the holder of KEY to stop: its dlock terminates its command (and everything \
the command started) and exits 79. The lock passes to the next holder only once the broken \
command has stopped, or once its lease has run out, so two commands never run at once. Prints \
whom it broke and when the lock is free at the latest; with --wait, waits until it is. Exits 0, \
also when nothing was held; 75 when --wait ran out first; 1 for a holder that is not dlock \
(it cannot be told to stop). --force removes the lock at once instead (unsafe)."
    )]
    Break(BreakArgs),
    /// Measure the backend: lock latency, hand-off latency and throughput
    #[command(
        long_about = "Measure the configured backend from this host: (a) uncontended acquire + \
release latency, (b) hand-off latency with CLIENTS clients contending for one key (from a release \
to the next holder's acquire), (c) throughput. Prints p50/p90/p99/max and a verdict. Uses keys \
of its own (dlock-bench-HOST-PID-...) and removes them afterwards."
    )]
    Bench(BenchArgs),
    /// Check the server and what stands between: can a lock there be sound?
    #[command(
        long_about = "Ask the backend's server, and whatever stands between (a pooler, a proxy, a \
cluster, a network filesystem), whether a lock there can be sound, and print one line per check: \
ok, warn (the lock is weakened) or unsafe (no lock can be sound), with what to change; \
\"could not check\" where the server would not say. Takes no lock.",
        after_long_help = table("Exit status", DOCTOR_EXIT_STATUS)
    )]
    Doctor(DoctorArgs),
    /// Remove what keys untouched for 30 days left on the backend (their history, lock files, counters)
    #[command(
        long_about = "Remove at once what keys untouched for the retention (30 days) left on the \
backend: their run history, and their lock file, fencing counter or node where one stays behind \
a free lock. dlock also does this as it goes, a few keys after some runs; this is for cleaning up \
at once (after a burst of per-build keys, say). A key that is held or waited for is never \
touched, and a key used again later still gets larger fencing tokens than before. Prints how \
many keys it removed."
    )]
    Prune(PruneArgs),
    /// A monitoring plugin: did KEY's job run, recently and well? (exit 0 OK .. 3 UNKNOWN)
    #[command(
        long_about = "Judge KEY's newest run as a Nagios, Icinga, Sensu or Zabbix check: OK when \
it started less than --max-age ago and ended well (exit 0) or is still running; WARNING when it \
started more than --warn-age ago; CRITICAL when it started more than --max-age ago, never ran, \
or ended badly (a non-zero exit, a signal, a lost lock, or no end recorded and no longer held). \
Several --key: the worst state wins. Prints one line `DLOCK OK - ...` with perfdata after `|`. \
An unreachable backend, an unreadable history and its own usage errors are UNKNOWN (3), never \
CRITICAL. Reads only.",
        after_long_help = table("Exit status", CHECK_EXIT_STATUS)
    )]
    Check(CheckArgs),
    /// Print the last runs and the locks as Prometheus metrics (for node_exporter's textfile collector)
    #[command(
        long_about = "Print, in Prometheus' text exposition format, for each KEY (every key with \
a run history when none is given) the last run's start and end time, duration, exit code and \
success, and whether the lock is held, for how long and how many wait. Every metric is named \
dlock_*, every label value escaped. --write FILE writes the same atomically (a temporary file in \
FILE's directory, renamed over it) for node_exporter's textfile collector. Reads only; exits 0, \
69 when the backend could not be asked."
    )]
    Metrics(MetricsArgs),
    /// Print a shell completion script
    Completions(CompletionsArgs),
}

/// `dlock doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The backend to check [default: --backend, else from the URL's scheme, else file]
    #[arg(value_name = "BACKEND", conflicts_with = "backend")]
    pub which: Option<BackendKind>,

    #[command(flatten)]
    pub backend: BackendArgs,

    /// The lease length the checks judge against (a ZooKeeper session timeout, a restart's
    /// hold-back), as `run --ttl`
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub ttl: Duration,

    /// Print one JSON object instead of the lines
    #[arg(long)]
    pub json: bool,
}

/// `dlock bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Contending clients (threads, each with its own connection) in the hand-off phase
    #[arg(value_hint = ValueHint::Other, short = 'c', long, value_name = "C", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(2..=256))]
    pub clients: u32,

    /// How long each phase runs [default: 3s]
    #[arg(short = 'd', long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "ops", value_hint = ValueHint::Other)]
    pub duration: Option<Duration>,

    /// Acquisitions per phase, instead of a duration
    #[arg(short = 'o', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000), value_hint = ValueHint::Other)]
    pub ops: Option<u64>,

    /// Lease length of the benchmark's locks
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub ttl: Duration,

    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Where the lock lives.
#[derive(Debug, Args)]
pub(crate) struct BackendArgs {
    /// Lock backend [default: from the URL's scheme, else file]
    #[arg(short = 'b', long, env = "DLOCK_BACKEND", value_name = "NAME")]
    pub backend: Option<BackendKind>,

    /// Where the backend lives, e.g. file:///var/lock/dlock, redis://host:6379; repeat (or
    /// separate with spaces in DLOCK_URL) for Redlock
    #[arg(
        value_hint = ValueHint::Other,
        short = 'u',
        long = "url",
        env = "DLOCK_URL",
        value_name = "URL",
        action = ArgAction::Append,
        value_delimiter = ' ',
        hide_env_values = true
    )]
    pub urls: Vec<String>,
}

/// Diagnostics on stderr.
#[derive(Debug, Args)]
pub(crate) struct OutputArgs {
    /// Log acquire, renew and release events with timings
    #[arg(short = 'v', long, action = ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Print nothing but errors (an expected skip — busy with --no-wait, or --once-per — is
    /// not one)
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// The lock: which keys, how, and how long to wait (`run` and `acquire`).
#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    /// The lock's name (1-256 bytes of UTF-8, no control characters); repeat to hold several
    /// locks at once (taken in one fixed order, so runs never deadlock)
    #[arg(short = 'k', long, value_name = "KEY", action = ArgAction::Append, required = true, value_hint = ValueHint::Other)]
    pub key: Vec<String>,

    /// Shared (reader) lock: many shared holders at once, or one exclusive holder
    #[arg(short = 's', long, conflicts_with = "limit")]
    pub shared: bool,

    /// Semaphore: up to N holders of KEY at once; every user of KEY must give the same N
    #[arg(value_hint = ValueHint::Other, short = 'l', long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_LIMIT as i64))]
    pub limit: u32,

    /// Lease length on the server; renewed every ttl/3
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub ttl: Duration,

    /// Give up after waiting this long for the lock [default: wait forever]
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub wait: Option<Duration>,

    /// Try once; do not wait
    #[arg(short = 'n', long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// Exit code when the lock was not acquired; 0 makes the skip a silent success (`run`
    /// only: `acquire` refuses it, as `eval` would take a busy lock for a taken one)
    #[arg(short = 'E', long, value_name = "N", default_value_t = crate::exit::DEFAULT_CONFLICT, value_hint = ValueHint::Other)]
    pub conflict_exit_code: u8,

    /// After SIGTERM to the command (and what it started), how long before SIGKILL
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub kill_grace: Duration,

    /// Why the lock is taken: stored with the holder, shown by `status` and to whoever finds
    /// the lock busy
    #[arg(long, value_name = "TEXT", value_hint = ValueHint::Other)]
    pub reason: Option<String>,

    /// Skip (exit 75, or -E's code) when a run of KEY started less than DURATION ago on any
    /// host, by the backend's clock; for cron on several hosts
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub once_per: Option<Duration>,

    /// Leave no record of this run in KEY's history (`dlock log`); also DLOCK_NO_HISTORY=1,
    /// which --once-per overrides
    #[arg(long)]
    pub no_history: bool,
}

/// `dlock run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    #[command(flatten)]
    pub lock: LockArgs,

    #[command(flatten)]
    pub output: OutputArgs,

    /// The command and its arguments (after `--`)
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        num_args = 1..,
        value_hint = ValueHint::CommandWithArguments
    )]
    pub command: Vec<OsString>,
}

/// How `dlock acquire` prints what the caller needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// `export NAME='value'` lines, for `eval "$(dlock acquire ...)"`
    Sh,
    /// One JSON object
    Json,
    /// `NAME=value` lines (heredoc form for several lines) to append to `$GITHUB_ENV`
    Github,
    /// `NAME="value"` lines, for systemd's `EnvironmentFile=`
    Env,
}

/// `dlock acquire`.
#[derive(Debug, Args)]
pub(crate) struct AcquireArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    #[command(flatten)]
    pub lock: LockArgs,

    /// How to print the handle and the DLOCK_* variables
    #[arg(short = 'f', long, value_name = "FORMAT", value_enum, default_value_t = Format::Sh)]
    pub format: Format,

    /// The process the lock is held for: released when it exits, its process group stopped
    /// (SIGTERM, SIGKILL after --kill-grace) if the lock is lost; `none` for nobody (needs
    /// --max-hold) [default: the process that runs dlock acquire]
    #[arg(long, value_name = "PID|none", value_hint = ValueHint::Other)]
    pub owner: Option<String>,

    /// Give the lock up after holding it this long (stopping the owner first)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, value_hint = ValueHint::Other)]
    pub max_hold: Option<Duration>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock release`.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// What `dlock acquire` printed as DLOCK_HANDLE
    #[arg(long, env = "DLOCK_HANDLE", value_name = "HANDLE", value_hint = ValueHint::Other)]
    pub handle: Option<String>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// The lock's name; without it, every lock held or waited for on the backend, one line each
    #[arg(short = 'k', long, value_name = "KEY", value_hint = ValueHint::Other)]
    pub key: Option<String>,

    /// Print one JSON object (key, backend, held, holders, ...); without --key, an array of them
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock log`.
#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// The lock's name
    #[arg(short = 'k', long, value_name = "KEY", value_hint = ValueHint::Other)]
    pub key: String,

    /// How many runs to show, newest first
    #[arg(value_hint = ValueHint::Other, short = 'r', long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=crate::history::MAX_RUNS as i64))]
    pub runs: u32,

    /// The old spelling of --runs: taken, with a warning, until a later release drops it (-n is
    /// --no-wait in run and acquire)
    #[arg(short = 'n', hide = true, value_name = "N", conflicts_with = "runs",
          value_parser = clap::value_parser!(u32).range(1..=crate::history::MAX_RUNS as i64))]
    pub runs_n: Option<u32>,

    /// Print a JSON array of runs instead of text
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock break`.
#[derive(Debug, Args)]
pub(crate) struct BreakArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// The lock's name
    #[arg(short = 'k', long, value_name = "KEY", value_hint = ValueHint::Other)]
    pub key: String,

    /// Wait until the broken holder has stopped and let go (at most DURATION when given)
    #[arg(value_hint = ValueHint::Other, short = 'w', long, value_name = "DURATION", num_args = 0..=1,
          value_parser = parse_duration)]
    pub wait: Option<Option<Duration>>,

    /// Remove the lock now, without waiting for its holder to stop: UNSAFE, the next holder
    /// may start while the broken command still runs
    #[arg(long, conflicts_with = "wait")]
    pub force: bool,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock prune`.
#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// Remove keys untouched for DURATION instead of 30 days (at least 1s)
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, value_hint = ValueHint::Other)]
    pub older_than: Option<Duration>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// The key whose job is watched; repeat for several (the worst state wins)
    #[arg(short = 'k', long = "key", value_name = "KEY", required = true, value_hint = ValueHint::Other)]
    pub keys: Vec<String>,

    /// CRITICAL when the newest run started longer ago than this (e.g. 25h for a daily job;
    /// -c as in the plugin guidelines)
    #[arg(short = 'c', long, value_name = "DURATION", value_parser = parse_positive_duration, value_hint = ValueHint::Other)]
    pub max_age: Duration,

    /// WARNING when the newest run started longer ago than this (at most --max-age)
    #[arg(short = 'w', long, value_name = "DURATION", value_parser = parse_positive_duration, value_hint = ValueHint::Other)]
    pub warn_age: Option<Duration>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `dlock metrics`.
#[derive(Debug, Args)]
pub(crate) struct MetricsArgs {
    #[command(flatten)]
    pub backend: BackendArgs,

    /// A key to report; repeat for several [default: every key with a run history]
    #[arg(short = 'k', long = "key", value_name = "KEY", value_hint = ValueHint::Other)]
    pub keys: Vec<String>,

    /// Write to FILE atomically (a temporary file beside it, then renamed) instead of stdout
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath)]
    pub write: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// A duration of at least a second (`dlock prune --older-than`).
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err("must be at least 1s".into());
    }
    Ok(d)
}

/// `dlock completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to print a completion script for
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// A humantime duration such as `500ms`, `30s` or `2m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 2m)"))
}
