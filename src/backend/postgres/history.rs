//! The postgres backend's run history (docs/history.md): one row per event in the table
//! `dlock_runs` of the URL's database (created if missing, on the first write that finds it
//! missing), newest last by its identity column.
//!
//! - The start is one statement on the lock's own session while it holds the lock: the
//!   `--once-per` check, the insert and the prune to the newest [`MAX_EVENTS`] (data-modifying
//!   `WITH`, one round trip). The end is one statement too, with the release
//!   (`pg_advisory_unlock_all()`); when the session is gone (`dlock break` terminates it),
//!   [`Backend::end_run`](crate::backend::Backend::end_run) writes it on a new one.
//! - `at` is the server's clock (`now()`, a `timestamptz`), and the `--once-per` age is computed
//!   by the server, so the hosts' clocks never matter.
//! - Every value is a bind parameter; the SQL text holds only constants (see
//!   tests/it/sql_safety.rs for what `standard_conforming_strings = off` did to spliced text).
//! - A read sends a body whole only up to [`SQL_EVENT_WHOLE`] bytes (the largest dlock writes),
//!   else its head and length ([`sql_event`]), so a forged history stays far below the reply
//!   bound of `stream::Checked`.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::rows::{Rows, cell, typed_row};
use super::{COMMAND_TIMEOUT, PgBackend, PgLease, db_text, ground};
use crate::backend::{Begun, Lease, SQL_EVENT_HEAD, SQL_EVENT_WHOLE, Stored, sql_event};
use crate::history::MAX_EVENTS;
use crate::model::Key;

/// The history table and its index (docs/history.md shows them). An identity column needs no
/// grant on a sequence.
pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_runs (\
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text NOT NULL, \
        kind text NOT NULL, at timestamptz NOT NULL, body text NOT NULL); \
    CREATE INDEX IF NOT EXISTS dlock_runs_key ON dlock_runs (key, id)";

/// The longest `--once-per` the server is asked about (an interval has a range): 10^15 ms,
/// some 31,000 years.
const LONGEST_ONCE_PER_MS: i64 = 1_000_000_000_000_000;

type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Why a history statement failed.
enum Fail {
    /// The server's error or a broken connection.
    Pg(tokio_postgres::Error),
    /// The table is missing and could not be created.
    Create(tokio_postgres::Error),
    Timeout,
}

impl Fail {
    fn text(&self) -> String {
        match self {
            Fail::Pg(e) => db_text(e),
            Fail::Create(e) => format!(
                "cannot create table dlock_runs ({}); create it as an administrator \
                 (docs/history.md has the SQL)",
                db_text(e)
            ),
            Fail::Timeout => format!("no answer within {COMMAND_TIMEOUT:?}"),
        }
    }

    fn is_missing_table(&self) -> bool {
        matches!(self, Fail::Pg(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE))
    }
}

/// The columns of a read event: the server clock in ms since the epoch, the body's length, the
/// body (whole, or its head: see [`sql_event`]). A forged `at` of ±infinity reads as NULL (it
/// would not fit a bigint, and the error would hide the whole history).
fn event_columns() -> String {
    format!(
        "CASE WHEN isfinite(at) THEN floor(extract(epoch FROM at) * 1000)::bigint END, \
         octet_length(body), \
         CASE WHEN octet_length(body) <= {SQL_EVENT_WHOLE} THEN body \
         ELSE left(body, {SQL_EVENT_HEAD}) END"
    )
}

/// The cells of [`event_columns`], from `from` on, as an event.
fn event(row: &[Option<String>], from: usize) -> Stored {
    let int = |i| cell(row, i).and_then(|v| v.parse::<i64>().ok());
    let body = cell(row, from + 2).unwrap_or_default().as_bytes().to_vec();
    sql_event(int(from), int(from + 1), body)
}

