//! The commands, end to end: parse, validate, then `run` (acquire, keep, supervise, release),
//! `status`, `break` and `completions`. Errors are printed here, once, as one `dlock: …` line.

use std::io::Write;
use std::process::ExitCode;

use crate::backend;
use crate::cli::{Cli, Command};
use crate::config::{KeyConfig, RunConfig};
use crate::exit;
use crate::report;

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
        // A monitoring plugin's own usage error is UNKNOWN (3), said on its status line.
        Err(e) if is_check() && !shows_help(&e) => {
            return crate::cmd::check::usage(&clap_line(&e));
        }
        Err(e) => return clap_error(&e),
    };
    match cli.command {
        Command::Run(args) => match RunConfig::from_args(args) {
            Ok(cfg) => crate::cmd::run::run(&cfg),
            Err(e) => report::usage(&e),
        },
        Command::Acquire(a) => match crate::config::AcquireConfig::from_args(&a) {
            Ok(cfg) => crate::hold::acquire(&cfg),
            Err(e) => report::usage(&e),
        },
        Command::Release(a) => crate::hold::release(&a),
        Command::Status(a) => match &a.key {
            Some(key) => match KeyConfig::new(&a.backend, key, &a.output) {
                Ok(cfg) => crate::cmd::status::status(&cfg, a.json),
                Err(e) => report::usage(&e),
            },
            None => match crate::config::Target::from_args(&a.backend) {
                Ok(target) => crate::cmd::status::list(
                    &target,
                    crate::model::Verbosity::from(&a.output),
                    a.json,
                ),
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
                crate::cmd::log::log(&cfg, a.runs_n.unwrap_or(a.runs) as usize, a.json)
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
                    crate::session::prune_all(b.as_ref(), a.older_than, a.output.quiet)
                }
                Err(e) => report::fail(target.kind.name(), &e, exit::DEFAULT_CONFLICT),
            },
            Err(e) => report::usage(&e),
        },
        Command::Check(a) => match crate::config::CheckConfig::from_args(&a) {
            Ok(cfg) => crate::cmd::check::check(&cfg),
            Err(e) => crate::cmd::check::usage(&e.to_string()),
        },
        Command::Metrics(a) => match crate::config::MetricsConfig::from_args(&a) {
            Ok(cfg) => crate::cmd::metrics::metrics(&cfg),
            Err(e) => report::usage(&e),
        },
        Command::Completions(a) => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&crate::generate::completion(a.shell));
            0
        }
    }
}

/// Whether this is `dlock check` (whose usage errors are UNKNOWN).
fn is_check() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == "check")
}

/// Whether clap's "error" is help or the version, which go to stdout as they are.
fn shows_help(e: &clap::Error) -> bool {
    use clap::error::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    )
}

/// clap's error as one line: its first paragraph ("error: what\n  detail\n\nUsage: ..."), and
/// a suggestion — clap's ("tip: a similar argument exists: '--key'", in a later paragraph), or
/// ours for a transposition in a short word (`--kye`), which clap misses ([`did_you_mean`]).
fn clap_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let mut line = first.join(" ");
    if let Some(tip) = did_you_mean(e).or_else(|| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("tip: "))
            .map(str::to_string)
    }) {
        line = format!("{line}; {tip}");
    }
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    format!("{line} (see --help)")
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
    report::usage_error(format_args!("{}", clap_line(e)));
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
