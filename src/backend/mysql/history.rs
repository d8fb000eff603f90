//! The mysql backend's run history (docs/history.md): one row per event in the table
//! `dlock_runs` of the URL's database (created if missing, on the first write that finds it
//! missing), newest last by its `AUTO_INCREMENT` id.
//!
//! - The start is written on the lock's own connection while it holds the lock (a `--once-per`
//!   check first, then the insert, then the prune to the newest [`MAX_EVENTS`]); the end is
//!   written on that connection just before `RELEASE_LOCK`, or, when that connection is gone
//!   (`dlock break` KILLs it), by [`Backend::end_run`](crate::backend::Backend::end_run) on a
//!   new one.
//! - `at` is the server's clock in UTC (`UTC_TIMESTAMP(3)`, a `DATETIME(3)`: no time zone, no
//!   2038), and the `--once-per` age is computed by the server (`TIMESTAMPDIFF`), so the hosts'
//!   clocks never matter.
//! - Every value is a parameter of a prepared statement; the SQL text holds only constants.
//! - Keys are `utf8mb4` with a binary collation (MariaDB before 11.6 defaults to latin1, and
//!   a case-insensitive collation would mix `Job` and `job`); a binary collation still pads
//!   (`'job' = 'job '`), so every match also compares the length in bytes.
//! - A read sends a body whole only up to [`SQL_EVENT_WHOLE`] bytes (the largest dlock writes),
//!   else its head and length ([`sql_event`]); at most [`MAX_EVENTS`] rows are kept.

use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Conn, Params, Row, Value};

use super::rows::err_text;
use super::{MysqlBackend, MysqlLease};
use crate::backend::{Begun, SQL_EVENT_HEAD, SQL_EVENT_WHOLE, Stored, sql_event};
use crate::history::MAX_EVENTS;
use crate::model::Key;
use crate::signals::HardStop;

/// A start in the holder record's transaction prunes the key's history only on every
/// `PRUNE_EVERY`th run of the key (its fence a multiple of it: the fence steps by one a run),
/// so that the other runs' transactions delete nothing: a prune scans the key's newest
/// [`MAX_EVENTS`] index entries and deletes two rows, ~0.4 ms of a run on MariaDB
/// (bench/README.md). Between two prunes a key holds at most `MAX_EVENTS + 2 * PRUNE_EVERY - 1`
/// events (every run adds a start and an end), within the 20 past [`MAX_EVENTS`] every backend
/// may keep.
const PRUNE_EVERY: u64 = 10;
const _: () = assert!(2 * PRUNE_EVERY as usize - 1 <= 20);

/// The history table (docs/history.md shows it). `lock_key` holds keys of up to 256 bytes.
pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_runs (\
id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
lock_key VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
kind VARCHAR(8) CHARACTER SET ascii NOT NULL, \
at DATETIME(3) NOT NULL, \
body MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
KEY dlock_runs_key (lock_key, id))";

/// The rows of one key: parameters (key, its length in bytes).
const OF_KEY: &str = "lock_key = ? AND OCTET_LENGTH(lock_key) = ?";

/// Error codes: the table does not exist; the user lacks a privilege on it.
const NO_TABLE: u16 = 1146;
const DENIED: u16 = 1142;

/// The columns of a read event: the server clock in ms since the epoch, the body's length, the
/// body (whole, or its head: see [`sql_event`]).
fn event_columns() -> String {
    format!(
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', at) DIV 1000, OCTET_LENGTH(body), \
         CASE WHEN OCTET_LENGTH(body) <= {SQL_EVENT_WHOLE} THEN body \
         ELSE LEFT(body, {SQL_EVENT_HEAD}) END"
    )
}

fn key_params(key: &Key) -> (String, u64) {
    (key.as_str().to_string(), key.as_str().len() as u64)
}

