//! What `dlock status` (and `break`, and a waiting run) reads: `pg_locks` and the holder
//! records. The key goes as a bind parameter; every record is read capped
//! ([`rows::capped`]), and one that does not parse is shown as unreadable, never dropped.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use super::rows::{self, cell};
use super::{
    COMMAND_TIMEOUT, PgBackend, advisory_id, advisory_on, broken, held_ids, locked_id, slots,
};
use crate::backend::Backend;
use crate::model::{Holder, Key, Mode, Status};

/// What `status` shows of a holder of the key's advisory lock without a dlock record.
const APP_HOLDS: &str = "pg_advisory_lock by an application";

/// The backend pid of a holder `status` read (its `session`).
pub(super) fn pid_of(h: &Holder) -> Option<i32> {
    h.session
        .as_deref()?
        .strip_prefix("backend pid ")?
        .parse()
        .ok()
}

/// The note for a holder whose dlock record does not parse.
fn unreadable(pid: &str) -> String {
    format!(
        "backend pid {pid}: its dlock record is unreadable (not JSON, not UTF-8, or over {} KiB)",
        rows::MAX_RECORD >> 10
    )
}

impl PgBackend {
    /// The backend pids that hold `key`'s lock or one of its semaphore slots now.
    pub(super) async fn live(&self, client: &Client, key: &Key) -> anyhow::Result<Vec<i32>> {
        let sql = format!(
            "SELECT DISTINCT pid FROM pg_locks WHERE granted AND {}",
            advisory_on("", &held_ids(key))
        );
        let rows = self
            .simple(client, &sql, COMMAND_TIMEOUT, "read pg_locks")
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| cell(r, 0)?.parse().ok())
            .collect())
    }

    /// The first recorded holder of `id` that holds it now, for the waiting line.
    pub(super) async fn current_holder(&self, client: &Client, id: i64) -> Option<Holder> {
        let sql = format!(
            "SELECT {} FROM dlock_holders h JOIN pg_locks l ON l.pid = h.pid \
             WHERE h.id = {id} AND l.granted AND {} LIMIT 1",
            rows::capped("h.holder"),
            advisory_on("l.", &[id])
        );
        let rows = self
            .simple(client, &sql, COMMAND_TIMEOUT, "read the holder")
            .await
            .ok()?;
        crate::backend::read_record(cell(rows.first()?, 0)?.as_bytes())
    }

    pub(super) async fn status_on(&self, client: &Client, key: &Key) -> anyhow::Result<Status> {
        let id = advisory_id(key);
        let sql = format!(
            "SELECT l.pid, l.mode, l.granted, coalesce(host(a.client_addr), 'local'), \
             a.application_name, floor(extract(epoch FROM a.backend_start) * 1000)::bigint \
             FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE {} ORDER BY l.granted DESC, l.pid",
            advisory_on("l.", &[id])
        );
        let locks = self
            .simple(client, &sql, COMMAND_TIMEOUT, "read pg_locks")
            .await?;
        let records: rows::Rows = self
            .simple(
                client,
                &format!(
                    "SELECT pid, fence, {} FROM dlock_holders WHERE id = {id}",
                    rows::capped("holder")
                ),
                COMMAND_TIMEOUT,
                "read the holder records",
            )
            .await
            .unwrap_or_default();
        let mut status = Status::new(
            key,
            self.kind(),
            format!("{} (advisory key {id})", self.addr()),
        );
        status.server_name = Some(id.to_string());
        let mut waiters = 0;
        let mut shared = false;
        for row in &locks {
            let pid = cell(row, 0).unwrap_or("?");
            if cell(row, 2) != Some("t") {
                waiters += 1;
                continue;
            }
            shared |= cell(row, 1) == Some("ShareLock");
            let record = records.iter().find(|r| cell(r, 0) == Some(pid));
            let parsed =
                record.map(|r| cell(r, 2).and_then(|m| crate::backend::read_record(m.as_bytes())));
            if let Some(None) = parsed {
                status.notes.push(unreadable(pid));
            }
            let mut h: Holder = parsed.flatten().unwrap_or_default();
            if let Some(fence) = record.and_then(|r| cell(r, 1)?.parse().ok()) {
                h.fencing_token = Some(fence);
            }
            h.session = Some(format!("backend pid {pid}"));
            if record.is_none() {
                // Not dlock: an application's pg_advisory_lock(<id>).
                h.foreign = Some(APP_HOLDS.into());
                h.host = cell(row, 3).map(str::to_string);
                h.since_ms = cell(row, 5).and_then(|v| v.parse().ok());
                status.notes.push(format!(
                    "backend pid {pid} ({}) holds it without a dlock record",
                    cell(row, 4).unwrap_or("")
                ));
            }
            status.holders.push(h);
        }
        // A semaphore's slot holders, and who queues for its slots.
        let gate = slots::slot_id(key, 0);
        let mut queue_ids = held_ids(key);
        queue_ids[0] = gate; // the gate and the slots; the key's own lock's waiters are above
        let slot_sql = format!(
            "SELECT o.pid, o.fence, {holder} FROM dlock_holders o JOIN pg_locks l ON l.pid = o.pid \
               AND l.granted AND l.locktype = 'advisory' AND l.objsubid = 1 AND {l_id} = o.id \
             WHERE o.key = $1 AND o.id <> {id} ORDER BY o.fence LIMIT {max}",
            holder = rows::capped("o.holder"),
            l_id = locked_id("l."),
            max = slots::MAX_LIMIT,
        );
        // (The one at the front of a semaphore's queue waits on every slot, one connection
        // each: it counts once.)
        let count_sql = format!(
            "SELECT count(*) FILTER (WHERE {a} = {gate}) + least(1, count(*) FILTER (WHERE {a} <> {gate})) \
               FROM pg_locks WHERE NOT granted AND {queued}",
            a = locked_id(""),
            queued = advisory_on("", &queue_ids),
        );
        // Both in one round trip: tokio-postgres pipelines requests on a connection.
        let k = key.as_str();
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 1] = [(&k, Type::TEXT)];
        let marks_sql = format!("SELECT objid FROM pg_locks WHERE {}", broken::marks(""));
        let (slot_rows, count, marks) = tokio::join!(
            self.typed(
                client,
                &slot_sql,
                &params,
                COMMAND_TIMEOUT,
                "read the semaphore",
            ),
            self.simple(client, &count_sql, COMMAND_TIMEOUT, "read the queue"),
            self.simple(client, &marks_sql, COMMAND_TIMEOUT, "read the break marks"),
        );
        for row in slot_rows.unwrap_or_default() {
            let pid = cell(&row, 0).unwrap_or("?");
            let parsed: Option<Holder> =
                cell(&row, 2).and_then(|m| crate::backend::read_record(m.as_bytes()));
            if parsed.is_none() {
                status.notes.push(unreadable(pid));
            }
            let mut h = parsed.unwrap_or_default();
            h.fencing_token = cell(&row, 1).and_then(|v| v.parse().ok());
            h.session = Some(format!("backend pid {pid}"));
            status.limit = h.mode.and_then(Mode::limit);
            status.holders.push(h);
        }
        waiters += count
            .ok()
            .and_then(|c| cell(c.first()?, 0)?.parse::<u64>().ok())
            .unwrap_or(0);
        // A holder with a break's mark on it (broken.rs) is stopping its command.
        let marked = broken::marked_pids(&marks.unwrap_or_default());
        for h in &mut status.holders {
            h.broken = h.foreign.is_none() && pid_of(h).is_some_and(|p| marked.contains(&p));
        }
        status.held = !status.holders.is_empty();
        if shared {
            status.mode = Some(Mode::Shared);
        }
        status.waiters = Some(waiters);
        // A young server holds a grant back: said as such (best effort).
        if status.holders.iter().any(|h| h.ttl_ms.is_some()) {
            let sql =
                "SELECT floor(extract(epoch FROM now() - pg_postmaster_start_time()))::bigint";
            let up = self
                .simple(client, sql, COMMAND_TIMEOUT, "read the server's uptime")
                .await
                .ok()
                .and_then(|r| cell(r.first()?, 0)?.parse::<u64>().ok());
            if let Some(up) = up {
                status.mark_held_back(up);
            }
        }
        Ok(status)
    }
}
