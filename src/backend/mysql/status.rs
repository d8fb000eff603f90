//! `dlock status` and `dlock break`: who holds a key (dlock's record, or an application's
//! `GET_LOCK`), who waits, and the locks held now. A record is read as bytes: one that is not
//! a record (not UTF-8, not JSON) is shown as unreadable, and its lock is still listed.

use mysql::Conn;
use mysql::prelude::Queryable;

use super::rows::{exec_row, hex, parse_record};
use super::{COMMAND_TIMEOUT, HARD_LIMIT, MysqlBackend, TABLE, UPTIME, lock_name, slot_prefix};
use crate::backend::Backend;
use crate::model::{Holder, Key, Mode, Record, Status};
use crate::signals::HardStop;

/// The note for connection `id`'s record that does not parse.
fn unreadable(id: u64) -> String {
    format!("connection {id}: its dlock record is unreadable (not UTF-8 JSON)")
}

impl MysqlBackend {
    /// The locks held now, from `dlock_locks` (a `dlock:KEY` name is its key; a hashed one or
    /// a semaphore slot names its key in the holder record).
    pub(super) fn list_locks(&self) -> anyhow::Result<Vec<Key>> {
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        let _stop = HardStop::arm(HARD_LIMIT, "mysql");
        let rows = match con.query_iter(format!(
            "SELECT name, holder FROM {TABLE} WHERE IS_USED_LOCK(name) IS NOT NULL LIMIT {}",
            crate::backend::MAX_LISTED
        )) {
            Ok(mut result) => match result.iter() {
                // Bytes: a record that is not UTF-8 must not drop its lock from the list.
                Some(set) => set
                    .take(crate::backend::MAX_LISTED)
                    .filter_map(|r| r.ok().and_then(|r| mysql::from_row_opt(r).ok()))
                    .collect::<Vec<(Vec<u8>, Vec<u8>)>>(),
                None => Vec::new(),
            },
            Err(mysql::Error::MySqlError(e)) if e.code == 1146 => Vec::new(), // no table yet
            Err(e) => return Err(self.fail(e)),
        };
        let mut unnamed = 0usize;
        let keys = rows
            .into_iter()
            .filter_map(|(name, holder)| {
                let name = String::from_utf8_lossy(&name);
                let plain = name.strip_prefix("dlock:").map(str::to_string);
                let recorded = || parse_record(&holder)?.record.key;
                let key = plain.or_else(recorded).and_then(|k| Key::new(&k).ok());
                unnamed += usize::from(key.is_none());
                key
            })
            .collect();
        if unnamed > 0 {
            // A hashed lock name (a long or non-ASCII key, a semaphore slot) names its key only
            // in its record: one that cannot be read leaves nothing to list it under.
            crate::report::warn(format_args!(
                "{unnamed} held lock(s) in {TABLE} have a record dlock cannot read, and no key \
                 to list them under"
            ));
        }
        Ok(keys)
    }

    pub(super) fn status_of(&self, key: &Key) -> anyhow::Result<Status> {
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        Ok(self.status_on(&mut con, key)?.0)
    }

