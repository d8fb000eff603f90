//! Blocking on a lock file: `flock` and the gate (an OFD byte lock), with a deadline and
//! signals. A blocked `flock` cannot be given a timeout, so a helper thread interrupts it with a
//! thread-directed signal (a real-time one, [`sys::interrupting_signal`]) whose handler has no
//! `SA_RESTART`, as `flock -w` does with SIGALRM.

use std::fs::File;
use std::io;
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::model::Deadline;
use crate::signals::Interrupt;
use crate::sys::{self, Thread};

/// `flock(fd, op | LOCK_NB)`: Ok(false) when someone else holds it.
pub(super) fn try_flock(file: &File, op: libc::c_int) -> anyhow::Result<bool> {
    match sys::flock(file, op | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e).context("flock failed"),
    }
}

/// How a blocking wait ended.
pub(super) enum Blocked {
    Acquired,
    TimedOut,
    Interrupted(i32),
}

/// A blocking lock operation on the lock file.
#[derive(Clone, Copy)]
pub(super) enum LockOp {
    /// `flock(op)`: the lock itself.
    Flock(libc::c_int),
    /// An open-file-description write lock on byte 0: the gate that a waiting exclusive run
    /// holds to keep new shared holders out, and that shared holders pass through. Independent
    /// of the flock on the same file.
    Gate,
}

impl LockOp {
    /// One attempt, waiting or not.
    fn call(self, file: &File, wait: bool) -> io::Result<()> {
        match self {
            LockOp::Flock(op) => sys::flock(file, if wait { op } else { op | libc::LOCK_NB }),
            LockOp::Gate => {
                let cmd = if wait {
                    libc::F_OFD_SETLKW
                } else {
                    libc::F_OFD_SETLK
                };
                sys::ofd_lock(file, cmd, libc::F_WRLCK)
            }
        }
    }
}

/// Takes the gate if it is free.
pub(super) fn try_gate(file: &File) -> anyhow::Result<bool> {
    match LockOp::Gate.call(file, false) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e).context("fcntl(F_OFD_SETLK) failed"),
    }
}

/// Lets the gate go (a no-op if it is not held).
pub(super) fn unlock_gate(file: &File) {
    let _ = sys::ofd_lock(file, libc::F_OFD_SETLK, libc::F_UNLCK);
}

/// The handler that lets a thread-directed signal end a blocked `flock` with EINTR.
fn install_wake_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| sys::install_interrupting_handler(sys::interrupting_signal()));
}

/// Blocks in `op` until acquired, `deadline`, or the interrupt. A helper thread
/// sleeps until the deadline (or is woken by the interrupt) and then signals this thread,
/// repeating every 10 ms until this thread is out of the call, which closes the race where the
/// signal lands just before `flock` starts.
pub(super) fn blocking_lock(
    file: &File,
    op: LockOp,
    deadline: Deadline,
    interrupt: &Interrupt,
) -> anyhow::Result<Blocked> {
    install_wake_handler();
    // This thread outlives the helper: it joins it before returning.
    let me = Thread::current();
    let state = Arc::new((Mutex::new(Alarm::default()), Condvar::new()));
    let waker_state = state.clone();
    let _guard = interrupt.on_fire(move || {
        waker_state
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .interrupted = true;
        waker_state.1.notify_all();
    });
    let helper_state = state.clone();
    let until = match deadline {
        Deadline::At(t) => Some(t),
        Deadline::Now => Some(Instant::now()),
        Deadline::Never => None,
    };
    let helper = std::thread::Builder::new()
        .name("dlock-flock-alarm".into())
        .spawn(move || alarm_thread(&helper_state, me, until))?;

    let result = loop {
        if let Some(sig) = interrupt.fired() {
            break Ok(Blocked::Interrupted(sig));
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            break Ok(Blocked::TimedOut);
        }
        match op.call(file, true) {
            Ok(()) => break Ok(Blocked::Acquired),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => break Err(anyhow::Error::new(e).context("lock failed")),
        }
    };
    state.0.lock().unwrap_or_else(|e| e.into_inner()).done = true;
    state.1.notify_all();
    let _ = helper.join();
    result
}

#[derive(Default)]
struct Alarm {
    done: bool,
    interrupted: bool,
}

fn alarm_thread(state: &(Mutex<Alarm>, Condvar), target: Thread, until: Option<Instant>) {
    let (lock, cvar) = state;
    let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if s.done {
            return;
        }
        let due = s.interrupted || until.is_some_and(|t| Instant::now() >= t);
        let wait = if due {
            // `target` is alive until it sets `done` and joins us.
            target.signal(sys::interrupting_signal());
            Some(Duration::from_millis(10))
        } else {
            until.map(|t| t.saturating_duration_since(Instant::now()))
        };
        s = match wait {
            Some(d) => cvar.wait_timeout(s, d).unwrap_or_else(|e| e.into_inner()).0,
            None => cvar.wait(s).unwrap_or_else(|e| e.into_inner()),
        };
    }
}
