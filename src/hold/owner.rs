//! The process an acquire-held lock is held for, and stopping it with what it started.
//!
//! The owner is pinned before the holder is forked — a pidfd and its start time — so that a pid
//! reused while `acquire` waited for the lock is never taken for it. Stopping signals, once
//! each: the owner's process group when the owner leads one (a job of a terminal's shell, a
//! cron job, a service; a group someone above the owner made holds the owner's parents), and
//! the owner and every process descended from it, each pinned ([`Proc`]) so that a signal
//! reaches the process scanned or none. Each SIGKILL pass rescans below every process still
//! running, so what was forked meanwhile (by a child the owner's death orphaned, too) is
//! caught. A group is dropped as soon as it is empty: its number could then be reused.
//!
//! **Process groups.** A group's id is the pid of the process that made it, and the kernel
//! hands that number out again only once no process has it as its pid or its group (a zombie
//! still has it). A holder or a watchdog is in no group of the owner's and cannot hold one
//! open, so it signals a group (`killpg`) only under this rule:
//!
//! 1. the owner led the group (its pid is the group's id) when it was pinned — recorded then
//!    ([`Owner::group`]); or it leads it when the stop begins and still runs (its own pid is
//!    then the group's, and cannot be anyone else's while it lives);
//! 2. and the group is seen to have a running process just before each signal; the first
//!    time it is seen without one, it is forgotten for good.
//!
//! So a group id that may have been handed to someone else is never signalled: not one the
//! owner never led (before this rule, an owner pinned in its parent's group that exited left
//! its pid — free for a new group leader — to be killed as "its group"), not one seen empty.
//! A group whose number is seen to be a new process's pid (not the owner's: another start time)
//! is dropped too: the owner's group emptied, and a stranger may lead one of that number.
//! What remains is the moment between an owner's exit and the first look (a few milliseconds
//! with pidfds; up to [`OWNER_CHECK`] without; as long as the holder is frozen): the group
//! would have to empty, its number come round again in the kernel's pid counter, and its new
//! process exit again while leaving a group of that number behind, within it. (The counter
//! wraps at `pid_max`: 32,768 by the kernel's default, more on machines with many CPUs, and
//! 4,194,304 where systemd raises it, as most 64-bit distributions do.)

use crate::exit::Usage;
use crate::procs::{self, Proc};
use crate::stopper::Tree;
use crate::sys::{self, PidFd};

/// How often a holder without pidfds (Linux < 5.3) looks whether its owner has exited: no
/// kernel before 5.3 tells a process that another one, not its child, has ended.
pub(super) const OWNER_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Programs that run dlock for a shell and exit with it (`eval "$(timeout 60 dlock acquire …)"`):
/// the default owner is the first process above them, not them — else the lock would be given
/// back as soon as the handle is printed.
pub(super) const WRAPPERS: &[&str] = &[
    "timeout", "time", "sudo", "doas", "env", "nice", "ionice", "chrt", "taskset", "stdbuf",
    "nohup", "setpriv", "runuser", "strace", "ltrace", "unbuffer", "flock",
];

/// The default owner: the process that ran `dlock acquire`, or above any [`WRAPPERS`] between
/// them (at most 8).
pub(super) fn caller_owner() -> libc::pid_t {
    let mut pid = sys::parent_pid();
    for _ in 0..8 {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !WRAPPERS.contains(&comm.trim_end()) {
            break;
        }
        match procs::parent_of(pid) {
            Some(up) if up > 1 => pid = up,
            _ => break,
        }
    }
    pid
}

/// A pinned owner process.
pub(super) struct Owner {
    pid: libc::pid_t,
    /// It led its process group when it was pinned (see "Process groups" above).
    led_group: bool,
    /// A pidfd, where the kernel has them; without, the start time alone names it (`proc`).
    fd: Option<PidFd>,
    proc: Proc,
}

