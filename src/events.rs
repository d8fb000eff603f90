//! What the keeper thread and the signal handling tell the main thread while the command runs:
//! the events of one run, and the channel they come by. A module of its own so that the keeper
//! (which sends) and the supervisor (which receives) do not import each other.

use std::process::ExitStatus;
use std::sync::mpsc::Sender;

use crate::clock::BootInstant;
use crate::signals::{self, Received};

/// Everything the main thread waits for while the child runs.
#[derive(Debug)]
pub enum Event {
    /// A signal dlock forwards arrived (SIGINT, SIGTERM, SIGHUP and every other whose default
    /// action would end dlock: `signals::FORWARDED_FIXED` and the real-time ones).
    Signal(Received),
    /// The command exited (reaped by the guardian).
    ChildExited(ExitStatus),
    /// The command exited, and processes it started still run.
    Leftovers,
    /// The guardian exited (normally once nothing is left below it).
    GuardianExited(ExitStatus),
    /// No child of dlock is left (the guardian and everything re-parented to dlock are reaped).
    AllReaped,
    /// The lease was renewed; it now lasts until this instant.
    Renewed(BootInstant),
    /// A renewal failed; the lease may still be ours until its deadline.
    RenewFailed(String),
    /// The backend says the lease is gone.
    Lost(String),
    /// The backend says the lock is already free on the server (its session's connection
    /// ended): as `Lost`, but what runs under it is SIGKILLed at once ([`crate::backend::Loss`]).
    Freed(String),
    /// For `dlock acquire`'s holder process (never sent during a `dlock run`).
    Holder(HolderEvent),
}

/// What the holder process of `dlock acquire` hears besides its keeper and signals.
#[derive(Debug)]
pub enum HolderEvent {
    /// `dlock acquire` printed the handle: its caller has it.
    CallerAcked,
    /// `dlock acquire` ended before it printed the handle: nobody has it.
    CallerGone,
    /// The owner process exited.
    OwnerExited,
    /// A process of this user sent a request (e.g. "release") on this connection.
    Request(std::os::unix::net::UnixStream, String),
}

/// The sending side of the main thread's event queue, for other threads: each send also wakes
/// the main thread from its signal wait.
#[derive(Clone)]
pub struct Events(pub Sender<Event>);

impl Events {
    /// Queues `event` for the main thread and wakes it.
    pub fn send(&self, event: Event) {
        let _ = self.0.send(event);
        signals::wake_main();
    }
}
