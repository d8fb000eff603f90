//! Signals without a signal thread: every signal dlock forwards (INT, TERM, HUP and the others
//! whose default action would end it), SIGCHLD and a wake-up signal are blocked in every thread
//! (the mask is set on the main thread before any other thread exists), and the main thread
//! takes them synchronously with `sigtimedwait`, which also says who sent each one. An
//! uncontended `dlock run` thus creates no thread at all: thread start-up was the largest part
//! of dlock's overhead over `flock(1)` on a 2-core machine.
//!
//! While a backend blocks in acquire, the main thread cannot wait for signals, so a backend about
//! to block registers a waker with [`Interrupt::on_fire`]; that starts a watcher thread that takes
//! the signals instead, fires the interrupt and runs the wakers, for as long as a waker is
//! registered — unless the wait is a read on dlock's own socket on the main thread, which a
//! forwarded signal ends by itself ([`interrupts_network_waits`]). The child gets an empty mask and default dispositions (std resets both on spawn).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::sys::{self, SigSet, Thread};

/// The signals dlock forwards to the child and turns into exit 128+N: every asynchronous signal
/// whose default action would end dlock — which would leave the command killed by PDEATHSIG
/// but a lease-based lock held until its TTL ran out. Not here: the fault signals (SEGV, BUS,
/// ILL, FPE, TRAP, SYS, ABRT: blocking them would not stop them), SIGPIPE (Rust's runtime ignores
/// it), SIGUSR1 (see [`WAKE`]; one sent by another process is forwarded too) and the real-time
/// signal the file backend uses to interrupt a blocked `flock`
/// ([`crate::sys::interrupting_signal`]); the other real-time signals are added at run time.
const FORWARDED_FIXED: [i32; 13] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGSTKFLT,
];
/// Sent to a thread blocked in [`wait`] to wake it: by the keeper to the main thread when it has
/// queued an event, and to the watcher thread to stop it. A SIGUSR1 that another process sent
/// is not a wake-up: it is forwarded like the others.
const WAKE: i32 = libc::SIGUSR1;

/// The forwarded signals, the main thread's set (plus SIGCHLD and WAKE) and the watcher's (plus
/// WAKE).
struct Sets {
    forwarded: Vec<i32>,
    main: Vec<i32>,
    watcher: Vec<i32>,
}

fn sets() -> &'static Sets {
    static SETS: OnceLock<Sets> = OnceLock::new();
    SETS.get_or_init(|| {
        let own = sys::interrupting_signal();
        let mut forwarded = FORWARDED_FIXED.to_vec();
        let deadline = sys::deadline_signal();
        forwarded
            .extend((libc::SIGRTMIN()..=libc::SIGRTMAX()).filter(|&s| s != own && s != deadline));
        let mut watcher = forwarded.clone();
        watcher.push(WAKE);
        let mut main = watcher.clone();
        main.push(libc::SIGCHLD);
        Sets {
            forwarded,
            main,
            watcher,
        }
    })
}

/// The signals dlock forwards, SIGUSR1 included, as a kernel signal set (bit N-1 for signal N):
/// what its guardian passes on when a process sends them to it.
pub(crate) fn forwarded_set() -> u64 {
    sets()
        .forwarded
        .iter()
        .chain(&[WAKE])
        .filter(|&&s| (1..=64).contains(&s))
        .fold(0, |set, &s| set | 1 << (s - 1))
}

/// What a process that only waits for its child passes on to it (`dlock acquire` waiting for
/// its holder): the forwarded signals and SIGUSR1; and SIGCHLD, to hear of the child's end.
pub(crate) fn relayed() -> Vec<i32> {
    let mut set = sets().watcher.clone();
    set.push(libc::SIGCHLD);
    set
}

/// Whether dlock forwards `sig` to the command (and exits 128+`sig`).
pub(crate) fn is_forwarded(sig: i32) -> bool {
    sig == WAKE || sets().forwarded.contains(&sig)
}

/// A received signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// The signal number.
    pub signal: i32,
    /// Sent by the kernel on behalf of the terminal (Ctrl-C, hang-up): the whole foreground
    /// process group, the child included, got it already, so it must not be sent twice.
    pub from_terminal: bool,
}

