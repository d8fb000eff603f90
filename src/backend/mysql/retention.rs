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

/// SQL run before a counter may be created: reads the floor into `@dlock_floor` with a plain
/// (non-locking) read. Read inside the `INSERT` as a subquery it took a shared lock on the
/// floor's gap in every acquire, and two first uses of keys deadlocked on it.
pub(super) const READ_FLOOR: &str = "SET @dlock_floor = NULL; \
    SELECT fence INTO @dlock_floor FROM dlock_locks WHERE name = 'dlock!floor'; ";

/// SQL: the first fencing token of a new counter: the clock in µs, or one past the floor
/// ([`READ_FLOOR`] ran first).
pub(super) fn first_token() -> String {
    format!("GREATEST({CLOCK_US}, COALESCE(@dlock_floor, 0) + 1)")
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
        // What is due is found by plain reads, which lock nothing: when nothing is, no lock is
        // taken at all (a prune scanning under InnoDB's next-key locks held a concurrent
        // acquire's insert up, and could deadlock with it). The deletes then name rows by
        // primary key. Only numbers and hex literals of ours in the text.
        let mut removed = 0usize;
        let due = format!(
            "SELECT name FROM {TABLE} WHERE fence < CAST({CLOCK_US} AS SIGNED) - {us} \
             AND name <> '{FLOOR}' LIMIT {most}"
        );
        let names = match column::<Vec<u8>>(&mut con, &due, most) {
            Ok(n) => n,
            Err(mysql::Error::MySqlError(e)) if e.code == 1146 => Vec::new(),
            Err(e) => return Err(self.fail(e).context("cannot prune")),
        };
        if !names.is_empty() {
            let list: Vec<String> = names
                .iter()
                .map(|n| format!("X'{}'", hex_bytes(n)))
                .collect();
            // The floor is raised in the same transaction, before anyone can take a removed key
            // (their GET_LOCK waits for this connection to close).
            let sql = format!(
                "SET @dlock_cut = CAST({CLOCK_US} AS SIGNED) - {us}; \
                 BEGIN; \
                 DELETE FROM {TABLE} WHERE name IN ({list}) AND fence < @dlock_cut \
                   AND IS_USED_LOCK(name) IS NULL AND GET_LOCK(name, 0) = 1; \
                 SET @dlock_gone = ROW_COUNT(); \
                 INSERT INTO {TABLE} (name, fence, holder, connection_id) \
                   SELECT '{FLOOR}', @dlock_cut, '', 0 FROM DUAL WHERE @dlock_gone > 0 \
                   ON DUPLICATE KEY UPDATE fence = GREATEST(fence, VALUES(fence)); \
                 COMMIT; \
                 SELECT @dlock_gone",
                list = list.join(",")
            );
            let mut result = last_value::<i64>(&mut con, &sql);
            // A deadlock rolled the transaction back whole (nothing removed): once more.
            if matches!(&result, Err(mysql::Error::MySqlError(e)) if e.code == 1213) {
                let _ = con.query_drop("ROLLBACK");
                result = last_value::<i64>(&mut con, &sql);
            }
            let n = result.map_err(|e| self.fail(e).context("cannot prune"))?;
            removed = usize::try_from(n.unwrap_or(0)).unwrap_or(0);
        }
        let old = format!(
            "SELECT id FROM (SELECT id, at FROM dlock_runs ORDER BY id LIMIT {rows}) o \
             WHERE at < UTC_TIMESTAMP(3) - INTERVAL {us} MICROSECOND"
        );
        let ids = match column::<u64>(&mut con, &old, rows) {
            Ok(ids) => ids,
            Err(mysql::Error::MySqlError(e)) if e.code == 1146 => Vec::new(),
            Err(e) => return Err(self.fail(e).context("cannot prune")),
        };
        for chunk in ids.chunks(1000) {
            let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
            con.query_drop(format!(
                "DELETE FROM dlock_runs WHERE id IN ({})",
                list.join(",")
            ))
            .map_err(|e| self.fail(e).context("cannot prune"))?;
        }
        removed = removed.max(ids.len().div_ceil(ROWS_PER_KEY - 1));
        // Closing the connection lets go of the GET_LOCKs, after the commit.
        drop(con);
        Ok(removed)
    }
}

/// The first column of `sql`'s rows, at most `most` of them; a cell that is not a `T` is
/// skipped (the server is not trusted).
fn column<T: mysql::prelude::FromValue>(
    con: &mut mysql::Conn,
    sql: &str,
    most: usize,
) -> mysql::Result<Vec<T>> {
    let _stop = crate::signals::HardStop::arm(super::HARD_LIMIT, "mysql");
    let mut out = Vec::new();
    let mut result = con.query_iter(sql)?;
    while let Some(set) = result.iter() {
        for row in set {
            let row = row?;
            if out.len() < most
                && let Some(Ok(v)) = row.get_opt::<T, usize>(0)
            {
                out.push(v);
            }
        }
    }
    Ok(out)
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}
