//! File locks (`flock`, OFD byte locks), filesystem types (`statfs`), inotify and `poll`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `flock(fd, op)`; `op` is `LOCK_SH`, `LOCK_EX` or `LOCK_UN`, with `LOCK_NB` to try once.
/// Blocks unless `LOCK_NB`; a signal whose handler has no `SA_RESTART` ends the wait (EINTR).
pub(crate) fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock takes a descriptor and an integer; `file` keeps the descriptor open.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The type of the filesystem that holds `path` (`statfs`'s `f_type`, a magic number such as
/// `0x6969` for NFS; see statfs(2)).
pub(crate) fn fs_type(path: &Path) -> io::Result<u32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: all-zero bytes are a valid `struct statfs` (integers and an array of them).
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a `struct statfs`, both outliving the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // `f_type` is a signed word whose width varies by architecture; the magic numbers are 32
    // bits (CIFS's 0xFF534D42 is negative in a 32-bit word): keep the low 32 bits.
    Ok(st.f_type as u32)
}

/// An open-file-description byte lock on byte 0 of `file`: `cmd` is `F_OFD_SETLK` (try) or
/// `F_OFD_SETLKW` (wait), `kind` is `F_WRLCK`, `F_RDLCK` or `F_UNLCK`. Independent of `flock`
/// locks on the same file, and owned by the open file, not the process.
pub(crate) fn ofd_lock(file: &File, cmd: libc::c_int, kind: libc::c_int) -> io::Result<()> {
    // SAFETY: all-zero bytes are a valid `struct flock` (OFD locks require l_pid = 0).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: a valid descriptor and a pointer to a valid `struct flock` that outlives the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An inotify instance (close-on-exec, non-blocking).
pub(crate) struct Inotify(File);

impl Inotify {
    /// A new instance with no watch.
    pub(crate) fn new() -> io::Result<Inotify> {
        // SAFETY: inotify_init1 takes flags and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(Inotify(File::from(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Watches `path` for the events in `mask` (`IN_CLOSE`, ...).
    pub(crate) fn add_watch(&self, path: &Path, mask: u32) -> io::Result<()> {
        let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path that outlives the call.
        let rc = unsafe { libc::inotify_add_watch(self.0.as_raw_fd(), c.as_ptr(), mask) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads and discards every queued event.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 4096];
        while io::Read::read(&mut &self.0, &mut buf).is_ok_and(|n| n > 0) {}
    }
}

impl AsFd for Inotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Waits until one of `fds` is readable, for at most `timeout_ms` (-1: no limit). Returns which
/// are readable; an empty list on timeout or EINTR.
pub(crate) fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid array of `pfds.len()` pollfds whose descriptors `fds` keeps open.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(Vec::new());
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// Waits until `fd` is ready for `events` (`POLLIN`, `POLLOUT`) or `other` is readable, for at
/// most `timeout` (rounded up to a millisecond). Returns (fd ready, other readable); both false
/// on timeout or EINTR. Errors and hang-ups count as ready: the next read or write reports them.
pub(crate) fn poll_ready(
    fd: BorrowedFd<'_>,
    events: i16,
    other: Option<BorrowedFd<'_>>,
    timeout: std::time::Duration,
) -> io::Result<(bool, bool)> {
    let mut pfds = [
        libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        },
        libc::pollfd {
            fd: other.map_or(-1, |o| o.as_raw_fd()), // a negative fd is skipped by poll
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: a valid array of two pollfds whose descriptors the borrows keep open (or -1).
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok((false, false));
        }
        return Err(e);
    }
    Ok((pfds[0].revents != 0, pfds[1].revents != 0))
}