/// What [`wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A forwarded signal.
    Signal(Received),
    /// SIGCHLD: some child changed state.
    Child,
    /// Another thread asked us to look at our queue (or the timeout ran out).
    Wake,
}

static MAIN_THREAD: OnceLock<Thread> = OnceLock::new();

/// Blocks the handled signals in this thread and in every thread created after it. Call first
/// thing on the main thread. A forwarded signal that this process inherited as ignored (`nohup`,
/// a background job of a non-interactive shell) stays ignored, for dlock and for the command:
/// blocking it would queue it anyway.
pub fn block() -> io::Result<()> {
    // An inherited SIG_IGN for SIGCHLD makes the kernel reap children by itself: waitid would
    // never report the command's exit, and dlock would wait forever.
    if sys::is_ignored(libc::SIGCHLD) {
        sys::reset_to_default(libc::SIGCHLD);
    }
    let mut handled: Vec<i32> = sets().main.clone();
    handled.retain(|&sig| !(is_forwarded(sig) && sig != WAKE && sys::is_ignored(sig)));
    sys::block_signals(&SigSet::of(&handled))?;
    let _ = MAIN_THREAD.set(Thread::current());
    Ok(())
}

/// Waits up to `timeout` on the main thread for a forwarded signal, SIGCHLD or a wake-up.
pub(crate) fn wait(timeout: Duration) -> Woken {
    take(&sets().main, timeout)
}

/// Takes a forwarded signal that is already pending, without waiting (SIGCHLD stays pending);
/// first one that a network wait took already ([`interrupts_network_waits`]).
pub(crate) fn pending() -> Option<Received> {
    let deferred = DEFERRED.swap(0, Ordering::SeqCst);
    if deferred != 0 {
        return Some(Received {
            signal: deferred & 0xffff,
            from_terminal: deferred & FROM_TERMINAL != 0,
        });
    }
    match take(&sets().watcher, Duration::ZERO) {
        Woken::Signal(r) => Some(r),
        _ => None,
    }
}

/// A signal taken by a network wait on the main thread, for [`pending`]: the number, with
/// [`FROM_TERMINAL`] or'ed in; 0 for none.
static DEFERRED: AtomicI32 = AtomicI32::new(0);
const FROM_TERMINAL: i32 = 1 << 16;

/// For a network wait about to block (a socket read or write): on the main thread, a descriptor
/// that turns readable when a forwarded signal arrives, so that the wait ends at once instead of
/// holding the signal until a reply or a timeout (a server that never answers, or answers a
/// byte a second, would otherwise make dlock deaf to Ctrl-C). `None` on other threads (the
/// keeper's renewals, Redlock's parallel requests): signals are the main thread's business.
pub(crate) fn interrupts_network_waits() -> Option<std::os::fd::BorrowedFd<'static>> {
    static FD: OnceLock<Option<std::os::fd::OwnedFd>> = OnceLock::new();
    static WITH_USR1: OnceLock<Option<std::os::fd::OwnedFd>> = OnceLock::new();
    use std::os::fd::AsFd;
    if MAIN_THREAD.get() != Some(&Thread::current()) || GIVING_BACK.load(Ordering::SeqCst) {
        return None;
    }
    let (fd, set) = match USR1_TOO.load(Ordering::SeqCst) {
        true => (&WITH_USR1, &sets().watcher),
        false => (&FD, &sets().forwarded),
    };
    fd.get_or_init(|| sys::signal_fd(&SigSet::of(set)).ok())
        .as_ref()
        .map(|fd| fd.as_fd())
}

/// Set while a [`WaitingForServer`] lives.
static USR1_TOO: AtomicBool = AtomicBool::new(false);

/// While this lives, network waits on the main thread also end at a SIGUSR1 (dlock forwards
/// one that another process sent; [`WAKE`]): for a wait in the server (a Redis `BLPOP`) with no
/// waker of its own, before any thread of this process sends the main thread wake-ups — one
/// taken here would be one the main thread's [`wait`] never sees. Nothing on other threads.
pub(crate) struct WaitingForServer(bool);

/// See [`WaitingForServer`]. Take it before asking [`interrupts_network_waits`] whether a wait
/// needs a waker: if its descriptor cannot be made, the answer is `None`, and the waker is.
pub(crate) fn waiting_for_server() -> WaitingForServer {
    let main = MAIN_THREAD.get() == Some(&Thread::current());
    if main {
        USR1_TOO.store(true, Ordering::SeqCst);
    }
    WaitingForServer(main)
}

