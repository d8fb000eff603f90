//! The one reader of `/proc/PID/stat` lines. It allocates nothing and cannot panic, so the
//! guardian (which shares dlock's memory, see `guard/guardian.rs`) parses with it too.

/// What dlock reads of a `/proc/PID/stat` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// A zombie (`Z`) or dead (`X`): it has exited, whether or not it was reaped.
    pub exited: bool,
    /// Stopped by a signal (`T`) or a tracer (`t`).
    pub stopped: bool,
    pub ppid: libc::pid_t,
    pub pgrp: libc::pid_t,
    /// Start time, clock ticks since boot.
    pub start: u64,
}

impl ProcStat {
    /// "pid (comm) state ppid pgrp ... starttime ...": comm may contain spaces and parentheses,
    /// so the fields are counted from the last ')': state is the first after it, ppid the
    /// second, pgrp the third and starttime (field 22 of the line) the twentieth. `None` for
    /// anything else.
    pub(crate) fn parse(line: &[u8]) -> Option<ProcStat> {
        let mut fields = after_comm(line)?;
        let state = fields.next()?;
        let ppid = number(fields.next()?)?;
        let pgrp = number(fields.next()?)?;
        let start = number(fields.nth(16)?)?;
        Some(ProcStat {
            exited: matches!(state, b"Z" | b"X"),
            stopped: matches!(state, b"T" | b"t"),
            ppid: libc::pid_t::try_from(ppid).ok()?,
            pgrp: libc::pid_t::try_from(pgrp).ok()?,
            start,
        })
    }

    /// Only the parent pid of a line (what the guardian needs: it reads into a fixed buffer,
    /// which a line with the largest numbers could overflow before the start time).
    pub(crate) fn parent(line: &[u8]) -> Option<libc::pid_t> {
        let mut fields = after_comm(line)?;
        let _state = fields.next()?;
        libc::pid_t::try_from(number(fields.next()?)?).ok()
    }

    /// `/proc/PID/stat`, read and parsed; `None` if it cannot be read (gone) or parsed.
    pub(crate) fn of(pid: libc::pid_t) -> Option<ProcStat> {
        ProcStat::parse(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
    }
}

/// The fields after the command name's last ')'.
fn after_comm(line: &[u8]) -> Option<impl Iterator<Item = &[u8]>> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = line.get(close.checked_add(1)?..)?;
    Some(
        rest.split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty()),
    )
}

/// A decimal number of at most 19 digits (no sign).
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |n, &b| {
        n.saturating_mul(10)
            .saturating_add(u64::from(b.wrapping_sub(b'0')))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(comm: &str, state: &str) -> String {
        format!("42 ({comm}) {state} 7 9 9 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0")
    }

    #[test]
    fn lines_are_read_past_any_command_name() {
        let want = ProcStat {
            exited: false,
            stopped: false,
            ppid: 7,
            pgrp: 9,
            start: 12345,
        };
        assert_eq!(ProcStat::parse(line("sh", "S").as_bytes()), Some(want));
        assert_eq!(
            ProcStat::parse(line("a) Z 1 (b", "R").as_bytes()),
            Some(want)
        );
        assert!(ProcStat::parse(line("sh", "Z").as_bytes()).is_some_and(|st| st.exited));
        assert!(ProcStat::parse(line("sh", "T").as_bytes()).is_some_and(|st| st.stopped));
        assert_eq!(ProcStat::parse(b"42 (sh) S 7"), None);
        assert_eq!(ProcStat::parse(b"garbage"), None);
        assert_eq!(ProcStat::parse(b"1 (x) S -1 9"), None);
        assert_eq!(ProcStat::parent(b"12 (sh) S 34 12 12 0"), Some(34));
        assert_eq!(ProcStat::parent(b"12 (a) b (c) S 56 1"), Some(56));
        assert_eq!(ProcStat::parent(b"12 (x"), None);
        assert_eq!(ProcStat::parent(b""), None);
    }

    #[test]
    fn this_process_reads_as_running_with_its_parent() {
        let me = ProcStat::of(std::process::id() as libc::pid_t).unwrap();
        assert!(!me.exited);
        assert_eq!(me.ppid as u32, std::os::unix::process::parent_id());
    }
}
