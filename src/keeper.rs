//! The keeper: one thread per held lock that owns the [`Lease`] (and so the backend connection),
//! renews it every `renew_every`, reports each renewal's new deadline and any loss to the
//! supervisor, and releases the lock when told to stop.
//!
//! It does not decide when to kill the child: the supervisor enforces the deadline itself, so a
//! renewal stuck in a slow server call cannot delay the termination.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::backend::{Lease, Loss, RenewError};
use crate::clock::{BootInstant, drift_margin};
use crate::events::{Event, Events};
use crate::report;

/// The longest the keeper sleeps before looking at `CLOCK_BOOTTIME` again: a sleep is measured
/// on the monotonic clock, which stops during suspend, so after a resume a long sleep would
/// renew late.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// The keeper of one held lease. Its thread starts only when the first renewal is due (see
/// [`Keeper::due`]): a command shorter than `renew_every` never costs a thread, and its lease is
/// released from the calling thread.
pub struct Keeper {
    state: State,
    events: Events,
    /// The thread could not be started: nothing will renew, don't try again.
    failed: bool,
}

enum State {
    Idle(Box<dyn Lease>),
    Running {
        stop: Sender<Option<Vec<u8>>>,
        thread: JoinHandle<anyhow::Result<bool>>,
    },
}

/// The lease deadline after a successful request sent at `sent`: the server's TTL counts from
/// somewhere after the send, so counting from the send is safe; the margin covers clock drift,
/// and without pidfds the time the guardian's kill takes (see [`tree_kill_allowance`]).
pub fn deadline_after(sent: BootInstant, ttl: Duration) -> BootInstant {
    sent + ttl - drift_margin(ttl) - tree_kill_allowance(ttl)
}

/// How much sooner the SIGKILL at a lease's deadline must come without pidfds: the guardian
/// kills a tree one level at a time (a level's processes come to it when their parent is
/// gone), 3–13 ms for the test trees on a loaded machine, where a pidfd sweep kills every
/// process at once. `min(ttl/10, 50 ms)`.
fn tree_kill_allowance(ttl: Duration) -> Duration {
    if crate::sys::has_pidfds() {
        Duration::ZERO
    } else {
        (ttl / 10).min(Duration::from_millis(50))
    }
}

impl Keeper {
    /// Takes charge of `lease`; events (renewals, loss) will go to the supervisor.
    pub fn new(mut lease: Box<dyn Lease>, events: Events) -> Keeper {
        let tell = events.clone();
        lease.watch_loss(Box::new(move |loss| {
            tell.send(match loss {
                Loss::Ended(why) => Event::Lost(why),
                Loss::Freed(why) => Event::Freed(why),
            })
        }));
        Keeper {
            state: State::Idle(lease),
            events,
            failed: false,
        }
    }

    /// When the thread must be started (the first renewal), `None` once it runs.
    pub fn due(&self) -> Option<BootInstant> {
        match &self.state {
            State::Idle(_) if self.failed => None,
            State::Idle(lease) => Some(lease.acquired_at() + lease.renew_every()),
            State::Running { .. } => None,
        }
    }

    /// For a supervisor's loop at `now`: once the first renewal is due, starts the thread and
    /// returns how that went (`Some`: look again at once); before, cuts `wake` to when it is due
    /// and returns `None`.
    pub fn start_if_due(
        &mut self,
        now: BootInstant,
        wake: &mut Duration,
    ) -> Option<std::io::Result<()>> {
        let due = self.due()?;
        if now >= due {
            return Some(self.start());
        }
        *wake = (*wake).min(due.saturating_duration_since(now));
        None
    }

