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

use std::time::Duration;

use anyhow::Context;
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder};
use sha2::{Digest, Sha256};

use super::{Backend, Holder, Lease, RenewError, Request, Status};
use crate::clock::BootInstant;
use crate::config::{BackendKind, Key, redact};
use crate::exit::{Interrupted, Unavailable, Usage};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest single GET_LOCK wait. The connection's read timeout (which also bounds the
/// handshake, and cannot be changed later) must outlast it: 2 s + 2 s keeps a black-holed
/// server's failure within about 4 s.
const MAX_SLICE: Duration = Duration::from_secs(2);
const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/dlock";
const TABLE: &str = "dlock_locks";

/// The table dlock keeps fencing counters and holder metadata in (README shows it too).
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_locks (\
name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
fence BIGINT UNSIGNED NOT NULL, \
holder TEXT NOT NULL, \
connection_id BIGINT UNSIGNED NOT NULL)";

/// Locks on one MySQL or MariaDB server.
pub struct MysqlBackend {
    opts: Opts,
    /// host:port/database, without credentials.
    addr: String,
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

/// Takes MySQL's own TLS parameter names out of the URL (the client crate does not know them):
/// `ssl-mode=DISABLED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY` and `ssl-ca=/path/ca.pem`. A CA without
/// a mode means VERIFY_IDENTITY; no parameter means no TLS.
fn split_tls_params(url: &str) -> Result<(String, Option<mysql::SslOpts>), Usage> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let (mut mode, mut ca, mut rest) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("ssl-mode" | "ssl_mode" | "sslmode", v)) => mode = Some(v.to_ascii_uppercase()),
            Some(("ssl-ca" | "ssl_ca" | "sslca", v)) => ca = Some(std::path::PathBuf::from(v)),
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let mode = mode.unwrap_or_else(|| {
        if ca.is_some() {
            "VERIFY_IDENTITY".into()
        } else {
            "DISABLED".into()
        }
    });
    let ssl = mysql::SslOpts::default().with_root_cert_path(ca.map(std::borrow::Cow::Owned));
    let ssl = match mode.as_str() {
        "DISABLED" => return Ok((url, None)),
        // Encrypted, but the server is not authenticated (as MySQL's own REQUIRED).
        "REQUIRED" => ssl.with_danger_accept_invalid_certs(true),
        "VERIFY_CA" => ssl.with_danger_skip_domain_validation(true),
        "VERIFY_IDENTITY" => ssl,
        other => {
            return Err(Usage(format!(
                "bad ssl-mode '{other}' in mysql URL: expected DISABLED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
            )));
        }
    };
    Ok((url, Some(ssl)))
}

