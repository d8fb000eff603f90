//! The guardian: the process that keeps the lock alive until the command's whole process tree
//! is gone, whatever happens to dlock (lifetime rule 4, docs/design.md "The guardian").
//!
//! ```text
//! dlock (holds the lock, renews it, forwards signals)        own process group: the job's
//!   └─ d-lock-guard (subreaper; holds copies of every descriptor dlock had, the lock's among them)
//!        └─ COMMAND ─ its children, grandchildren, daemons that called setsid …
//! ```
//!
//! A `kill -9` (or the OOM killer) used to free a file lock or a MySQL/PostgreSQL connection at
//! once while the command's tree ran on (PDEATHSIG reaches only the direct child, and the kernel
//! closes a dying process's files before it sends it). Now the command is the guardian's child
//! and every orphan below it is re-parented to the guardian (a child subreaper), which also holds
//! duplicates of dlock's descriptors, so a flock or a connection cannot end before it does. When
//! dlock dies, the guardian sees the end of its pipe, SIGKILLs the whole tree, waits until the
//! last process is reaped, and only then exits — releasing the descriptors. A lock with a TTL
//! runs out on the server some time later; the tree is long gone by then. The guardian also
//! holds a deadline before the lease's and kills the tree by itself when it passes (dlock
//! frozen by SIGSTOP or starved). If the guardian is killed instead, the command dies of its
//! PDEATHSIG, the orphans come to dlock (a subreaper too), and dlock kills them before it
//! releases.
//!
//! **Cost.** The guardian shares dlock's memory (`clone(CLONE_VM)`, [`crate::sys::clone_vm`]: a
//! `fork()` copies page tables: +0.45 ms per run here, this +0.05–0.1 ms), which means it runs with the
//! C library's per-thread state of dlock's main thread. So it allocates nothing, takes no lock,
//! never touches `errno` (its system calls are [`crate::sys::raw`]) and cannot panic (the lints
//! of `guardian.rs`), and it is done with dlock's memory once it reported the command started.
//! A process sharing memory with dlock would die with it if the OOM killer chose dlock (it
//! kills every process of the victim's memory), so a guardian whose command still runs after
//! [`DETACH_AFTER`] gets memory of its own by executing dlock's binary again
//! (`/proc/self/exe`, [`resume_if_asked`]); a short command never pays for that.

// What runs in the guardian must not be able to panic (see `guardian.rs`): checked here for the
// whole module, dlock's side included.
#![deny(
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::arithmetic_side_effects,
    clippy::unreachable,
    clippy::string_slice
)]

mod buf;
mod family;
mod guardian;
mod tree;

use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use crate::clock::BootInstant;
use crate::sys::raw;
use crate::sys::spawn::Plan;

pub use guardian::resume_if_asked;

/// How long a guardian shares dlock's memory before it executes itself anew (see the module
/// documentation): until then an OOM kill of dlock takes the guardian with it.
pub(crate) const DETACH_AFTER: Duration = Duration::from_millis(20);

/// The guardian's stack: what it touches is mapped on use.
const STACK: usize = 256 * 1024;

/// One message on either pipe: a tag and a value, written at once (less than PIPE_BUF).
const MESSAGE: usize = 16;

/// Messages from dlock to the guardian.
mod to_guard {
    /// Send this signal to the command, if it has not exited.
    pub(super) const SIGNAL: u8 = b'S';
    /// The lease now lasts until this `CLOCK_BOOTTIME` nanosecond (0: it does not expire).
    pub(super) const DEADLINE: u8 = b'D';
    /// Kill the whole tree now (SIGKILL, round after round, until nothing is left).
    pub(super) const KILL: u8 = b'X';
}

/// Messages from the guardian to dlock.
mod from_guard {
    /// The command started with this pid.
    pub(super) const STARTED: u8 = b'P';
    /// The command could not be executed: this errno.
    pub(super) const FAILED: u8 = b'F';
    /// The command exited with this wait status.
    pub(super) const EXITED: u8 = b'E';
    /// The command exited, and processes it started still run.
    pub(super) const LEFTOVERS: u8 = b'L';
    /// The lease deadline passed: the guardian killed the tree.
    pub(super) const DEADLINE_PASSED: u8 = b'K';
}