    /// `key`'s status, read on `con`, and the connection id of each of its holders (in the
    /// order of `holders`). A holder with a break's mark on it is `broken` (broken.rs).
    pub(super) fn status_on(
        &self,
        con: &mut Conn,
        key: &Key,
    ) -> anyhow::Result<(Status, Vec<u64>)> {
        let con = &mut *con;
        let name = lock_name(key);
        let mut ids = Vec::new();
        let holder_id: Option<u64> = exec_row(con, "SELECT IS_USED_LOCK(?)", (&name,))
            .map_err(|e| self.fail(e))?
            .flatten();
        // Waiters are the sessions blocked in GET_LOCK on this name (visible to the same user, or
        // to all with the PROCESS privilege).
        let pattern = format!("%GET_LOCK(X'{}'%", hex(&name));
        let waiters: Option<u64> = exec_row(
            con,
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
            (&pattern,),
        )
        .ok()
        .flatten();
        let location = format!("{} (lock name {name})", self.addr);
        let mut status = Status {
            held: holder_id.is_some(),
            waiters,
            server_name: Some(name.clone()),
            ..Status::new(key, self.kind(), location)
        };
        // A semaphore's slot holders or the shared holders, and the one waiter at the front
        // (waiting on every slot, or for the shared holders to leave).
        let prefix = slot_prefix(key);
        let mut shared = false;
        for (fence, meta, id) in self.slot_holders(con, &prefix) {
            let parsed = parse_record(&meta);
            if parsed.is_none() {
                status.notes.push(unreadable(id));
            }
            let mut h = parsed.unwrap_or_default();
            h.fencing_token = Some(fence);
            status.limit = h.mode.and_then(Mode::limit);
            shared |= h.mode == Some(Mode::Shared);
            let what = if shared { "shared lock" } else { "slot" };
            status.notes.push(format!("{what} held by connection {id}"));
            h.broken = self.marked(con, id);
            status.holders.push(h);
            ids.push(id);
            status.held = true;
        }
        if let Some(id) = holder_id {
            let (mut h, unreadable_record) = self.holder_of(con, &name, id);
            if unreadable_record {
                status.notes.push(unreadable(id));
            }
            if shared && h.foreign.is_none() {
                // An exclusive run holds the key's name while the shared holders leave.
                status.notes.push(format!(
                    "connection {id} (exclusive) waits for the shared holders to leave"
                ));
            } else {
                status.notes.push(format!("held by connection {id}"));
                h.broken = h.foreign.is_none() && self.marked(con, id);
                status.holders.insert(0, h);
                ids.insert(0, id);
            }
        }
        let count = |con: &mut Conn, name: &str| -> u64 {
            exec_row(
                con,
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
                (format!("%GET_LOCK(X'{}%", hex(name)),),
            )
            .ok()
            .flatten()
            .unwrap_or(0)
        };
        let queued = count(con, &format!("{prefix}gate"));
        let at_front = u64::from(count(con, &prefix) > queued);
        status.waiters = status.waiters.map(|w| w + queued + at_front);
        // A young server holds a grant back: said as such (best effort).
        if status.holders.iter().any(|h| h.ttl_ms.is_some()) {
            let up: Option<i64> = exec_row(con, &format!("SELECT {UPTIME}"), ())
                .ok()
                .flatten();
            if let Some(up) = up.and_then(|u| u64::try_from(u).ok()) {
                status.mark_held_back(up);
            }
        }
        Ok((status, ids))
    }

    /// (fence, record, connection id) of each live holder of a semaphore's slots.
    pub(super) fn slot_holders(&self, con: &mut Conn, prefix: &str) -> Vec<(u64, Vec<u8>, u64)> {
        // At most 32 slots: the LIMIT, and `take` for a server that ignores it.
        let _stop = HardStop::arm(HARD_LIMIT, "mysql");
        let Ok(mut result) = con.query_iter(format!(
            "SELECT fence, holder, connection_id FROM {TABLE} WHERE name LIKE '{prefix}%' \
             AND name <> '{prefix}' AND IS_USED_LOCK(name) = connection_id ORDER BY fence LIMIT 64"
        )) else {
            return Vec::new();
        };
        let Some(rows) = result.iter() else {
            return Vec::new();
        };
        rows.take(64)
            .filter_map(|r| r.ok().and_then(|r| mysql::from_row_opt(r).ok()))
            .collect()
    }

    /// (fence, record, connection id) of lock `name`'s record.
    pub(super) fn holder_row(&self, con: &mut Conn, name: &str) -> Option<(u64, Vec<u8>, u64)> {
        exec_row(
            con,
            &format!("SELECT fence, holder, connection_id FROM {TABLE} WHERE name = ?"),
            (name,),
        )
        .ok()
        .flatten()
    }

    /// Who holds lock `name` now, best effort: dlock's record if the holding connection wrote
    /// it, else an application's `GET_LOCK` (with the host it connected from, where the
    /// process list shows it). `None`: free, or unknown.
    pub(super) fn holder_now(&self, con: &mut Conn, name: &str) -> Option<Holder> {
        let id: u64 = exec_row::<Option<u64>>(con, "SELECT IS_USED_LOCK(?)", (name,))
            .ok()
            .flatten()
            .flatten()?;
        Some(self.holder_of(con, name, id).0)
    }

    /// The holder of lock `name`, held by connection `id`, and whether its dlock record is
    /// unreadable.
    fn holder_of(&self, con: &mut Conn, name: &str, id: u64) -> (Holder, bool) {
        if let Some((fence, meta, conn)) = self.holder_row(con, name)
            && conn == id
        {
            let parsed = parse_record(&meta);
            let unreadable = parsed.is_none();
            let mut h = parsed.unwrap_or_default();
            h.fencing_token = Some(fence);
            h.session = Some(format!("connection {id}"));
            return (h, unreadable);
        }
        let host: Option<String> = exec_row::<Option<Vec<u8>>>(
            con,
            "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = ?",
            (id,),
        )
        .ok()
        .flatten()
        .flatten()
        .map(|h| String::from_utf8_lossy(&h).into_owned());
        let h = Holder {
            record: Record {
                host,
                ..Record::default()
            },
            foreign: Some(super::APP_HOLDS.into()),
            session: Some(format!("connection {id}")),
            ..Holder::default()
        };
        (h, false)
    }
}