/// Runs `sql` (possibly several statements) and returns the first column of the first row of
/// its last result set.
fn last_value<T: mysql::prelude::FromValue>(con: &mut Conn, sql: &str) -> mysql::Result<Option<T>> {
    let mut result = con.query_iter(sql)?;
    let mut value = None;
    while let Some(set) = result.iter() {
        for row in set {
            let row = row?;
            if value.is_none() {
                value = row
                    .get_opt::<T, usize>(0)
                    .transpose()
                    .map_err(|e| mysql::Error::FromValueError(e.0))?;
            }
        }
    }
    Ok(value)
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

impl MysqlBackend {
    /// `urls` empty: `mysql://root@127.0.0.1:3306/dlock`; one URL: that server.
    pub fn open(urls: &[String]) -> anyhow::Result<MysqlBackend> {
        let url = match urls {
            [] => DEFAULT_URL,
            [u] => u.as_str(),
            _ => return Err(Usage("the mysql backend takes one --url".into()).into()),
        };
        let url = url.replacen("mariadb://", "mysql://", 1);
        let (url, ssl) = split_tls_params(&url)?;
        let mut opts: Opts = Opts::from_url(&url)
            .map_err(|e| Usage(format!("bad mysql URL '{}': {e}", redact(&url))))?;
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
        Ok(MysqlBackend { opts, addr })
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
        Conn::new(opts)
            .map_err(|e| Unavailable(format!("cannot connect to {}: {e}", self.addr)).into())
    }

    fn fail(&self, e: mysql::Error) -> anyhow::Error {
        Unavailable(format!("{}: {e}", self.addr)).into()
    }

    /// Records the new holder and bumps the fence, on the lock's own connection. The first
    /// token of a name is the server clock in microseconds (as for the other backends).
    fn record(&self, con: &mut Conn, name: &str, holder: &Holder) -> anyhow::Result<u64> {
        let meta = serde_json::to_string(holder)?;
        // One round trip, text protocol: the values are hex literals, so nothing needs escaping.
        let sql = format!(
            "INSERT INTO {TABLE} (name, fence, holder, connection_id) \
             VALUES (X'{n}', CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED), CONVERT(X'{m}' USING utf8mb4), CONNECTION_ID()) \
             ON DUPLICATE KEY UPDATE fence = fence + 1, holder = VALUES(holder), connection_id = VALUES(connection_id); \
             SELECT fence FROM {TABLE} WHERE name = X'{n}'",
            n = hex(name),
            m = hex(&meta)
        );
        let mut result = last_value::<u64>(con, &sql);
        if let Err(mysql::Error::MySqlError(e)) = &result {
            if e.code == 1146 {
                // Table missing: create it once, then retry.
                con.query_drop(CREATE_TABLE).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create table {TABLE} on {} ({e}); create it as an administrator, see README",
                        self.addr
                    )
                })?;
                result = last_value::<u64>(con, &sql);
            }
        }
        if let Err(mysql::Error::MySqlError(e)) = &result {
            if e.code == 1142 {
                // The server says "denied" before it says "missing".
                anyhow::bail!(
                    "cannot create table {TABLE} or write to it on {}: the user lacks the privilege \
                     ({}); create it and grant SELECT, INSERT, UPDATE on it, see README",
                    self.addr,
                    e.message
                );
            }
        }
        let fence = result
            .map_err(|e| self.fail(e))
            .context("cannot record the holder")?;
        fence.context("the fencing counter vanished")
    }

    fn holder_row(&self, con: &mut Conn, name: &str) -> Option<(u64, String, u64)> {
        con.exec_first(
            format!("SELECT fence, holder, connection_id FROM {TABLE} WHERE name = ?"),
            (name,),
        )
        .ok()
        .flatten()
    }
}