impl Owner {
    /// Pins `pid`, a live process of this user (any, for root). `parent`: it must still be the
    /// default owner once pinned ([`caller_owner`]: this process's parent, or the process above
    /// its wrappers; one that died meanwhile could have had its pid reused). Refused: init and namespace inits (every process descends from
    /// them) and a service manager (`systemd --user` runs `ExecStartPre=`).
    pub(super) fn pin(pid: u32, parent: bool) -> Result<Owner, Usage> {
        let which = if parent {
            "the owner (the process that runs dlock acquire)"
        } else {
            "--owner"
        };
        let hint = "give --owner PID, or --owner none with --max-hold";
        if pid <= 1 || pid > i32::MAX as u32 {
            return Err(Usage(format!(
                "{which} would be pid {pid}, whose descendants are every process: {hint}"
            )));
        }
        let pid = pid as libc::pid_t;
        // Without a pidfd (none on this kernel, or no descriptor to spare) the start time alone
        // pins it, and the holder looks every OWNER_CHECK whether it exited.
        let gone = || Usage(format!("{which} {pid}: no such process"));
        let fd = match sys::has_pidfds().then(|| PidFd::open(pid)) {
            Some(Ok(fd)) => Some(fd),
            Some(Err(libc::ESRCH)) => return Err(gone()),
            Some(Err(_)) | None => None,
        };
        let proc = Proc::of(pid).ok_or_else(gone)?;
        let led_group = sys::process_group_of(pid) == Some(pid);
        if parent && caller_owner() != pid {
            return Err(Usage(format!("{which} {pid} exited: {hint}")));
        }
        use std::os::unix::fs::MetadataExt;
        let me = sys::euid();
        match std::fs::metadata(format!("/proc/{pid}")) {
            Ok(m) if m.uid() == me || me == 0 => {}
            _ => return Err(Usage(format!("{which} {pid} is another user's process"))),
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let namespace_init = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last())
            == Some("1");
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if namespace_init || comm.trim_end() == "systemd" {
            return Err(Usage(format!(
                "{which} {pid} is {} (a container's first process or a service manager), whose \
                 descendants are every process of it: {hint}",
                crate::report::clean(comm.trim_end(), 32)
            )));
        }
        Ok(Owner {
            pid,
            led_group,
            fd,
            proc,
        })
    }

    /// Its pid.
    pub(super) fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Its pidfd (readable once it has exited); `None` on a kernel without pidfds, where the
    /// holder looks at [`Owner::has_exited`] every [`OWNER_CHECK`] instead.
    pub(super) fn fd(&self) -> Option<&PidFd> {
        self.fd.as_ref()
    }

    /// The process group that is the owner's to stop: its own, if it led it when pinned and
    /// it is not the holder's (see "Process groups" above).
    pub(super) fn group(&self) -> Option<libc::pid_t> {
        (self.led_group && self.pid != sys::own_process_group()).then_some(self.pid)
    }

    /// The owner as scanned.
    pub(super) fn proc(&self) -> Proc {
        self.proc
    }

    /// Whether it has exited.
    pub(super) fn has_exited(&self) -> bool {
        self.fd.as_ref().is_some_and(PidFd::has_exited) || !self.proc.is_running()
    }

    /// Its command line from /proc, arguments joined by spaces, credentials in URLs hidden,
    /// cut to `max` characters.
    pub(super) fn command_line(&self, max: usize) -> Option<String> {
        let raw = std::fs::read(format!("/proc/{}/cmdline", self.pid)).ok()?;
        let words: Vec<String> = raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let text = crate::config::hide_credentials(&words.join(" "));
        (!text.is_empty() && !self.has_exited()).then(|| text.chars().take(max).collect())
    }
}

/// Whether group `leader.pid` (the owner's number) may have been handed to someone else: a
/// process other than the owner has that pid now (it may lead a group of that number: the
/// owner's is gone then, since the kernel reuses a pid only once no group has it).
fn group_number_reused(leader: &Proc) -> bool {
    Proc::of(leader.pid).is_some_and(|p| p.start != leader.start)
}

