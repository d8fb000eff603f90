//! The MySQL/MariaDB backend: `GET_LOCK` on a dedicated connection (no pool, no reconnect).
//!
//! - The connection *is* the lease: the server releases the lock when it closes. The session's
//!   `wait_timeout` is set from `--ttl`, so a dead client host frees the lock within about a TTL
//!   (the server default is 8 hours), and the keeper pings every ttl/3 with
//!   `SELECT IS_USED_LOCK(name) = CONNECTION_ID()`: false or an error means lost (a broken
//!   connection cannot be re-established without losing the lock).
//! - The server does the waiting (`GET_LOCK(name, seconds)`), in slices of at most 2 s, so a wait
//!   abandoned by a dead client can never be granted long after; a signal kills the waiting query
//!   from a second connection (`KILL QUERY`), and the waiting connection is then closed, which
//!   releases anything granted in the meantime.
//! - Lock names: at most 64 characters, compared case-insensitively. A key of lower-case ASCII
//!   that fits becomes `dlock:KEY`; any other key becomes `dlock~` + 40 hex digits of its
//!   SHA-256, so `Job` and `job`, or two long keys with a common prefix, stay distinct.
//! - Fencing counter and holder metadata live in the table `dlock_locks` (created if missing),
//!   written on the lock's own connection right after acquiring.
//! - Run history: the table `dlock_runs`, written on the lock's connection (history.rs).
//! - `--limit N` (N <= 32): N slot locks `dlock#<hash>#1..N`. A run takes the first free one in
//!   one round trip (`CASE WHEN GET_LOCK(slot, 0) ...`); waiters queue on `dlock#<hash>#gate`
//!   (the server waits), and the one at the front waits on every slot at once, one connection
//!   per slot (GET_LOCK waits for one name only). One counter row gives the semaphore's fencing
//!   tokens; a holder of the key in another mode (another N, or the exclusive lock) is reported.
//! - `--shared`: GET_LOCK has no shared mode. A shared holder takes the key's lock, then a lock
//!   of its own (`dlock#<hash>#r<connection id>`) and a record of it, and lets the key's lock go;
//!   an exclusive run keeps the key's lock from the moment it asks (so no shared holder comes in
//!   past it) and waits, in GET_LOCK on each one's name, for the recorded shared holders to leave.
//!   Every lock is still a connection's, so a dead holder frees it at once; nothing is polled.
//!   (Rejected: InnoDB row locks `FOR SHARE`/`FOR UPDATE` — a transaction open for the whole
//!   run, in which the holder record and fence cannot be written without serializing readers
//!   or a second connection; see docs/backends.md.)

mod broken;
mod cluster;
mod conflict;
mod ground;
mod history;
mod lease;
mod retention;
mod rows;
mod shared;
mod slots;
mod status;
mod tls;

use std::time::Duration;

use anyhow::Context;
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder};
use sha2::{Digest, Sha256};

use super::marks::SessionMarks;
use super::{Backend, BreakHow, Broken, Lease, Reach, RenewError, Request};
use crate::backend::Grant;
use crate::clock::BootInstant;
use crate::config::redact;
use crate::exit::{Interrupted, Unavailable, Usage};
use crate::model::{BackendKind, Key, Record};
use crate::model::{Holder, Mode, Status};
use crate::signals::HardStop;

use self::conflict::{APP_HOLDS, AppHolds, conflict_holder, conflict_sql, mismatch};
use self::lease::MysqlLease;
use self::rows::{err_text, hex, last_row, last_value, parse_record, url_text};
use self::shared::{Reader, SHARED_RECORD};
use self::tls::split_tls_params;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest single GET_LOCK wait. The connection's read timeout (which also bounds the
/// handshake, and cannot be changed later) must outlast it: 2 s + 2 s keeps a black-holed
/// server's failure within about 4 s.
const MAX_SLICE: Duration = Duration::from_secs(2);

