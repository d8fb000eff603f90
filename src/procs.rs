//! Processes found in `/proc`: the descendants of a process, each pinned so that a signal
//! reaches the process that was scanned or none. Used to stop a command's whole tree
//! (`supervise`) and an acquire-held lock's owner with what it started (`hold`).

use crate::sys::ProcStat;

/// A process as scanned: its pid and start time (clock ticks since boot), which together name
/// it even after the pid is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Proc {
    /// Its pid.
    pub pid: libc::pid_t,
    /// Its start time, from `/proc/PID/stat`.
    pub start: u64,
}

impl Proc {
    /// The process `pid` now, if it exists.
    pub(crate) fn of(pid: libc::pid_t) -> Option<Proc> {
        ProcStat::of(pid).map(|st| Proc {
            pid,
            start: st.start,
        })
    }

    /// Sends each of `sigs` to this process if it is still the one scanned; says if it did.
    ///
    /// Never by bare pid where the kernel has pidfds: a process that dies between the scan and
    /// the kill can have its pid handed to an unrelated process at once (pids wrap after 32768
    /// by default, and a long-lived process's pid is a full cycle old). It is pinned with a
    /// pidfd, checked to be the one scanned (same start time), and signalled through the pidfd.
    /// This once killed another test's dlock with SIGKILL.
    ///
    /// Without pidfds (Linux < 5.3, or a sandbox that denies them) the process is checked to be
    /// the one scanned and signalled by pid at once: what is left is the few microseconds
    /// between the check and the kill, in which it would have to exit, be reaped by its parent
    /// and have its pid handed out again. `run`'s SIGKILLs come from parents (the guardian kills
    /// its own unreaped children; dlock, [`Proc::signal_child`]) and go this way only to what is
    /// left 200 ms after them (below a process that cannot die); `acquire`'s holder, which is
    /// no ancestor of its owner, has no other way (docs/failures.md, "Old kernels and sandboxes").
    pub(crate) fn signal(&self, sigs: &[i32]) -> bool {
        if !crate::sys::has_pidfds() {
            return self.signal_checked(sigs);
        }
        let fd = match crate::sys::PidFd::open(self.pid) {
            Ok(fd) => fd,
            Err(libc::ESRCH) => return false,
            // Out of descriptors or memory for a moment: checked by pid rather than not at all.
            Err(_) => return self.signal_checked(sigs),
        };
        if !self.is_scanned() {
            return false;
        }
        for &sig in sigs {
            fd.signal(sig);
        }
        true
    }

    /// By pid, right after checking that it is still the one scanned (see [`Proc::signal`]).
    fn signal_checked(&self, sigs: &[i32]) -> bool {
        self.is_scanned() && self.kill(sigs)
    }

    /// Whether the process under this pid is still the one scanned (same start time).
    fn is_scanned(&self) -> bool {
        ProcStat::of(self.pid).is_some_and(|st| st.start == self.start)
    }

    /// By bare pid: only after a check that makes it safe (or as safe as it gets).
    fn kill(&self, sigs: &[i32]) -> bool {
        for &sig in sigs {
            let _ = crate::sys::raw::kill(self.pid, sig);
        }
        true
    }

    /// Sends each of `sigs` to this process, a child of the calling process that the calling
    /// thread alone reaps: by pid, which no other process can have been given while the child
    /// is unreaped (a child that exited stays a zombie, its pid held, until it is reaped). Every
    /// kernel. Says if it was still our child.
    pub(crate) fn signal_child(&self, sigs: &[i32]) -> bool {
        let me = std::process::id() as libc::pid_t;
        ours(()).is_ok()
            && ProcStat::of(self.pid).is_some_and(|st| st.ppid == me && st.start == self.start)
            && self.kill(sigs)
    }
}

impl Proc {
    /// Whether this process has certainly exited: gone from /proc, its pid another process's
    /// now, or a zombie. A /proc that cannot be read for another reason says nothing (false):
    /// the acquire holder must not stop a live owner because a read failed.
    pub(crate) fn has_exited(&self) -> bool {
        match std::fs::read(format!("/proc/{}/stat", self.pid)) {
            Err(e) => {
                e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
            }
            Ok(text) => {
                ProcStat::parse(&text).is_some_and(|st| st.exited || st.start != self.start)
            }
        }
    }

    /// Whether this process still runs: it exists, is the one scanned, and has not exited (a
    /// zombie waiting for its parent has).
    pub(crate) fn is_running(&self) -> bool {
        ProcStat::of(self.pid).is_some_and(|st| !st.exited && st.start == self.start)
    }
}

/// Every descendant of `root` (children, their children, ...), not `root` itself. A process
/// forked during the scan is caught by the next call.
pub(crate) fn descendants(root: libc::pid_t) -> Vec<Proc> {
    descendants_but(root, 0)
}

/// [`descendants`] of `root` less the process `but` and its own descendants (an acquire
/// holder's: itself and its watchdog, below an owner whose caller has not exited yet).
pub(crate) fn descendants_but(root: libc::pid_t, but: libc::pid_t) -> Vec<Proc> {
    let procs = scan();
    let mut tree = vec![Proc {
        pid: root,
        start: 0,
    }];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i].pid;
        tree.extend(
            procs
                .iter()
                .filter(|&&(pid, pp, _)| pp == p && pid != but)
                .map(|&(pid, _, start)| Proc { pid, start }),
        );
        i += 1;
    }
    tree.remove(0);
    tree
}

