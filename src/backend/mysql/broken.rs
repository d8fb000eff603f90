//! `dlock break` on MySQL/MariaDB. A lock lives as long as its holder's connection: there is no
//! lease to wait out, and ending the connection (`KILL`, `--force`) hands the lock to a waiter
//! at once while the holder's command still runs. A safe break ends nothing: it takes, on a
//! connection of its own, one more user lock per holder — the mark [`mark_sql`] names from the
//! holder's connection id — and keeps it until the holders are gone. Each holder's renewal asks
//! about its own mark in the statement it sends anyway (`IS_USED_LOCK`), stops its command as
//! on any loss, and only then releases: the waiters, woken by the server, get the lock then.
//!
//! A connection id is never reused while the server runs, so a mark can only ever stop the
//! holder it was taken for (a later holder of the key has another connection), and it goes with
//! break's connection (or with the server: then the lock went too). Behind a proxy that hands
//! one server connection to several clients (ProxySQL's multiplexing), a later client on the
//! same connection within break's 200 ms look could see the mark: it would stop, never run
//! beside anyone.

use std::cell::RefCell;
use std::rc::Rc;

use mysql::Conn;
use mysql::prelude::Queryable;

use super::rows::{err_text, last_value};
use super::{COMMAND_TIMEOUT, MysqlBackend, lock_name, slot_prefix};
use crate::backend::{Broken, marks};
use crate::model::{Key, Status};

/// Break's connection, which holds the marks.
type Shared = Rc<RefCell<Conn>>;

/// The mark on the holder whose connection id is the SQL expression `id`: a lock name outside
/// every name dlock locks (`dlock:`, `dlock~`, `dlock#`), at most 33 characters.
pub(super) fn mark_sql(id: &str) -> String {
    format!("CONCAT('dlock!broken:', {id})")
}

impl marks::SessionMarks for MysqlBackend {
    type Kept = Shared;

    /// A safe break: marks every dlock holder of `key` (see the module doc).
    fn break_safe(&self, key: &Key) -> anyhow::Result<Broken> {
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        // The marks live as long as this connection: the server must not drop it as idle
        // (a server-wide `wait_timeout` may be short) while the holders stop. A break whose host
        // died leaves marks that only ever reach the holders it broke.
        con.query_drop("SET SESSION wait_timeout = 31536000")
            .map_err(|e| self.fail(e))?;
        let con = Rc::new(RefCell::new(con));
        marks::mark_holders(
            || self.status_on(&mut con.borrow_mut(), key),
            |ids: &[u64]| {
                for id in ids {
                    // 0: another break holds this mark already; the holder is told all the same.
                    last_value::<Option<i64>>(
                        &mut con.borrow_mut(),
                        &format!("SELECT GET_LOCK({}, 0)", mark_sql(&id.to_string())),
                    )
                    .map_err(|e| self.fail(e).context("cannot take the break's mark"))?;
                }
                Ok(())
            },
            || Box::new(con.clone()) as Box<dyn std::any::Any>,
        )
    }

    fn status_on_kept(&self, con: &Shared, key: &Key) -> anyhow::Result<Status> {
        Ok(self.status_on(&mut con.borrow_mut(), key)?.0)
    }

    fn status_fresh(&self, key: &Key) -> anyhow::Result<Status> {
        self.status_of(key)
    }

    /// `--force`: ends the holders' connections, which frees their locks at once.
    fn break_forced(&self, key: &Key) -> anyhow::Result<Broken> {
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        let (status, ids) = self.status_on(&mut con, key)?;
        // The holders status shows, and a holder of the key's name it does not show (an
        // exclusive run waiting for the shared holders to leave), as before.
        let main: Option<u64> = last_value(
            &mut con,
            &format!(
                "SELECT IS_USED_LOCK(X'{}')",
                super::rows::hex(&lock_name(key))
            ),
        )
        .map_err(|e| self.fail(e))?;
        let slots = self
            .slot_holders(&mut con, &slot_prefix(key))
            .into_iter()
            .map(|(_, _, id)| id);
        let mut all: Vec<u64> = ids.into_iter().chain(main).chain(slots).collect();
        all.sort_unstable();
        all.dedup();
        for id in all {
            match con.query_drop(format!("KILL {id}")) {
                Ok(()) => {}
                // 1094: no such thread (it left meanwhile).
                Err(mysql::Error::MySqlError(e)) if e.code == 1094 => {}
                Err(e) => anyhow::bail!(
                    "cannot kill connection {id} that holds the lock ({}); this needs the \
                     CONNECTION_ADMIN (or SUPER) privilege, or the holder's user",
                    err_text(&e)
                ),
            }
        }
        Ok(Broken::now(status))
    }
}

impl MysqlBackend {
    /// Whether a break's mark is on the holder with connection `id`.
    pub(super) fn marked(&self, con: &mut Conn, id: u64) -> bool {
        last_value::<Option<i64>>(
            con,
            &format!(
                "SELECT IS_USED_LOCK({}) IS NOT NULL",
                mark_sql(&id.to_string())
            ),
        )
        .ok()
        .flatten()
        .flatten()
            == Some(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_the_one_the_docs_name_and_no_lock_of_a_key() {
        // docs/backends.md gives applications this name.
        assert_eq!(mark_sql("7"), "CONCAT('dlock!broken:', 7)");
        let longest = format!("dlock!broken:{}", u64::MAX);
        assert!(longest.len() <= 64);
        for k in ["broken:7", "x"] {
            let key = Key::new(k).unwrap();
            assert!(!lock_name(&key).starts_with("dlock!"));
            assert!(!slot_prefix(&key).starts_with("dlock!"));
        }
    }
}