/// The longest GET_LOCK wait for a lease of `ttl`: at most a third of it. The lease is counted
/// from the moment the granting GET_LOCK was *sent* (the server's idle clock starts no earlier),
/// so a wait as long as the TTL would leave a lease that has run out on arrival (seen: a waiter
/// granted the lock after a 2 s wait with `--ttl 2s` lost it at once).
fn max_slice(ttl: Duration) -> Duration {
    MAX_SLICE.min(ttl / 3)
}
/// The session's `wait_timeout` (whole seconds) for a lease of `ttl`: rounded *up*. The server
/// drops an idle connection, and so frees its lock, `wait_timeout` after the last statement; the
/// client's lease deadline is `ttl` (less a margin) after it sent one. Rounded down, a `--ttl
/// 1900ms` gave 1 s, and a partitioned holder's lock went to a waiter while its command ran on.
fn wait_timeout_secs(ttl: Duration) -> u64 {
    super::ttl_secs_up(ttl)
}

const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/dlock";
const TABLE: &str = "dlock_locks";
/// The server's uptime in seconds, for [`super::hold_back_until`]: a restarted server has
/// forgotten its GET_LOCKs. `UUID_SHORT()` carries the server's start time (seconds since the
/// epoch) in bits 24..56 (MySQL and MariaDB document it so), and costs nothing, where
/// `SHOW GLOBAL STATUS` costs the server ~0.3 ms. (Past 2^24 calls the counter below carries into those bits, which
/// only makes the server look younger: a longer hold-back, never a shorter one.)
const UPTIME: &str =
    "CAST(UNIX_TIMESTAMP() AS SIGNED) - CAST((UUID_SHORT() >> 24) & 4294967295 AS SIGNED)";

/// The table dlock keeps fencing counters and holder metadata in (README shows it too).
pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_locks (\
name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
fence BIGINT UNSIGNED NOT NULL, \
holder TEXT NOT NULL, \
connection_id BIGINT UNSIGNED NOT NULL)";

/// The largest `--limit` on this backend: a semaphore waiter waits on every slot, with one
/// connection each.
const MAX_LIMIT: u32 = 32;

