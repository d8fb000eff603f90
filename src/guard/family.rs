//! What a watchdog kills when its holder dies: the owner and every process descended from it,
//! found with raw system calls into a fixed array (see `guardian.rs` for why).
//!
//! The owner's descendants need not be in its process group (a script run by `make`, a CI
//! runner or `sh -c` leads no group; a child may call `setsid`), and once a process dies its
//! children are re-parented away from it, where no scan can tell they were its. So the tree is
//! first frozen: the owner is stopped (SIGSTOP), then `/proc/*/stat` is scanned again and again,
//! every process whose parent is in the family (or that is in the owner's group, when that may
//! be signalled) stopped and added, until a scan finds nothing new and all are seen stopped.
//! Only then is every one of them killed; what a kill did not end is looked at again next round.
//! Each process is named by its pid and start time, and signalled through a pidfd opened before
//! that is checked (or by pid, on kernels without pidfds), so a reused pid is never hit.

use std::time::Duration;

use super::buf::Buf;
use super::tree;
use crate::sys::raw;

/// The most processes a watchdog holds at once. More: it kills those it holds and rescans
/// (what those had started is then re-parented, out of its sight).
pub(super) const MAX: usize = 1024;

/// How long the watchdog waits, at most, for what it stopped to be seen stopped (a process in
/// an uninterruptible sleep stops only when it wakes).
const STOP_WAIT: Duration = Duration::from_millis(1);
const STOP_TRIES: u32 = 50;

/// A process: its pid and start time (clock ticks since boot).
type Pinned = (i32, u64);

/// The processes being killed.
pub(super) struct Family {
    procs: [Pinned; MAX],
    len: usize,
}

impl Family {
    pub(super) fn new() -> Family {
        Family {
            procs: [(0, 0); MAX],
            len: 0,
        }
    }

    fn known(&self) -> &[Pinned] {
        self.procs.get(..self.len).unwrap_or_default()
    }

    fn has(&self, pid: i32) -> bool {
        self.known().iter().any(|&(p, _)| p == pid)
    }

    fn add(&mut self, p: Pinned) -> bool {
        match self.procs.get_mut(self.len) {
            Some(slot) => {
                *slot = p;
                self.len = self.len.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// Forgets every process that no longer runs (gone, exited, or its pid another's); true
    /// when none is left.
    pub(super) fn prune(&mut self) -> bool {
        let mut kept = 0usize;
        for i in 0..self.len {
            let Some(&p) = self.procs.get(i) else { break };
            if runs(p) {
                if let Some(slot) = self.procs.get_mut(kept) {
                    *slot = p;
                }
                kept = kept.saturating_add(1);
            }
        }
        self.len = kept;
        kept == 0
    }

    /// Stops `owner` (pid 0: none) if it still runs, then every process below a process of the
    /// family or in `group` (0: none), until a scan of /proc finds nothing new. `skip`: pids
    /// never touched (the watchdog, its holder). False if the family is full.
    pub(super) fn stop_all(&mut self, owner: Pinned, group: i32, skip: [i32; 2]) -> bool {
        if !tree::proc_is_ours(raw::getpid()) {
            return true;
        }
        if owner.0 > 0 && !self.has(owner.0) && signal(owner, libc::SIGSTOP) && !self.add(owner) {
            return false;
        }
        loop {
            let Some(dir) = tree::open(&Buf::of(b"/proc"), libc::O_DIRECTORY) else {
                return true;
            };
            let (mut new, mut full) = (false, false);
            tree::for_each_entry(dir, |name| {
                let Some(pid) = tree::parse_pid(name) else {
                    return;
                };
                if full || skip.contains(&pid) || self.has(pid) {
                    return;
                }
                let Some(st) = tree::read_stat(pid) else {
                    return;
                };
                let below = self
                    .known()
                    .iter()
                    .any(|&(p, start)| p == st.ppid && start <= st.start);
                if st.exited || !(below || (group > 1 && st.pgrp == group)) {
                    return;
                }
                // One that cannot be signalled (another user's: a setuid program) is left out,
                // and what it started with it.
                if signal((pid, st.start), libc::SIGSTOP) {
                    full = !self.add((pid, st.start));
                    new = true;
                }
            });
            raw::close(dir);
            if full {
                return false;
            }
            if !new {
                return true;
            }
            self.wait_stopped();
        }
    }

    /// Waits (briefly) until every process of the family is seen stopped or ended: one stopped
    /// forks no more, so the next scan is complete.
    fn wait_stopped(&self) {
        for _ in 0..STOP_TRIES {
            let moving = self.known().iter().any(|&(pid, start)| {
                tree::read_stat(pid)
                    .is_some_and(|st| st.start == start && !st.exited && !st.stopped)
            });
            if !moving {
                return;
            }
            raw::poll(&mut [], Some(STOP_WAIT));
        }
    }

    /// SIGKILL to every process of the family (SIGKILL ends a stopped process too).
    pub(super) fn kill_all(&self) {
        for &p in self.known() {
            signal(p, libc::SIGKILL);
        }
    }
}

/// Whether `p` still runs: its pid names a live process started when it was.
fn runs((pid, start): Pinned) -> bool {
    tree::read_stat(pid).is_some_and(|st| st.start == start && !st.exited)
}

/// Sends `sig` to `p` if it still runs; true if it was sent. Through a pidfd opened before the
/// check, so that the process checked is the one signalled; by pid without pidfds (or in a
/// sandbox that denies sending through one), just after the check.
fn signal(p: Pinned, sig: i32) -> bool {
    let fd = raw::pidfd_open(p.0);
    let sent = runs(p)
        && match fd.map(|fd| raw::pidfd_send_signal(fd, sig)) {
            Ok(Ok(())) => true,
            Ok(Err(libc::ESRCH)) => false,
            Ok(Err(_)) | Err(_) => raw::kill(p.0, sig).is_ok(),
        };
    if let Ok(fd) = fd {
        raw::close(fd);
    }
    sent
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_tree_is_found_and_killed_whatever_its_groups() {
        // sh (in our group) ─ sh (a group of its own) ─ sleep
        let dir = std::env::temp_dir().join(format!("dlock-family-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("grandchild");
        let mut top = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid sh -c 'sleep 60 & echo $! > {}; wait' & wait",
                f.display()
            ))
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let grandchild: i32 = loop {
            if let Some(n) = std::fs::read_to_string(&f)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break n;
            }
            assert!(std::time::Instant::now() < deadline, "no grandchild");
            std::thread::sleep(Duration::from_millis(5));
        };
        let pid = top.id() as i32;
        let owner = (pid, tree::read_stat(pid).unwrap().start);
        let g = tree::read_stat(grandchild).unwrap();
        let mut family = Family::new();
        assert!(family.stop_all(owner, 0, [raw::getpid(), 0]));
        assert!(family.has(grandchild), "{:?}", family.known());
        assert!(tree::read_stat(grandchild).unwrap().stopped);
        family.kill_all();
        top.wait().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while runs((grandchild, g.start)) {
            assert!(std::time::Instant::now() < deadline, "the grandchild runs");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