fn encode(tag: u8, value: u64) -> [u8; MESSAGE] {
    let mut m = [0u8; MESSAGE];
    m[0] = tag;
    m[8..].copy_from_slice(&value.to_le_bytes());
    m
}

fn decode(m: &[u8]) -> Option<(u8, u64)> {
    let value: [u8; 8] = m.get(8..MESSAGE)?.try_into().ok()?;
    Some((*m.first()?, u64::from_le_bytes(value)))
}

/// What the guardian reports while the command runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GuardianReport {
    /// The command exited (or was killed) with this status.
    Exited(ExitStatus),
    /// The command exited and left processes running.
    Leftovers,
    /// Its deadline passed before dlock renewed the lease or stopped: the guardian killed the
    /// tree.
    DeadlinePassed,
}

/// Why the guardian could not start the command.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The command could not be executed (ENOENT, EACCES, ...); the guardian is gone.
    Exec(io::Error),
    /// No guardian could be made (out of processes or memory); nothing runs.
    Guardian(io::Error),
}

/// dlock's handle on its guardian.
pub(crate) struct Guardian {
    pid: libc::pid_t,
    /// The command's pid; `None` if the guardian died before it said.
    command: Option<libc::pid_t>,
    to_guard: OwnedFd,
    from_guard: OwnedFd,
    /// The deadline it was last told (as sent: ns, 0 for none), from its start on: the same
    /// one is not sent again, one that could not be written is.
    told_ns: std::sync::atomic::AtomicU64,
}

/// What a watchdog watches (a guardian in "watch" mode, started by `dlock acquire`'s holder
/// instead of a command): the owner and its process group, which exist already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The owner's process group, if the owner led it when it was pinned (0: none). See
    /// `hold/owner.rs` for when a group id may be signalled.
    pub group: libc::pid_t,
    /// The owner's pid, and its start time (`/proc/PID/stat`, clock ticks) that names it.
    pub owner: libc::pid_t,
    pub owner_start: u64,
    /// A pidfd of the owner in the holder's descriptor table (the watchdog gets a copy of the
    /// table), or -1 without pidfds.
    pub owner_fd: i32,
}

/// What the guardian reads from dlock's memory while it starts; nothing after it reported.
struct Setup<'a> {
    /// The command to start; `None` for a watchdog.
    plan: Option<&'a mut Plan>,
    watch: Watch,
    /// Descriptors the guardian closes in its copy of the table (-1: none): a watchdog must not
    /// keep its caller's socket or the handle's listener.
    close: [i32; 4],
    /// Put on the guardian's stderr, if not -1 (a watchdog must not keep a caller's `$(…)` open).
    stderr_to: i32,
    /// The guardian's ends of the pipes.
    from_dlock: i32,
    to_dlock: i32,
    /// dlock's ends, which the guardian closes in its copy of the descriptor table.
    dlock_ends: [i32; 2],
    dlock: libc::pid_t,
    deadline_ns: u64,
    quiet: bool,
    /// This binary resumes guardians ([`resume_if_asked`]): detaching is allowed.
    detach: bool,
    /// What the guardian passes on to dlock ([`crate::signals::forwarded_set`]).
    forward: u64,
}

impl Guardian {
    /// Starts the guardian, which starts the command as its child. Returns once the command has
    /// been executed (or could not be). Call from the main thread, whose signals are blocked.
    pub(crate) fn start(
        mut plan: Box<Plan>,
        deadline: Option<BootInstant>,
        quiet: bool,
    ) -> Result<Guardian, StartError> {
        let started = Guardian::clone(
            Some(&mut plan),
            Watch::default(),
            [-1; 4],
            -1,
            deadline,
            quiet,
        );
        let (mut g, first) = started.map_err(StartError::Guardian)?;
        crate::trace::stage("spawn");
        match first {
            Some((from_guard::STARTED, pid)) => g.command = i32::try_from(pid).ok(),
            Some((from_guard::FAILED, errno)) => {
                crate::sys::wait_pid(g.pid);
                let errno = i32::try_from(errno).unwrap_or(libc::EINVAL);
                return Err(StartError::Exec(io::Error::from_raw_os_error(errno)));
            }
            // The guardian died before it said (killed): its end closed. Whatever it started
            // is now dlock's child; the supervisor kills and reaps it. The plan stays: a
            // command killed before its exec may still be running on its stack.
            None => {
                Box::leak(plan);
            }
            _ => {}
        }
        Ok(g)
    }