impl Drop for WaitingForServer {
    fn drop(&mut self) {
        if self.0 {
            USR1_TOO.store(false, Ordering::SeqCst);
        }
    }
}

/// Set while a [`GivingBack`] lives.
static GIVING_BACK: AtomicBool = AtomicBool::new(false);

/// While this lives, network waits on the main thread are not ended by a signal: for giving
/// back what a wait a signal ended had taken (a waiter's etcd lease and key, a Redis waiter
/// entry), each request under its own short deadline. Ended at once, the give-back failed, and
/// the key blocked the next waiter until its TTL ran out (seen: a freed `--limit` slot taken
/// 2.3 s late). The signal stays pending for the caller.
pub(crate) struct GivingBack(());

/// See [`GivingBack`].
pub(crate) fn giving_back() -> GivingBack {
    GIVING_BACK.store(true, Ordering::SeqCst);
    GivingBack(())
}

impl Drop for GivingBack {
    fn drop(&mut self) {
        GIVING_BACK.store(false, Ordering::SeqCst);
    }
}

/// Whether a network wait on the main thread already took a signal that nobody has collected
/// yet (with [`pending`]): then every later wait there must end at once too. The signal has left
/// the descriptor, and the watcher thread never saw it, so a request that swallowed its error
/// (reading who holds the lock, say) would otherwise let the next wait — a BLPOP of seconds —
/// run to its end before anyone noticed the Ctrl-C (seen: 2.1 s).
pub(crate) fn network_wait_interrupted() -> bool {
    DEFERRED.load(Ordering::SeqCst) != 0
}

/// Called by a network wait whose descriptor from [`interrupts_network_waits`] turned readable:
/// takes the signal now (it stays in [`pending`] for the caller's error path) and says whether
/// there was one. (Another thread may have taken it first: then the interrupt has fired.)
pub(crate) fn take_for_network_wait() -> bool {
    if DEFERRED.load(Ordering::SeqCst) != 0 {
        return true;
    }
    match take(&sets().watcher, Duration::ZERO) {
        Woken::Signal(r) => {
            let v = r.signal | if r.from_terminal { FROM_TERMINAL } else { 0 };
            let _ = DEFERRED.compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst);
            true
        }
        _ => false,
    }
}

fn take(signals: &[i32], timeout: Duration) -> Woken {
    match sys::take_signal(&SigSet::of(signals), timeout) {
        Some(t) if t.signal == libc::SIGCHLD => Woken::Child,
        Some(t) if t.signal == WAKE && t.sent_by_this_process() => Woken::Wake,
        Some(t) if is_forwarded(t.signal) => Woken::Signal(Received {
            signal: t.signal,
            from_terminal: t.code == libc::SI_KERNEL,
        }),
        _ => Woken::Wake, // timeout or EINTR
    }
}

/// Wakes the main thread from [`wait`] (after queueing an event for it).
pub(crate) fn wake_main() {
    // The main thread lives as long as the process.
    if let Some(&t) = MAIN_THREAD.get() {
        t.signal(WAKE);
    }
}

/// A stretch of blocking calls into a library that offers no way to end them early (the `mysql`
/// crate retries reads interrupted by a signal and does not hand out its socket), bounded the
/// only way left: when `limit` passes, a timer signal ends the process with exit 69 and a
/// one-line message; on the main thread of `dlock run`, a forwarded signal ends it with 128+N.
/// Sound only where ending the process leaves nothing behind: MySQL's locks belong to their
/// connections, which the kernel closes at exit, so the server releases them at once. The limit
/// is a backstop above the library's own timeouts, for a server that answers a byte at a time.
pub(crate) struct HardStop {
    timer: Option<sys::ThreadTimer>,
    unblocked: Option<SigSet>,
}

