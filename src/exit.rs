//! The exit-code table (docs/design.md, "Exit codes"), the few typed errors that choose an exit
//! code, and the mapping from a child's wait status to dlock's own exit code.
//!
//! Everything else is an `anyhow::Error` with context; [`code_for`] finds the typed errors by
//! downcast, so a backend only has to wrap the cause in the right type once, at the boundary.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// Usage error: bad flag, duration, key or URL.
pub(crate) const USAGE: u8 = 2;
/// The backend was unavailable or failed before the child started (sysexits `EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// Default code for "lock not acquired" (sysexits `EX_TEMPFAIL`); `-E` changes it.
pub(crate) const DEFAULT_CONFLICT: u8 = 75;
/// The backend is set up so that no lock there can be sound (sysexits `EX_CONFIG`): a pooler in
/// transaction mode, a multi-primary cluster. Refused before anything runs.
pub(crate) const UNSOUND: u8 = 78;
/// The lock was lost while the child ran and the child was terminated.
pub(crate) const LOST: u8 = 79;
/// The command exists but could not be executed.
pub(crate) const NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub(crate) const NOT_FOUND: u8 = 127;

/// A usage error found after clap: a bad key, URL or combination of options.
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Usage {}

/// The lock is held by someone else and the caller did not (or no longer) want to wait.
#[derive(Debug)]
pub(crate) struct Busy {
    /// What the backend knows of the holder, for the message (e.g. "held by host-a pid 42").
    pub holder: Option<String>,
    /// True when a `--wait` deadline ran out, false for a `--no-wait` attempt.
    pub waited: bool,
    /// Why it is busy when nobody else holds it (a lock held back after a server restart).
    pub why: Option<String>,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.waited {
            "gave up waiting: lock is busy"
        } else {
            "lock is busy"
        })?;
        if let Some(h) = &self.holder {
            write!(f, " (held by {h})")?;
        }
        if let Some(why) = &self.why {
            write!(f, ": {why}")?;
        }
        Ok(())
    }
}
impl std::error::Error for Busy {}

/// A wait for the lock was interrupted by a signal; nothing is held.
#[derive(Debug)]
pub(crate) struct Interrupted(pub i32);

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "interrupted by {} while waiting for the lock",
            signal_name(self.0)
        )
    }
}
impl std::error::Error for Interrupted {}

/// The backend cannot be reached or failed; wrap the root cause of a connect/acquire failure.
#[derive(Debug)]
pub(crate) struct Unavailable(pub String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Unavailable {}

/// What stands between dlock and its server (a pooler, a proxy, a cluster) makes any lock there
/// unsound: refused with exit 78 before anything runs. The message names what was found and
/// what to change; `dlock doctor` says the same.
#[derive(Debug)]
pub(crate) struct Unsound(pub String);

impl fmt::Display for Unsound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Unsound {}

/// The connection to a server that this process had reached broke, or the server stopped
/// answering: a run that has not started its command reconnects and queues again (within
/// `--wait`) instead of failing. Exit 69 like [`Unavailable`] where it ends a run. A server
/// that could not be reached at all is [`Unavailable`], and so is any error the server itself
/// answered with (permissions, a missing table): waiting would not cure those.
#[derive(Debug)]
pub(crate) struct Outage(pub String);

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Outage {}

/// A grant that fewer replicas acknowledged than `?min-replicas=N` requires: it was given back,
/// and a waiting run tries again within `--wait` as after an [`Outage`] (the connection is
/// fine: the message says what the run waits for). Exit 69 where it ends a run.
#[derive(Debug)]
pub(crate) struct Unreplicated(pub String);

impl fmt::Display for Unreplicated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Unreplicated {}

/// The exit code for an error, by the first typed error found in its chain. Untyped errors are
/// backend failures (69): every I/O path of a backend ends there.
pub(crate) fn code_for(err: &anyhow::Error, conflict_code: u8) -> u8 {
    for cause in err.chain() {
        if cause.is::<Usage>() {
            return USAGE;
        }
        if cause.is::<Busy>() {
            return conflict_code;
        }
        if let Some(Interrupted(sig)) = cause.downcast_ref::<Interrupted>() {
            return signal_code(*sig);
        }
        if cause.is::<Unsound>() {
            return UNSOUND;
        }
        if cause.is::<Unavailable>() || cause.is::<Outage>() || cause.is::<Unreplicated>() {
            return UNAVAILABLE;
        }
    }
    UNAVAILABLE
}

/// 128 + N, as shells report a death by signal N.
pub(crate) fn signal_code(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}

/// The exit code that reports a child's wait status: its own code, or 128+N for signal N.
pub(crate) fn child_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return code as u8;
    }
    status.signal().map_or(UNAVAILABLE, signal_code)
}

/// "killed by SIGKILL", "exit code 3": a wait status, for messages.
pub(crate) fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by {}", signal_name(sig)),
        _ => format!("wait status {}", status.into_raw()),
    }
}

/// "SIGTERM" for 15, for messages.
pub(crate) fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSTKFLT => "SIGSTKFLT",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_choose_their_code_through_context() {
        let busy = anyhow::Error::new(Busy {
            holder: None,
            why: None,
            waited: false,
        })
        .context("file: 'job'");
        assert_eq!(code_for(&busy, 75), 75);
        assert_eq!(code_for(&busy, 3), 3);
        let usage = anyhow::Error::new(Usage("bad".into())).context("x");
        assert_eq!(code_for(&usage, 75), USAGE);
        assert_eq!(
            code_for(&anyhow::Error::new(Interrupted(libc::SIGINT)), 75),
            130
        );
        assert_eq!(
            code_for(&anyhow::anyhow!("connection refused"), 75),
            UNAVAILABLE
        );
        let unsound = anyhow::Error::new(Unsound("pooled".into())).context("x");
        assert_eq!(code_for(&unsound, 75), UNSOUND);
    }

    #[test]
    fn child_status_maps_codes_and_signals() {
        assert_eq!(child_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(child_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