    /// Starts a watchdog: a guardian that starts nothing but watches `watch` (the owner of an
    /// acquire-held lock and its process group). It holds copies of every descriptor of the
    /// calling process but `close`, the lease deadline, and SIGKILLs the owner and its group
    /// when the caller dies or the deadline passes — until no process of them is left — and
    /// only then exits. [`Guardian::dismiss`] ends it without that. Returns once it runs.
    pub(crate) fn watch(
        watch: Watch,
        close: [i32; 4],
        stderr_to: Option<i32>,
        deadline: Option<BootInstant>,
    ) -> io::Result<Guardian> {
        let (g, first) =
            Guardian::clone(None, watch, close, stderr_to.unwrap_or(-1), deadline, false)?;
        match first {
            Some((from_guard::STARTED, _)) => Ok(g),
            _ => {
                crate::sys::wait_pid(g.pid);
                Err(io::Error::other("the watchdog died as it started"))
            }
        }
    }

    /// Ends a watchdog at a clean end (the lock is being given back or was lost, and the owner
    /// is stopped or gone): SIGKILL, so that it signals nothing and cannot be kept from exiting
    /// (a message could sit unread in a full pipe of a stopped watchdog, and the holder wait
    /// for it for ever). Our unreaped child: its pid cannot have been reused. Reap it with
    /// [`Guardian::reap`] before the end is final: until then it holds its copies of the lock's
    /// descriptors. (Its exit overlaps with the release's round trip.)
    pub(crate) fn dismiss(&self) {
        let _ = raw::kill(self.pid, libc::SIGKILL);
    }

    /// Continues the guardian if something stopped it (a stopped watchdog protects nothing).
    /// Our unreaped child: safe to signal by pid.
    pub(crate) fn resume(&self) {
        let _ = raw::kill(self.pid, libc::SIGCONT);
    }

    /// Waits for the guardian to exit, and reaps it.
    pub(crate) fn reap(self) {
        crate::sys::wait_pid(self.pid);
    }

    /// The guardian's wait status if it has exited (reaped then); `None` while it runs.
    pub(crate) fn try_reap(&self) -> Option<ExitStatus> {
        crate::sys::try_wait_pid(self.pid)
    }