/// A semaphore's names share a prefix: `dlock#` + 40 hex digits of the key's SHA-256 + `#`. The
/// prefix itself names its fencing counter row, `<prefix>gate` the lock its waiters queue on,
/// `<prefix><i>` slot i. `#` appears in no [`lock_name`].
pub fn slot_prefix(key: &Key) -> String {
    let digest = Sha256::digest(key.as_str().as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("dlock#{hex}#")
}

/// Locks on one MySQL or MariaDB server.
pub(crate) struct MysqlBackend {
    opts: Opts,
    /// Whether this process reached the server (see [`Reach`]).
    reach: Reach,
    /// host:port/database, without credentials.
    addr: String,
    /// `?cluster=one-node`: the user states that every dlock uses this one node of its
    /// cluster (see cluster.rs).
    one_node: bool,
}

/// The server-side lock name for a key (see the module doc).
pub fn lock_name(key: &Key) -> String {
    let k = key.as_str();
    let plain = k
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase() || b == b' ');
    if plain && k.len() + 6 <= 64 {
        return format!("dlock:{k}");
    }
    let digest = Sha256::digest(k.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("dlock~{hex}")
}

/// The longest any one statement may take before [`HardStop`] ends dlock (exit 69): above the
/// longest server-side wait plus the read timeout, so that it only stops a server that keeps a
/// reply coming a byte at a time (each byte restarts the crate's read timeout).
const HARD_LIMIT: Duration = Duration::from_secs(8);

impl MysqlBackend {
    /// `urls` empty: `mysql://root@127.0.0.1:3306/dlock`; one URL: that server.
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<MysqlBackend> {
        let url = match urls {
            [] => DEFAULT_URL,
            [u] => u.as_str(),
            _ => return Err(Usage("the mysql backend takes one --url".into()).into()),
        };
        let url = url.replacen("mariadb://", "mysql://", 1);
        let (url, one_node) = cluster::split_cluster_param(&url)?;
        let (url, ssl) = split_tls_params(&url)?;
        let mut opts: Opts = Opts::from_url(&url).map_err(|e| {
            Usage(format!(
                "bad mysql URL '{}': {}",
                redact(&url),
                url_text(&e)
            ))
        })?;
        if let Some(ssl) = ssl {
            // As for Redis: rustls needs a crypto provider; an error means one is installed.
            let _ = rustls::crypto::ring::default_provider().install_default();
            opts = OptsBuilder::from_opts(opts).ssl_opts(ssl).into();
        }
        let addr = format!(
            "{}:{}/{}",
            opts.get_ip_or_hostname(),
            opts.get_tcp_port(),
            opts.get_db_name().unwrap_or("")
        );
        Ok(MysqlBackend {
            opts,
            addr,
            reach: Reach::default(),
            one_node,
        })
    }

    /// A dedicated connection: TCP even on loopback (the crate would silently switch to the unix
    /// socket), bounded connect and read times, no pool, no reconnect.
    fn connect(&self, read_timeout: Duration) -> anyhow::Result<Conn> {
        let opts = OptsBuilder::from_opts(self.opts.clone())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(CONNECT_TIMEOUT))
            .read_timeout(Some(read_timeout))
            .write_timeout(Some(COMMAND_TIMEOUT))
            // Given, the crate skips its `SELECT @@max_allowed_packet` round trip; dlock's
            // statements are tiny.
            .max_allowed_packet(Some(1 << 20));
        // The crate bounds each read, not the handshake: a server dripping its greeting would
        // keep dlock here for ever, deaf to signals.
        let _stop = HardStop::arm(
            CONNECT_TIMEOUT + read_timeout + COMMAND_TIMEOUT,
            &format!("mysql: {}", self.addr),
        );
        let con = Conn::new(opts).map_err(|e| match e {
            mysql::Error::IoError(_) | mysql::Error::DriverError(_) => self
                .reach
                .transport_error(format!("cannot connect to {}: {}", self.addr, err_text(&e))),
            e => Unavailable(format!("cannot connect to {}: {}", self.addr, err_text(&e))).into(),
        })?;
        self.reach.connected();
        Ok(con)
    }

    /// A failed statement: an [`Outage`](crate::exit::Outage) when the connection broke or
    /// timed out (after the server was reached), else [`Unavailable`] (what the server answered).
    fn fail(&self, e: mysql::Error) -> anyhow::Error {
        match e {
            mysql::Error::IoError(_)
            | mysql::Error::CodecError(_)
            | mysql::Error::DriverError(_) => {
                self.reach
                    .transport_error(format!("{}: {}", self.addr, err_text(&e)))
            }
            e => Unavailable(format!("{}: {}", self.addr, err_text(&e))).into(),
        }
    }

    /// Records the new holder and bumps the fence, on the lock's own connection, in one round
    /// trip. The fence lives in the row `counter` (the lock's own row, or the key's counter for
    /// a semaphore slot or a shared holder); the first token of a counter is the server clock in
    /// microseconds (as for the other backends). `conflict` is an SQL expression giving the
    /// metadata of a holder of the key in another mode, or NULL. A shared holder (`reader`)
    /// also deletes the records of shared holders that are gone, and lets the key's lock go —
    /// after its record is committed, so that an exclusive run that takes the key's lock next
    /// sees it. Returns the token, that conflicting holder, and the server's uptime in seconds
    /// ([`UPTIME`], in the same row).
    fn record(
        &self,
        con: &mut Conn,
        name: &str,
        counter: &str,
        holder: &Record,
        conflict: &str,
        reader: Option<&Reader>,
    ) -> anyhow::Result<(u64, Option<Holder>, u64)> {
        let meta = rows::record_text(holder)?;
        // Text protocol: the values are hex literals, so nothing needs escaping.
        let seed = retention::first_token();
        let read = retention::READ_FLOOR;
        let upsert = "ON DUPLICATE KEY UPDATE fence = fence + 1, holder = VALUES(holder), \
                      connection_id = VALUES(connection_id)";
        let sql = if name == counter {
            format!(
                "{read}INSERT INTO {TABLE} (name, fence, holder, connection_id) \
                 VALUES (X'{n}', {seed}, CONVERT(X'{m}' USING utf8mb4), CONNECTION_ID()) {upsert}; \
                 SELECT fence, {conflict}, {UPTIME} FROM {TABLE} WHERE name = X'{n}'",
                n = hex(name),
                m = hex(&meta)
            )
        } else {
            let (inside, after) = match reader {
                Some(r) => (
                    format!(
                        "DELETE FROM {TABLE} WHERE name LIKE '{}%' AND IS_USED_LOCK(name) IS NULL; ",
                        r.pattern
                    ),
                    format!("DO RELEASE_LOCK(X'{}'); ", hex(&r.main)),
                ),
                None => (String::new(), String::new()),
            };
            // One transaction: one log flush instead of two or three.
            format!(
                "{read}BEGIN; \
                 INSERT INTO {TABLE} (name, fence, holder, connection_id) \
                 VALUES (X'{c}', {seed}, '', 0) ON DUPLICATE KEY UPDATE fence = fence + 1; \
                 SELECT fence INTO @dlock_fence FROM {TABLE} WHERE name = X'{c}'; \
                 INSERT INTO {TABLE} (name, fence, holder, connection_id) \
                 VALUES (X'{n}', @dlock_fence, CONVERT(X'{m}' USING utf8mb4), CONNECTION_ID()) \
                 ON DUPLICATE KEY UPDATE fence = @dlock_fence, holder = VALUES(holder), \
                 connection_id = VALUES(connection_id); \
                 {inside}COMMIT; {after}\
                 SELECT @dlock_fence, {conflict}, {UPTIME}",
                c = hex(counter),
                n = hex(name),
                m = hex(&meta)
            )
        };
        let mut result = last_row::<(u64, Option<Vec<u8>>, i64)>(con, &sql);
        if let Err(mysql::Error::MySqlError(e)) = &result
            && e.code == 1146
        {
            // Table missing: create it once, then retry.
            con.query_drop(CREATE_TABLE).map_err(|e| {
                anyhow::anyhow!(
                    "cannot create table {TABLE} on {} ({}); create it as an administrator, see README",
                    self.addr,
                    err_text(&e)
                )
            })?;
            result = last_row(con, &sql);
        }
        if let Err(mysql::Error::MySqlError(e)) = &result
            && e.code == 1142
        {
            // The server says "denied" before it says "missing".
            anyhow::bail!(
                "cannot create table {TABLE} or write to it on {}: the user lacks the privilege \
                 ({}); create it and grant SELECT, INSERT, UPDATE on it, see README",
                self.addr,
                e.message
            );
        }
        let (fence, conflict, uptime) = result
            .map_err(|e| self.fail(e))
            .context("cannot record the holder")?
            .context("the fencing counter vanished")?;
        let conflict = conflict.map(|m| conflict_holder(&m).unwrap_or_default());
        // A clock stepped back since the start reads as a server just started.
        Ok((fence, conflict, u64::try_from(uptime).unwrap_or(0)))
    }
}

