//! `dlock acquire` and `dlock release`: a lock that spans several commands.
//!
//! `dlock acquire` forks before it has any thread. The child becomes the *holder*
//! ([`holder`]): a session of its own, stdin and stdout on `/dev/null` (so `$(dlock acquire …)`
//! returns as soon as the lock is held), the lock taken and kept exactly as `dlock run` keeps
//! it, and a Unix socket that `dlock release` reaches it by ([`handle`]). The parent only relays
//! signals to it (Ctrl-C while waiting gives up, as for `run`) and, once the holder says the
//! lock is held, prints the handle and the `DLOCK_*` variables ([`format`]) and tells the holder
//! its caller has them; if the parent dies first, the holder gives the lock back.
//!
//! The holder holds the lock *for an owner*: by default the process that ran `dlock acquire`
//! (the shell). When the owner exits, the lock is released; when the lease is lost, the owner's
//! process group is stopped (SIGTERM, SIGKILL after `--kill-grace`) before the lease can run
//! out. Only that process group is protected: `dlock run` remains the strict form, whose guard
//! covers every descendant of its command.

mod format;
mod handle;
mod holder;
mod owner;
mod watchdog;
mod watcher;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::cli::ReleaseArgs;
use crate::config::{AcquireConfig, OwnerChoice};
use crate::exit::{self, Usage};
use crate::model::Verbosity;
use crate::report;
use crate::sys::{self, Forked, SigSet};

pub(crate) use self::format::Granted;

/// `dlock acquire`: returns the exit code (0 once the caller has the handle).
pub(crate) fn acquire(cfg: &AcquireConfig) -> u8 {
    report::set_verbosity(cfg.lock.verbosity);
    let owner = match resolve_owner(cfg.owner) {
        Ok(o) => o,
        Err(e) => return report::usage(&e),
    };
    // Blocked before the fork, so that the holder starts with them blocked (it takes them as
    // `dlock run` does) and this side can take them from a descriptor.
    let relayed = SigSet::of(&crate::signals::relayed());
    let (to_holder, to_caller) = match UnixStream::pair() {
        Ok(pair) => pair,
        Err(e) => return setup_failed(&e),
    };
    if let Err(e) = sys::block_signals(&relayed) {
        return setup_failed(&e);
    }
    let caller = std::process::id() as libc::pid_t;
    match sys::fork() {
        Err(e) => setup_failed(&e),
        Ok(Forked::Child) => {
            drop(to_holder);
            holder::hold(cfg, owner, to_caller, caller)
        }
        Ok(Forked::Parent(pid)) => {
            drop(to_caller);
            relay(cfg, pid, to_holder, &relayed)
        }
    }
}

fn setup_failed(e: &std::io::Error) -> u8 {
    report::error(format_args!("cannot start the holder process: {e}"));
    exit::UNAVAILABLE
}

/// The owner, pinned (`None` for `--owner none`).
fn resolve_owner(owner: OwnerChoice) -> Result<Option<owner::Owner>, Usage> {
    match owner {
        OwnerChoice::Nobody => Ok(None),
        OwnerChoice::Caller => owner::Owner::pin(owner::caller_owner() as u32, true).map(Some),
        OwnerChoice::Pid(p) => owner::Owner::pin(p, false).map(Some),
    }
}

