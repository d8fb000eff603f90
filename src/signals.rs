//! SIGINT, SIGTERM and SIGHUP: one thread receives them (with their origin) and passes them on;
//! [`Interrupt`] lets a backend's blocking wait be woken by them.
//!
//! `ctrlc` cannot tell which signal arrived, but SPEC.md forwards the exact signal and exits
//! 128+N, hence `signal-hook`'s iterator. The handler itself only queues the signal; everything
//! else happens on the signal thread, outside signal context.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::Cause;

/// The signals dlock forwards to the child and turns into exit 128+N.
pub const FORWARDED: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// A received signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// The signal number.
    pub signal: i32,
    /// Sent by the kernel on behalf of the terminal (Ctrl-C, hang-up): the whole foreground
    /// process group, the child included, got it already, so it must not be sent twice.
    pub from_terminal: bool,
}

/// Installs handlers for the forwarded signals at once and returns the [`Interrupt`] they fire.
///
/// The thread that reads them starts lazily, on [`Interrupt::start_watching`] or when a backend
/// registers a waker before blocking: an uncontended `dlock run` then creates no thread before
/// its child is running (thread creation is a measurable part of dlock's overhead). Signals that
/// arrive meanwhile are queued by the handler and not lost.
pub fn watch(deliver: impl Fn(Received) + Send + 'static) -> std::io::Result<Arc<Interrupt>> {
    let signals = SignalsInfo::<WithOrigin>::new(FORWARDED)?;
    Ok(Arc::new_cyclic(|me| Interrupt {
        me: me.clone(),
        idle: Mutex::new(Some(Idle {
            signals,
            deliver: Box::new(deliver),
        })),
        ..Interrupt::default()
    }))
}

fn received(origin: &signal_hook::low_level::siginfo::Origin) -> Received {
    Received {
        signal: origin.signal,
        from_terminal: matches!(origin.cause, Cause::Kernel),
    }
}

type Waker = Box<dyn Fn() + Send>;

/// Installed signal handlers whose reading thread has not started yet.
struct Idle {
    signals: SignalsInfo<WithOrigin>,
    deliver: Box<dyn Fn(Received) + Send>,
}

/// A one-shot "stop waiting" flag with wake-up callbacks. Fired by the first forwarded signal;
/// a backend blocked in a wait registers a waker that unblocks it (a signal to the waiting
/// thread, a socket shutdown, ...) and then sees [`Interrupt::fired`].
#[derive(Default)]
pub struct Interrupt {
    signal: AtomicI32,
    next_id: AtomicU64,
    wakers: Mutex<Vec<(u64, Waker)>>,
    me: Weak<Interrupt>,
    idle: Mutex<Option<Idle>>,
}

impl Interrupt {
    /// A new, unfired interrupt that no signal fires (for tests and embedding).
    pub fn new() -> Arc<Interrupt> {
        Arc::new(Interrupt::default())
    }

    /// Starts the thread that reads signals, fires this interrupt and delivers them (once; later
    /// calls do nothing).
    pub fn start_watching(&self) -> std::io::Result<()> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let (
            Some(Idle {
                mut signals,
                deliver,
            }),
            Some(me),
        ) = (idle.take(), self.me.upgrade())
        else {
            return Ok(());
        };
        std::thread::Builder::new()
            .name("dlock-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let r = received(&origin);
                    me.fire(r.signal);
                    deliver(r);
                }
            })?;
        Ok(())
    }

    /// Handles signals that arrived before the watching thread started, on this thread.
    pub fn check_pending(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Idle { signals, deliver }) = idle.as_mut() {
            for origin in signals.pending() {
                let r = received(&origin);
                self.fire(r.signal);
                deliver(r);
            }
        }
    }

    /// The signal that fired it, if any.
    pub fn fired(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Fires (the first signal is kept) and runs every registered waker.
    pub fn fire(&self, signal: i32) {
        let _ = self
            .signal
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        for (_, wake) in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            wake();
        }
    }

    /// Registers `wake` until the guard drops, for a caller about to block: starts the signal
    /// thread if needed. If already fired, `wake` runs at once too, so a waiter that registers
    /// and then checks [`Interrupt::fired`] cannot miss a signal.
    pub fn on_fire(&self, wake: impl Fn() + Send + 'static) -> std::io::Result<WakerGuard<'_>> {
        self.check_pending();
        self.start_watching()?;
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        if self.fired().is_some() {
            wake();
        }
        wakers.push((id, Box::new(wake)));
        Ok(WakerGuard {
            interrupt: self,
            id,
        })
    }
}

/// Unregisters a waker on drop.
pub struct WakerGuard<'a> {
    interrupt: &'a Interrupt,
    id: u64,
}

impl Drop for WakerGuard<'_> {
    fn drop(&mut self) {
        let mut wakers = self
            .interrupt
            .wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        wakers.retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn wakers_run_on_fire_and_after_it() {
        let i = Interrupt::new();
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let guard = i
            .on_fire(move || {
                c.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        assert_eq!(i.fired(), None);
        i.fire(libc::SIGTERM);
        i.fire(libc::SIGINT);
        assert_eq!(i.fired(), Some(libc::SIGTERM), "the first signal is kept");
        assert_eq!(count.load(Ordering::SeqCst), 2);
        drop(guard);
        let c = count.clone();
        let _late = i
            .on_fire(move || {
                c.fetch_add(10, Ordering::SeqCst);
            })
            .unwrap();
        assert_eq!(
            count.load(Ordering::SeqCst),
            12,
            "a late waker runs at once"
        );
    }
}
