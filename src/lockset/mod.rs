//! Everything a run holds: one lock or several (`--key` repeated), some of them perhaps inherited
//! from an enclosing `dlock run` (nested reentrancy).
//!
//! - Several keys are taken one by one in one canonical order (bytewise), so two runs that name
//!   the same keys in different orders never deadlock. One deadline covers the whole set; on any
//!   failure the locks already taken are released before the error is returned. While waiting
//!   for a later key, the earlier ones are renewed (the wait is cut into slices that end when a
//!   renewal is due), so a long wait cannot let them expire. They are held as one [`LeaseSet`]:
//!   losing any one is losing the lock.
//! - A run exports the locks it runs under in `DLOCK_HELD` (JSON). A nested run on the same
//!   backend, location and key, with a mode the enclosing lock covers, asks the backend whether
//!   that holder (host, pid, start, fencing token) still holds it and whether it is one of this
//!   process's ancestors; if so it runs under the same lock and token and leaves the release to
//!   the ancestor. A stale claim falls back to a normal acquire.

mod nested;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, Grant, Lease, LossNotifier, RenewError, Request, hostname};
use crate::clock::BootInstant;
use crate::config::Target;
use crate::exit::{Busy, Interrupted, Usage};
use crate::model::{Deadline, Holder, Key, Mode, Record};
use crate::report;
use crate::waiting::{Lookup, WaitingLine};

pub(crate) use self::nested::{Claim, Detached, HELD_ENV};
use self::nested::{Inherited, inherited, still_held};
use crate::signals::Interrupt;

/// What a run asks for.
pub(crate) struct Want<'a> {
    /// The keys in canonical order.
    pub keys: Vec<&'a Key>,
    /// The mode for every key.
    pub mode: Mode,
    /// Lease length.
    pub ttl: Duration,
    /// When to give up, for the whole set.
    pub deadline: Deadline,
    /// Metadata stored beside each lock.
    pub holder: &'a Record,
    /// Signals.
    pub interrupt: &'a Interrupt,
    /// Where the waiting line on a terminal looks up who holds a busy key, on a backend handle
    /// of its own (`None`: it shows only what the wait itself learns).
    pub look_up: Option<&'a Target>,
    /// The run's start, for a backend to record while it takes the lock (one key only: a
    /// start recorded for a key of a set that is then given back would stay without an end).
    pub start: Option<&'a crate::history::Opening>,
}

/// One held lock of a run.
pub(crate) struct Part {
    /// Its key.
    pub key: Key,
    /// Its lease (possibly inherited).
    pub lease: Box<dyn Lease>,
    /// When the lease was last extended: the send time of its acquire or latest renewal.
    pub since: BootInstant,
}

impl Part {
    fn new(key: &Key, lease: Box<dyn Lease>) -> Part {
        let since = lease.acquired_at();
        Part {
            key: key.clone(),
            lease,
            since,
        }
    }

    fn due(&self) -> BootInstant {
        self.since + self.lease.renew_every()
    }

    /// Renews the lease if a renewal is due; `while_` says what the run was doing, for the error.
    fn renew_if_due(&mut self, while_: &str) -> anyhow::Result<()> {
        if self.due().remaining() > Duration::ZERO {
            return Ok(());
        }
        let sent = BootInstant::now();
        match self.lease.renew() {
            Ok(()) => {
                self.since = sent;
                Ok(())
            }
            Err(RenewError::Lost(why)) => {
                anyhow::bail!("lost '{}' while {while_}: {why}", self.key)
            }
            Err(RenewError::Failed(e)) => {
                Err(e.context(format!("cannot renew '{}' while {while_}", self.key)))
            }
        }
    }
}

/// The locks of one run, in canonical key order.
pub(crate) struct Held {
    /// Each key with its lease.
    pub parts: Vec<Part>,
    /// The claims to export to the command (inherited ones plus the ones taken here).
    pub claims: Vec<Claim>,
}

impl Held {
    /// The fencing token of each of `keys` (in that order), `None` where there is none.
    pub(crate) fn tokens_of(&self, keys: &[Key]) -> Vec<Option<u64>> {
        keys.iter()
            .map(|k| {
                self.parts
                    .iter()
                    .find(|p| &p.key == k)
                    .and_then(|p| p.lease.fencing_token())
            })
            .collect()
    }
}

/// `keys` sorted bytewise: the one order every run takes them in.
pub(crate) fn canonical(keys: &[Key]) -> Vec<&Key> {
    let mut sorted: Vec<&Key> = keys.iter().collect();
    sorted.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
    sorted
}

