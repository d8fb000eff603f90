//! `dlock break` on PostgreSQL. An advisory lock lives as long as its holder's session: there is
//! no lease to wait out, and ending the session (`pg_terminate_backend`, `--force`) hands the
//! lock to a waiter at once while the holder's command still runs. A safe break ends nothing: on
//! a session of its own it takes one more advisory lock per holder — the mark, in the two-key
//! form `(MARK_CLASS, holder's backend pid)`, a space apart from dlock's single-bigint lock keys
//! (`objsubid` 2, not 1) — and keeps it until the holders are gone. Each holder's lease check
//! reads `pg_locks` anyway; the same scan now counts its own mark ([`check_sql`]), so the
//! holder stops its command as on any loss, and only then unlocks: the waiters, in the server's
//! queue, get the lock then.
//!
//! A backend pid could be reused by a later session only after the broken holder's session has
//! ended — or, behind a session pooler, by the next client the same server session is handed
//! to. break lets its marks go as soon as it sees the holders gone (it polls every 200 ms; a
//! holder on the same session with another dlock record counts as gone), so a later holder on
//! that pid within that instant is the one thing a mark could touch wrongly — and it would stop,
//! never run beside anyone.

use std::rc::Rc;

use super::rows::cell;
use super::{COMMAND_TIMEOUT, PgBackend, Session, advisory_on, status};
use crate::backend::{Backend, Broken, marks};
use crate::model::{Key, Status};

/// The first key of a mark (`pg_advisory_lock(MARK_CLASS, pid)`): "dlkb" in ASCII.
pub(super) const MARK_CLASS: i32 = 0x646c_6b62;

/// The `pg_locks` rows (columns prefixed with `t`) of break marks.
pub(super) fn marks(t: &str) -> String {
    format!(
        "{t}locktype = 'advisory' AND {t}objsubid = 2 AND {t}classid = {MARK_CLASS} AND {t}granted"
    )
}

/// The lease check of a session holding advisory id `held`: one scan of `pg_locks` giving the
/// number of this session's grants of `held` (1 while held) and of break marks on it.
pub(super) fn check_sql(held: i64) -> String {
    format!(
        "SELECT count(*) FILTER (WHERE pid = pg_backend_pid() AND {own}) AS held, \
         count(*) FILTER (WHERE objsubid = 2 AND classid = {MARK_CLASS} \
           AND objid = pg_backend_pid()::oid) AS broken \
         FROM pg_locks WHERE granted AND locktype = 'advisory'",
        own = advisory_on("", &[held])
    )
}

impl marks::SessionMarks for PgBackend {
    type Kept = Rc<Session>;

    /// A safe break: marks every dlock holder of `key` (see the module doc).
    fn break_safe(&self, key: &Key) -> anyhow::Result<Broken> {
        let rt = self.runtime()?;
        let s = Rc::new(rt.block_on(async {
            let s = self.connect("dlock break").await?;
            // The marks live as long as this session: no idle timeout may end it.
            self.simple(
                &s.client,
                "SET idle_session_timeout = 0; SET idle_in_transaction_session_timeout = 0",
                COMMAND_TIMEOUT,
                "set up the break's session",
            )
            .await?;
            anyhow::Ok(s)
        })?);
        marks::mark_holders(
            || {
                let status = rt.block_on(self.status_on(&s.client, key))?;
                let pids = status
                    .holders
                    .iter()
                    .map(|h| status::pid_of(h).unwrap_or(0))
                    .collect();
                Ok((status, pids))
            },
            |pids: &[i32]| {
                // false: another break holds this mark already; the holder is told all the same.
                let tries: Vec<String> = pids
                    .iter()
                    .filter(|&&pid| pid > 0)
                    .map(|pid| format!("pg_try_advisory_lock({MARK_CLASS}, {pid})"))
                    .collect();
                if tries.is_empty() {
                    return Ok(());
                }
                let sql = format!("SELECT {}", tries.join(", "));
                rt.block_on(self.simple(&s.client, &sql, COMMAND_TIMEOUT, "take the break's mark"))
                    .map(drop)
            },
            || Box::new(s.clone()) as Box<dyn std::any::Any>,
        )
    }

    fn status_on_kept(&self, s: &Rc<Session>, key: &Key) -> anyhow::Result<Status> {
        self.runtime()?.block_on(self.status_on(&s.client, key))
    }

    fn status_fresh(&self, key: &Key) -> anyhow::Result<Status> {
        self.status(key)
    }

    /// `--force`: ends the holders' sessions, which frees their locks at once.
    fn break_forced(&self, key: &Key) -> anyhow::Result<Broken> {
        let rt = self.runtime()?;
        let status = rt.block_on(async {
            let s = self.connect("dlock break").await?;
            let status = self.status_on(&s.client, key).await?;
            // The key's own lock and every semaphore slot.
            let sql = format!(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_locks WHERE granted AND {}",
                advisory_on("", &super::held_ids(key))
            );
            self.simple(&s.client, &sql, COMMAND_TIMEOUT, "end the holder's session")
                .await
                .map_err(|e| {
                    e.context(
                        "ending another user's session needs the pg_signal_backend role (or \
                         superuser)",
                    )
                })?;
            anyhow::Ok(status)
        })?;
        Ok(Broken::now(status))
    }
}

/// The pids a `SELECT` of [`marks`]`("")`'s `objid` returned.
pub(super) fn marked_pids(rows: &super::rows::Rows) -> Vec<i32> {
    rows.iter()
        .filter_map(|r| cell(r, 0)?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_the_one_the_docs_name() {
        // docs/backends.md gives applications this number.
        assert_eq!(MARK_CLASS, 1_684_826_978);
        assert!(check_sql(7).contains("classid = 1684826978"));
    }
}