impl HardStop {
    /// Arms the stop for `limit`; `doing` describes the request for the message ("mysql:
    /// 10.0.0.5:3306").
    pub(crate) fn arm(limit: Duration, doing: &str) -> HardStop {
        static HANDLERS: OnceLock<()> = OnceLock::new();
        static MESSAGES: Mutex<Vec<&'static [u8]>> = Mutex::new(Vec::new());
        HANDLERS.get_or_init(|| sys::install_exiting_handlers(&sets().forwarded));
        let text = format!(
            "dlock: {doing}: a request did not finish within {limit:?} (the server answers too slowly, or a byte at a time)\n"
        );
        {
            // One copy of each distinct message for the life of the process (the handler needs
            // a 'static one); a run uses one or two.
            let mut known = MESSAGES.lock().unwrap_or_else(|e| e.into_inner());
            let msg = match known.iter().find(|m| **m == text.as_bytes()) {
                Some(m) => *m,
                None => {
                    let m: &'static [u8] = Box::leak(text.into_bytes().into_boxed_slice());
                    known.push(m);
                    m
                }
            };
            sys::set_deadline_message(msg);
        }
        let on_main = MAIN_THREAD.get() == Some(&Thread::current());
        let mut set = vec![sys::deadline_signal()];
        if on_main {
            set.extend_from_slice(&sets().forwarded);
        }
        let set = SigSet::of(&set);
        let timer = sys::ThreadTimer::start(limit).ok();
        let unblocked = sys::unblock_signals(&set).ok().map(|()| set);
        HardStop { timer, unblocked }
    }
}

impl Drop for HardStop {
    fn drop(&mut self) {
        // Block, delete the timer, then take a deadline signal that fired meanwhile, so that it
        // cannot end a later stretch.
        if let Some(set) = self.unblocked.take() {
            let _ = sys::block_signals(&set);
        }
        drop(self.timer.take());
        let _ = sys::take_signal(&SigSet::of(&[sys::deadline_signal()]), Duration::ZERO);
    }
}

type Waker = Box<dyn Fn() + Send>;

/// A one-shot "stop waiting" flag with wake-up callbacks, fired by the first forwarded signal
/// that arrives while a backend waits. A backend about to block registers a waker that unblocks
/// it (a signal to the waiting thread, a socket shutdown, ...) and then checks
/// [`Interrupt::fired`].
#[derive(Default)]
pub(crate) struct Interrupt {
    /// What the watcher thread shares: it fires the interrupt when a signal arrives.
    state: std::sync::Arc<State>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    signal: AtomicI32,
    /// One lock for the wakers and the watcher: `fire` runs the wakers under it, and a waker
    /// may wait (see [`Blocked`]) until its waiter checks [`Interrupt::fired`], so no waiter may
    /// need a second lock held by a thread that waits for this one. (With two locks, a guard
    /// dropping on one thread held the watcher's lock while it waited for the wakers', a waiter
    /// registering on another waited for the watcher's, and `fire` poked that waiter for 5 s per
    /// waker: Ctrl-C of `dlock bench` hung for seconds.)
    registry: Mutex<Registry>,
}