    /// Starts renewing on a new thread (idempotent). On error the lease is still held here.
    pub fn start(&mut self) -> std::io::Result<()> {
        let State::Idle(_) = &self.state else {
            return Ok(());
        };
        let (stop, stop_rx) = mpsc::channel();
        let (lease_tx, lease_rx) = mpsc::channel::<Box<dyn Lease>>();
        let events = self.events.clone();
        let spawned = std::thread::Builder::new()
            .name("dlock-keeper".into())
            .spawn(move || {
                let lease = lease_rx
                    .recv()
                    .map_err(|_| anyhow::anyhow!("no lease to keep"))?;
                keep(lease, &stop_rx, &events)
            });
        let thread = spawned.inspect_err(|_| self.failed = true)?;
        let State::Idle(lease) =
            std::mem::replace(&mut self.state, State::Running { stop, thread })
        else {
            unreachable!("checked above")
        };
        lease_tx
            .send(lease)
            .map_err(|_| std::io::Error::other("the keeper thread exited"))
    }

    /// Stops renewing without waiting for the thread, which may be stuck in a call to a server
    /// that does not answer: for a lease that is lost (or running out), where releasing is moot.
    /// The thread ends with the process.
    pub fn abandon(self) {
        if let State::Running { stop, .. } = self.state {
            let _ = stop.send(None);
        }
    }

    /// For a lease that is lost: releases it on a thread of its own, and returns what says when
    /// that is done. A lock that a safe `dlock break` took passes on only once its holder lets
    /// go (its mark or tombstone stays until then), so the release is worth a short wait; a
    /// server that stopped answering must not hold up the exit, so the caller waits a bound.
    pub fn release_in_background(self) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("dlock-release".into())
            .spawn(move || {
                let _ = self.release();
                let _ = tx.send(());
            });
        if let Err(e) = spawned {
            report::verbose(format_args!("cannot release the lost lock: {e}"));
        }
        rx
    }

    /// Stops renewing and releases the lock (a no-op on the server if it was lost). Blocks until
    /// the release is done.
    pub fn release(self) -> anyhow::Result<()> {
        self.finish(None).map(|_| ())
    }

    /// [`release`](Keeper::release), adding the run's end event `end` to the history in the
    /// same round trip where the backend can ([`Lease::release_with_end`]): whether it did.
    pub fn release_with_end(self, end: Vec<u8>) -> anyhow::Result<bool> {
        self.finish(Some(end))
    }

    fn finish(self, end: Option<Vec<u8>>) -> anyhow::Result<bool> {
        match self.state {
            State::Idle(lease) => release_lease(lease, end),
            State::Running { stop, thread } => {
                let _ = stop.send(end);
                // A panic aborts a release build (panic = "abort"); only a test build unwinds.
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the keeper thread panicked")))
            }
        }
    }
}

