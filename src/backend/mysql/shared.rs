//! `--shared` on a server whose GET_LOCK is exclusive only: a shared holder takes the key's lock,
//! then a lock of its own and a record of it, and lets the key's lock go; an exclusive run keeps
//! the key's lock from the moment it asks and waits for the recorded shared holders to leave.

use mysql::Conn;
use mysql::prelude::Queryable;

use super::rows::{hex, last_row, last_value, parse_record};
use super::{MysqlBackend, TABLE, lock_name, max_slice, slot_prefix};
use crate::backend::{Lease, Request};
use crate::clock::BootInstant;
use crate::exit::Unavailable;
use crate::model::Holder;
use crate::model::Key;

/// SQL `LIKE` pattern: the record of a shared holder.
pub(super) const SHARED_RECORD: &str = "%\"mode\":\"shared\"%";

/// A shared holder registering: it holds the key's lock `main` until its record is committed,
/// and cleans up the records of shared holders that are gone (names starting with `pattern`).
pub(super) struct Reader {
    pub(super) main: String,
    pub(super) pattern: String,
}

/// A shared holder's own lock name: `<prefix>r<connection id>` (see [`slot_prefix`]); unique,
/// since the server never reuses a connection id while it runs.
fn reader_name(key: &Key, connection_id: u32) -> String {
    format!("{}r{connection_id}", slot_prefix(key))
}

impl MysqlBackend {
    /// `--shared`: the key's own lock (waiting, in the server, behind an exclusive holder or an
    /// exclusive run that waits), then the holder's own lock [`reader_name`] and its record,
    /// then the key's lock goes back. An exclusive run holds the key's lock from the moment it
    /// asks until it ends, so no shared holder comes in past it (writers are not starved), and
    /// it waits for the shared holders recorded before it ([`Self::drain_readers`]).
    pub(super) fn acquire_shared(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let main = lock_name(req.key);
        let (mut con, sent) = self.get_lock(&main, req)?;
        let own = reader_name(req.key, con.connection_id());
        let got: Option<i64> =
            last_value(&mut con, &format!("SELECT GET_LOCK(X'{}', 0)", hex(&own)))
                .map_err(|e| self.fail(e))?;
        if got != Some(1) {
            return Err(Unavailable(format!(
                "{}: lock {own}, this shared holder's own name, is held by another connection",
                self.addr
            ))
            .into());
        }
        self.lease(con, own, &main, req, sent)
    }

    /// An exclusive run that holds the key's lock waits for the shared holders to leave, one at
    /// a time: GET_LOCK on each one's own name (the server wakes it when that holder lets go),
    /// until no recorded shared holder is live. None can come in meanwhile. Returns when the
    /// last check was sent: the server's idle clock, which ends the lease, starts later.
    pub(super) fn drain_readers(
        &self,
        con: &mut Conn,
        req: &Request<'_>,
        first: &Holder,
    ) -> anyhow::Result<BootInstant> {
        let live = format!(
            "SELECT name, holder FROM {TABLE} WHERE name LIKE '{}r%' \
             AND IS_USED_LOCK(name) = connection_id LIMIT 1",
            slot_prefix(req.key)
        );
        (req.on_holder)(first);
        loop {
            let asked = BootInstant::now();
            let Some((name, meta)) =
                last_row::<(String, Vec<u8>)>(con, &live).map_err(|e| self.fail(e))?
            else {
                return Ok(asked);
            };
            if req.waited_out() {
                let holder = parse_record(&meta);
                return Err(req.busy(holder.as_ref()));
            }
            let longest = max_slice(req.ttl);
            let slice = req.deadline.remaining().map_or(longest, |d| d.min(longest));
            let (got, _) = self.wait_slice(con, &name, slice, req)?;
            if got.map_err(|e| self.fail(e))? == Some(Some(1)) {
                con.query_drop(format!("DO RELEASE_LOCK(X'{}')", hex(&name)))
                    .map_err(|e| self.fail(e))?;
            }
        }
    }
}
