//! A run's history from its start to its end: [`RunLog::begin`] records the start (or finds
//! that `--once-per` skips the run), [`RunLog::end`] makes the end event the release carries.

use std::time::Duration;

use crate::backend::{Backend, Lease, RenewError};
use crate::history::{
    Begun, Ending, MAX_EVENT_BYTES, Opening, RunEvent, new_run_id, show, start_body,
};
use crate::model::{Key, Record};
use crate::report;

/// A run whose start is recorded, until its end is.
pub(crate) struct RunLog {
    id: String,
    keys: Vec<Key>,
}

/// Why a run does not start: skipped by `--once-per` (the line to print), or a failure that made
/// it impossible to tell.
pub(crate) enum NotBegun {
    Skipped(String),
    Failed(anyhow::Error),
}

/// After a failed history write (`why`): whether the command may run anyway. A backend that
/// writes the history on the lock's own connection (MySQL, PostgreSQL) fails that write when the
/// connection is gone — and a session lock goes with its connection, to the next holder. So the
/// lease is confirmed with one renewal first (a round trip, only on this failure path): if it
/// cannot be, the run does not start ([`NotBegun::Failed`]); if it is, the failure is a warning.
fn confirm_held(lease: &mut dyn Lease, why: anyhow::Error) -> Result<(), NotBegun> {
    match lease.renew() {
        Ok(()) => {
            report::warn(format_args!(
                "cannot record the run in the history (the command runs anyway; --no-history switches it off): {why:#}"
            ));
            Ok(())
        }
        Err(RenewError::Lost(lost)) => Err(NotBegun::Failed(anyhow::anyhow!(
            "the lock was lost before the command could start: {lost} (the history's start \
             could not be written either: {why:#})"
        ))),
        Err(RenewError::Failed(e)) => Err(NotBegun::Failed(e.context(format!(
            "the lock could not be confirmed after its history's start failed ({why:#}); \
             the command was not started"
        )))),
    }
}

impl RunLog {
    /// Records the start of the run holding `lease` on `keys` (with `once_per`, unless a run
    /// started less than that ago: [`NotBegun::Skipped`]). `Ok(None)`: no history is kept (off,
    /// or the backend keeps none); a failure to write history without `--once-per` is a warning,
    /// not a reason to keep the command from running.
    ///
    /// With `opening` (the start made before the lock was taken: [`Opening`]), the run keeps
    /// its id; a backend that recorded it while taking the lock answers without a round trip.
    pub(crate) fn begin(
        lease: &mut dyn Lease,
        keys: &[Key],
        holder: &Record,
        token: Option<u64>,
        once_per: Option<Duration>,
        opening: Option<&Opening>,
    ) -> Result<Option<RunLog>, NotBegun> {
        let (id, body) = match opening {
            Some(o) => (o.id.clone(), o.with_token(token)),
            None => {
                let id = new_run_id(holder);
                let body = start_body(&id, holder, token, MAX_EVENT_BYTES);
                (id, body)
            }
        };
        match lease.begin_run(&body, once_per) {
            Ok(Begun::Started) => Ok(Some(RunLog {
                id,
                keys: keys.to_vec(),
            })),
            Ok(Begun::Skip { last, ago }) => Err(NotBegun::Skipped(show::skip_line(
                &keys[0],
                &last,
                ago,
                once_per.unwrap_or_default(),
            ))),
            Ok(Begun::Inside) => Ok(None),
            Ok(Begun::NotKept) if once_per.is_some() => Err(NotBegun::Failed(
                crate::exit::Usage(
                    "this backend keeps no run history, so --once-per cannot work here".into(),
                )
                .into(),
            )),
            Ok(Begun::NotKept) => Ok(None),
            Err(e) if once_per.is_some() => Err(NotBegun::Failed(
                e.context("cannot check the run history for --once-per"),
            )),
            Err(e) => {
                confirm_held(lease, e)?;
                Ok(None)
            }
        }
    }

    /// The run whose start `opening` is (recorded while the lock was taken), on `keys`.
    pub(crate) fn opened(opening: &Opening, keys: &[Key]) -> RunLog {
        RunLog {
            id: opening.id.clone(),
            keys: keys.to_vec(),
        }
    }

    /// The end event for `ending`, to hand to [`Lease::release_with_end`] or
    /// [`RunLog::write_end`].
    pub(crate) fn end(&self, ending: Ending) -> Vec<u8> {
        serde_json::to_vec(&RunEvent::end(&self.id, ending)).unwrap_or_default()
    }

    /// Writes `end` for every key through `backend` (when the release could not), warning on
    /// failure.
    pub(crate) fn write_end(&self, backend: &dyn Backend, end: &[u8]) {
        for key in &self.keys {
            if let Err(e) = backend.end_run(key, end) {
                report::warn(format_args!(
                    "cannot record the end of the run of '{key}' in the history: {e:#}"
                ));
            }
        }
    }

    /// Writes `end` for every key through a new connection to `target`, waiting at most `bound`
    /// (for a run whose lease was lost: its own connection may hang on a server that stopped
    /// answering).
    pub(crate) fn write_end_within(
        &self,
        target: &crate::config::Target,
        end: Vec<u8>,
        bound: Duration,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let target = target.clone();
        let keys = self.keys.clone();
        let spawned = std::thread::Builder::new()
            .name("dlock-history".into())
            .spawn(move || {
                let written = crate::backend::open(&target)
                    .and_then(|b| keys.iter().try_for_each(|k| b.end_run(k, &end)));
                let _ = tx.send(written);
            });
        if spawned.is_err() {
            return;
        }
        // After a loss, which has been reported: a missing end is worth a -v line only.
        match rx.recv_timeout(bound) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => report::verbose(format_args!(
                "cannot record the end of the run in the history: {e:#}"
            )),
            Err(_) => report::verbose(format_args!(
                "cannot record the end of the run in the history: no answer within {}",
                report::short_duration(bound)
            )),
        }
    }
}