/// Takes every key (or finds it held by an enclosing run). On error nothing is held.
pub(crate) fn acquire(backend: &dyn Backend, want: &Want<'_>) -> anyhow::Result<Held> {
    let inherited = inherited();
    let location = backend.location();
    let backend_name = backend.kind().name();
    let mut held = Held {
        parts: Vec::with_capacity(want.keys.len()),
        claims: inherited.clone(),
    };
    for key in &want.keys {
        let claim = inherited
            .iter()
            .find(|c| c.backend == backend_name && c.location == location && c.key == key.as_str());
        if let Some(claim) = claim {
            if !claim.mode.covers(want.mode) {
                release_all(held.parts);
                return Err(Usage(format!(
                    "an enclosing dlock run (pid {}) holds '{key}' as {}; a nested run cannot take it as {}",
                    claim.pid,
                    claim.mode.describe(),
                    want.mode.describe()
                ))
                .into());
            }
            match still_held(backend, key, claim) {
                Ok(true) => {
                    report::verbose(format_args!(
                        "'{key}' is held by the enclosing dlock run (pid {}): running under it",
                        claim.pid
                    ));
                    held.parts
                        .push(Part::new(key, Box::new(Inherited::new(claim))));
                    continue;
                }
                Ok(false) => report::verbose(format_args!(
                    "'{key}': the enclosing dlock run (pid {}) no longer holds it; acquiring",
                    claim.pid
                )),
                Err(e) => {
                    release_all(held.parts);
                    return Err(e);
                }
            }
        }
        match acquire_one(backend, key, want, &mut held.parts) {
            Ok(lease) => {
                held.claims.retain(|c| {
                    !(c.backend == backend_name && c.location == location && c.key == key.as_str())
                });
                held.claims.push(Claim {
                    backend: backend_name.to_string(),
                    location: location.clone(),
                    key: key.to_string(),
                    mode: want.mode,
                    token: lease.fencing_token(),
                    host: want.holder.host.clone().unwrap_or_else(hostname),
                    pid: std::process::id(),
                    pidns: want.holder.pidns,
                    since_ms: want.holder.since_ms,
                    detached: want
                        .holder
                        .owner
                        .as_ref()
                        .map(|o| Detached { owner: o.pid }),
                });
                held.parts.push(Part::new(key, lease));
            }
            Err(e) => {
                release_all(held.parts);
                return Err(if want.keys.len() > 1 {
                    e.context(format!("cannot acquire '{key}'"))
                } else {
                    e
                });
            }
        }
    }
    // A server that restarted less than a TTL ago may have forgotten a holder whose command
    // still runs: keep the locks (renewed), and start only once that holder must be gone.
    if let Some(until) = held
        .parts
        .iter()
        .filter_map(|p| p.lease.held_back_until())
        .max()
    {
        let result = match announce_hold_back(&held.parts, until, want, backend_name) {
            Ok(None) => hold_back(&mut held.parts, until, want.interrupt),
            // `--wait` ends before the hold-back: wait it out all the same (the operator asked
            // for that long), then give up as busy.
            Ok(Some(end)) => hold_back(&mut held.parts, end, want.interrupt)
                .and_then(|()| Err(hold_back_busy(&held.parts, until, want, backend_name).into())),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            release_all(held.parts);
            return Err(e);
        }
    }
    // Leases that lived unattended (or were taken first) may have waited long for the others:
    // make sure each is still ours, and restart its lease clock, before the command starts.
    if held.parts.len() > 1 {
        for i in 0..held.parts.len() {
            if let Err(e) = held.parts[i].renew_if_due("acquiring the other keys") {
                release_all(held.parts);
                return Err(e);
            }
        }
    }
    Ok(held)
}

