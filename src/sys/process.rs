//! Children and other processes: the subreaper flag, `waitid`/`waitpid`, `kill`, pidfds.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// Makes this process the reaper of every orphan below it. Fails on a kernel before 3.4 (or in
/// a sandbox that denies the `prctl`): then the command's tree cannot be covered.
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The pid of a child that has exited, without reaping it (`waitid(P_ALL, WEXITED | WNOHANG |
/// WNOWAIT)`): `Ok(None)` when children remain but none has exited, `Err` with ECHILD when none
/// is left.
pub(crate) fn waitid_exited_nowait() -> io::Result<Option<libc::pid_t>> {
    loop {
        // SAFETY: all-zero bytes are a valid siginfo_t, used only as an out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: a valid pointer to a siginfo_t that outlives the call.
        if unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: waitid filled in a CLD_* siginfo, or left it zeroed (pid 0: none exited).
        let pid = unsafe { info.si_pid() };
        return Ok((pid != 0).then_some(pid));
    }
}

/// Waits for our child `pid` to exit (through EINTR) and reaps it.
pub(crate) fn wait_pid(pid: libc::pid_t) -> ExitStatus {
    let mut status = 0;
    loop {
        // SAFETY: a valid pointer to an int; waitpid only writes the status there.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return ExitStatus::from_raw(status);
        }
    }
}

/// Reaps our child `pid` if it has exited: its status; `None` while it runs (or if it is not
/// our child).
pub(crate) fn try_wait_pid(pid: libc::pid_t) -> Option<ExitStatus> {
    let mut status = 0;
    // SAFETY: a valid pointer to an int; waitpid only writes the status there.
    let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    (rc == pid).then(|| ExitStatus::from_raw(status))
}

/// Whether this kernel and sandbox give pidfds (Linux ≥ 5.3, neither `pidfd_open` nor
/// `pidfd_send_signal` denied by a seccomp filter): asked once, by opening one for this process
/// and sending it signal 0 through it. Without them, what dlock signals is either its own
/// unreaped child (by pid: safe) or checked by pid (`procs::Proc`). A failure that says nothing
/// of the kernel (out of descriptors) counts as having them: each signal then falls back by
/// itself ([`PidFd::open`]'s error).
pub(crate) fn has_pidfds() -> bool {
    use super::raw;
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let missing = |e| matches!(e, libc::ENOSYS | libc::EPERM | libc::EACCES);
    *KNOWN.get_or_init(|| match raw::pidfd_open(raw::getpid()) {
        Ok(fd) => {
            let sent = raw::pidfd_send_signal(fd, 0);
            raw::close(fd);
            !sent.is_err_and(missing)
        }
        Err(e) => !missing(e),
    })
}

/// A process pinned by a pidfd (Linux ≥ 5.3): signals through it reach that process or none,
/// never one that inherited its pid.
pub(crate) struct PidFd(OwnedFd);

impl PidFd {
    /// Pins `pid`; the errno if it cannot: ESRCH if it is gone, ENOSYS without pidfds, EMFILE…
    pub(crate) fn open(pid: libc::pid_t) -> Result<PidFd, i32> {
        let fd = super::raw::pidfd_open(pid)?;
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor: readable once the process has exited.
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.0.as_fd()
    }

    /// Whether the pinned process has exited.
    pub(crate) fn has_exited(&self) -> bool {
        crate::sys::poll_readable(&[self.as_fd()], 0).is_ok_and(|r| r.first() == Some(&true))
    }

    /// Sends `sig` to the pinned process (nothing if it has exited).
    pub(crate) fn signal(&self, sig: libc::c_int) {
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }
}
