//! Redlock's give-back of a grant it does not keep, with the run's start its acquire recorded.

use std::time::Duration;

use super::super::redis::{Keys, history, release_script};
use super::Slot;

/// Gives back a grant this attempt does not keep, on every master at once: where the
/// master may have recorded the run's start with it — the entry its granting reply carried,
/// or, where the reply was lost, the newest start of run `run` — the start is taken back
/// first (while the lock keeps others' starts out), so that it neither makes later runs
/// skip nor shows as a run that never ended; then the release.
pub(super) fn give_back<T: Sync>(
    slots: &mut [Slot],
    keys: &Keys,
    token: &str,
    entries: &[Option<Vec<u8>>],
    replies: &[anyhow::Result<T>],
    run: Option<&str>,
    timeout: Duration,
) {
    std::thread::scope(|s| {
        for (i, slot) in slots.iter_mut().enumerate() {
            let entry = entries.get(i).and_then(Option::as_ref);
            let lost = replies.get(i).is_some_and(Result::is_err);
            s.spawn(move || {
                if let Some(run) = run {
                    match entry {
                        Some(e) => {
                            let _ = slot.with(timeout, |c| history::undo(c, keys, e));
                        }
                        None if lost => {
                            let _ = slot.with(timeout, |c| history::undo_run(c, keys, run));
                        }
                        None => {}
                    }
                }
                let inv = release_script(keys, token);
                let _ = slot.with(timeout, |c| inv.invoke::<i64>(c));
            });
        }
    });
}
