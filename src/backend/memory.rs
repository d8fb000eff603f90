//! An in-memory backend for the core's unit tests (`lockset`, `keeper`): exclusive locks with a
//! TTL, a fencing counter, waiting on a condition variable (woken by releases, deadlines and
//! interrupts, never by polling), and knobs to make the "server" misbehave: refuse a key, fail
//! every renewal, or grant locks as a server that has just restarted (the hold-back).
//!
//! Compiled for tests only. Integration tests never use it: they run the real binary against
//! real servers. It says it is the file backend (`kind`), since the core only uses the kind for
//! names; its location is "memory".

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{Backend, BreakHow, Broken, Lease, RenewError, Request};
use crate::backend::Grant;
use crate::clock::BootInstant;
use crate::exit::{Interrupted, Unavailable};
use crate::model::{BackendKind, Key};
use crate::model::{Holder, Status};

/// One in-memory lock server; clones share it.
#[derive(Clone, Default)]
pub(crate) struct Memory {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    fence: u64,
    next_token: u64,
    /// Successful renewals, all keys.
    renewals: u64,
    /// Keys whose acquire fails as if the server were unreachable.
    unavailable: HashSet<String>,
    /// Every renewal fails (the server stopped answering).
    fail_renewals: bool,
    /// Grant locks as a server that restarted recently would: held back for this long.
    hold_back: Option<Duration>,
}

struct Held {
    token: u64,
    holder: Holder,
    expires: BootInstant,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn live(&mut self, key: &str) -> Option<&Held> {
        if self
            .locks
            .get(key)
            .is_some_and(|h| h.expires.remaining().is_zero())
        {
            self.locks.remove(key);
        }
        self.locks.get(key)
    }
}

impl Memory {
    /// A fresh server with no locks.
    pub(crate) fn new() -> Memory {
        Memory::default()
    }

    /// Makes acquiring `key` fail as if the server could not be reached.
    pub(crate) fn refuse(&self, key: &str) {
        self.inner.state().unavailable.insert(key.to_string());
    }

    /// Makes every renewal fail (or succeed again).
    pub(crate) fn fail_renewals(&self, fail: bool) {
        self.inner.state().fail_renewals = fail;
    }

    /// Grants every later lock as a server that restarted recently: held back for `d`.
    pub(crate) fn hold_back(&self, d: Duration) {
        self.inner.state().hold_back = Some(d);
    }

    /// Whether `key` is held now, and by the holder with this pid.
    pub(crate) fn holder_pid(&self, key: &str) -> Option<Option<u32>> {
        self.inner.state().live(key).map(|h| h.holder.pid)
    }

    /// When `key`'s lease runs out on the "server".
    pub(crate) fn expires(&self, key: &str) -> Option<BootInstant> {
        self.inner.state().live(key).map(|h| h.expires)
    }

    /// Successful renewals so far.
    pub(crate) fn renewals(&self) -> u64 {
        self.inner.state().renewals
    }

    /// Takes `key` for another holder (pid `pid`) for `ttl`, as another process would.
    pub(crate) fn take_as(&self, key: &str, pid: u32, ttl: Duration) {
        let mut s = self.inner.state();
        s.next_token += 1;
        let token = s.next_token;
        s.locks.insert(
            key.to_string(),
            Held {
                token,
                holder: Holder::from(crate::model::Record {
                    pid: Some(pid),
                    ..crate::model::Record::default()
                }),
                expires: BootInstant::now() + ttl,
            },
        );
    }

    /// Removes `key`'s lock whoever holds it, and wakes the waiters.
    pub(crate) fn remove(&self, key: &str) {
        self.inner.state().locks.remove(key);
        self.inner.changed.notify_all();
    }
}

impl Backend for Memory {
    fn kind(&self) -> BackendKind {
        BackendKind::File
    }

    fn location(&self) -> String {
        "memory".into()
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let key = req.key.as_str();
        let inner = self.inner.clone();
        // Takes the state's lock before notifying: a waiter between its check of the
        // interrupt and its wait holds that lock, so the wake-up cannot fall in between.
        let _guard = req.interrupt.on_fire(move || {
            let _s = inner.state();
            inner.changed.notify_all();
        })?;
        let mut s = self.inner.state();
        loop {
            if s.unavailable.contains(key) {
                return Err(Unavailable(format!("memory: '{key}' is unreachable")).into());
            }
            if let Some(sig) = req.interrupt.fired() {
                return Err(Interrupted(sig).into());
            }
            let sent = BootInstant::now();
            let holder_expires = match s.live(key) {
                None => {
                    s.fence += 1;
                    s.next_token += 1;
                    let (fence, token) = (s.fence, s.next_token);
                    s.locks.insert(
                        key.to_string(),
                        Held {
                            token,
                            holder: Holder::from(req.holder.clone()),
                            expires: sent + req.ttl,
                        },
                    );
                    return Ok(Box::new(MemoryLease {
                        inner: self.inner.clone(),
                        key: key.to_string(),
                        token,
                        grant: Grant {
                            fence: Some(fence),
                            acquired_at: sent,
                            held_back_until: s.hold_back.map(|d| BootInstant::now() + d),
                        },
                        ttl: req.ttl,
                    }));
                }
                Some(h) => {
                    (req.on_holder)(&h.holder);
                    h.expires
                }
            };
            let wait = match req.deadline.remaining() {
                Some(d) if d.is_zero() => {
                    let holder = s.locks.get(key).map(|h| h.holder.clone());
                    return Err(req.busy(holder.as_ref()));
                }
                Some(d) => d.min(holder_expires.remaining()),
                None => holder_expires.remaining(),
            };
            s = self
                .inner
                .changed
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let mut status = Status::new(key, self.kind(), self.location());
        if let Some(h) = self.inner.state().live(key.as_str()) {
            status.held = true;
            status.holders.push(h.holder.clone());
        }
        Ok(status)
    }

    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        // Not yet safe on this backend: both ways remove the lock at once.
        let _ = how;
        let removed = || -> anyhow::Result<Status> {
            let status = self.status(key)?;
            self.remove(key.as_str());
            Ok(status)
        };
        removed().map(Broken::now)
    }
}

/// A lock held on a [`Memory`] server.
struct MemoryLease {
    inner: Arc<Inner>,
    key: String,
    token: u64,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    grant: Grant,
    ttl: Duration,
}

impl Lease for MemoryLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let mut s = self.inner.state();
        if s.fail_renewals {
            return Err(RenewError::Failed(anyhow::anyhow!("memory: no answer")));
        }
        let token = self.token;
        let ttl = self.ttl;
        match s.locks.get_mut(&self.key) {
            Some(h) if h.token == token && !h.expires.remaining().is_zero() => {
                h.expires = BootInstant::now() + ttl;
                s.renewals += 1;
                Ok(())
            }
            _ => Err(RenewError::Lost("the lock is gone".into())),
        }
    }

    fn release(self: Box<Self>) -> anyhow::Result<()> {
        let mut s = self.inner.state();
        if s.locks
            .get(&self.key)
            .is_some_and(|h| h.token == self.token)
        {
            s.locks.remove(&self.key);
        }
        drop(s);
        self.inner.changed.notify_all();
        Ok(())
    }
}