/// Acquires one key; while it waits, renews the leases already in `held` when they are due.
fn acquire_one(
    backend: &dyn Backend,
    key: &Key,
    want: &Want<'_>,
    held: &mut [Part],
) -> anyhow::Result<Box<dyn Lease>> {
    let holder = Record {
        key: Some(key.to_string()),
        ttl_ms: Some(want.ttl.as_millis() as u64),
        ..want.holder.clone()
    };
    let line = WaitingLine::start(
        key.as_str(),
        want.deadline,
        &holder,
        want.look_up.map(|t| status_lookup(t, key)),
    );
    let on_holder = |h: &Holder| line.holder(h);
    let waiting = format!("waiting for '{key}'");
    let mut outage = Reconnecting::default();
    loop {
        let next_renewal = held
            .iter()
            .filter(|p| !p.lease.lives_unattended())
            .map(Part::due)
            .min()
            .map(|d| Instant::now() + d.remaining());
        let (deadline, sliced) = match (want.deadline, next_renewal) {
            (Deadline::Now, _) | (_, None) => (want.deadline, false),
            (Deadline::At(t), Some(r)) if t <= r => (want.deadline, false),
            (_, Some(r)) => (Deadline::At(r), true),
        };
        let attempt = Instant::now();
        let result = backend.acquire(&Request {
            key,
            mode: want.mode,
            ttl: want.ttl,
            deadline,
            holder: &holder,
            interrupt: want.interrupt,
            on_holder: &on_holder,
            start: want.start.filter(|_| want.keys.len() == 1),
        });
        if result.is_err() {
            // A network wait on this thread may have ended for a signal: that is the answer.
            if let Some(r) = crate::signals::pending() {
                want.interrupt.fire(r.signal);
            }
            if let Some(sig) = want.interrupt.fired() {
                return Err(Interrupted(sig).into());
            }
        }
        match result {
            Err(e) if sliced && e.is::<Busy>() => {
                outage.over();
                for part in held.iter_mut().filter(|p| !p.lease.lives_unattended()) {
                    part.renew_if_due(&waiting)?;
                }
            }
            // The server was reached before and the connection broke: nothing has started, so
            // reconnect and queue again, within --wait (a --no-wait run tried once).
            Err(e)
                if want.deadline != Deadline::Now
                    && e.chain().any(|c| {
                        c.is::<crate::exit::Outage>() || c.is::<crate::exit::Unreplicated>()
                    }) =>
            {
                if attempt.elapsed() > OUTAGE_RECOVERED {
                    outage.over(); // it had reconnected and waited: this is a new outage
                }
                let pause = outage.next_pause(backend.kind().name(), key, &e);
                let left = want.deadline.remaining();
                if left.is_some_and(|l| l.is_zero()) {
                    return Err(Busy {
                        holder: None,
                        waited: true,
                        why: Some(if unreplicated(&e) {
                            format!("{e:#}")
                        } else {
                            format!("the server could not be reached: {e:#}")
                        }),
                    }
                    .into());
                }
                let renewal = next_renewal.map(|r| r.saturating_duration_since(Instant::now()));
                let pause = [Some(pause), left, renewal].into_iter().flatten().min();
                want.interrupt.nap(pause.unwrap_or_default())?;
                if let Some(sig) = want.interrupt.fired() {
                    return Err(Interrupted(sig).into());
                }
                for part in held.iter_mut().filter(|p| !p.lease.lives_unattended()) {
                    part.renew_if_due(&waiting)?;
                }
            }
            other => return other,
        }
    }
}

/// The waiting line's lookup of `key`'s status on `target`: a backend handle of its own, opened
/// on the line's thread when it first looks (never the one that waits).
fn status_lookup(target: &Target, key: &Key) -> Lookup {
    let (target, key) = (target.clone(), key.clone());
    Box::new(move || match crate::backend::open(&target) {
        Ok(b) => Box::new(move || b.status(&key).ok()),
        Err(_) => Box::new(|| None),
    })
}

/// An attempt that ran this long before its connection broke had reconnected and waited.
const OUTAGE_RECOVERED: Duration = Duration::from_secs(3);

/// Whether `e` is a grant the required replicas did not acknowledge (not a broken connection).
fn unreplicated(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<crate::exit::Unreplicated>())
}

/// A waiting run's view of an [`Outage`](crate::exit::Outage) (or of a grant too few replicas
/// acknowledged): says so once, and backs off between attempts (100 ms, doubling, at most 2 s).
#[derive(Default)]
struct Reconnecting {
    pause: Option<Duration>,
}

impl Reconnecting {
    /// The pause before the next reconnect; the first of an outage says so on stderr.
    fn next_pause(&mut self, backend: &str, key: &Key, e: &anyhow::Error) -> Duration {
        let pause = match self.pause {
            None if unreplicated(e) => {
                report::notice(format_args!(
                    "{backend}: waiting for replicas to acknowledge '{key}' ({e:#}); \
                     trying again until --wait runs out"
                ));
                Duration::from_millis(100)
            }
            None => {
                report::notice(format_args!(
                    "{backend}: lost the connection while waiting for '{key}' ({e:#}); \
                     reconnecting and queueing again until --wait runs out"
                ));
                Duration::from_millis(100)
            }
            Some(p) => (p * 2).min(Duration::from_secs(2)),
        };
        self.pause = Some(pause);
        pause
    }

    /// The server answered again.
    fn over(&mut self) {
        self.pause = None;
    }
}

