//! Nested runs: the locks a run exports to its command in `DLOCK_HELD`, and how a `dlock run`
//! below it recognises one it may run under (same backend, location and key; a mode the outer
//! lock covers; the claimant is an ancestor and still holds the lock).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Grant, Lease, RenewError, hostname};
use crate::clock::BootInstant;
use crate::model::Key;
use crate::model::Mode;
use crate::report;

/// The variable a run exports its locks in, for nested runs.
pub(crate) const HELD_ENV: &str = "DLOCK_HELD";

/// How often an inherited lock checks that the enclosing run is still alive.
const ANCESTOR_CHECK: Duration = Duration::from_millis(500);

/// One lock a run holds, as exported to its command in [`HELD_ENV`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claim {
    /// Backend name.
    pub backend: String,
    /// [`Backend::location`]: where the lock lives, without credentials.
    pub location: String,
    /// The key.
    pub key: String,
    /// How the holder holds it.
    pub mode: Mode,
    /// The fencing token it was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The holding dlock's host.
    pub host: String,
    /// The holding dlock's pid.
    pub pid: u32,
    /// The PID namespace that pid is in: a claim is honoured only within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidns: Option<u64>,
    /// When it acquired the lock (ms since the epoch), as stored beside the lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Set for a lock held by `dlock acquire`'s holder process (`pid`), which is not an ancestor
    /// of the processes it holds the lock for: those descend from the owner instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached: Option<Detached>,
}

/// Whom a `dlock acquire` holder holds its lock for (see [`Claim::detached`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Detached {
    /// The owner's pid; `None` for `--owner none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<u32>,
}

impl Claim {
    /// Whether the process that made this claim is still the one a nested run may trust: for a
    /// `dlock run`, an ancestor of this process; for a `dlock acquire` holder, a live process of
    /// this user (and the owner, if there is one, an ancestor).
    fn holder_is_related(&self) -> bool {
        match &self.detached {
            None => is_ancestor(self.pid),
            Some(d) => d.owner.is_none_or(is_ancestor) && is_ours(self.pid),
        }
    }
}

/// Whether `pid` is a live process of this user (its `/proc` directory is owned by our uid).
fn is_ours(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == crate::sys::euid())
}

/// The claims inherited from enclosing runs; unreadable content is ignored (with `-v`).
pub(crate) fn inherited() -> Vec<Claim> {
    let Some(text) = std::env::var_os(HELD_ENV) else {
        return Vec::new();
    };
    match serde_json::from_slice(text.as_encoded_bytes()) {
        Ok(claims) => claims,
        Err(e) => {
            report::verbose(format_args!("ignoring {HELD_ENV}: {e}"));
            Vec::new()
        }
    }
}

/// Whether the holder a claim names still holds `key`, and is an ancestor of this process (a
/// claim copied into an unrelated process is not honoured). Pids are compared within one PID
/// namespace, this process's, which the holder's record must name too: otherwise a claim
/// naming pid 1, made in another container on a host of the same name, passed for the holder
/// that is pid 1 of its own (the forger's pid 1 is its ancestor too).
pub(super) fn still_held(backend: &dyn Backend, key: &Key, claim: &Claim) -> anyhow::Result<bool> {
    let here = crate::sys::pid_namespace();
    if claim.host != hostname()
        || here.is_none()
        || claim.pidns != here
        || !claim.holder_is_related()
    {
        return Ok(false);
    }
    let status = backend.status(key)?;
    Ok(status.holders.iter().any(|h| {
        h.pid == Some(claim.pid)
            && h.pidns == claim.pidns
            && h.host.as_deref().is_none_or(|host| host == claim.host)
            && h.fencing_token == claim.token
            && (h.since_ms.is_none() || claim.since_ms.is_none() || h.since_ms == claim.since_ms)
    }))
}

/// Whether `pid` is this process's parent, grandparent, ...
pub(super) fn is_ancestor(pid: u32) -> bool {
    let mut p = std::os::unix::process::parent_id();
    for _ in 0..1024 {
        if p == pid {
            return true;
        }
        if p <= 1 {
            return false;
        }
        match i32::try_from(p).ok().and_then(crate::procs::parent_of) {
            Some(pp) => p = pp.unsigned_abs(),
            None => return false,
        }
    }
    false
}

/// A lock held by an enclosing run: nothing to renew or release here, but if that run dies the
/// lock goes with it (its lease runs out), so its pid is checked every [`ANCESTOR_CHECK`].
pub(super) struct Inherited {
    claim: Claim,
    since: BootInstant,
}

impl Inherited {
    pub(super) fn new(claim: &Claim) -> Inherited {
        Inherited {
            claim: claim.clone(),
            since: BootInstant::now(),
        }
    }
}

impl Lease for Inherited {
    fn grant(&self) -> Grant {
        Grant {
            fence: self.claim.token,
            acquired_at: self.since,
            held_back_until: None,
        }
    }
    fn ttl(&self) -> Option<Duration> {
        None
    }
    fn renew_every(&self) -> Duration {
        ANCESTOR_CHECK
    }
    fn lives_unattended(&self) -> bool {
        true
    }
    fn renew(&mut self) -> Result<(), RenewError> {
        if self.claim.holder_is_related() {
            Ok(())
        } else if self.claim.detached.is_some() {
            Err(RenewError::Lost(format!(
                "the dlock acquire holder (pid {}) that holds it is gone",
                self.claim.pid
            )))
        } else {
            Err(RenewError::Lost(format!(
                "the enclosing dlock run (pid {}) that holds it is gone",
                self.claim.pid
            )))
        }
    }
    fn release(self: Box<Self>) -> anyhow::Result<()> {
        Ok(())
    }
    /// A nested run is part of the enclosing run, whose start is recorded (and which passed
    /// any `--once-per`): it records nothing of its own.
    fn begin_run(
        &mut self,
        _start: &[u8],
        _once_per: Option<Duration>,
    ) -> anyhow::Result<crate::history::Begun> {
        Ok(crate::history::Begun::Inside)
    }
}
