//! The holder's watchdog: the guardian of `dlock run` (`crate::guard`) in its "watch" mode,
//! started by the holder once it holds the lock, before the caller hears of it.
//!
//! ```text
//! holder (holds the lock, renews it, stops the owner on a loss)
//!   └─ d-lock-guard (watchdog: copies of every descriptor the holder has, the lease deadline)
//! owner ─ what it started, in the owner's process group
//! ```
//!
//! A `kill -9` (or an OOM kill) of the holder used to free a file lock or a MySQL/PostgreSQL
//! session at once, and let a TTL lease lapse, while the owner's script and what it started
//! ran on. Now the watchdog holds duplicates of the lock's descriptors and connections, so the lock
//! cannot end before it does. It sees the end of the holder's pipe (or its deadline pass without a
//! renewal: `LeaseClock::guard_deadline`, before the lease's), SIGKILLs the owner and the owner's
//! process group (the group only under the rule of `owner.rs`, "Process groups") until none of them
//! runs, and only then exits. On every clean end — `release`, the owner's exit, a loss the holder
//! handled — the holder dismisses it first ([`Watchdog::dismiss`]: a SIGKILL, so it exits touching
//! nothing and nothing can keep it running; it is reaped once the release is done, before `release`
//! hears of it, so its copies never outlive one).
//!
//! What it kills is the owner, every process descended from it, whatever its group or session
//! (it stops them all first, then kills: `guard/family.rs`), and the owner's group under the
//! rule of `owner.rs`. While the holder lives it watches the owner: once the owner has exited,
//! its group is forgotten the first time it is seen empty (its number may come round again).
//! What an owner that has exited left behind outside its group is found by no one: its
//! parent is gone.
//!
//! If the watchdog itself dies (`kill -9`), the holder — alive, with the lock — starts a new
//! one ([`Watchdog::check`]); the lock is not lost, and protection resumes at once.

use std::io;
use std::os::fd::AsRawFd;

use super::owner::Owner;
use crate::clock::BootInstant;
use crate::guard::{Guardian, GuardianReport, Watch};

/// What [`Watchdog::check`] found.
pub(super) enum Check {
    /// It runs (or there is none).
    Fine,
    /// It died and a new one took its place: (old pid, how it ended, new pid).
    Replaced(libc::pid_t, std::process::ExitStatus, libc::pid_t),
    /// Its deadline passed without a renewal: it killed the owner and its group, and exited.
    /// The lease is given up as lost.
    DeadlinePassed,
    /// It died and no new one could be started.
    Gone(io::Error),
}

/// The holder's handle on its watchdog.
pub(super) struct Watchdog {
    guardian: Option<Guardian>,
    watch: Watch,
    /// Told of a clean end: not replaced if it exits.
    dismissed: bool,
}

impl Watchdog {
    /// Starts the watchdog for `owner`; `close`: the holder's descriptors it must not keep
    /// (the caller's socket, the handle's listener), -1 for none.
    pub(super) fn start(
        owner: &Owner,
        close: [i32; 4],
        deadline: Option<BootInstant>,
    ) -> io::Result<Watchdog> {
        let watch = Watch {
            group: owner.group().unwrap_or(0),
            owner: owner.pid() as libc::pid_t,
            owner_start: owner.proc().start,
            owner_fd: owner.fd().map_or(-1, |f| f.as_fd().as_raw_fd()),
        };
        let guardian = spawn(watch, close, deadline)?;
        Ok(Watchdog {
            guardian: Some(guardian),
            watch,
            dismissed: false,
        })
    }

    /// Tells it when to kill by itself ([`crate::supervise::LeaseClock::guard_deadline`]), if
    /// that changed.
    pub(super) fn set_deadline(&self, deadline: Option<BootInstant>) {
        if let Some(g) = &self.guardian {
            g.set_deadline(deadline);
        }
    }

    /// Whether it still runs; if it died, replaces it (see the module documentation) unless
    /// it ended because the lease deadline passed.
    pub(super) fn check(&mut self, deadline: Option<BootInstant>) -> Check {
        let Some(g) = self.guardian.as_ref().filter(|_| !self.dismissed) else {
            return Check::Fine;
        };
        let Some(status) = g.try_reap() else {
            // Every wake of the holder: a watchdog someone stopped protects nothing.
            g.resume();
            return Check::Fine;
        };
        let old = g.pid();
        let passed = g.reports().contains(&GuardianReport::DeadlinePassed);
        self.guardian = None;
        if passed {
            return Check::DeadlinePassed;
        }
        // The caller's socket and the listener are the watcher thread's now (their numbers
        // may have been reused): nothing is closed. A copy of the listener in the watchdog
        // only makes a `release` after the holder's death wait until it has exited.
        match spawn(self.watch, [-1; 4], deadline) {
            Ok(g) => {
                let new = g.pid();
                self.guardian = Some(g);
                Check::Replaced(old, status, new)
            }
            Err(e) => Check::Gone(e),
        }
    }

    /// Ends it (SIGKILL) at a clean end, before the lock is given back: it touches nothing.
    /// [`Watchdog::reap`] waits for that, after the release (the two overlap).
    pub(super) fn dismiss(&mut self) {
        if let Some(g) = &self.guardian {
            g.dismiss();
            self.dismissed = true;
        }
    }

    /// Waits until a dismissed watchdog has exited (its copies of the lock's descriptors
    /// closed).
    pub(super) fn reap(&mut self) {
        if let Some(g) = self.guardian.take() {
            if !self.dismissed {
                g.dismiss();
            }
            g.reap();
        }
    }
}

/// Starts a watchdog; its stderr is the holder's if that is a terminal (where its one line on
/// a holder's death is worth it), else `/dev/null` (a caller's `$(… 2>&1)` must end).
fn spawn(watch: Watch, close: [i32; 4], deadline: Option<BootInstant>) -> io::Result<Guardian> {
    use std::io::IsTerminal;
    let null = if io::stderr().is_terminal() {
        None
    } else {
        Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?,
        )
    };
    Guardian::watch(watch, close, null.as_ref().map(|f| f.as_raw_fd()), deadline)
}
