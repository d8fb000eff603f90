//! Retention on MySQL/MariaDB ([`crate::history::retention`]), on a connection of its own,
//! after a run has let go:
//!
//! - **History**: events older than the retention go, oldest first; the statement looks only at
//!   the oldest rows by id (the primary key; ids grow with time), so it costs a few index entries
//!   when nothing is due. A key untouched for the retention has only such events.
//! - **Counter rows** (`dlock_locks`): a counter starts at the server clock in µs and counts up
//!   by one a use, so one below "now less the retention" was created before then. It goes only
//!   if no one holds or waits for its lock (`IS_USED_LOCK` is NULL) and the prune gets the lock
//!   itself at once (`GET_LOCK(name, 0)`, kept until its connection closes, after the commit):
//!   a first use racing the prune waits for that, and then sees the floor. The **floor** is the
//!   row [`FLOOR`], raised in the same transaction to the cutoff, above every counter removed; a
//!   new counter starts above it and above the clock ([`first_token`]), so a key used again gets
//!   a larger token than it ever had, even if the server's clock stepped back. (A key in steady
//!   use loses its row once a retention after its first use, and goes on from the clock.)

use std::time::Duration;

use mysql::prelude::Queryable;

use super::rows::last_value;
use super::{MysqlBackend, TABLE};

/// The row of `dlock_locks` that holds the floor: every other name starts with `dlock:`,
/// `dlock~` or `dlock#`.
const FLOOR: &str = "dlock!floor";

/// How many history rows one prune removes per key it may remove (a key keeps ~200 events).
const ROWS_PER_KEY: usize = 201;

/// The server clock in µs, as counters start from it.
const CLOCK_US: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)";

/// SQL: the first fencing token of a new counter: the clock in µs, or one past the floor.
pub(super) fn first_token() -> String {
    format!(
        "GREATEST({CLOCK_US}, (SELECT COALESCE(MAX(fence), 0) + 1 FROM \
         (SELECT fence FROM {TABLE} WHERE name = '{FLOOR}') AS dlock_floor))"
    )
}

impl MysqlBackend {
    pub(super) fn prune_keys(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        let ms = u64::try_from(older_than.as_millis())
            .unwrap_or(u64::MAX)
            .min(i64::MAX as u64 / 1000);
        let us = ms.saturating_mul(1000);
        let most = most.clamp(1, 100_000);
        let rows = most.saturating_mul(ROWS_PER_KEY);
        let mut con = self.connect(super::COMMAND_TIMEOUT)?;
        // Only numbers of ours in the text.
        // The delete first: two prunes then take row locks in one order (the primary key's)
        // and wait for each other instead of deadlocking; the floor is raised in the same
        // transaction, before anyone can take a removed key (their GET_LOCK waits for this
        // connection to close).
        let counters = format!(
            "SET @dlock_cut = CAST({CLOCK_US} AS SIGNED) - {us}; \
             BEGIN; \
             DELETE FROM {TABLE} WHERE fence < @dlock_cut AND name <> '{FLOOR}' \
               AND IS_USED_LOCK(name) IS NULL AND GET_LOCK(name, 0) = 1 LIMIT {most}; \
             SET @dlock_gone = ROW_COUNT(); \
             INSERT INTO {TABLE} (name, fence, holder, connection_id) \
               SELECT '{FLOOR}', @dlock_cut, '', 0 FROM DUAL WHERE @dlock_gone > 0 \
               ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence)); \
             COMMIT; \
             SELECT @dlock_gone"
        );
        let history = format!(
            "DELETE r FROM dlock_runs r JOIN (SELECT id FROM (SELECT id, at FROM dlock_runs \
               ORDER BY id LIMIT {rows}) o WHERE at < UTC_TIMESTAMP(3) - INTERVAL {us} MICROSECOND) c \
               ON r.id = c.id; \
             SELECT ROW_COUNT()"
        );
        let mut removed = 0usize;
        for (sql, per_key) in [(counters, 1), (history, ROWS_PER_KEY - 1)] {
            let mut result = last_value::<i64>(&mut con, &sql);
            // A deadlock rolled the transaction back whole (nothing removed): once more.
            if matches!(&result, Err(mysql::Error::MySqlError(e)) if e.code == 1213) {
                let _ = con.query_drop("ROLLBACK");
                result = last_value::<i64>(&mut con, &sql);
            }
            match result {
                Ok(n) => {
                    let n = usize::try_from(n.unwrap_or(0)).unwrap_or(0);
                    removed = removed.max(n.div_ceil(per_key));
                }
                // A table that does not exist yet holds nothing.
                Err(mysql::Error::MySqlError(e)) if e.code == 1146 => {}
                Err(e) => return Err(self.fail(e).context("cannot prune")),
            }
        }
        // Closing the connection lets go of the GET_LOCKs, after the commit.
        drop(con);
        Ok(removed)
    }
}