fn keep(
    mut lease: Box<dyn Lease>,
    stop: &mpsc::Receiver<Option<Vec<u8>>>,
    events: &Events,
) -> anyhow::Result<bool> {
    let every = lease.renew_every();
    let retry = (every / 2).min(Duration::from_secs(1));
    let mut next = lease.acquired_at() + every;
    loop {
        match stop.recv_timeout(next.remaining().min(MAX_SLEEP)) {
            Ok(end) => return release_lease(lease, end),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if next.remaining() > Duration::ZERO {
            continue;
        }
        let sent = BootInstant::now();
        match lease.renew() {
            Ok(()) => {
                let took = BootInstant::now().saturating_duration_since(sent);
                if let Some(ttl) = lease.ttl() {
                    report::verbose(format_args!("renewed the lease in {took:.1?}"));
                    events.send(Event::Renewed(deadline_after(sent, ttl)));
                }
                next = sent + every;
            }
            Err(RenewError::Lost(why)) => {
                events.send(Event::Lost(why));
                // Nothing to renew any more; wait to be told to clean up.
                let end = stop.recv().ok().flatten();
                return release_lease(lease, end);
            }
            Err(RenewError::Failed(e)) => {
                report::verbose(format_args!("renewal failed, retrying in {retry:?}: {e:#}"));
                events.send(Event::RenewFailed(format!("{e:#}")));
                next = BootInstant::now() + retry;
            }
        }
    }
    release_lease(lease, None)
}

/// Releases `lease`, with the run's end event if there is one.
fn release_lease(lease: Box<dyn Lease>, end: Option<Vec<u8>>) -> anyhow::Result<bool> {
    match end {
        Some(end) => lease.release_with_end(&end),
        None => lease.release().map(|()| false),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::Receiver;

    use super::*;
    use crate::backend::memory::Memory;
    use crate::backend::{Backend, Request};
    use crate::model::Key;
    use crate::model::{Deadline, Holder};
    use crate::signals::Interrupt;

    fn take(mem: &Memory, key: &str, ttl: Duration) -> Box<dyn Lease> {
        let key = Key::new(key).unwrap();
        let interrupt = Interrupt::new();
        mem.acquire(&Request {
            key: &key,
            mode: crate::model::Mode::Exclusive,
            ttl,
            deadline: Deadline::Now,
            holder: &Holder::default(),
            interrupt: &interrupt,
            on_holder: &|_| {},
            start: None,
        })
        .unwrap()
    }

    fn keeper(lease: Box<dyn Lease>) -> (Keeper, Receiver<Event>) {
        let (tx, rx) = mpsc::channel();
        let mut k = Keeper::new(lease, Events(tx));
        k.start().unwrap();
        (k, rx)
    }

    #[test]
    fn renews_every_third_of_the_ttl_and_never_promises_more_than_the_server() {
        let mem = Memory::new();
        let ttl = Duration::from_millis(300);
        let lease = take(&mem, "k", ttl);
        let acquired = lease.acquired_at();
        let (k, rx) = keeper(lease);
        let mut renewed = Vec::new();
        while renewed.len() < 4 {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(Event::Renewed(deadline)) => {
                    let server = mem.expires("k").expect("still held");
                    assert!(deadline < server, "the client's deadline is the earlier");
                    renewed.push(BootInstant::now().saturating_duration_since(acquired));
                }
                other => panic!("expected a renewal, got {other:?}"),
            }
        }
        // Due at 100, 200, 300, 400 ms after the acquire.
        assert!(renewed[0] >= Duration::from_millis(95), "{renewed:?}");
        assert!(renewed[3] >= Duration::from_millis(395), "{renewed:?}");
        assert!(renewed[3] < Duration::from_millis(1000), "{renewed:?}");
        k.release().unwrap();
        assert_eq!(mem.holder_pid("k"), None, "released");
    }

    #[test]
    fn a_broken_lock_is_reported_lost_within_a_renewal() {
        let mem = Memory::new();
        let ttl = Duration::from_millis(600);
        let (k, rx) = keeper(take(&mem, "k", ttl));
        mem.remove("k");
        let broken = BootInstant::now();
        loop {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(Event::Renewed(_)) => continue,
                Ok(Event::Lost(why)) => {
                    assert!(why.contains("gone"), "{why}");
                    break;
                }
                other => panic!("expected the loss, got {other:?}"),
            }
        }
        assert!(BootInstant::now().saturating_duration_since(broken) < ttl / 3 + ttl / 6);
        k.abandon();
    }

    #[test]
    fn failing_renewals_are_retried_and_reported_without_a_new_deadline() {
        let mem = Memory::new();
        let ttl = Duration::from_millis(300);
        mem.fail_renewals(true);
        let (k, rx) = keeper(take(&mem, "k", ttl));
        let mut failures = 0;
        while failures < 3 {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(Event::RenewFailed(why)) => {
                    assert!(why.contains("no answer"), "{why}");
                    failures += 1;
                }
                other => panic!("expected failed renewals only, got {other:?}"),
            }
        }
        // Back again: the next renewal succeeds and reports a fresh deadline.
        mem.fail_renewals(false);
        loop {
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(Event::RenewFailed(_)) => continue,
                Ok(Event::Renewed(d)) => {
                    assert!(d > BootInstant::now() + ttl / 2);
                    break;
                }
                other => panic!("expected a renewal, got {other:?}"),
            }
        }
        k.release().unwrap();
    }

    #[test]
    fn a_short_command_needs_no_thread() {
        let mem = Memory::new();
        let (tx, _rx) = mpsc::channel();
        let lease = take(&mem, "k", Duration::from_secs(30));
        let due = lease.acquired_at() + Duration::from_secs(10);
        let k = Keeper::new(lease, Events(tx));
        assert_eq!(k.due(), Some(due));
        k.release().unwrap();
        assert_eq!(mem.holder_pid("k"), None);
    }
}