impl Backend for MysqlBackend {
    /// The locks held now, from `dlock_locks` (see `status.rs`).
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.list_locks()
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Mysql
    }

    fn location(&self) -> String {
        self.addr.clone()
    }

    fn unsupported(&self, mode: Mode) -> Option<String> {
        match mode {
            Mode::Limit(n) if n > MAX_LIMIT => Some(format!(
                "--limit {n} is too large for the mysql backend (at most {MAX_LIMIT}: a waiter \
                 waits on every slot, with one connection each)"
            )),
            _ => None,
        }
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        match req.mode {
            Mode::Limit(n) => return self.acquire_slot(req, n),
            Mode::Shared => return self.acquire_shared(req),
            Mode::Exclusive => {}
        }
        let name = lock_name(req.key);
        let (con, sent) = self.get_lock(&name, req)?;
        self.lease(con, name.clone(), &name, req, sent)
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        self.status_of(key)
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        let prefix = slot_prefix(key);
        con.exec_drop(
            format!("DELETE FROM {TABLE} WHERE name = ? OR name LIKE ?"),
            (lock_name(key), format!("{prefix}%")),
        )
        .map_err(|e| self.fail(e))?;
        self.purge_history(&mut con, key)
    }

    fn prune(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        self.prune_keys(older_than, most)
    }

    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        self.break_by_marks(key, how)
    }

    fn await_broken(
        &self,
        key: &Key,
        broken: &Broken,
        deadline: crate::model::Deadline,
    ) -> anyhow::Result<bool> {
        self.await_marked(key, broken, deadline)
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        self.history_of(key)
    }

    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_with_history()
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        self.end_on_new_connection(key, end)
    }

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<crate::backend::ground::Finding>> {
        self.doctor_checks(ttl)
    }
}

