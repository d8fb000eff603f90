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

/// A descriptor that turns readable while a signal of `set` (blocked in every thread) is pending
/// for the calling thread or the process; reading it is never needed: [`take_signal`] takes them.
pub(crate) fn signal_fd(set: &SigSet) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a valid set pointer; -1 asks for a new descriptor, which we own from here on.
    let fd = unsafe { libc::signalfd(-1, &set.0, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Removes `set` from the calling thread's blocked signals.
pub(crate) fn unblock_signals(set: &SigSet) -> io::Result<()> {
    // SAFETY: a valid set pointer; no old mask is asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set.0, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// The signal a [`ThreadTimer`] sends when a hard deadline passes: the real-time signal after
/// [`interrupting_signal`].
pub(crate) fn deadline_signal() -> i32 {
    libc::SIGRTMIN() + 1
}

/// A one-shot timer that sends [`deadline_signal`] to the thread that started it; deleted on
/// drop.
pub(crate) struct ThreadTimer(libc::timer_t);

impl ThreadTimer {
    /// Fires once, `after` from now (on CLOCK_BOOTTIME: a suspended machine's time counts).
    pub(crate) fn start(after: Duration) -> io::Result<ThreadTimer> {
        // SAFETY: all-zero bytes are a valid sigevent.
        let mut ev: libc::sigevent = unsafe { std::mem::zeroed() };
        ev.sigev_notify = libc::SIGEV_THREAD_ID;
        ev.sigev_signo = deadline_signal();
        // The raw system call, not glibc's gettid() wrapper: that one is glibc 2.30's, and the
        // release binary links against glibc 2.17 (scripts/release).
        // SAFETY: SYS_gettid takes no arguments and cannot fail; it returns this thread's id,
        // which fits a pid_t.
        ev.sigev_notify_thread_id = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: valid pointers to the sigevent and the out-parameter; the event names this
        // thread, which outlives the timer (it is deleted on drop, on the same thread: not Send).
        if unsafe { libc::timer_create(libc::CLOCK_BOOTTIME, &mut ev, &mut id) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let timer = ThreadTimer(id);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: after.subsec_nanos().max(1) as libc::c_long,
            },
        };
        // SAFETY: a timer this process created and has not deleted; a valid itimerspec.
        if unsafe { libc::timer_settime(timer.0, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(timer)
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: a timer this process created and deletes once, here.
        unsafe { libc::timer_delete(self.0) };
    }
}

/// What the deadline handler writes to stderr before exiting: set by [`set_deadline_message`].
static DEADLINE_MESSAGE: std::sync::atomic::AtomicPtr<u8> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static DEADLINE_MESSAGE_LEN: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Sets the line written when a hard deadline ends the process.
pub(crate) fn set_deadline_message(text: &'static [u8]) {
    use std::sync::atomic::Ordering;
    // Length first, to zero: the handler writes nothing rather than a torn pair.
    DEADLINE_MESSAGE_LEN.store(0, Ordering::SeqCst);
    DEADLINE_MESSAGE.store(text.as_ptr().cast_mut(), Ordering::SeqCst);
    DEADLINE_MESSAGE_LEN.store(text.len(), Ordering::SeqCst);
}

extern "C" fn exit_on_deadline(_: libc::c_int) {
    use std::sync::atomic::Ordering;
    let len = DEADLINE_MESSAGE_LEN.load(Ordering::SeqCst);
    let ptr = DEADLINE_MESSAGE.load(Ordering::SeqCst);
    if len > 0 && !ptr.is_null() {
        // SAFETY: write and _exit are async-signal-safe; `ptr` and `len` describe a `'static`
        // byte string (set_deadline_message takes only those).
        unsafe { libc::write(2, ptr.cast(), len) };
    }
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(69) }
}

extern "C" fn exit_on_signal(sig: libc::c_int) {
    // The one line every other way of ending says, from a 'static string (no formatting here).
    let text: &[u8] = match sig {
        libc::SIGINT => b"dlock: interrupted by SIGINT while waiting for the server\n",
        libc::SIGTERM => b"dlock: interrupted by SIGTERM while waiting for the server\n",
        libc::SIGHUP => b"dlock: interrupted by SIGHUP while waiting for the server\n",
        libc::SIGQUIT => b"dlock: interrupted by SIGQUIT while waiting for the server\n",
        _ => b"dlock: interrupted by a signal while waiting for the server\n",
    };
    // SAFETY: write and _exit are async-signal-safe; `text` is a 'static byte string.
    unsafe {
        libc::write(2, text.as_ptr().cast(), text.len());
        libc::_exit(128 + sig)
    }
}

/// Installs, for each of `signals` (unless it is ignored), a handler that ends the process at
/// once with 128+N, and for [`deadline_signal`] one that writes the deadline message and ends it
/// with 69. They run only where these signals are unblocked (see `signals::HardStop`).
pub(crate) fn install_exiting_handlers(signals: &[i32]) {
    let install = |sig: i32, handler: extern "C" fn(libc::c_int)| {
        // SAFETY: all-zero bytes are a valid sigaction; the handlers only call
        // async-signal-safe functions; the mask is emptied before use.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    };
    for &sig in signals {
        if !is_ignored(sig) {
            install(sig, exit_on_signal);
        }
    }
    install(deadline_signal(), exit_on_deadline);
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
