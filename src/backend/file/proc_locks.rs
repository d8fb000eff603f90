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
    Ok(parse(&read()?, &inode_id(dev, ino)))
}

/// The inodes (as `/proc/locks` names them, see [`inode_id`]) that any process holds or waits
/// for a lock on: what `status` without a key looks at.
pub(super) fn locked_inodes() -> anyhow::Result<std::collections::HashSet<String>> {
    Ok(read()?
        .lines()
        .filter_map(|line| fields(line).1.get(4).map(|id| id.to_string()))
        .collect())
}

/// How `/proc/locks` names an inode: `MAJOR:MINOR:INODE`, the device numbers in hex.
pub(super) fn inode_id(dev: u64, ino: u64) -> String {
    format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev))
}

fn read() -> anyhow::Result<String> {
    std::fs::read_to_string("/proc/locks").context("cannot read /proc/locks")
}

/// A line's fields after its id, and whether it is a blocked waiter (`->`).
fn fields(line: &str) -> (bool, Vec<&str>) {
    let mut fields = line.split_whitespace().skip(1).peekable();
    let waiting = fields.peek() == Some(&"->");
    if waiting {
        fields.next();
    }
    (waiting, fields.collect())
}

/// The locks on the inode `want` in the text of `/proc/locks`.
fn parse(text: &str, want: &str) -> ProcLocks {
    let mut out = ProcLocks {
        holders: Vec::new(),
        waiters: 0,
    };
    for line in text.lines() {
        let (waiting, f) = fields(line);
        if f.len() < 5 || f[4] != want {
            continue;
        }
        match (f[0], waiting) {
            ("FLOCK", false) => out.holders.extend(f[3].parse().ok().map(|pid| ProcLock {
                pid,
                write: f[2] == "WRITE",
            })),
            // A gate holder is also blocked on (or past) the flock, and counted there.
            ("FLOCK", true) | ("OFDLCK", true) => out.waiters = out.waiters.saturating_add(1),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                          1: -> FLOCK  ADVISORY  WRITE 4243 fd:01:1234 0 EOF\n\
                          2: OFDLCK ADVISORY  WRITE -1 fd:01:1234 0 0\n\
                          3: FLOCK  ADVISORY  READ 77 fd:01:99 0 EOF\n\
                          3: -> OFDLCK ADVISORY  WRITE -1 fd:01:99 0 0\n";

    #[test]
    fn holders_and_waiters_of_one_inode() {
        let l = parse(SAMPLE, "fd:01:1234");
        let holders: Vec<(u32, bool)> = l.holders.iter().map(|h| (h.pid, h.write)).collect();
        assert_eq!((holders, l.waiters), (vec![(4242, true)], 1));
        let l = parse(SAMPLE, "fd:01:99");
        assert_eq!(
            (l.holders.len(), l.holders[0].write, l.waiters),
            (1, false, 1)
        );
        assert_eq!(inode_id(libc::makedev(253, 1), 1234), "fd:01:1234");
    }

    proptest! {
        /// Any text (another kernel's format, a truncated read) gives some answer, never a
        /// panic; a line for another inode never counts.
        #[test]
        fn any_proc_locks_text_is_read(text in "\\PC*|.*", extra in "[ -~]{0,80}") {
            let _ = parse(&text, "fd:01:1234");
            let other = format!("{text}\n9: FLOCK ADVISORY WRITE 1 fd:01:5 0 EOF {extra}");
            let l = parse(&other, "fd:01:1234");
            prop_assert!(!l.holders.iter().any(|h| h.pid == 1 && !text.contains("1234")));
        }
    }
}
