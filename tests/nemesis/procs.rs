//! The one clock and the processes faults are aimed at. pid_max is small (32768 here): a pid read
//! a moment ago may name another process now, so a process is known by its pid and its start
//! time, and is signalled through a pidfd opened and then checked against that start time.

use std::path::Path;

/// Now on CLOCK_MONOTONIC, in nanoseconds: the clock of every event of the campaign.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// A process: its pid and its start time (field 22 of /proc/PID/stat, in clock ticks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Proc {
    pub pid: i32,
    pub start: u64,
}

/// The start time of `pid`, if it exists.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields are counted after
    // its last ')'. Field 22 is the 20th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Proc {
    /// The process that has `pid` now.
    pub(crate) fn of(pid: i32) -> Option<Proc> {
        Some(Proc {
            pid,
            start: start_time(pid)?,
        })
    }

    /// Sends `sig` if this very process still exists (a pidfd is opened, then the start time
    /// checked: the pidfd cannot come to name another process). False if it is gone.
    pub(crate) fn signal(&self, sig: i32) -> bool {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) };
        let Ok(fd) = i32::try_from(fd) else {
            return false;
        };
        if fd < 0 {
            return false;
        }
        let same = start_time(self.pid) == Some(self.start);
        // SAFETY: fd is the pidfd just opened; a null siginfo is allowed.
        let sent = same
            && unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd,
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            } == 0;
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
        sent
    }

    /// Whether this process still exists (and is not a zombie).
    pub(crate) fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
            && std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                .ok()
                .and_then(|s| {
                    s.rfind(')')
                        .map(|i| s[i + 1..].trim_start().starts_with('Z'))
                })
                == Some(false)
    }

    /// The children of this process that run `exe` (the guardian of a dlock is a dlock).
    pub(crate) fn children_running(&self, exe: &Path) -> Vec<Proc> {
        let mut out = Vec::new();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return out;
        };
        for t in tasks.flatten() {
            let Ok(list) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for pid in list.split_whitespace().filter_map(|p| p.parse().ok()) {
                let runs = std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| {
                    e == exe
                        || e.to_string_lossy().trim_end_matches(" (deleted)")
                            == exe.to_string_lossy()
                });
                if let Some(p) = Proc::of(pid).filter(|_| runs) {
                    out.push(p);
                }
            }
        }
        if self.alive() { out } else { Vec::new() }
    }
}