/// The caller's side: passes signals on to the holder until it says the lock is held (then
/// prints the handle) or exits (then exits with its code).
fn relay(cfg: &AcquireConfig, holder: libc::pid_t, to_holder: UnixStream, relayed: &SigSet) -> u8 {
    let signals = match sys::signal_fd(relayed) {
        Ok(fd) => fd,
        Err(e) => return setup_failed(&e),
    };
    let mut reader = BufReader::new((&to_holder).take(1 << 20));
    loop {
        let ready =
            sys::poll_readable(&[to_holder.as_fd(), signals.as_fd()], -1).unwrap_or_default();
        if ready.get(1) == Some(&true) {
            while let Some(t) = sys::take_signal(relayed, Duration::ZERO) {
                if t.signal != libc::SIGCHLD {
                    let _ = sys::raw::kill(holder, t.signal);
                }
            }
        }
        if ready.first() != Some(&true) {
            continue;
        }
        let mut line = String::new();
        let granted = match reader.read_line(&mut line) {
            Ok(n) if n > 0 => serde_json::from_str::<Granted>(&line).ok(),
            _ => None,
        };
        let Some(granted) = granted else {
            // The holder ended without the lock (it said why on stderr): its code is ours.
            drop(reader);
            drop(to_holder);
            return exit::child_code(sys::wait_pid(holder));
        };
        let text = format::render(&granted, cfg.format);
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            report::error(format_args!(
                "cannot print the handle ({e}); the lock is given back"
            ));
            return exit::UNAVAILABLE;
        }
        // The holder now detaches; it is not this process's to wait for.
        let _ = (&to_holder).write_all(b"1");
        return 0;
    }
}

/// `eval "$(dlock acquire …)"` of nothing succeeds: a script would go on without the lock, even
/// under `set -e`. So when `dlock acquire` fails in any way — a usage error too — and prints
/// into a pipe (not a terminal), it prints `(exit N)`, and the `eval` fails with acquire's own
/// code — unless clap itself parsed a format that is not for a shell (`--format json`…): a
/// hand-made reading of the arguments missed `--format shell` (a usage error, so nothing else
/// was printed) and `--reason -fjson` (a value, not a flag). `args` are dlock's arguments,
/// program name first; anything but `acquire` is left alone.
pub(crate) fn fail_the_eval(args: &[std::ffi::OsString], code: u8) {
    use clap::Parser;
    use std::io::IsTerminal;
    if code == 0 || args.get(1).is_none_or(|a| a != "acquire") || std::io::stdout().is_terminal() {
        return;
    }
    let not_for_a_shell = matches!(
        crate::cli::Cli::try_parse_from(args),
        Ok(crate::cli::Cli { command: crate::cli::Command::Acquire(a), .. })
            if a.format != crate::cli::Format::Sh
    );
    if !not_for_a_shell {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "(exit {code})");
        let _ = out.flush();
    }
}

/// `dlock release`.
pub(crate) fn release(a: &ReleaseArgs) -> u8 {
    report::set_verbosity(Verbosity::from(&a.output));
    let Some(text) = a.handle.as_deref().filter(|h| !h.is_empty()) else {
        return report::usage(&Usage(
            "no handle: give --handle, or set DLOCK_HANDLE as dlock acquire prints it".into(),
        ));
    };
    let socket = match handle::parse(text) {
        Ok(p) => p,
        Err(e) => return report::usage(&e),
    };
    // Releasing waits for the backend (bounded by its own timeouts).
    let reply = match handle::ask(&socket, handle::RELEASE, Duration::from_secs(120)) {
        Ok(r) => r,
        Err(e) if e.is::<Usage>() => return report::usage(&Usage(format!("{e}"))),
        Err(e) => {
            report::error(format_args!("release: {e:#}"));
            return exit::UNAVAILABLE;
        }
    };
    let end = handle::end_file(&socket);
    let reply = match reply {
        Some(r) => r,
        None => match handle::read_end(&end) {
            Some(r) => r,
            None if socket.exists() => handle::Reply {
                code: exit::LOST,
                message: "the holder process of this handle is gone (killed?); the lock was \
                          given back when it died (a lease runs out by itself)"
                    .into(),
            },
            None => {
                return report::usage(&Usage(format!(
                    "no lock is held under handle {}: released already, or its owner exited",
                    socket.display()
                )));
            }
        },
    };
    let _ = std::fs::remove_file(&end);
    let _ = std::fs::remove_file(&socket);
    if !reply.message.is_empty() {
        if reply.code == 0 {
            report::warn(format_args!("{}", reply.message));
        } else {
            report::error(format_args!("{}", reply.message));
        }
    }
    reply.code
}
