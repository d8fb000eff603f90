//! What the guardian reads from `/proc`, with raw system calls and fixed buffers (see
//! `guardian.rs` for why): its children, to kill them, and its descriptors, to keep them across
//! `execve`.
//!
//! Killing only the guardian's *children* round after round reaches the whole tree: it is a
//! child subreaper, so when a killed process dies its children become the guardian's, and the
//! next round kills them. A direct child is signalled by pid safely: an unreaped child's pid
//! cannot be handed to another process.

use super::buf::Buf;
use crate::sys::{ProcStat, raw};

/// Sends `sig` to every child of this (single-threaded) process. Reads
/// `/proc/self/task/PID/children`; without it (a kernel built without `CONFIG_PROC_CHILDREN`),
/// scans `/proc/*/stat` for processes whose parent we are. Nothing if the /proc mounted here
/// numbers processes differently from us (another PID namespace's): its pids are not ours to
/// signal. (The caller kills the command by its pid anyway.)
pub(super) fn signal_children(sig: i32) {
    let me = raw::getpid();
    if !proc_is_ours(me) {
        return;
    }
    let mut path = Buf::<64>::default();
    path.push(b"/proc/self/task/");
    path.number(u64::from(me.unsigned_abs()));
    path.push(b"/children");
    match open(&path, 0) {
        Some(fd) => {
            numbers_in(fd, |pid| {
                let _ = raw::kill(pid, sig);
            });
            raw::close(fd);
        }
        None => scan_proc_for_children(me, sig),
    }
}

/// Whether `/proc/self` names us by our own pid: /proc belongs to our PID namespace.
pub(super) fn proc_is_ours(me: i32) -> bool {
    let mut buf = [0u8; 16];
    raw::readlink(c"/proc/self", &mut buf)
        .ok()
        .and_then(parse_pid)
        == Some(me)
}

/// Calls `f` with each whitespace-separated decimal number read from `fd`.
fn numbers_in(fd: i32, mut f: impl FnMut(i32)) {
    let mut buf = [0u8; 4096];
    let mut n: Option<i32> = None;
    while let Ok(len @ 1..) = raw::read(fd, &mut buf) {
        for &b in buf.get(..len).unwrap_or_default() {
            if b.is_ascii_digit() {
                let d = i32::from(b.wrapping_sub(b'0'));
                n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d));
            } else if let Some(v) = n.take() {
                f(v);
            }
        }
    }
    if let Some(v) = n {
        f(v);
    }
}

/// The fallback of [`signal_children`].
fn scan_proc_for_children(me: i32, sig: i32) {
    let Some(dir) = open(&Buf::of(b"/proc"), libc::O_DIRECTORY) else {
        return;
    };
    for_each_entry(dir, |name| {
        let Some(pid) = parse_pid(name) else { return };
        let mut path = Buf::<64>::default();
        path.push(b"/proc/");
        path.number(u64::from(pid.unsigned_abs()));
        path.push(b"/stat");
        let Some(fd) = open(&path, 0) else { return };
        let mut stat = [0u8; 1024];
        let len = raw::read(fd, &mut stat).unwrap_or(0);
        raw::close(fd);
        if ProcStat::parent(stat.get(..len).unwrap_or_default()) == Some(me) {
            let _ = raw::kill(pid, sig);
        }
    });
    raw::close(dir);
}

/// The process `pid`'s stat, if it exists (and /proc is our PID namespace's).
pub(super) fn stat_of(pid: i32) -> Option<ProcStat> {
    if pid <= 0 || !proc_is_ours(raw::getpid()) {
        return None;
    }
    read_stat(pid)
}

/// Whether a process of group `pgid` runs (a zombie does not count: it runs nothing, though
/// it keeps the group's id from being reused). Scans `/proc/*/stat`; false if /proc is
/// another PID namespace's.
pub(super) fn group_runs(pgid: i32) -> bool {
    if pgid <= 1 || !proc_is_ours(raw::getpid()) {
        return false;
    }
    let Some(dir) = open(&Buf::of(b"/proc"), libc::O_DIRECTORY) else {
        return false;
    };
    let mut found = false;
    for_each_entry(dir, |name| {
        if !found && let Some(pid) = parse_pid(name) {
            found = read_stat(pid).is_some_and(|st| st.pgrp == pgid && !st.exited);
        }
    });
    raw::close(dir);
    found
}