impl MysqlBackend {
    /// The lease for lock `name`, just granted to `con`: records the holder (fence from
    /// `counter`) and checks that no holder of the key uses another mode. On error `con` is
    /// dropped, which releases the lock.
    fn lease(
        &self,
        mut con: Conn,
        name: String,
        counter: &str,
        req: &Request<'_>,
        sent: BootInstant,
    ) -> anyhow::Result<Box<dyn Lease>> {
        let conflict = conflict_sql(req.key, req.mode);
        let reader = (req.mode == Mode::Shared).then(|| Reader {
            main: counter.to_string(),
            pattern: format!("{}r", slot_prefix(req.key)),
        });
        let start = req
            .start
            .filter(|_| req.mode == Mode::Exclusive && name == counter);
        let folded = match start {
            Some(start) => {
                history::record_starting(&mut con, &name, req.key, req.holder, &conflict, start)
            }
            None => None,
        };
        let (fence, theirs, uptime, started) = match folded {
            Some(r) => r,
            None => {
                let (fence, theirs, uptime) = self.record(
                    &mut con,
                    &name,
                    counter,
                    req.holder,
                    &conflict,
                    reader.as_ref(),
                )?;
                (fence, theirs, uptime, false)
            }
        };
        let mut acquired_at = sent;
        match theirs {
            Some(h) if req.mode == Mode::Exclusive && h.mode == Some(Mode::Shared) => {
                acquired_at = self.drain_readers(&mut con, req, &h)?;
            }
            Some(h) => return Err(mismatch(req, &h)),
            None => {}
        }
        Ok(Box::new(MysqlLease {
            con: Some(con),
            name,
            // Shared holders and semaphore slots are invisible to an application's GET_LOCK
            // on the key's name: the keeper watches that name.
            watch: (req.mode != Mode::Exclusive).then(|| lock_name(req.key)),
            intruder: None,
            history: (req.mode == Mode::Exclusive).then(|| req.key.clone()),
            started,
            addr: self.addr.clone(),
            ttl: req.ttl,
            grant: Grant {
                fence: Some(fence),
                acquired_at,
                held_back_until: super::hold_back_until(uptime, req.ttl),
            },
            hangup: None,
            failed: None,
        }))
    }

    /// A holder in another mode, else the error `busy` makes.
    fn mismatch_or(
        &self,
        con: &mut Conn,
        req: &Request<'_>,
        busy: impl Fn(&mut Conn) -> anyhow::Error,
    ) -> anyhow::Error {
        let conflict = conflict_sql(req.key, req.mode);
        let theirs: Option<Vec<u8>> = last_value(con, &format!("SELECT {conflict}"))
            .ok()
            .flatten();
        match theirs.and_then(|m| conflict_holder(&m)) {
            Some(h) if h.foreign.is_some() => req.busy(Some(&h)),
            Some(h) => mismatch(req, &h),
            None => busy(con),
        }
    }

