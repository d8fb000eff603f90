//! Retention on PostgreSQL ([`crate::history::retention`]), one statement on a session of its
//! own, after a run has let go:
//!
//! - **History**: events older than the retention go, oldest first: the statement looks only
//!   at the oldest rows by id (the primary key; ids grow with time), so it costs a few index
//!   entries when nothing is due. A key untouched for the retention has only such events.
//! - **Fencing rows** (`dlock_fences`): a key's counter follows the server clock in µs
//!   (`greatest(fence + 1, clock)`), so a counter below "now less the retention" belongs to a
//!   key not taken since. The row goes only if the statement gets the key's advisory lock at
//!   once (`pg_try_advisory_xact_lock`, held until it commits): never a held key, nor one a
//!   session waits for; a first use racing the prune waits for that commit and then sees the
//!   floor. The **floor** is the row [`FLOOR_ID`], raised in the same statement to the largest
//!   counter removed; a new counter starts above it and above the clock (`record`), so a key
//!   used again gets a larger token even if the server's clock stepped back.
//! - **Holder records** (`dlock_holders`) of server sessions that are gone.

use std::time::Duration;

use super::{COMMAND_TIMEOUT, PgBackend, UNDEFINED_TABLE};

/// The `dlock_fences` row that holds the floor: no key's advisory id is `i64::MIN` but with
/// odds of 2^-64.
pub(super) const FLOOR_ID: &str = "'-9223372036854775808'::bigint";

/// How many history rows one prune removes per key it may remove (a key keeps ~200 events).
const ROWS_PER_KEY: usize = 201;

/// SQL: the first fencing token of a new counter: the clock in µs, or one past the floor.
pub(super) fn first_token() -> String {
    format!(
        "greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
         (SELECT fence + 1 FROM dlock_fences WHERE id = {FLOOR_ID}))"
    )
}

impl PgBackend {
    pub(super) fn prune_keys(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        let ms = u64::try_from(older_than.as_millis())
            .unwrap_or(u64::MAX)
            .min(i64::MAX as u64 / 1000);
        let most = most.clamp(1, 100_000);
        let rows = most.saturating_mul(ROWS_PER_KEY);
        // Only numbers of ours in the text.
        let fences = format!(
            "WITH cand AS MATERIALIZED (SELECT id FROM dlock_fences WHERE id <> {FLOOR_ID} \
               AND fence < (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - {us} \
               LIMIT {most}), \
             gone AS (DELETE FROM dlock_fences f USING cand \
               WHERE f.id = cand.id AND pg_try_advisory_xact_lock(cand.id) RETURNING f.fence), \
             raised AS (INSERT INTO dlock_fences (id, fence) SELECT {FLOOR_ID}, max(fence) FROM gone \
               HAVING count(*) > 0 ON CONFLICT (id) DO UPDATE \
               SET fence = greatest(dlock_fences.fence, EXCLUDED.fence)), \
             idle AS (DELETE FROM dlock_holders WHERE pid NOT IN (SELECT pid FROM pg_stat_activity)) \
             SELECT count(*) FROM gone",
            us = ms.saturating_mul(1000),
        );
        let runs = format!(
            "WITH old AS MATERIALIZED (SELECT id FROM (SELECT id, at FROM dlock_runs \
               ORDER BY id LIMIT {rows}) o WHERE at < now() - interval '{ms} milliseconds'), \
             gone AS (DELETE FROM dlock_runs r USING old WHERE r.id = old.id RETURNING r.key) \
             SELECT count(*), count(DISTINCT key) FROM gone"
        );
        let rt = self.runtime()?;
        rt.block_on(async {
            let s = self.connect("dlock prune").await?;
            let limit = COMMAND_TIMEOUT;
            let mut removed = 0usize;
            match self
                .simple(&s.client, &fences, limit, "prune fencing counters")
                .await
            {
                Ok(r) => removed = count(&r, 0),
                Err(e) if e.to_string().contains(UNDEFINED_TABLE) => {}
                Err(e) => return Err(e),
            }
            match self
                .simple(&s.client, &runs, limit, "prune the history")
                .await
            {
                Ok(r) => removed = removed.max(count(&r, 1)),
                Err(e) if e.to_string().contains(UNDEFINED_TABLE) => {}
                Err(e) => return Err(e),
            }
            Ok(removed)
        })
    }
}

fn count(rows: &super::rows::Rows, col: usize) -> usize {
    rows.last()
        .and_then(|r| r.get(col))
        .and_then(|c| c.as_deref())
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