    /// Clones the guardian and waits for its first word (`None`: it died before it said).
    fn clone(
        plan: Option<&mut Plan>,
        watch: Watch,
        close: [i32; 4],
        stderr_to: i32,
        deadline: Option<BootInstant>,
        quiet: bool,
    ) -> io::Result<(Guardian, Option<(u8, u64)>)> {
        let (from_dlock, to_guard) = crate::sys::pipe_nonblocking()?;
        let (from_guard, to_dlock) = crate::sys::pipe_nonblocking()?;
        let watching = plan.is_none();
        let mut setup = Setup {
            plan,
            watch,
            close,
            stderr_to,
            from_dlock: from_dlock.as_raw_fd(),
            to_dlock: to_dlock.as_raw_fd(),
            dlock_ends: [to_guard.as_raw_fd(), from_guard.as_raw_fd()],
            dlock: raw::getpid(),
            deadline_ns: deadline.map_or(0, ns),
            quiet,
            detach: guardian::can_detach(),
            forward: crate::signals::forwarded_set(),
        };
        // A watchdog starts nothing, and calls nothing but raw system calls from its first
        // instruction: it is not waited for (that would put its first time slice on the
        // holder's path). Its setup is never freed instead (a few words, once per watchdog);
        // a guardian's stays on this stack, which outlives its reading (waited for below).
        let setup: &mut Setup<'_> = if watching {
            Box::leak(Box::new(setup))
        } else {
            &mut setup
        };
        // `guardian::entry` keeps the rules of a process in dlock's memory (no allocation, no
        // lock, no panic, no C library: this module's lints and `sys::raw`), and reads `setup`
        // only until it reports on `to_dlock`.
        let pid = crate::sys::clone_vm(STACK, guardian::entry, setup)?;
        crate::trace::stage("guardian");
        // Closed without the C library: the guardian may be using `errno` now.
        raw::close(from_dlock.into_raw_fd());
        raw::close(to_dlock.into_raw_fd());
        let g = Guardian {
            pid,
            command: None,
            to_guard,
            from_guard,
            told_ns: std::sync::atomic::AtomicU64::new(deadline.map_or(0, ns)),
        };
        if watching {
            return Ok((g, Some((from_guard::STARTED, 0))));
        }
        // The guardian may be writing `errno` (dlock's main thread's) while it starts the
        // command: wait without reading it.
        let mut fds = [libc::pollfd {
            fd: g.from_guard.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut m = [0u8; MESSAGE];
        let first = loop {
            match raw::read(g.from_guard.as_raw_fd(), &mut m) {
                Ok(MESSAGE) => break decode(&m),
                Err(libc::EAGAIN | libc::EINTR) => {
                    raw::poll(&mut fds, None);
                }
                // The guardian died before it said (killed): its end closed.
                _ => return Ok((g, None)),
            }
        };
        Ok((g, first))
    }

    /// The guardian's pid.
    pub(crate) fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// The command's pid, if the guardian said it.
    pub(crate) fn command(&self) -> Option<libc::pid_t> {
        self.command
    }

    /// Asks the guardian to send `sig` to the command (nothing if it has exited).
    pub(crate) fn signal_command(&self, sig: i32) {
        self.tell(to_guard::SIGNAL, sig as u64);
    }

    /// Asks the guardian to kill the command's whole tree: its own children by pid (safe for
    /// their parent, on every kernel), round after round, until none is left; then it exits.
    pub(crate) fn kill_tree(&self) {
        self.tell(to_guard::KILL, 0);
    }

    /// Tells the guardian when to kill the tree by itself
    /// ([`crate::supervise::LeaseClock::guard_deadline`]: before the lease's deadline), if
    /// that is not what it was told last; call again after every change (and a write that
    /// failed is tried again then).
    pub(crate) fn set_deadline(&self, deadline: Option<BootInstant>) {
        use std::sync::atomic::Ordering::Relaxed;
        let v = deadline.map_or(0, ns);
        if self.told_ns.load(Relaxed) != v && self.tell(to_guard::DEADLINE, v) {
            self.told_ns.store(v, Relaxed);
        }
    }

    /// Best effort: a guardian that is gone (EPIPE) or stopped with a full pipe (EAGAIN) misses
    /// it. dlock's own deadline and signal handling do not depend on a deadline or a signal
    /// message; a kill message is repeated every kill round (and dlock sends the guardian
    /// SIGCONT each time), so one that is missed is sent again.
    fn tell(&self, tag: u8, value: u64) -> bool {
        raw::write(self.to_guard.as_raw_fd(), &encode(tag, value)) == Ok(MESSAGE)
    }

    /// Everything the guardian reported since the last call, in order. Never blocks.
    pub(crate) fn reports(&self) -> Vec<GuardianReport> {
        let mut out = Vec::new();
        let mut buf = [0u8; MESSAGE * 8];
        while let Ok(n @ 1..) = raw::read(self.from_guard.as_raw_fd(), &mut buf) {
            for m in buf.get(..n).unwrap_or_default().chunks_exact(MESSAGE) {
                match decode(m) {
                    Some((from_guard::EXITED, status)) => {
                        out.push(GuardianReport::Exited(ExitStatus::from_raw(status as i32)));
                    }
                    Some((from_guard::LEFTOVERS, _)) => out.push(GuardianReport::Leftovers),
                    Some((from_guard::DEADLINE_PASSED, _)) => {
                        out.push(GuardianReport::DeadlinePassed)
                    }
                    _ => {}
                }
            }
        }
        out
    }
}

/// A `CLOCK_BOOTTIME` instant in nanoseconds.
fn ns(t: BootInstant) -> u64 {
    u64::try_from(t.since_boot().as_nanos()).unwrap_or(u64::MAX)
}
