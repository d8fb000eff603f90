//! The system calls std does not offer, each behind a safe function that states why its
//! `unsafe` block is sound. Nothing outside this module writes `unsafe` (clippy's
//! `undocumented_unsafe_blocks` is denied crate-wide, so every block here carries its argument).
//!
//! What std does (opening with `O_NOFOLLOW`, seeking a `&File`, pipes, pids) is done with std
//! where it is used; this module holds only what std cannot do: `flock` and OFD locks, `statfs`, inotify,
//! `poll`, signal masks and synchronous signal waits, thread-directed signals, `prctl`, `waitid`,
//! pidfds, a socket's hang-up, `CLOCK_BOOTTIME`, the terminal's width, and starting the command (`spawn`).

mod detach;
mod fs;
#[cfg(feature = "mysql")]
mod hangup;
mod proc_stat;
mod process;
pub(crate) mod raw;
mod signal;
pub(crate) mod spawn;
mod vm;

pub(crate) use detach::{
    Forked, close_inherited, fork, own_process_group, parent_pid, peer_credentials,
    process_group_of, set_parent_death_signal, setsid, signal_group, to_dev_null,
};
pub(crate) use fs::{Inotify, flock, fs_type, ofd_lock, poll_readable, poll_ready};
#[cfg(feature = "mysql")]
pub(crate) use hangup::HangupWatch;
pub(crate) use proc_stat::ProcStat;
pub(crate) use process::{
    PidFd, become_subreaper, has_pidfds, try_wait_pid, wait_pid, waitid_exited_nowait,
};
pub(crate) use signal::{
    SigSet, Thread, ThreadTimer, block_signals, deadline_signal, install_exiting_handlers,
    install_interrupting_handler, interrupting_signal, is_ignored, reset_to_default,
    set_deadline_message, signal_fd, take_signal, unblock_signals,
};
pub(crate) use vm::{clone_vm, has_interpreter, pipe_nonblocking};

use std::time::Duration;

/// `CLOCK_BOOTTIME` now: monotonic, and it keeps counting while the machine is suspended.
pub(crate) fn boottime() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_BOOTTIME exists on every Linux since 2.6.39,
    // and clock_gettime cannot fail with a valid clock id and pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    debug_assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The width in columns of the terminal on stderr (`TIOCGWINSZ`), else `COLUMNS` from the
/// environment; `None` when neither says (not a terminal, or a size of 0).
pub(crate) fn terminal_width() -> Option<usize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which is valid for it; on a
    // descriptor that is not a terminal it fails with ENOTTY and writes nothing.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        return Some(usize::from(ws.ws_col));
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&c| c > 0)
}

/// This host's name, or "localhost" if it has none.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length are valid; gethostname NUL-terminates when it fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// What Rust's runtime start-up would have done that dlock needs (see `app::start`): SIGPIPE
/// ignored, and descriptors 0-2 open, `/dev/null` standing in for a closed one.
pub(crate) fn start_like_std() {
    // SAFETY: SIG_IGN is always a valid disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: a valid array of three pollfds; zero timeout.
    if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } < 0 {
        return;
    }
    for p in fds {
        if p.revents & libc::POLLNVAL != 0 {
            // SAFETY: a NUL-terminated path; the descriptor is left open on purpose: it takes the
            // lowest free number, which is the closed one.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// This process's PID namespace (the inode of `/proc/self/ns/pid`), `None` if it cannot be read.
/// Pids mean something only within one: a holder's pid 1 and a nested run's pid 1 in another
/// container are different processes.
pub(crate) fn pid_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let text = link.to_str()?;
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The size of a memory page (the kernel's `seq_file` buffers start at one), in bytes; 4096
/// if the system does not say.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf takes a constant and has no other effect.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// The effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The effective user's login name, from the password database; `None` if it has none.
pub(crate) fn user_name() -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: all-zero is a valid `passwd` (null pointers, zero ids).
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to live memory of the given size; getpwuid_r writes the strings
    // into `buf` and points `pwd`'s fields (and `found`) into it.
    let rc = unsafe { libc::getpwuid_r(euid(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name points to a NUL-terminated string inside `buf`, which is still alive.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}
