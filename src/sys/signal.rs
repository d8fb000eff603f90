//! Signal masks, synchronous signal waits, dispositions and thread-directed signals.

use std::io;
use std::time::Duration;

/// A set of signals.
#[derive(Clone, Copy)]
pub(crate) struct SigSet(libc::sigset_t);

impl SigSet {
    /// The set holding exactly `signals`.
    pub(crate) fn of(signals: &[i32]) -> SigSet {
        // SAFETY: all-zero bytes are a valid sigset_t; sigemptyset and sigaddset only write
        // into the set they are given.
        unsafe {
            let mut s: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut s);
            for &sig in signals {
                libc::sigaddset(&mut s, sig);
            }
            SigSet(s)
        }
    }
}

/// Adds `set` to the calling thread's blocked signals (threads created later inherit it).
pub(crate) fn block_signals(set: &SigSet) -> io::Result<()> {
    // SAFETY: a valid set pointer; no old mask is asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// A signal taken by [`take_signal`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    /// The signal number.
    pub(crate) signal: i32,
    /// `si_code`: `SI_KERNEL` from the terminal, `SI_USER` from kill(2), `SI_TKILL` from
    /// tgkill/pthread_kill, ...
    pub(crate) code: i32,
    /// `si_pid`: the sender, for signals sent by a process.
    pub(crate) pid: libc::pid_t,
}

impl Taken {
    /// Sent by a thread of this process (pthread_kill), not by another process or the kernel.
    /// Judged by the sender's pid only: `si_code` for pthread_kill is `SI_TKILL` on Linux but
    /// `SI_USER` in some sandboxes (seen here).
    pub(crate) fn sent_by_this_process(&self) -> bool {
        self.code <= 0 && self.pid as u32 == std::process::id()
    }
}

/// Takes one pending signal of `set` (which must be blocked in this thread), waiting up to
/// `timeout`; `None` on timeout or EINTR.
pub(crate) fn take_signal(set: &SigSet, timeout: Duration) -> Option<Taken> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: all-zero bytes are a valid siginfo_t, used only as an out-parameter.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to the set, the siginfo and the timeout, all outliving the call.
    let sig = unsafe { libc::sigtimedwait(&set.0, &mut info, &ts) };
    if sig <= 0 {
        return None;
    }
    // SAFETY: sigtimedwait filled in the siginfo; si_pid reads the sender field, which is set
    // for user- and thread-sent signals and zero (never garbage: the struct was zeroed) else.
    let pid = unsafe { info.si_pid() };
    Some(Taken {
        signal: sig,
        code: info.si_code,
        pid,
    })
}

/// The signal the file backend sends a thread to end its blocked `flock` (see
/// [`install_interrupting_handler`]): the first real-time signal the C library leaves free, so
/// that every classic signal stays free for dlock to forward.
pub(crate) fn interrupting_signal() -> i32 {
    libc::SIGRTMIN()
}

/// Whether `sig`'s disposition is "ignore" (inherited from `nohup`, say).
pub(crate) fn is_ignored(sig: i32) -> bool {
    // SAFETY: all-zero bytes are a valid sigaction; this only reads the disposition into it.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Restores `sig`'s default disposition.
pub(crate) fn reset_to_default(sig: i32) {
    // SAFETY: SIG_DFL is always a valid disposition.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

extern "C" fn do_nothing(_: libc::c_int) {}

/// Installs a handler for `sig` that does nothing, without `SA_RESTART`: a thread-directed `sig`
/// then makes a blocking system call in that thread return EINTR instead of being restarted.
pub(crate) fn install_interrupting_handler(sig: i32) {
    // SAFETY: all-zero bytes are a valid sigaction; the handler is a valid `extern "C"` function
    // that touches nothing, so it is async-signal-safe; the mask is emptied before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = do_nothing as *const () as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// A thread of this process, for thread-directed signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Thread(libc::pthread_t);

impl Thread {
    /// The calling thread.
    pub(crate) fn current() -> Thread {
        // SAFETY: pthread_self takes nothing and cannot fail.
        Thread(unsafe { libc::pthread_self() })
    }

    /// Sends `sig` to this thread. The caller makes sure the thread has not exited (joined
    /// threads' ids may be reused): every caller signals a thread that waits for it to finish.
    pub(crate) fn signal(self, sig: i32) {
        // SAFETY: pthread_kill on a live thread's id; the liveness is the caller's contract
        // above (a dead thread's id is undefined behaviour in POSIX, ESRCH in glibc).
        unsafe { libc::pthread_kill(self.0, sig) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_from_this_thread_is_known_as_ours() {
        let set = SigSet::of(&[libc::SIGUSR2]);
        block_signals(&set).unwrap();
        Thread::current().signal(libc::SIGUSR2);
        let t = take_signal(&set, Duration::from_secs(1)).expect("pending");
        assert_eq!(t.signal, libc::SIGUSR2);
        assert!(
            t.sent_by_this_process(),
            "{t:?} (pid {})",
            std::process::id()
        );
    }
}
