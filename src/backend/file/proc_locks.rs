//! `/proc/locks`: who holds and who waits for the flocks on one inode, read by `status` without
//! taking the lock.

use anyhow::Context;

/// What `/proc/locks` says about one inode's flocks.
pub(super) struct ProcLocks {
    /// Every process holding a flock on it.
    pub(super) holders: Vec<ProcLock>,
    /// Processes blocked on its flock or its gate.
    pub(super) waiters: u64,
}

pub(super) struct ProcLock {
    pub(super) pid: u32,
    /// `LOCK_EX` (else `LOCK_SH`).
    pub(super) write: bool,
}

/// Reads `/proc/locks` for the locks on (dev, ino). Lines look like
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`, with `->` after the id for a blocked
/// waiter; the gate shows as `OFDLCK` (pid -1).
pub(super) fn proc_locks(dev: u64, ino: u64) -> anyhow::Result<ProcLocks> {
    let text = std::fs::read_to_string("/proc/locks").context("cannot read /proc/locks")?;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let mut out = ProcLocks {
        holders: Vec::new(),
        waiters: 0,
    };
    for line in text.lines() {
        let mut fields = line.split_whitespace().skip(1).peekable();
        let waiting = fields.peek() == Some(&"->");
        if waiting {
            fields.next();
        }
        let f: Vec<&str> = fields.collect();
        if f.len() < 5 || f[4] != want {
            continue;
        }
        match (f[0], waiting) {
            ("FLOCK", false) => out.holders.extend(f[3].parse().ok().map(|pid| ProcLock {
                pid,
                write: f[2] == "WRITE",
            })),
            // A gate holder is also blocked on (or past) the flock, and counted there.
            ("FLOCK", true) | ("OFDLCK", true) => out.waiters += 1,
            _ => {}
        }
    }
    Ok(out)
}