/// The owner's tree, to stop ([`crate::stopper`]): its process group (while it may be the
/// owner's, see "Process groups" above) and the owner and its descendants, each pinned.
pub(super) struct OwnerTree {
    /// The owner's group (it led it), until it is empty.
    group: Option<libc::pid_t>,
    /// The owner as pinned: a process with its pid and another start time means the group's
    /// number is someone else's now.
    leader: Proc,
    /// The owner and its descendants, pinned.
    procs: Vec<Proc>,
    /// Just scanned by [`OwnerTree::of`]: a kill at once (a lock already free) signals what
    /// that scan found without scanning again.
    fresh: bool,
}

impl OwnerTree {
    /// The owner's group and the owner and its descendants, as they are now (nothing is
    /// signalled yet); an owner that has exited leaves only its group, if it led one and any
    /// process of it is left.
    pub(super) fn of(owner: &Owner) -> OwnerTree {
        let me = std::process::id() as libc::pid_t;
        // Rule 1 of "Process groups" above; rule 2 is `is_over`, before every signal.
        let running = !owner.has_exited();
        let leads = (running && sys::process_group_of(owner.pid) == Some(owner.pid))
            || (owner.led_group
                && procs::group_is_running(owner.pid)
                && !group_number_reused(&owner.proc));
        let mut t = OwnerTree {
            // Never the holder's own group (it has a session of its own, but be sure).
            group: (leads && owner.pid != sys::own_process_group()).then_some(owner.pid),
            leader: owner.proc,
            procs: Vec::new(),
            fresh: true,
        };
        if !owner.has_exited() {
            t.procs.push(owner.proc);
            // Never the holder and its watchdog, below the owner while the caller runs (a stop
            // begun then killed the watchdog, which the holder replaced mid-stop).
            t.procs.extend(procs::descendants_but(owner.pid, me));
            // Still the one scanned: else the scan may have been of a reused pid.
            if !owner.proc.is_running() {
                t.procs.truncate(1);
            }
        }
        t.procs.retain(|p| p.pid != me);
        t
    }

    /// Whether the stop found anything to signal.
    pub(super) fn found_any(&self) -> bool {
        self.group.is_some() || !self.procs.is_empty()
    }

    fn signal(&self, sigs: &[i32]) {
        if let Some(g) = self.group {
            for &s in sigs {
                sys::signal_group(g, s);
            }
        }
        for p in &self.procs {
            // Once each: a member of the group got it already (a shell's trap would run twice).
            if self.group.is_none() || sys::process_group_of(p.pid) != self.group {
                p.signal(sigs);
            }
        }
    }
}

impl Tree for OwnerTree {
    /// SIGTERM (and SIGCONT, for a stopped process) to the owner's group and to the owner and
    /// its descendants.
    fn terminate(&mut self) {
        self.fresh = false;
        self.signal(&[libc::SIGTERM, libc::SIGCONT]);
    }

    /// SIGKILL to everything left, after a rescan below each process still running.
    fn kill(&mut self, _rounds_for: std::time::Duration) {
        if std::mem::replace(&mut self.fresh, false) {
            self.is_over();
            self.signal(&[libc::SIGKILL]);
            return;
        }
        let me = std::process::id() as libc::pid_t;
        let mut found = Vec::new();
        for p in self.procs.iter().filter(|p| p.is_running()) {
            let below = procs::descendants_but(p.pid, me);
            if p.is_running() {
                found.extend(below);
            }
        }
        self.procs.extend(found);
        self.procs.retain(|p| p.pid != me);
        self.procs.sort_by_key(|p| (p.pid, p.start));
        self.procs.dedup();
        self.is_over();
        self.signal(&[libc::SIGKILL]);
    }

    /// Whether anything is left to stop (a group seen empty is forgotten for good).
    fn is_over(&mut self) -> bool {
        if let Some(g) = self.group
            && (!procs::group_is_running(g) || group_number_reused(&self.leader))
        {
            self.group = None;
        }
        self.group.is_none() && !self.procs.iter().any(Proc::is_running)
    }

    fn why_alive(&self) -> String {
        let alive: Vec<Proc> = self
            .procs
            .iter()
            .copied()
            .filter(Proc::is_running)
            .collect();
        procs::why_alive(&alive)
            .unwrap_or_else(|| "processes of the owner's process group do not die".into())
    }
}