    /// `GET_LOCK(name)` on a new connection whose `wait_timeout` follows `--ttl`, waiting (by
    /// the server, in slices) until `req.deadline`; returns the connection that holds it and
    /// when the request that got it was sent.
    fn get_lock(&self, name: &str, req: &Request<'_>) -> anyhow::Result<(Conn, BootInstant)> {
        // One connection for the whole wait (a failed GET_LOCK leaves it usable); its read
        // timeout outlasts the longest server-side wait.
        let mut con = self.connect(MAX_SLICE + COMMAND_TIMEOUT)?;
        let mut sent = BootInstant::now();
        // First a try without waiting, in the same round trip as the session's wait_timeout (a
        // dead client host keeps its lock until the server drops the idle connection, 8 h by
        // default) and the question of a cluster (a node of one is refused, `?` drops `con`).
        // The name is a hex literal: safe to inline, and visible in PROCESSLIST.
        let first =
            self.first_take(&mut con, req.ttl, &format!("GET_LOCK(X'{}', 0)", hex(name)))?;
        let mut got: mysql::Result<Option<Option<i64>>> = Ok(Some(first));
        let mut told_holder = false;
        loop {
            match got {
                Ok(Some(Some(1))) => return Ok((con, sent)),
                Ok(_) => {}
                // Any error leaves the outcome unknown: `con` is dropped, which releases it.
                Err(e) => return Err(self.fail(e)),
            }
            let holder = self.holder_now(&mut con, name);
            if req.waited_out() {
                return Err(req.busy(holder.as_ref()));
            }
            let longest = max_slice(req.ttl);
            let slice = req.deadline.remaining().map_or(longest, |d| d.min(longest));
            if !told_holder {
                if let Some(h) = &holder {
                    (req.on_holder)(h);
                }
                told_holder = true;
            }
            // `?`: on a signal `con` is dropped, which releases anything granted meanwhile.
            (got, sent) = self.wait_slice(&mut con, name, slice, req)?;
        }
    }

    /// One wait in the server for lock `name` on `con`, at most `slice` long: GET_LOCK's answer
    /// (NULL when the wait was killed) and when it was sent. A signal kills the wait from a
    /// second connection (`KILL QUERY`) and makes this [`Interrupted`]; the caller then drops
    /// `con`, which releases anything granted in the meantime.
    fn wait_slice(
        &self,
        con: &mut Conn,
        name: &str,
        slice: Duration,
        req: &Request<'_>,
    ) -> anyhow::Result<(mysql::Result<Option<Option<i64>>>, BootInstant)> {
        let id = con.connection_id();
        let opts = self.clone_for_waker();
        let blocked = crate::signals::Blocked::new();
        let killer = std::sync::Mutex::new(None::<Conn>);
        let _guard = req.interrupt.on_fire(blocked.waker(move || {
            // Runs on the signal watcher thread while this thread waits in GET_LOCK.
            let mut c = killer.lock().unwrap_or_else(|e| e.into_inner());
            if c.is_none() {
                *c = Conn::new(opts.clone()).ok();
            }
            if let Some(c) = c.as_mut() {
                let _ = c.query_drop(format!("KILL QUERY {id}"));
            }
        }))?;
        if let Some(sig) = req.interrupt.fired() {
            blocked.done();
            return Err(Interrupted(sig).into());
        }
        let sent = BootInstant::now();
        let got = last_value(
            con,
            &format!(
                "SELECT GET_LOCK(X'{}', {:.3})",
                hex(name),
                slice.as_secs_f64()
            ),
        );
        blocked.done();
        if let Some(sig) = req.interrupt.fired() {
            return Err(Interrupted(sig).into());
        }
        Ok((got, sent))
    }

    fn clone_for_waker(&self) -> Opts {
        OptsBuilder::from_opts(self.opts.clone())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(1)))
            .read_timeout(Some(Duration::from_secs(1)))
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_timeout_is_never_shorter_than_the_lease() {
        for (ms, secs) in [
            (300, 1),
            (1000, 1),
            (1001, 2),
            (1900, 2),
            (2500, 3),
            (30_000, 30),
        ] {
            let ttl = Duration::from_millis(ms);
            assert_eq!(wait_timeout_secs(ttl), secs, "{ttl:?}");
            assert!(Duration::from_secs(wait_timeout_secs(ttl)) >= ttl);
        }
    }
}