/// One statement with bind parameters, within [`COMMAND_TIMEOUT`]: its rows (at most
/// [`MAX_EVENTS`]) as text cells.
async fn run(client: &Client, sql: &str, params: &[Param<'_>]) -> Result<Rows, Fail> {
    match tokio::time::timeout(COMMAND_TIMEOUT, client.query_typed(sql, params)).await {
        Ok(Ok(rows)) => Ok(rows.iter().take(MAX_EVENTS).map(typed_row).collect()),
        Ok(Err(e)) => Err(Fail::Pg(e)),
        Err(_) => Err(Fail::Timeout),
    }
}

/// [`with_table`] on the lock's session, with `lock_timeout` at [`LOCK_PATIENCE`] for it (the
/// three statements pipelined: one round trip): a lock someone holds on `dlock_runs` makes the
/// start fail (a warning; `--once-per` refuses to run) rather than leave the lock's session
/// stuck behind it, with its renewals and release queued up. Then `RESET`: the session's own
/// setting comes back (a role's or database's `lock_timeout`, which `SET … = 0` overrode).
/// When the table is missing, its creation and the retry come after that reset, so they set
/// and reset the patience themselves ([`with_table`]).
async fn bounded(client: &Client, sql: &str, params: &[Param<'_>]) -> Result<Rows, Fail> {
    let set = client.batch_execute(LOCK_PATIENCE);
    let rows = with_table(client, sql, params, true);
    let reset = client.batch_execute(LOCK_RESET);
    let (set, rows, _) = tokio::join!(set, rows, reset);
    set.map_err(Fail::Pg)?;
    rows
}

/// How long a history statement on the lock's session waits for a lock on the table.
const LOCK_PATIENCE: &str = "SET lock_timeout = 1000";
/// The session's own `lock_timeout` again.
const LOCK_RESET: &str = "RESET lock_timeout";

/// [`run`], creating the table first if it is missing.
async fn with_table(
    client: &Client,
    sql: &str,
    params: &[Param<'_>],
    patient: bool,
) -> Result<Rows, Fail> {
    match run(client, sql, params).await {
        Err(f) if f.is_missing_table() => {}
        r => return r,
    }
    if patient {
        let set = client.batch_execute(LOCK_PATIENCE).await;
        let rows = create_then(client, sql, params).await;
        let _ = client.batch_execute(LOCK_RESET).await;
        set.map_err(Fail::Pg)?;
        return rows;
    }
    create_then(client, sql, params).await
}

/// Creates the table, then runs `sql`.
async fn create_then(client: &Client, sql: &str, params: &[Param<'_>]) -> Result<Rows, Fail> {
    match tokio::time::timeout(COMMAND_TIMEOUT, client.simple_query(CREATE_TABLE)).await {
        Ok(Ok(_)) => {}
        // Another session created it at the same moment (CREATE TABLE IF NOT EXISTS is not
        // safe against a concurrent one: 23505 on pg_type).
        Ok(Err(e))
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                || e.code() == Some(&SqlState::DUPLICATE_TABLE) => {}
        Ok(Err(e)) => return Err(Fail::Create(e)),
        Err(_) => return Err(Fail::Timeout),
    }
    run(client, sql, params).await
}

/// The common table expressions that add the run's start to the holder record's statement
/// (`f`: the fence; `$1` the key, `$3` the start without its token, [`Opening`]), where
/// `ours` holds: the insert, its token spliced in on the server. No prune: planning one cost a
/// new session ~0.6 ms (any statement on `dlock_runs` is planned anew in each session); the
/// release prunes, after the unlock, unawaited ([`PgLease::release_writing`]).
///
/// [`Opening`]: crate::history::Opening
pub(super) fn start_ctes(ours: &str) -> String {
    format!(
        ", s AS (INSERT INTO dlock_runs (key, kind, at, body) \
           SELECT $1, 'start', now(), left($3, -1) || ',\"token\":' || f.fence::text || '}}' \
           FROM f WHERE {ours})"
    )
}

/// SQL: deletes all but the newest [`MAX_EVENTS`] events of key $1.
fn prune_sql() -> String {
    format!(
        "DELETE FROM dlock_runs WHERE key = $1 AND id < (SELECT id FROM dlock_runs \
         WHERE key = $1 ORDER BY id DESC OFFSET {} LIMIT 1)",
        MAX_EVENTS - 1
    )
}

/// Sends `request` (its first poll does) and lets it go: the server runs it, nobody waits for
/// its answer.
fn send_only<F: Future>(request: F) {
    let request = std::pin::pin!(request);
    let _ = request.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
}

/// The holder record's statement with the run's start in it ([`start_ctes`]), with
/// `lock_timeout` at [`LOCK_PATIENCE`] and reset after, pipelined (one round trip, as
/// [`bounded`]). The table is not created here: a server's error (`Err(None)`) falls back to
/// the record alone; no answer or a broken connection is `Err(Some(why))`.
pub(super) async fn bounded_record(
    client: &Client,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Rows, Option<String>> {
    let set = client.batch_execute(LOCK_PATIENCE);
    let rows = run(client, sql, params);
    let reset = client.batch_execute(LOCK_RESET);
    let (set, rows, _) = tokio::join!(set, rows, reset);
    match (set, rows) {
        (Ok(()), Ok(rows)) => Ok(rows),
        (_, Err(f @ Fail::Timeout)) => Err(Some(f.text())),
        (_, Err(Fail::Pg(e))) | (Err(e), _) if e.as_db_error().is_none() => Err(Some(db_text(&e))),
        _ => Err(None),
    }
}

/// SQL: adds the end event ($1 key, $2 body).
const INSERT_END: &str =
    "INSERT INTO dlock_runs (key, kind, at, body) VALUES ($1, 'end', now(), $2)";

impl PgLease {
    /// [`Lease::begin_run`] on the lock's session, in one statement: the newest start younger
    /// than `--once-per` if there is one (then nothing is written), else the insert and the
    /// prune to the newest [`MAX_EVENTS`] events. (Every part of the statement sees the rows
    /// from before it: the prune keeps the newest `MAX_EVENTS - 1` of those.)
    pub(super) fn begin_history(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<Begun> {
        if self.started && once_per.is_none() && self.history.is_some() {
            // Recorded with the holder record.
            self.started = false;
            return Ok(Begun::Started);
        }
        let (Some(key), Some(s)) = (&self.history, &self.session) else {
            return match self.history {
                None => Ok(Begun::NotKept),
                Some(_) => Err(anyhow::anyhow!("{}: the session is gone", self.addr)),
            };
        };
        let sql = format!(
            "WITH last AS (SELECT at, body FROM dlock_runs WHERE $3::bigint IS NOT NULL \
               AND key = $1 AND kind = 'start' ORDER BY id DESC LIMIT 1), \
             skip AS (SELECT at, body FROM last \
               WHERE at > now() - $3::float8 * interval '1 millisecond' \
                 AND at <= now() + $3::float8 * interval '1 millisecond'), \
             ins AS (INSERT INTO dlock_runs (key, kind, at, body) \
               SELECT $1, 'start', now(), $2 WHERE NOT EXISTS (SELECT 1 FROM skip) RETURNING id), \
             gone AS (DELETE FROM dlock_runs WHERE key = $1 AND EXISTS (SELECT 1 FROM ins) \
               AND id < (SELECT id FROM dlock_runs WHERE key = $1 \
                 ORDER BY id DESC OFFSET {} LIMIT 1)) \
             SELECT CASE WHEN isfinite(at) THEN \
               floor(extract(epoch FROM now() - at) * 1000)::bigint END, {} FROM skip",
            MAX_EVENTS - 2,
            event_columns()
        );
        let once_ms = once_per.map(|d| {
            i64::try_from(d.as_millis())
                .unwrap_or(i64::MAX)
                .min(LONGEST_ONCE_PER_MS)
        });
        let body = String::from_utf8_lossy(start);
        let params: [Param<'_>; 3] = [
            (&key.as_str(), Type::TEXT),
            (&body, Type::TEXT),
            (&once_ms, Type::INT8),
        ];
        let rows = self
            .rt
            .block_on(bounded(&s.client, &sql, &params))
            .map_err(|f| anyhow::anyhow!("{}: cannot record the run: {}", self.addr, f.text()))?;
        Ok(match rows.first() {
            Some(row) => {
                // A start in the future (the server's clock went back) counts as just now
                // when it is less than DUR ahead; farther, it did not count (the query).
                let ago = cell(row, 0).and_then(|v| v.parse::<u64>().ok());
                Begun::Skip {
                    last: event(row, 1),
                    ago: Duration::from_millis(ago.unwrap_or(0)),
                }
            }
            None => Begun::Started,
        })
    }

    /// [`Lease::release_with_end`]: the end, the holder record's removal and the unlock in one
    /// statement, sent with `lock_timeout` at a second ([`bounded`]): a lock someone holds on
    /// `dlock_runs` (a statement takes its table locks before it runs) delays the release by
    /// that second at most, then a plain release goes out and the caller writes the end on a
    /// new session. In the same round trip as the release, the end costs no time after it:
    /// dlock exits as soon as the lock is free (an end written on a new session after the
    /// release kept dlock alive, for the connection, while the next holder's command started).
    pub(super) fn release_writing(mut self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        let (Some(key), Some(s)) = (self.history.clone(), self.session.as_ref()) else {
            return self.release().map(|()| false);
        };
        self.releasing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Unlocks only the server session that carries this session's mark, where it has one
        // ([`ground`]).
        let (and_ours, where_ours) = match ground::is_ours(s) {
            Some(ours) => (format!(" AND {ours}"), format!(" WHERE {ours}")),
            None => (String::new(), String::new()),
        };
        let sql = format!(
            "WITH e AS ({INSERT_END}), \
             h AS (DELETE FROM dlock_holders WHERE pid = pg_backend_pid(){and_ours}) \
             SELECT pg_advisory_unlock_all(){where_ours}"
        );
        let body = String::from_utf8_lossy(end);
        let params: [Param<'_>; 2] = [(&key.as_str(), Type::TEXT), (&body, Type::TEXT)];
        // The prune goes out behind the release, in the same write; the server runs it after
        // the unlock, while dlock is on its way out (its answer is not waited for).
        let prune = prune_sql();
        let pruned = [(&key.as_str() as &(dyn ToSql + Sync), Type::TEXT)];
        let releasing = async {
            let released = bounded(&s.client, &sql, &params);
            let pruning = async { send_only(s.client.query_typed(&prune, &pruned)) };
            tokio::join!(released, pruning).0
        };
        match self.rt.block_on(releasing) {
            Ok(_) => {
                self.session = None;
                Ok(true)
            }
            Err(_) => self.release().map(|()| false),
        }
    }
}

/// The statement that also records the run's start failed: record without it.
#[derive(Debug)]
pub(super) struct Folded;

impl std::fmt::Display for Folded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the run's start could not be recorded with the lock")
    }
}

impl std::error::Error for Folded {}

impl PgBackend {
    /// [`PgBackend::record`], and with `start` the run's start in the same statement
    /// ([`history::start_ctes`]). A failure of that statement (the history table missing, no
    /// right to write it, a lock on it) falls back to [`PgBackend::record`] alone; the lease's
    /// `begin_run` writes the start then, as it would have.
    pub(super) async fn record_starting(
        &self,
        s: &super::Session,
        key: &Key,
        held: i64,
        holder: &crate::model::Record,
        start: &crate::history::Opening,
    ) -> anyhow::Result<((u64, u64, Vec<(i32, crate::model::Holder)>), bool)> {
        match self.record_with(s, key, held, holder, Some(start)).await {
            Ok(r) => Ok((r, true)),
            Err(e) if e.is::<Folded>() => Ok((self.record(s, key, held, holder).await?, false)),
            Err(e) => Err(e),
        }
    }

    fn history_error(&self, doing: &str, f: Fail) -> anyhow::Error {
        match f {
            Fail::Pg(e) => self.fail(doing, e),
            f => crate::exit::Unavailable(format!("{}: cannot {doing}: {}", self.addr(), f.text()))
                .into(),
        }
    }

    /// [`Backend::runs`](crate::backend::Backend::runs): none without the table.
    pub(super) fn history_of(&self, key: &Key) -> anyhow::Result<Vec<Stored>> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let s = self.connect("dlock log").await?;
            let sql = format!(
                "SELECT {} FROM dlock_runs WHERE key = $1 ORDER BY id DESC LIMIT {MAX_EVENTS}",
                event_columns()
            );
            match run(&s.client, &sql, &[(&key.as_str(), Type::TEXT)]).await {
                Ok(rows) => Ok(rows.iter().map(|r| event(r, 0)).collect()),
                Err(f) if f.is_missing_table() => Ok(Vec::new()),
                Err(f) => Err(self.history_error("read the run history", f)),
            }
        })
    }

    /// [`Backend::history_keys`](crate::backend::Backend::history_keys): the keys with events,
    /// at most [`MAX_EVENTS`] (an index-only scan of `dlock_runs_key`).
    pub(super) fn keys_with_history(&self) -> anyhow::Result<Vec<Key>> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let s = self.connect("dlock metrics").await?;
            let sql =
                format!("SELECT DISTINCT key COLLATE \"C\" AS k FROM dlock_runs ORDER BY k LIMIT {MAX_EVENTS}");
            match run(&s.client, &sql, &[]).await {
                Ok(rows) => Ok(rows
                    .iter()
                    .filter_map(|r| cell(r, 0).and_then(|k| Key::new(k).ok()))
                    .collect()),
                Err(f) if f.is_missing_table() => Ok(Vec::new()),
                Err(f) => Err(self.history_error("list the keys with a run history", f)),
            }
        })
    }

    /// [`Backend::end_run`](crate::backend::Backend::end_run), on a new session.
    pub(super) fn end_on_new_session(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let s = self.connect("dlock history").await?;
            let body = String::from_utf8_lossy(end);
            let params: [Param<'_>; 2] = [(&key.as_str(), Type::TEXT), (&body, Type::TEXT)];
            with_table(&s.client, INSERT_END, &params, false)
                .await
                .map(drop)
                .map_err(|f| self.history_error("record the end of the run", f))
        })
    }

    /// Deletes `key`'s history (for [`Backend::purge`](crate::backend::Backend::purge)).
    pub(super) async fn purge_history(&self, client: &Client, key: &Key) -> anyhow::Result<()> {
        let sql = "DELETE FROM dlock_runs WHERE key = $1";
        match run(client, sql, &[(&key.as_str(), Type::TEXT)]).await {
            Err(f) if !f.is_missing_table() => Err(self.history_error("forget the history", f)),
            _ => Ok(()),
        }
    }
}