/// The children of `parent`, from a scan of `/proc` (a subreaper's orphans among them).
pub(crate) fn children(parent: libc::pid_t) -> Vec<Proc> {
    scan()
        .into_iter()
        .filter(|&(_, ppid, _)| ppid == parent)
        .map(|(pid, _, start)| Proc { pid, start })
        .collect()
}

/// Every process of `/proc` as (pid, ppid, start time); none if that /proc is not our PID
/// namespace's (see [`ours`]).
fn scan() -> Vec<(libc::pid_t, libc::pid_t, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc").map_err(drop).and_then(ours) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter_map(|pid| ProcStat::of(pid).map(|st| (pid, st.ppid, st.start)))
        .collect()
}

/// Whether any process of group `pgid` still runs (a zombie waiting for its parent does not:
/// `killpg(pgid, 0)` would count it, and an orphaned zombie may wait long for its reaper).
pub(crate) fn group_is_running(pgid: libc::pid_t) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .any(|pid| ProcStat::of(pid).is_some_and(|st| !st.exited && st.pgrp == pgid))
}

/// `Ok(x)` if the /proc mounted here is our PID namespace's (`/proc/self` names us by our own
/// pid): another namespace's /proc numbers processes differently, and a pid read there is not
/// ours to signal.
fn ours<T>(x: T) -> Result<T, ()> {
    let me = std::fs::read_link("/proc/self").ok();
    let me = me.as_ref().and_then(|p| p.to_str()?.parse::<u32>().ok());
    if me == Some(std::process::id()) {
        Ok(x)
    } else {
        Err(())
    }
}

/// Why the first of `alive` (processes that outlived SIGKILL) does not die, for messages: it
/// runs as another user (its process changed user, with `sudo` or `su`: a signal from this
/// uid gets EPERM), it is in uninterruptible sleep, or it just does not; `None` for none.
pub(crate) fn why_alive(alive: &[Proc]) -> Option<String> {
    let me = crate::sys::euid();
    let first = alive.first()?;
    for p in alive {
        let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap_or_default();
        let field = |name: &str| -> Vec<String> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default()
        };
        // Real, effective, saved: a signal needs this uid to match its real or saved uid.
        let uids = field("Uid:");
        let uid = |i: usize| uids.get(i).and_then(|u| u.parse::<u32>().ok());
        if me != 0 && uid(0).is_some_and(|u| u != me) && uid(2).is_some_and(|u| u != me) {
            return Some(format!(
                "pid {} runs as uid {} (it changed user, with sudo or su?) and cannot be signalled \
                 by uid {me}",
                p.pid,
                uid(0).unwrap_or_default()
            ));
        }
        if field("State:").first().is_some_and(|s| s == "D") {
            return Some(format!("pid {} is in uninterruptible sleep", p.pid));
        }
    }
    Some(format!("pid {} does not die", first.pid))
}

/// The parent of `pid`, if it exists.
pub(crate) fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    ProcStat::of(pid).map(|st| st.ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_found_signalled_and_seen_to_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let me = std::process::id() as libc::pid_t;
        let p = Proc::of(pid).unwrap();
        assert!(children(me).contains(&p));
        assert!(descendants(me).contains(&p));
        assert!(!p.has_exited() && p.is_running());
        assert!(p.signal_child(&[libc::SIGKILL]));
        // A zombie until reaped: exited, and its pid still ours.
        wait_until_zombie(pid);
        assert!(p.has_exited() && !p.is_running());
        child.wait().unwrap();
        assert!(p.has_exited());
        assert!(!p.signal_child(&[0]), "a reaped child is not ours any more");
        let other = Proc {
            pid,
            start: p.start + 1,
        };
        assert!(other.has_exited(), "another start time is another process");
    }

    /// `descendants_but` leaves out one process and what is below it, and nothing else (an
    /// acquire holder and its watchdog below the owner).
    #[test]
    fn descendants_but_leaves_out_a_subtree() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 30 & wait' & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let root = sh.id() as libc::pid_t;
        let mut all = Vec::new();
        for _ in 0..2000 {
            all = descendants(root);
            if all.len() >= 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(all.len(), 3, "sh, its sleep, and the other sleep: {all:?}");
        let inner = children(root)
            .into_iter()
            .find(|p| !children(p.pid).is_empty())
            .expect("the inner sh, with its sleep");
        let left = descendants_but(root, inner.pid);
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(children(inner.pid).iter().all(|p| !left.contains(p)));
        assert!(!left.contains(&inner));
        let _ = sh.kill();
        for p in &all {
            p.signal(&[libc::SIGKILL]);
        }
        let _ = sh.wait();
    }

    fn wait_until_zombie(pid: libc::pid_t) {
        for _ in 0..2000 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, r)| r.starts_with('Z'))
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("{pid} did not become a zombie");
    }
}