impl State {
    fn fire(&self, signal: i32) {
        let _ = self
            .signal
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        for (_, wake) in self.registry().wakers.iter() {
            wake();
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct Registry {
    wakers: Vec<(u64, Waker)>,
    watcher: Option<Watcher>,
}

struct Watcher {
    thread: Thread,
    handle: std::thread::JoinHandle<()>,
    /// This watcher's own stop flag: a watcher being stopped and the next one started by
    /// another thread's waiter must not share one.
    stop: std::sync::Arc<AtomicBool>,
}

impl Watcher {
    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        // Alive until joined below.
        self.thread.signal(WAKE);
        let _ = self.handle.join();
    }
}

impl Interrupt {
    /// A new, unfired interrupt.
    pub(crate) fn new() -> std::sync::Arc<Interrupt> {
        std::sync::Arc::new(Interrupt::default())
    }

    /// The signal that fired it, if any.
    pub(crate) fn fired(&self) -> Option<i32> {
        match self.state.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Fires (the first signal is kept) and runs every registered waker.
    pub(crate) fn fire(&self, signal: i32) {
        self.state.fire(signal);
    }

    /// Registers `wake` until the guard drops, for a caller about to block. While any waker is
    /// registered, a watcher thread takes the forwarded signals and fires this interrupt. The
    /// caller must check [`Interrupt::fired`] after registering: a fire before the registration
    /// is seen there, a fire after it runs `wake`. (`wake` is never run here, on the caller's
    /// thread: a waker that pokes until the caller leaves its blocking call would wait for
    /// itself.)
    pub(crate) fn on_fire(&self, wake: impl Fn() + Send + 'static) -> io::Result<WakerGuard<'_>> {
        if let Some(r) = pending() {
            self.fire(r.signal);
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let mut registry = self.registry();
        registry.wakers.push((id, Box::new(wake)));
        let guard = WakerGuard {
            interrupt: self,
            id,
        };
        // Under the same lock: a guard dropping on another thread either sees this waker (and
        // leaves the watcher running) or has taken its watcher already (and one starts here).
        self.start_watcher(&mut registry.watcher)?;
        Ok(guard)
    }

    /// Sleeps for `d`, or until this interrupt fires (a signal arriving meanwhile fires it).
    pub(crate) fn nap(&self, d: Duration) -> io::Result<()> {
        use std::sync::{Arc, Condvar};
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let waker = pair.clone();
        let _guard = self.on_fire(move || {
            *waker.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            waker.1.notify_all();
        })?;
        if self.fired().is_some() {
            return Ok(()); // fired before the waker was registered
        }
        let fired = pair.0.lock().unwrap_or_else(|e| e.into_inner());
        let _ = pair.1.wait_timeout_while(fired, d, |f| !*f);
        Ok(())
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.state.registry()
    }

    /// Starts the watcher thread unless it runs. The new thread takes no lock before it has
    /// reported its id, so this may run under the registry's lock.
    fn start_watcher(&self, watcher: &mut Option<Watcher>) -> io::Result<()> {
        if watcher.is_some() || MAIN_THREAD.get().is_none() {
            return Ok(()); // running, or signals are not blocked (tests): nothing to take
        }
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // The thread shares the state it fires; the last guard's drop stops and joins it.
        let state = self.state.clone();
        let handle = std::thread::Builder::new()
            .name("dlock-signals".into())
            .spawn(move || {
                let _ = tx.send(Thread::current());
                while !stopped.load(Ordering::SeqCst) {
                    if let Woken::Signal(r) = take(&sets().watcher, Duration::from_secs(1)) {
                        state.fire(r.signal);
                    }
                }
            })?;
        let thread = rx
            .recv()
            .map_err(|_| io::Error::other("signal watcher died"))?;
        *watcher = Some(Watcher {
            thread,
            handle,
            stop,
        });
        Ok(())
    }
}

/// For wakers that poke a blocking call from outside (a signal, `CLIENT UNBLOCK`, `KILL QUERY`):
/// a poke that lands just before the call starts is lost, so [`Interrupt::on_fire`] gets a waker
/// that repeats `poke` every 10 ms (for at most 5 s) until the waiter calls [`Blocked::done`].
#[derive(Clone)]
pub(crate) struct Blocked(std::sync::Arc<AtomicBool>);

impl Blocked {
    /// A waiter about to block.
    pub(crate) fn new() -> Blocked {
        Blocked(std::sync::Arc::new(AtomicBool::new(true)))
    }

    /// The waiter is out of its blocking call: stop poking. Call before dropping the guard.
    pub(crate) fn done(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// A waker that pokes until [`Blocked::done`].
    pub(crate) fn waker(&self, poke: impl Fn() + Send + 'static) -> impl Fn() + Send + 'static {
        let blocked = self.clone();
        move || {
            for _ in 0..500 {
                if !blocked.0.load(Ordering::SeqCst) {
                    return;
                }
                poke();
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Default for Blocked {
    fn default() -> Self {
        Blocked::new()
    }
}

/// Unregisters a waker on drop; the last one stops the watcher thread.
pub(crate) struct WakerGuard<'a> {
    interrupt: &'a Interrupt,
    id: u64,
}

impl Drop for WakerGuard<'_> {
    fn drop(&mut self) {
        let idle = {
            let mut registry = self.interrupt.registry();
            registry.wakers.retain(|(id, _)| *id != self.id);
            match registry.wakers.is_empty() {
                true => registry.watcher.take(),
                false => None,
            }
        };
        // Joined outside the lock: the watcher may be in `fire`, waiting for it.
        if let Some(w) = idle {
            w.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn wakers_run_on_fire_and_late_callers_see_the_flag() {
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
            2,
            "a late waker is not run on the caller's thread"
        );
        assert_eq!(i.fired(), Some(libc::SIGTERM), "the caller sees it instead");
    }
}
