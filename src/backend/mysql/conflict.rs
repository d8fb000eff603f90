//! A key held in another mode than a request's: the query that finds such a holder (of the
//! exclusive lock, of a semaphore slot, or an application's `GET_LOCK` on the key's name) and
//! what a run says about it.

use super::*;

/// SQL: the metadata of a live holder of one of `key`'s semaphore slots in another mode than
/// `mode` (any, for an exclusive lock), or of `key`'s exclusive lock (for a semaphore), or NULL.
pub(super) fn conflict_sql(key: &Key, mode: Mode) -> String {
    let prefix = slot_prefix(key);
    let live_slots = format!(
        "FROM {TABLE} WHERE name LIKE '{prefix}%' AND name <> '{prefix}' \
         AND IS_USED_LOCK(name) = connection_id"
    );
    match mode {
        // The key's own lock: dlock's exclusive lock if its holder wrote a record, else an
        // application's GET_LOCK (waited for, never a mode mismatch).
        Mode::Limit(n) => format!(
            "COALESCE((SELECT holder {live_slots} AND holder NOT LIKE '%\"limit\":{n}}}%' LIMIT 1), \
             IF(IS_USED_LOCK(X'{base}') IS NULL, NULL, \
                IF(EXISTS(SELECT 1 FROM {TABLE} WHERE name = X'{base}' \
                          AND connection_id = IS_USED_LOCK(X'{base}')), \
                   '{{\"mode\":\"exclusive\"}}', '{APP_HOLDS}')))",
            base = hex(&lock_name(key))
        ),
        // The run holds the key's own lock, so only semaphore slots and shared holders can be
        // in its way. An exclusive run waits for shared holders (see `drain_readers`); any other
        // mode is a mismatch, listed first.
        Mode::Exclusive => {
            format!("(SELECT holder {live_slots} ORDER BY holder LIKE '{SHARED_RECORD}' LIMIT 1)")
        }
        Mode::Shared => {
            format!("(SELECT holder {live_slots} AND holder NOT LIKE '{SHARED_RECORD}' LIMIT 1)")
        }
    }
}

/// What the conflict query ([`conflict_sql`]) answers for an application's `GET_LOCK` on the key's
/// own name: not JSON, so no record reads as it.
pub(super) const APP_HOLDS: &str = "GET_LOCK by an application";

/// The holder a conflict query's answer names: a record, or an application's `GET_LOCK`.
pub(super) fn conflict_holder(answer: &[u8]) -> Option<Holder> {
    if answer == APP_HOLDS.as_bytes() {
        return Some(Holder {
            foreign: Some(APP_HOLDS.into()),
            ..Holder::default()
        });
    }
    parse_record(answer)
}

/// The error for a holder `theirs` of the key in another mode than the request's; for an
/// application's `GET_LOCK` on the key's name, [`AppHolds`].
pub(super) fn mismatch(req: &Request<'_>, theirs: &Holder) -> anyhow::Error {
    if theirs.foreign.is_some() {
        return AppHolds(theirs.clone()).into();
    }
    let mode = theirs.mode.unwrap_or(Mode::Exclusive);
    crate::backend::mode_mismatch(req.key, req.mode, &mode.describe())
}

/// A semaphore slot was free, but an application holds the key's own name with `GET_LOCK`: the
/// run waits for it like for any holder (see `slots::acquire_slot`).
#[derive(Debug)]
pub(super) struct AppHolds(pub(super) Holder);

impl std::fmt::Display for AppHolds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "held by {}", self.0.short())
    }
}

impl std::error::Error for AppHolds {}