impl Backend for MysqlBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Mysql
    }

    fn location(&self) -> String {
        self.addr.clone()
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let name = lock_name(req.key);
        let ttl_secs = req.ttl.as_secs().max(1);
        // One connection for the whole wait (a failed GET_LOCK leaves it usable); its read
        // timeout outlasts the longest server-side wait.
        let mut con = self.connect(MAX_SLICE + COMMAND_TIMEOUT)?;
        let id = con.connection_id();
        let mut sent = BootInstant::now();
        // First a try without waiting, in the same round trip as the session's wait_timeout (a
        // dead client host keeps its lock until the server drops the idle connection, 8 h by
        // default). The name is a hex literal: safe to inline, and visible in PROCESSLIST.
        let mut got: mysql::Result<Option<Option<i64>>> = last_value(
            &mut con,
            &format!(
                "SET SESSION wait_timeout = {ttl_secs}; SELECT GET_LOCK(X'{}', 0)",
                hex(&name)
            ),
        );
        let mut told_holder = false;
        loop {
            match got {
                Ok(Some(Some(1))) => {
                    // On error `con` is dropped, which releases the lock.
                    let fence = self.record(&mut con, &name, req.holder)?;
                    return Ok(Box::new(MysqlLease {
                        con: Some(con),
                        name,
                        addr: self.addr.clone(),
                        ttl: req.ttl,
                        fence,
                        acquired_at: sent,
                    }));
                }
                Ok(_) => {}
                // Any error leaves the outcome unknown: `con` is dropped, which releases it.
                Err(e) => return Err(self.fail(e)),
            }
            let holder = self
                .holder_row(&mut con, &name)
                .and_then(|(_, h, _)| serde_json::from_str::<Holder>(&h).ok());
            if req.waited_out() {
                return Err(req.busy(holder.as_ref()));
            }
            let slice = req
                .deadline
                .remaining()
                .map_or(MAX_SLICE, |d| d.min(MAX_SLICE));
            if !told_holder {
                if let Some(h) = &holder {
                    (req.on_holder)(h);
                }
                told_holder = true;
            }
            // Waiting: a signal must be able to end the wait, from another connection.
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
            sent = BootInstant::now();
            // NULL when the wait was killed (KILL QUERY), hence Option<Option<_>>.
            got = last_value(
                &mut con,
                &format!(
                    "SELECT GET_LOCK(X'{}', {:.3})",
                    hex(&name),
                    slice.as_secs_f64()
                ),
            );
            blocked.done();
            if let Some(sig) = req.interrupt.fired() {
                drop(con); // closing releases anything granted meanwhile
                return Err(Interrupted(sig).into());
            }
        }
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let name = lock_name(key);
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        let holder_id: Option<u64> = con
            .exec_first("SELECT IS_USED_LOCK(?)", (&name,))
            .map_err(|e| self.fail(e))?
            .flatten();
        // Waiters are the sessions blocked in GET_LOCK on this name (visible to the same user, or
        // to all with the PROCESS privilege).
        let pattern = format!("%GET_LOCK(X'{}'%", hex(&name));
        let waiters: Option<u64> = con
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
                (&pattern,),
            )
            .ok()
            .flatten();
        let location = format!("{} (lock name {name})", self.addr);
        let mut status = Status {
            held: holder_id.is_some(),
            waiters,
            ..Status::new(key, self.kind(), location)
        };
        if let Some(id) = holder_id {
            let mut h = Holder::default();
            if let Some((fence, meta, conn)) = self.holder_row(&mut con, &name) {
                if conn == id {
                    h = serde_json::from_str(&meta).unwrap_or_default();
                    h.fencing_token = Some(fence);
                }
            }
            status.notes.push(format!("held by connection {id}"));
            status.holders.push(h);
        }
        Ok(status)
    }

    fn break_lock(&self, key: &Key) -> anyhow::Result<Status> {
        let status = self.status(key)?;
        let name = lock_name(key);
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        let holder_id: Option<u64> = con
            .exec_first("SELECT IS_USED_LOCK(?)", (&name,))
            .map_err(|e| self.fail(e))?
            .flatten();
        if let Some(id) = holder_id {
            con.query_drop(format!("KILL {id}")).map_err(|e| {
                anyhow::anyhow!(
                    "cannot kill connection {id} that holds the lock ({e}); \
                     this needs the CONNECTION_ADMIN (or SUPER) privilege, or the holder's user"
                )
            })?;
        }
        Ok(status)
    }
}

impl MysqlBackend {
    fn clone_for_waker(&self) -> Opts {
        OptsBuilder::from_opts(self.opts.clone())
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(1)))
            .read_timeout(Some(Duration::from_secs(1)))
            .into()
    }
}

/// A held GET_LOCK: the lock lives exactly as long as `con`.
struct MysqlLease {
    con: Option<Conn>,
    name: String,
    addr: String,
    ttl: Duration,
    fence: u64,
    acquired_at: BootInstant,
}

impl Lease for MysqlLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fence)
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn acquired_at(&self) -> BootInstant {
        self.acquired_at
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let Some(con) = self.con.as_mut() else {
            return Err(RenewError::Lost("the lock's connection is gone".into()));
        };
        let mine: mysql::Result<Option<Option<i64>>> =
            con.exec_first("SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (&self.name,));
        match mine {
            Ok(Some(Some(1))) => Ok(()),
            Ok(_) => Err(RenewError::Lost(format!(
                "{}: lock {} is no longer held by this connection",
                self.addr, self.name
            ))),
            Err(e) => {
                // The connection is the lease: once it fails, the server has (or will have)
                // released the lock, and reconnecting cannot get it back.
                self.con = None;
                Err(RenewError::Lost(format!(
                    "{}: the lock's connection failed: {e}",
                    self.addr
                )))
            }
        }
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        if let Some(mut con) = self.con.take() {
            let _ = con.query_drop(format!("DO RELEASE_LOCK(X'{}')", hex(&self.name)));
            // Closing the connection releases it in any case.
        }
        Ok(())
    }
}
