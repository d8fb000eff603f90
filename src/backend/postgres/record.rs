//! The holder record's statement: a lock's fence bumped, its holder recorded beside it (and,
//! for an exclusive run, the run's start in the same statement: [`super::history`]), in one
//! round trip.

use anyhow::Context;
use tokio_postgres::types::Type;

use super::rows::{self, cell};
use super::{
    COMMAND_TIMEOUT, CREATE_TABLES, PgBackend, Session, UNDEFINED_TABLE, advisory_id, ground,
    history, retention, slots,
};
use crate::model::{Holder, Key, Record};

impl PgBackend {
    /// Records the holder of `held` (the key's own id, or a semaphore slot's) and bumps the
    /// key's fence, creating the tables if missing. Returns the fence, the server's uptime in
    /// seconds, and the key's other holder records, live or not (for the mode check, which
    /// asks `pg_locks` only about a record in another mode: [`PgBackend::live`]). Reading
    /// `pg_locks` in every acquisition cost ~1 ms of a new session's cold catalog.
    pub(super) async fn record(
        &self,
        s: &Session,
        key: &Key,
        held: i64,
        holder: &Record,
    ) -> anyhow::Result<(u64, u64, Vec<(i32, Holder)>)> {
        self.record_with(s, key, held, holder, None).await
    }

    pub(super) async fn record_with(
        &self,
        s: &Session,
        key: &Key,
        held: i64,
        holder: &Record,
        start: Option<&crate::history::Opening>,
    ) -> anyhow::Result<(u64, u64, Vec<(i32, Holder)>)> {
        let id = advisory_id(key);
        let meta = serde_json::to_string(holder)?;
        let ours = ground::is_ours(s).unwrap_or_else(|| "true".into());
        let starting = match start {
            Some(_) => history::start_ctes(&ours),
            None => String::new(),
        };
        // The key and the record are bind parameters: nothing from the user is SQL text.
        let sql = format!(
            "WITH f AS (INSERT INTO dlock_fences (id, fence) \
               VALUES ({id}, {first}) \
               ON CONFLICT (id) DO UPDATE SET fence = greatest(dlock_fences.fence + 1, EXCLUDED.fence) \
               RETURNING fence), \
             h AS (INSERT INTO dlock_holders (pid, id, key, fence, holder) \
               SELECT pg_backend_pid(), {held}, $1, f.fence, $2 FROM f \
               ON CONFLICT (pid) DO UPDATE SET id = EXCLUDED.id, key = EXCLUDED.key, \
               fence = EXCLUDED.fence, holder = EXCLUDED.holder){starting} \
             SELECT fence, floor(extract(epoch FROM now() - pg_postmaster_start_time()))::bigint, \
               (SELECT json_agg(json_build_array(o.pid, {holder}))::text FROM \
                 (SELECT pid, holder FROM dlock_holders WHERE key = $1 \
                   AND pid <> pg_backend_pid() LIMIT {most}) o), {ours} FROM f",
            holder = rows::capped("o.holder"),
            most = 2 * slots::MAX_LIMIT,
            first = retention::first_token(),
        );
        let client = &s.client;
        let body = start.map(|o| String::from_utf8_lossy(o.body()).into_owned());
        let key_text = key.as_str();
        let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> =
            vec![(&key_text, Type::TEXT), (&meta, Type::TEXT)];
        if let Some(body) = &body {
            params.push((body, Type::TEXT));
            let rows = match history::bounded_record(client, &sql, &params).await {
                Ok(rows) => rows,
                Err(None) => return Err(history::Folded.into()),
                Err(Some(why)) => {
                    return Err(self.reach.transport_error(format!(
                        "{}: cannot record the holder: {why}",
                        self.addr()
                    )));
                }
            };
            return self.recorded(s, rows).await;
        }
        let mut result = self
            .typed(client, &sql, &params, COMMAND_TIMEOUT, "record the holder")
            .await;
        if let Err(e) = &result
            && e.to_string().contains(UNDEFINED_TABLE)
        {
            let created = self
                .simple(
                    client,
                    CREATE_TABLES,
                    COMMAND_TIMEOUT,
                    "create dlock's tables",
                )
                .await;
            match created {
                Ok(_) => {}
                // Another session created them at the same moment (CREATE TABLE IF NOT
                // EXISTS is not safe against a concurrent one: 23505 on pg_type).
                Err(e)
                    if e.to_string().contains("(23505)") || e.to_string().contains("(42P07)") => {}
                Err(e) => {
                    return Err(e.context(
                        "create the tables as an administrator (docs/backends.md has the SQL)",
                    ));
                }
            }
            result = self
                .typed(client, &sql, &params, COMMAND_TIMEOUT, "record the holder")
                .await;
        }
        self.recorded(s, result?).await
    }

    /// What [`PgBackend::record`]'s statement returned.
    async fn recorded(
        &self,
        s: &Session,
        rows: rows::Rows,
    ) -> anyhow::Result<(u64, u64, Vec<(i32, Holder)>)> {
        let client = &s.client;
        let row = rows.first().context("no fence returned")?;
        if cell(row, 3) != Some("t") {
            // The lock was granted on the server session that carries the mark, and this
            // statement reached another: give it back there if the next one lands on it.
            if let Some(ours) = ground::is_ours(s) {
                let undo = format!("SELECT pg_advisory_unlock_all() WHERE {ours}");
                let _ = self
                    .simple(client, &undo, COMMAND_TIMEOUT, "give the lock back")
                    .await;
            }
            return Err(ground::pooled(self.addr()));
        }
        let fence = cell(row, 0)
            .and_then(|v| v.parse().ok())
            .context("no fence returned")?;
        let uptime = cell(row, 1)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        let others: Vec<(i32, String)> = cell(row, 2)
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        let others = others
            .into_iter()
            .filter_map(|(pid, h)| Some((pid, crate::backend::read_record(h.as_bytes())?)))
            .collect();
        Ok((fence, u64::try_from(uptime).unwrap_or(0), others))
    }
}
