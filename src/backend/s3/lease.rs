//! A held S3 lock: renewed with `If-Match` every ttl/3, released by a conditional "free"
//! write; any write whose outcome is unknown is read back before anything is decided.

use std::time::Duration;

use super::client::{Client, Cond};
use super::record::LockRecord;
use crate::backend::{Grant, Lease, RenewError};
use crate::clock::BootInstant;
use crate::history::Begun;

/// A renewal's limit: a third of the lease (a stalled server must not hold the keeper past
/// the deadline), between 200 ms and 3 s.
pub(super) fn renew_timeout(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(200), super::REQUEST_TIMEOUT)
}

pub(super) struct S3Lease {
    client: Client,
    object: String,
    /// The ETag of our last write that is known to have landed.
    etag: String,
    record: LockRecord,
    ttl: Duration,
    acquired_at: BootInstant,
    /// A write's outcome was unknown: the next renewal reads back first.
    unsure: bool,
}

impl S3Lease {
    pub(super) fn new(
        client: Client,
        object: String,
        etag: String,
        record: LockRecord,
        ttl: Duration,
        acquired_at: BootInstant,
    ) -> S3Lease {
        S3Lease {
            client,
            object,
            etag,
            record,
            ttl,
            acquired_at,
            unsure: false,
        }
    }

    fn owner(&self) -> &str {
        self.record.owner.as_deref().unwrap_or_default()
    }

    fn here(&self) -> String {
        self.client.place.describe()
    }

    /// The object now, if it still holds our record (this acquisition's): its ETag and record.
    fn ours_now(&mut self) -> Result<Option<(String, LockRecord)>, RenewError> {
        let r = self
            .client
            .get(&self.object, &[])
            .map_err(|e| RenewError::Failed(anyhow::anyhow!("{}: {e}", self.here())))?;
        match super::Seen::of(r) {
            Ok(Some(s)) => Ok(s
                .record
                .filter(|r| r.held_by(self.owner()) && r.counter == self.record.counter)
                .map(|r| (s.etag, r))),
            Ok(None) => Ok(None),
            Err(r) => Err(RenewError::Failed(anyhow::anyhow!(
                "{}: {}",
                self.here(),
                r.error()
            ))),
        }
    }

    fn lost(&self, rec: Option<&LockRecord>) -> RenewError {
        RenewError::Lost(match rec {
            Some(r) if r.broken => format!(
                "{}: dlock break told it to stop (object {})",
                self.here(),
                self.object
            ),
            _ => format!(
                "{}: the lock object {} was taken over or freed (dlock break --force, or a lease that ran out)",
                self.here(),
                self.object
            ),
        })
    }
}

impl Lease for S3Lease {
    fn grant(&self) -> Grant {
        Grant {
            fence: Some(self.record.counter),
            acquired_at: self.acquired_at,
            held_back_until: None,
        }
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        if self.unsure {
            match self.ours_now()? {
                Some((etag, rec)) if !rec.broken => {
                    self.etag = etag;
                    self.record = rec;
                    self.unsure = false;
                }
                Some((_, rec)) => return Err(self.lost(Some(&rec))),
                None => return Err(self.lost(None)),
            }
        }
        for _ in 0..3 {
            let next = LockRecord {
                beat: self.record.beat.wrapping_add(1),
                ..self.record.clone()
            };
            let r = self
                .client
                .put(&self.object, Cond::Is(&self.etag), &next.to_bytes());
            match r {
                Ok(r) if (200..300).contains(&r.status) && r.etag.is_some() => {
                    self.etag = r.etag.unwrap_or_default();
                    self.record = next;
                    return Ok(());
                }
                Ok(r) if r.status == 412 || r.status == 409 => {
                    // Someone wrote (a break, a taker) — or our own write of an unknown outcome
                    // landed: read it.
                    match self.ours_now()? {
                        Some((etag, rec)) if !rec.broken => {
                            self.etag = etag;
                            self.record = rec;
                        }
                        Some((_, rec)) => return Err(self.lost(Some(&rec))),
                        None if r.status == 409 => {}
                        None => return Err(self.lost(None)),
                    }
                }
                Ok(r) if r.status < 500 && r.etag.is_none() && (200..300).contains(&r.status) => {
                    self.unsure = true;
                    return Err(RenewError::Failed(anyhow::anyhow!(
                        "{}: a renewal's reply had no ETag",
                        self.here()
                    )));
                }
                Ok(r) => {
                    self.unsure = true;
                    return Err(RenewError::Failed(anyhow::anyhow!(
                        "{}: {}",
                        self.here(),
                        r.error()
                    )));
                }
                Err(e) => {
                    self.unsure = true;
                    return Err(RenewError::Failed(anyhow::anyhow!("{}: {e}", self.here())));
                }
            }
        }
        self.unsure = true;
        Err(RenewError::Failed(anyhow::anyhow!(
            "{}: the lock object kept changing",
            self.here()
        )))
    }

    /// A "free" record with `If-Match`; when our ETag is stale (an unknown outcome, a safe
    /// break), read back and free it if it is still this acquisition's.
    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        self.free()
    }

    /// The start goes to the key's history object by a conditional read-modify-write
    /// ([`super::history::append`]), which also decides `--once-per`, while the lock is held.
    fn begin_run(&mut self, start: &[u8], once_per: Option<Duration>) -> anyhow::Result<Begun> {
        let object = super::history::object_of(&self.object);
        // Every request starts within half the lease (each lasts at most a third of it).
        let until = self.acquired_at + self.ttl / 2;
        super::history::append(&mut self.client, &object, start, once_per, Some(until))
            .map_err(|f| super::history::failed(&self.client.place, f))
    }

    /// The release first (the next holder need not wait for the history), then the end.
    fn release_with_end(mut self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        self.free()?;
        let object = super::history::object_of(&self.object);
        let until = BootInstant::now() + super::REQUEST_TIMEOUT;
        Ok(super::history::append(&mut self.client, &object, end, None, Some(until)).is_ok())
    }
}

impl S3Lease {
    fn free(&mut self) -> anyhow::Result<()> {
        let free = self.record.freed().to_bytes();
        let mut etag = self.etag.clone();
        for _ in 0..3 {
            match self.client.put(&self.object, Cond::Is(&etag), &free) {
                Ok(r) if (200..300).contains(&r.status) => return Ok(()),
                _ => match self.ours_now() {
                    Ok(Some((now, _))) => etag = now,
                    Ok(None) => return Ok(()),
                    Err(_) => continue,
                },
            }
        }
        anyhow::bail!(
            "{}: could not free the lock object {}; it frees itself a lease after the last renewal",
            self.here(),
            self.object
        )
    }
}