/// Why the locks in `parts` are held back until `until`: the keys, the server's age and the
/// time left, for the notice and for the busy error.
fn hold_back_why(parts: &[Part], until: BootInstant, want: &Want<'_>, backend: &str) -> String {
    let young: Vec<&str> = parts
        .iter()
        .filter(|p| p.lease.held_back_until().is_some())
        .map(|p| p.key.as_str())
        .collect();
    let left = until.remaining();
    // Whole seconds, rounded up: the hold-back is never shorter than it says.
    let says = Duration::from_secs(left.as_millis().div_ceil(1000) as u64);
    // The server's uptime: the span of a hold-back less what is left of it.
    let up = crate::backend::hold_back_span(want.ttl).saturating_sub(left);
    let ago = match up.as_secs() {
        0 => "less than a second".to_string(),
        s => report::short_duration(Duration::from_secs(s)),
    };
    format!(
        "the {backend} server of '{}' started {ago} ago (if it restarted, it forgot its locks, \
         and a holder from before may still run its command); its lock is held back for {} more",
        young.join("', '"),
        report::short_duration(says)
    )
}

/// The busy error of a run that cannot wait for the hold-back to end.
fn hold_back_busy(parts: &[Part], until: BootInstant, want: &Want<'_>, backend: &str) -> Busy {
    Busy {
        holder: None,
        waited: want.deadline != Deadline::Now,
        why: Some(hold_back_why(parts, until, want, backend)),
    }
}

/// Says at once (one line, unless `-q`) that the locks are held back, why and for how long.
/// `Ok(None)`: wait for the hold-back to end, then start. `Ok(Some(end))`: `--wait` ends at
/// `end`, before the hold-back: wait until then, then give up as busy ([`hold_back_busy`]).
/// `--no-wait` is busy at once (exit 75).
fn announce_hold_back(
    parts: &[Part],
    until: BootInstant,
    want: &Want<'_>,
    backend: &str,
) -> anyhow::Result<Option<BootInstant>> {
    let why = hold_back_why(parts, until, want, backend);
    let left = until.remaining();
    let end = match want.deadline {
        Deadline::Now => return Err(hold_back_busy(parts, until, want, backend).into()),
        Deadline::At(t) if t < Instant::now() + left => {
            Some(BootInstant::now() + t.saturating_duration_since(Instant::now()))
        }
        Deadline::At(_) | Deadline::Never => None,
    };
    match end {
        Some(_) => report::notice(format_args!(
            "{why}, longer than --wait: waiting until --wait runs out"
        )),
        None => report::notice(format_args!("{why} before the command starts")),
    }
    Ok(end)
}

/// Keeps `parts` until `until`, renewing each when due, without starting the command (see
/// [`crate::backend::hold_back_until`]). A signal ends the wait.
fn hold_back(parts: &mut [Part], until: BootInstant, interrupt: &Interrupt) -> anyhow::Result<()> {
    let young: Vec<&str> = parts
        .iter()
        .filter(|p| p.lease.held_back_until().is_some())
        .map(|p| p.key.as_str())
        .collect();
    let _line = WaitingLine::saying(format!(
        "holding '{}' back after a server restart",
        young.join("', '")
    ));
    let while_ = "holding it back after a server restart";
    loop {
        if let Some(sig) = interrupt.fired() {
            return Err(Interrupted(sig).into());
        }
        let left = until.remaining();
        if left.is_zero() {
            return Ok(());
        }
        let renewal = parts.iter().map(Part::due).min();
        interrupt.nap(renewal.map_or(left, |r| r.remaining().min(left)))?;
        if interrupt.fired().is_none() {
            for p in parts.iter_mut() {
                p.renew_if_due(while_)?;
            }
        }
    }
}

fn release_all(parts: Vec<Part>) {
    for p in parts.into_iter().rev() {
        if let Err(e) = p.lease.release() {
            report::warn(format_args!(
                "release of '{}' failed (it expires by itself): {e:#}",
                p.key
            ));
        }
    }
}

/// Several leases held as one: renewed together, released together (in reverse order); losing
/// any is losing all.
pub(crate) struct LeaseSet {
    parts: Vec<(Key, Box<dyn Lease>)>,
    /// When each part's lease was last extended (the send time of its acquire or renewal).
    since: Vec<BootInstant>,
}