/// `/proc/PID/stat` read into a fixed buffer (a line is a few hundred bytes) and parsed.
pub(super) fn read_stat(pid: i32) -> Option<ProcStat> {
    let mut path = Buf::<64>::default();
    path.push(b"/proc/");
    path.number(u64::from(pid.unsigned_abs()));
    path.push(b"/stat");
    let fd = open(&path, 0)?;
    let mut stat = [0u8; 1024];
    let len = raw::read(fd, &mut stat).unwrap_or(0);
    raw::close(fd);
    ProcStat::parse(stat.get(..len).unwrap_or_default())
}

pub(super) fn parse_pid(name: &[u8]) -> Option<i32> {
    if name.is_empty() || name.len() > 9 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(name.iter().fold(0i32, |n, &b| {
        n.saturating_mul(10)
            .saturating_add(i32::from(b.wrapping_sub(b'0')))
    }))
}

/// Clears close-on-exec on every open descriptor, so that a guardian executing itself anew
/// keeps all it holds (the lock's descriptors among them). False if they could not be listed.
pub(super) fn keep_descriptors_on_exec() -> bool {
    let Some(dir) = open(&Buf::of(b"/proc/self/fd"), libc::O_DIRECTORY) else {
        return false;
    };
    let listed = for_each_entry(dir, |name| match parse_pid(name) {
        Some(fd) if fd != dir => {
            let _ = raw::fcntl(fd, libc::F_SETFD, 0);
        }
        _ => {}
    });
    raw::close(dir);
    listed
}

/// Calls `f` with the name of each entry of the open directory `dir`; false on a read error.
pub(super) fn for_each_entry(dir: i32, mut f: impl FnMut(&[u8])) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let len = match raw::getdents64(dir, &mut buf) {
            Ok(0) => return true,
            Ok(len) => len,
            Err(_) => return false,
        };
        // struct linux_dirent64 { u64 ino; i64 off; u16 reclen; u8 type; char name[]; }
        let mut at = 0usize;
        while at < len {
            let Some(reclen) = buf
                .get(at.saturating_add(16)..at.saturating_add(18))
                .and_then(|b| b.try_into().ok())
                .map(u16::from_ne_bytes)
            else {
                break;
            };
            let end = at.saturating_add(usize::from(reclen));
            if let Some(rec) = buf.get(at.saturating_add(19)..end.min(len)) {
                let name_len = rec.iter().position(|&b| b == 0).unwrap_or(rec.len());
                f(rec.get(..name_len).unwrap_or_default());
            }
            if reclen == 0 {
                break;
            }
            at = end;
        }
    }
}

/// Opens a /proc path built in `path` (read-only, close-on-exec; `flags` added).
pub(super) fn open(path: &Buf<64>, flags: i32) -> Option<i32> {
    raw::open(path.c_str()?, libc::O_RDONLY | flags).ok()
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    #[test]
    fn pids_are_plain_short_numbers() {
        assert_eq!(parse_pid(b"0123"), Some(123));
        assert_eq!(parse_pid(b"12a"), None);
        assert_eq!(parse_pid(b"9999999999"), None);
    }

    #[test]
    fn this_process_and_its_group_are_read() {
        let me = stat_of(raw::getpid()).unwrap();
        assert!(!me.exited && me.start > 0);
        let pg = crate::sys::own_process_group();
        assert_eq!(me.pgrp, pg);
        assert!(group_runs(pg));
        assert!(stat_of(0).is_none());
    }

    #[test]
    fn numbers_are_read_across_chunks() {
        let (r, w) = crate::sys::pipe_nonblocking().unwrap();
        use std::os::fd::AsRawFd;
        raw::write(w.as_raw_fd(), b"12 345 6\n").unwrap();
        drop(w);
        let mut got = Vec::new();
        numbers_in(r.as_raw_fd(), |n| got.push(n));
        assert_eq!(got, [12, 345, 6]);
    }

    #[test]
    fn proc_is_this_process_namespace() {
        assert!(proc_is_ours(raw::getpid()));
        assert!(!proc_is_ours(raw::getpid() + 1));
    }

    #[test]
    fn this_process_descriptors_are_listed() {
        let dir = open(&Buf::of(b"/proc/self/fd"), libc::O_DIRECTORY).unwrap();
        let mut names = Vec::new();
        assert!(for_each_entry(dir, |n| names.push(n.to_vec())));
        raw::close(dir);
        assert!(names.iter().any(|n| n == b"0"), "{names:?}");
    }
}
