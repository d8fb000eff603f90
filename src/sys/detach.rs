//! What `dlock acquire` needs to leave a holder process behind: `fork` (while the process still
//! has one thread), a session of its own, the parent-death signal, process groups, descriptors
//! pointed at `/dev/null`, and the credentials of a Unix socket's peer.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Which side of a [`fork`] this is.
pub(crate) enum Forked {
    /// The parent; the child has this pid.
    Parent(libc::pid_t),
    /// The child.
    Child,
}

/// `fork()`. Only sound while the process has a single thread: the child gets a copy of one
/// thread only, so a lock another thread held (the allocator's, stdout's) would stay locked
/// forever in it. `dlock acquire` forks before it starts any thread.
pub(crate) fn fork() -> io::Result<Forked> {
    // SAFETY: fork takes nothing; see above for why the child's state is consistent.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// `setsid()`: a new session and process group, without a controlling terminal, so that the
/// terminal's Ctrl-C and hang-up no longer reach this process.
pub(crate) fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes nothing.
    if unsafe { libc::setsid() } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for `sig` when the parent (the thread that forked us) exits; 0 cancels it.
pub(crate) fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The parent's pid.
pub(crate) fn parent_pid() -> libc::pid_t {
    // SAFETY: getppid takes nothing and cannot fail.
    unsafe { libc::getppid() }
}

/// The process group of `pid`; `None` if it is gone.
pub(crate) fn process_group_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    // SAFETY: getpgid takes an integer.
    let pg = unsafe { libc::getpgid(pid) };
    (pg > 0).then_some(pg)
}

/// This process's group.
pub(crate) fn own_process_group() -> libc::pid_t {
    // SAFETY: getpgrp takes nothing and cannot fail.
    unsafe { libc::getpgrp() }
}

/// Sends `sig` to every process of group `pgid` (`killpg`); says whether any got it.
pub(crate) fn signal_group(pgid: libc::pid_t, sig: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: killpg takes two integers.
    unsafe { libc::killpg(pgid, sig) == 0 }
}

/// Points descriptor `fd` at `/dev/null` (read-write), e.g. stdout of a process that must not
/// keep its caller's pipe open.
pub(crate) fn to_dev_null(fd: i32) -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // SAFETY: dup2 between two descriptors this process has; `null` stays owned by the File.
    if unsafe { libc::dup2(null.as_raw_fd(), fd) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The credentials of a connected Unix socket's peer (`SO_PEERCRED`): (pid, uid).
pub(crate) fn peer_credentials(sock: BorrowedFd<'_>) -> io::Result<(libc::pid_t, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid out-pointer to a ucred and its length, both outliving the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid))
}

/// Closes every descriptor above 2 that this process inherited across its `exec` (those without
/// close-on-exec: every descriptor dlock opens itself has it): what a detached process has no
/// use for (a caller's `exec 9>file; flock 9` would otherwise stay locked as long as it lives).
/// The descriptors are listed first (`/proc/self/fd`), then closed.
pub(crate) fn close_inherited() -> io::Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds.into_iter().filter(|fd| *fd > 2) {
        // The listing's own descriptor is closed by now (EBADF), and nothing opened since.
        if super::raw::fcntl(fd, libc::F_GETFD, 0).is_ok_and(|f| f & libc::FD_CLOEXEC as usize == 0)
        {
            super::raw::close(fd);
        }
    }
    Ok(())
}