/// Runs one prepared statement, within [`super::HARD_LIMIT`]; returns its rows, at most
/// [`MAX_EVENTS`] (any more are read and dropped).
fn exec(con: &mut Conn, sql: &str, params: impl Into<Params>) -> mysql::Result<Vec<Row>> {
    let _stop = HardStop::arm(super::HARD_LIMIT, "mysql");
    let mut result = con.exec_iter(sql, params)?;
    let mut rows = Vec::new();
    while let Some(set) = result.iter() {
        for row in set {
            let row = row?;
            if rows.len() < MAX_EVENTS {
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

fn is(e: &mysql::Error, code: u16) -> bool {
    matches!(e, mysql::Error::MySqlError(e) if e.code == code)
}

/// A number cell, whichever way the server sent it; `None` for NULL or anything else.
fn int(v: Option<&Option<Value>>) -> Option<i64> {
    match v? {
        Some(Value::Int(i)) => Some(*i),
        Some(Value::UInt(u)) => i64::try_from(*u).ok(),
        Some(Value::Bytes(b)) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        _ => None,
    }
}

/// The cells of [`event_columns`], from `from` on, as an event.
fn event(cells: &[Option<Value>], from: usize) -> Stored {
    let body = match cells.get(from + 2) {
        Some(Some(Value::Bytes(b))) => b.clone(),
        _ => Vec::new(),
    };
    sql_event(int(cells.get(from)), int(cells.get(from + 1)), body)
}

/// The error for a failed history statement on `addr`.
fn failed(addr: &str, doing: &str, e: &mysql::Error) -> anyhow::Error {
    if is(e, DENIED) {
        anyhow::anyhow!(
            "{addr}: cannot {doing}: the user lacks the privilege ({}); an administrator \
             can create dlock_runs and grant SELECT, INSERT, DELETE on it (docs/history.md)",
            err_text(e)
        )
    } else {
        anyhow::anyhow!("{addr}: cannot {doing}: {}", err_text(e))
    }
}

/// Adds an event of `kind` ('start' or 'end', a constant) for `key`, creating the table if it
/// is missing.
fn insert(con: &mut Conn, addr: &str, key: &Key, kind: &str, body: &[u8]) -> anyhow::Result<()> {
    let sql = format!(
        "INSERT INTO dlock_runs (lock_key, kind, at, body) \
         VALUES (?, '{kind}', UTC_TIMESTAMP(3), ?)"
    );
    let params = || (key.as_str(), Value::Bytes(body.to_vec()));
    let mut done = exec(con, &sql, params()).map(drop);
    if let Err(e) = &done
        && is(e, NO_TABLE)
    {
        exec(con, CREATE_TABLE, ()).map_err(|e| {
            anyhow::anyhow!(
                "{addr}: cannot create table dlock_runs ({}); create it as an administrator \
                 (docs/history.md has the SQL)",
                err_text(&e)
            )
        })?;
        done = exec(con, &sql, params()).map(drop);
    }
    done.map_err(|e| failed(addr, "record the run", &e))
}

/// The newest start of `key` and how long ago it was stored (ms, by the server's clock), if
/// there is one.
fn last_start(con: &mut Conn, key: &Key) -> mysql::Result<Option<(Stored, Option<i64>)>> {
    let sql = format!(
        "SELECT TIMESTAMPDIFF(MICROSECOND, at, UTC_TIMESTAMP(6)) DIV 1000, {} \
         FROM dlock_runs WHERE {OF_KEY} AND kind = 'start' ORDER BY id DESC LIMIT 1",
        event_columns()
    );
    match exec(con, &sql, key_params(key)) {
        Ok(rows) => Ok(rows.into_iter().next().map(|row| {
            let cells = row.unwrap_raw();
            (event(&cells, 1), int(cells.first()))
        })),
        Err(e) if is(&e, NO_TABLE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Keeps the newest [`MAX_EVENTS`] events of `key`. (MySQL refuses a subquery on the table a
/// DELETE deletes from, but not on a derived table made of it.)
fn prune(con: &mut Conn, key: &Key) -> mysql::Result<()> {
    let sql = format!(
        "DELETE FROM dlock_runs WHERE {OF_KEY} AND id < (SELECT id FROM \
         (SELECT id FROM dlock_runs WHERE {OF_KEY} ORDER BY id DESC LIMIT 1 OFFSET {}) AS cut)",
        MAX_EVENTS - 1
    );
    let (k, n) = key_params(key);
    exec(con, &sql, (k.clone(), n, k, n)).map(drop)
}

/// The holder record of an exclusive run (as [`MysqlBackend::record`] writes it, `conflict` as
/// there) and its start, in one transaction (one log flush) and one round trip: the start (`start`,
/// its token spliced in on the server) and, on every [`PRUNE_EVERY`]th run of the key, the prune to
/// the newest [`MAX_EVENTS`], only when no holder in another mode is there (a mismatch is refused;
/// shared holders are waited for, after which `begin_run` writes the start). `None` when the
/// statement failed (rolled back; the caller records the holder alone, and `begin_run` writes the
/// start — or says why not — as it would have); else the token, the conflicting holder, the uptime
/// and whether the start was written.
pub(super) fn record_starting(
    con: &mut Conn,
    name: &str,
    key: &Key,
    holder: &crate::model::Record,
    conflict: &str,
    start: &crate::history::Opening,
) -> Option<(u64, Option<crate::model::Holder>, u64, bool)> {
    use super::rows::{hex, last_row};
    let meta = super::rows::record_text(holder).ok()?;
    let body = start.body();
    let head = &body[..body.len().saturating_sub(1)];
    let k = format!("CONVERT(X'{}' USING utf8mb4)", hex(key.as_str()));
    let of_key = format!(
        "lock_key = {k} AND OCTET_LENGTH(lock_key) = {}",
        key.as_str().len()
    );
    let table = super::TABLE;
    // A new counter starts above the retention's floor (retention.rs).
    let (read, seed) = (
        super::retention::READ_FLOOR,
        super::retention::first_token(),
    );
    // The gate is in the derived table too: MySQL and MariaDB build a derived table before
    // they look at the outer WHERE, and a gate there alone still scanned the key's newest
    // events on every run (~60 µs, `mariadb` client, 300 statements; 8 µs gated inside).
    let gate = format!("@dlock_started > 0 AND @dlock_fence % {PRUNE_EVERY} = 0");
    let prune = format!(
        "DELETE FROM dlock_runs WHERE {gate} AND {of_key} AND id < (SELECT id FROM \
         (SELECT id FROM dlock_runs WHERE {gate} AND {of_key} ORDER BY id DESC LIMIT 1 \
         OFFSET {}) AS cut); ",
        MAX_EVENTS - 1
    );
    let sql = format!(
        "{read}BEGIN; \
         INSERT INTO {table} (name, fence, holder, connection_id) \
         VALUES (X'{n}', {seed}, \
           CONVERT(X'{m}' USING utf8mb4), CONNECTION_ID()) \
         ON DUPLICATE KEY UPDATE fence = fence + 1, holder = VALUES(holder), \
           connection_id = VALUES(connection_id); \
         SELECT fence, {conflict} INTO @dlock_fence, @dlock_other FROM {table} WHERE name = X'{n}'; \
         INSERT INTO dlock_runs (lock_key, kind, at, body) \
           SELECT {k}, 'start', UTC_TIMESTAMP(3), \
             CONCAT(CONVERT(X'{b}' USING utf8mb4), ',\"token\":', @dlock_fence, '}}') \
           FROM DUAL WHERE @dlock_other IS NULL; \
         SET @dlock_started = ROW_COUNT(); \
         {prune}COMMIT; \
         SELECT @dlock_fence, @dlock_other, {uptime}, @dlock_started",
        n = hex(name),
        m = hex(&meta),
        b = hex_bytes(head),
        uptime = super::UPTIME,
    );
    match last_row::<(u64, Option<Vec<u8>>, i64, i64)>(con, &sql) {
        Ok(Some((fence, other, uptime, started))) => {
            let other = other.map(|m| super::conflict::conflict_holder(&m).unwrap_or_default());
            Some((
                fence,
                other,
                u64::try_from(uptime).unwrap_or(0),
                started > 0,
            ))
        }
        _ => {
            let _ = con.query_drop("ROLLBACK");
            None
        }
    }
}

/// The end `body` of `key`'s run, as one text statement (hex literals: nothing to escape).
pub(super) fn insert_end_sql(key: &Key, body: &[u8]) -> String {
    format!(
        "INSERT INTO dlock_runs (lock_key, kind, at, body) VALUES \
         (CONVERT(X'{}' USING utf8mb4), 'end', UTC_TIMESTAMP(3), CONVERT(X'{}' USING utf8mb4))",
        super::rows::hex(key.as_str()),
        hex_bytes(body)
    )
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

impl MysqlLease {
    /// [`Lease::begin_run`](crate::backend::Lease::begin_run) on the lock's connection.
    pub(super) fn begin_history(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<Begun> {
        let Some(key) = self.history.clone() else {
            return Ok(Begun::NotKept);
        };
        if std::mem::take(&mut self.started) && once_per.is_none() {
            // Recorded with the holder record.
            return Ok(Begun::Started);
        }
        let addr = self.addr.clone();
        let Some(con) = self.con.as_mut() else {
            anyhow::bail!("{addr}: the lock's connection is gone");
        };
        if let Some(d) = once_per {
            let last = last_start(con, &key).map_err(|e| failed(&addr, "read the history", &e))?;
            if let Some((last, ago)) = last {
                // By the server's clock. A start without a time does not count, nor one more
                // than DUR in the future ([`crate::history::age_of`]).
                let ago = ago
                    .and_then(|a| crate::history::age_of(a, d))
                    .unwrap_or(Duration::MAX);
                if ago < d {
                    return Ok(Begun::Skip { last, ago });
                }
            }
        }
        insert(con, &addr, &key, "start", start)?;
        if let Err(e) = prune(con, &key) {
            crate::report::warn(format_args!(
                "cannot prune the run history of '{key}': {}",
                failed(&addr, "delete old runs", &e)
            ));
        }
        Ok(Begun::Started)
    }

    /// Writes the end on the lock's connection (after the lock is let go: see
    /// `release_with_end`): whether it did (not for a connection that is gone, or a lease that
    /// keeps no history).
    pub(super) fn write_end(&mut self, end: &[u8]) -> bool {
        match (&self.history, self.con.as_mut()) {
            (Some(key), Some(con)) => insert(con, &self.addr, key, "end", end).is_ok(),
            _ => false,
        }
    }
}

impl MysqlBackend {
    /// [`Backend::runs`](crate::backend::Backend::runs): none without the table.
    pub(super) fn history_of(&self, key: &Key) -> anyhow::Result<Vec<Stored>> {
        let mut con = self.connect(super::COMMAND_TIMEOUT)?;
        let sql = format!(
            "SELECT {} FROM dlock_runs WHERE {OF_KEY} ORDER BY id DESC LIMIT {MAX_EVENTS}",
            event_columns()
        );
        match exec(&mut con, &sql, key_params(key)) {
            Ok(rows) => Ok(rows
                .into_iter()
                .map(|r| event(&r.unwrap_raw(), 0))
                .collect()),
            Err(e) if is(&e, NO_TABLE) => Ok(Vec::new()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// [`Backend::history_keys`](crate::backend::Backend::history_keys): the keys with events,
    /// at most [`MAX_EVENTS`].
    pub(super) fn keys_with_history(&self) -> anyhow::Result<Vec<Key>> {
        let mut con = self.connect(super::COMMAND_TIMEOUT)?;
        let sql = format!(
            "SELECT DISTINCT lock_key FROM dlock_runs ORDER BY lock_key LIMIT {MAX_EVENTS}"
        );
        match exec(&mut con, &sql, ()) {
            Ok(rows) => Ok(rows
                .into_iter()
                .filter_map(|r| r.get_opt::<String, usize>(0).and_then(Result::ok))
                .filter_map(|k| Key::new(&k).ok())
                .collect()),
            Err(e) if is(&e, NO_TABLE) => Ok(Vec::new()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// [`Backend::end_run`](crate::backend::Backend::end_run), on a new connection.
    pub(super) fn end_on_new_connection(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let mut con = self.connect(super::COMMAND_TIMEOUT)?;
        insert(&mut con, &self.addr, key, "end", end)
    }

    /// Deletes `key`'s history (for [`Backend::purge`](crate::backend::Backend::purge)).
    pub(super) fn purge_history(&self, con: &mut Conn, key: &Key) -> anyhow::Result<()> {
        match exec(
            con,
            &format!("DELETE FROM dlock_runs WHERE {OF_KEY}"),
            key_params(key),
        ) {
            Err(e) if !is(&e, NO_TABLE) => Err(self.fail(e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_cells_are_read_whichever_way_they_come() {
        assert_eq!(int(Some(&Some(Value::Int(-3)))), Some(-3));
        assert_eq!(int(Some(&Some(Value::UInt(7)))), Some(7));
        assert_eq!(int(Some(&Some(Value::UInt(u64::MAX)))), None);
        assert_eq!(int(Some(&Some(Value::Bytes(b"42".to_vec())))), Some(42));
        assert_eq!(int(Some(&Some(Value::Bytes(b"\xff4".to_vec())))), None);
        assert_eq!(int(Some(&Some(Value::Double(1.0)))), None);
        assert_eq!(int(Some(&None)), None);
        assert_eq!(int(None), None);
    }

    proptest::proptest! {
        #[test]
        fn any_number_cell_reads_without_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let _ = int(Some(&Some(Value::Bytes(b))));
        }
    }
}