impl LeaseSet {
    /// One lease for several; a single lease is returned as it is, unless it was renewed here.
    pub(crate) fn join(mut parts: Vec<Part>) -> Box<dyn Lease> {
        // A lone lease renewed here (held back) knows only its acquire time: the set keeps the
        // time of the last renewal.
        if parts.len() == 1 && parts[0].since == parts[0].lease.acquired_at() {
            return parts.remove(0).lease;
        }
        let since = parts.iter().map(|p| p.since).collect();
        let parts = parts.into_iter().map(|p| (p.key, p.lease)).collect();
        Box::new(LeaseSet { parts, since })
    }
}

impl Lease for LeaseSet {
    /// The first key's token; the earliest send time of the parts' last grants or renewals; no
    /// hold-back (each part's was waited out before the set was made, see [`acquire`]).
    fn grant(&self) -> Grant {
        Grant {
            fence: self.parts.first().and_then(|(_, l)| l.fencing_token()),
            acquired_at: self
                .since
                .iter()
                .copied()
                .min()
                .unwrap_or_else(BootInstant::now),
            held_back_until: None,
        }
    }

    fn ttl(&self) -> Option<Duration> {
        self.parts.iter().filter_map(|(_, l)| l.ttl()).min()
    }

    fn renew_every(&self) -> Duration {
        self.parts
            .iter()
            .map(|(_, l)| l.renew_every())
            .min()
            .unwrap_or(Duration::from_secs(1))
    }

    fn lives_unattended(&self) -> bool {
        self.parts.iter().all(|(_, l)| l.lives_unattended())
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let mut failed = None;
        for ((key, lease), since) in self.parts.iter_mut().zip(self.since.iter_mut()) {
            let sent = BootInstant::now();
            match lease.renew() {
                Ok(()) => *since = sent,
                Err(RenewError::Lost(why)) => {
                    return Err(RenewError::Lost(format!("'{key}': {why}")));
                }
                Err(RenewError::Failed(e)) => {
                    failed.get_or_insert(RenewError::Failed(e.context(format!("'{key}'"))));
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    fn release(self: Box<Self>) -> anyhow::Result<()> {
        let mut first_error = None;
        for (key, lease) in self.parts.into_iter().rev() {
            if let Err(e) = lease.release() {
                first_error.get_or_insert(e.context(format!("'{key}'")));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Every key's history gets the start; a skip of any part is the set's (the caller refuses
    /// `--once-per` with several keys, so a skip cannot follow a recorded start). A key whose
    /// history cannot be written is a warning once another key's start is recorded: the run
    /// goes on, and its end must reach the keys that have its start.
    fn begin_run(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<crate::backend::Begun> {
        let mut begun = crate::backend::Begun::NotKept;
        let mut failed = Vec::new();
        for (key, lease) in &mut self.parts {
            match lease.begin_run(start, once_per) {
                Ok(crate::backend::Begun::NotKept | crate::backend::Begun::Inside) => {}
                Ok(crate::backend::Begun::Started) => begun = crate::backend::Begun::Started,
                Ok(skip @ crate::backend::Begun::Skip { .. }) => return Ok(skip),
                Err(e) if once_per.is_some() => return Err(e.context(format!("'{key}'"))),
                // As for a single lease (`confirm_held`, session/runlog.rs): a part whose
                // history failed is renewed once; one that cannot be fails the whole set's start.
                Err(e) => match lease.renew() {
                    Ok(()) => failed.push(e.context(format!("'{key}'"))),
                    Err(_) => return Err(e.context(format!("'{key}'"))),
                },
            }
        }
        match begun {
            crate::backend::Begun::Started => {
                for e in failed {
                    report::warn(format_args!(
                        "cannot record the run in the history (the command runs anyway): {e:#}"
                    ));
                }
                Ok(begun)
            }
            _ => failed.into_iter().next().map_or(Ok(begun), Err),
        }
    }

    /// Every part writes the end if it can; `false` if any could not (the caller writes it to
    /// every key, and readers keep one end per run).
    fn release_with_end(self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        let mut first_error = None;
        let mut all = true;
        for (key, lease) in self.parts.into_iter().rev() {
            match lease.release_with_end(end) {
                Ok(wrote) => all &= wrote,
                Err(e) => {
                    all = false;
                    first_error.get_or_insert(e.context(format!("'{key}'")));
                }
            }
        }
        first_error.map_or(Ok(all), Err)
    }

    fn watch_loss(&mut self, lost: LossNotifier) {
        let lost: Arc<LossNotifier> = Arc::new(lost);
        for (key, lease) in &mut self.parts {
            let lost = lost.clone();
            let key = key.to_string();
            lease.watch_loss(Box::new(move |loss| {
                lost(loss.map(|why| format!("'{key}': {why}")))
            }));
        }
    }
}

#[cfg(test)]
mod tests;
