//! The PostgreSQL backend: a session advisory lock on a dedicated connection (no pool).
//!
//! - Key → advisory key: the first 8 bytes of SHA-256(`dlock:` + key), big-endian, as a signed
//!   64-bit number ([`advisory_id`]); an application takes the same lock with
//!   `pg_advisory_lock(<id>)` (`dlock status --json` shows the id).
//! - Exclusive: `pg_advisory_lock`; `--shared`: `pg_advisory_lock_shared`; `--limit N`: slot
//!   locks (slots.rs). The server does the
//!   waiting, in its lock queue: a try first, then one blocking call bounded by `lock_timeout`
//!   (`--wait`), so a waiter keeps its place in the queue. PostgreSQL queues a shared request
//!   behind a waiting exclusive one (a conflict with a waiter counts), so writers are not
//!   starved. A signal sends a cancel request and closes the connection, which releases
//!   anything granted meanwhile.
//! - The lease is the session: the server releases the lock when the session ends. Its
//!   `idle_session_timeout` is `--ttl` rounded up (PostgreSQL ≥ 14), so the server ends a
//!   partitioned holder's session — and frees the lock — no sooner than a TTL after its last
//!   statement, while the keeper checks the lock every ttl/3 (which also resets that timer) and
//!   stops the command at the client's deadline, which is earlier. A holder whose session is
//!   ended (`pg_terminate_backend`) learns it from the closed connection at once.
//! - Fencing token: `dlock_fences`, one row per advisory id, bumped to the larger of fence + 1
//!   and the server clock in microseconds, on the lock's own connection; the holder record in
//!   `dlock_holders`, one row per backend pid. Both tables are created if missing.
//! - Run history: the table `dlock_runs`, written on the lock's session (history.rs).
//! - A standby is refused (its advisory locks are its own); a server up for less than the TTL
//!   holds the lock back ([`super::hold_back_until`], from `pg_postmaster_start_time()`).

mod broken;
mod doctor;
mod ground;
mod history;
mod lease;
mod record;
mod retention;
mod rows;
mod slots;
mod status;
mod stream;
mod url;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sha2::{Digest, Sha256};
use tokio::runtime::Runtime;
use tokio::sync::Notify;
use tokio_postgres::{Client, NoTls};

use self::rows::cell;

use self::lease::PgLease;
use super::marks::SessionMarks;
use super::{Backend, BreakHow, Broken, Lease, Reach, Request};
use crate::backend::Grant;
use crate::clock::BootInstant;
use crate::exit::{Interrupted, Unavailable};
use crate::model::{BackendKind, Key};
use crate::model::{Holder, Mode, Status};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The fencing counters and holder records (created if missing; docs/backends.md has the SQL).
const CREATE_TABLES: &str = "CREATE TABLE IF NOT EXISTS dlock_fences (\
        id bigint PRIMARY KEY, fence bigint NOT NULL); \
    CREATE TABLE IF NOT EXISTS dlock_holders (\
        pid integer PRIMARY KEY, id bigint NOT NULL, key text NOT NULL, \
        fence bigint NOT NULL, holder text NOT NULL); \
    CREATE INDEX IF NOT EXISTS dlock_holders_key ON dlock_holders (key)";

/// SQLSTATE 42P01, as [`db_text`] shows it: dlock's tables do not exist (yet).
const UNDEFINED_TABLE: &str = "(42P01)";

/// The advisory key of `key`: what `pg_advisory_lock(<id>)` takes.
pub(crate) fn advisory_id(key: &Key) -> i64 {
    let digest = Sha256::digest(format!("dlock:{key}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(b)
}

/// The advisory id a `pg_locks` row (columns prefixed with `t`, e.g. `"l."`) is about: a
/// single-bigint advisory lock keeps the high half in `classid` and the low half in `objid`.
fn locked_id(t: &str) -> String {
    format!("(({t}classid::bigint << 32) | {t}objid::bigint)")
}

/// The `pg_locks` rows (columns prefixed with `t`) of single-bigint advisory locks on `ids`.
fn advisory_on(t: &str, ids: &[i64]) -> String {
    let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
    format!(
        "{t}locktype = 'advisory' AND {t}objsubid = 1 AND {} IN ({})",
        locked_id(t),
        ids.join(",")
    )
}

/// The key's own advisory id and those of its semaphore slots: every lock a holder of the key
/// may hold.
fn held_ids(key: &Key) -> Vec<i64> {
    std::iter::once(advisory_id(key))
        .chain((1..=slots::MAX_LIMIT).map(|i| slots::slot_id(key, i)))
        .collect()
}

pub(crate) struct PgBackend {
    config: url::PgConfig,
    rt: std::sync::OnceLock<Arc<Runtime>>,
    reach: Reach,
}

/// Why a connect failed.
#[derive(Debug)]
enum Connect {
    Io(std::io::Error),
    Pg(tokio_postgres::Error),
}

impl std::fmt::Display for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connect::Io(e) => write!(f, "{e}"),
            Connect::Pg(e) => write!(f, "{}", db_text(e)),
        }
    }
}

/// A connection and what tells when it ended.
pub(super) struct Session {
    client: Client,
    /// Set to true when the connection task ends (the server closed it, or it broke).
    ended: tokio::sync::watch::Receiver<bool>,
    /// The random mark this session puts on its server session ([`ground`]).
    mark: String,
    /// How the first lock statement checks the server session ([`ground::Reached`]).
    reached: ground::Reached,
    /// The process id the server's BackendKeyData named (-1: none came).
    key_pid: Arc<std::sync::atomic::AtomicI64>,
    /// Whether something may stand between (a proxy, an unproven socket): the session's lock
    /// statements then act only where its mark is ([`ground::on_ours`]).
    guarded: std::sync::atomic::AtomicBool,
}

impl PgBackend {
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<PgBackend> {
        let config = match urls {
            [] => url::PgConfig::parse(url::DEFAULT_URL)?,
            [one] => url::PgConfig::parse(one)?,
            _ => {
                return Err(
                    crate::exit::Usage("the postgres backend takes one --url".into()).into(),
                );
            }
        };
        Ok(PgBackend {
            config,
            rt: std::sync::OnceLock::new(),
            reach: Reach::default(),
        })
    }

    fn runtime(&self) -> anyhow::Result<Arc<Runtime>> {
        super::async_runtime(&self.rt, "pg")
    }

    fn addr(&self) -> &str {
        &self.config.addr
    }

    /// A transport failure or a server error, as dlock's error types.
    fn fail(&self, doing: &str, e: tokio_postgres::Error) -> anyhow::Error {
        if e.as_db_error().is_some() {
            Unavailable(format!("{}: cannot {doing}: {}", self.addr(), db_text(&e))).into()
        } else {
            self.reach
                .transport_error(format!("{}: cannot {doing}: {}", self.addr(), db_text(&e)))
        }
    }

    /// A new session named for `key` in `pg_stat_activity`, within [`CONNECT_TIMEOUT`] for TCP
    /// and as much again for the handshake.
    async fn connect(&self, application: &str) -> anyhow::Result<Session> {
        let mut cfg = self.config.config.clone();
        cfg.application_name(application);
        let key_pid = Arc::new(std::sync::atomic::AtomicI64::new(-1));
        let connecting = tokio::time::timeout(CONNECT_TIMEOUT * 2, async {
            let socket = tokio::time::timeout(
                CONNECT_TIMEOUT,
                stream::Socket::connect(&self.config.target, self.config.port),
            )
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))
            .map_err(Connect::Io)?
            .map_err(Connect::Io)?;
            let reached = socket.reached();
            let host = match &self.config.target {
                url::Target::Tcp(h) | url::Target::Unix(h) => h.as_str(),
            };
            let link = stream::Link::negotiate(socket, host, &self.config.tls)
                .await
                .map_err(Connect::Io)?;
            cfg.connect_raw(stream::Checked::new(link, key_pid.clone()), NoTls)
                .await
                .map(|c| (c, reached))
                .map_err(Connect::Pg)
        });
        let ((client, connection), reached) = match connecting.await {
            Ok(Ok(c)) => c,
            Ok(Err(Connect::Pg(e))) if e.as_db_error().is_some() => {
                return Err(Unavailable(format!(
                    "cannot connect to {}: {}",
                    self.addr(),
                    db_text(&e)
                ))
                .into());
            }
            Ok(Err(e)) => {
                return Err(self
                    .reach
                    .transport_error(format!("cannot connect to {}: {e}", self.addr())));
            }
            Err(_) => {
                return Err(self.reach.transport_error(format!(
                    "cannot connect to {}: no answer within {:?}",
                    self.addr(),
                    CONNECT_TIMEOUT * 2
                )));
            }
        };
        let (tx, ended) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = connection.await;
            let _ = tx.send(true);
        });
        self.reach.connected();
        Ok(Session {
            client,
            ended,
            mark: ground::new_mark()?,
            reached,
            key_pid,
            guarded: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The first round trip of a lock's session: its lease setting, the standby check, the
    /// mark and the proxy check ([`ground`]), and `try_expr` (a try of the lock); returns what
    /// `try_expr` gave, as text. Behind a proxy, a second round trip tries after the probe.
    async fn first_try(
        &self,
        s: &Session,
        req: &Request<'_>,
        try_expr: &str,
    ) -> anyhow::Result<String> {
        let timeout = ttl_secs(req.ttl);
        let first = format!(
            "SET idle_session_timeout = '{timeout}s'; SELECT pg_is_in_recovery(), {}",
            ground::claim(s, try_expr)
        );
        let rows = match self
            .simple(&s.client, &first, COMMAND_TIMEOUT, "try the lock")
            .await
        {
            Err(e) if e.to_string().contains("idle_session_timeout") => {
                return Err(Unavailable(format!(
                    "{}: the server is older than PostgreSQL 14 and has no idle_session_timeout, \
                     so it would not end a partitioned holder's session (and free its lock) in \
                     time; use PostgreSQL 14 or later",
                    self.addr()
                ))
                .into());
            }
            r => r?,
        };
        let row = rows.first().context("no reply to the lock request")?;
        if cell(row, 0) == Some("t") {
            return Err(Unavailable(format!(
                "{} is a standby (in recovery): its advisory locks are its own, not the \
                 primary's; point dlock at the primary",
                self.addr()
            ))
            .into());
        }
        match cell(row, 1) {
            Some(got) => Ok(got.to_string()),
            None => {
                if self.behind_proxy(s).await? == ground::Probe::Pooled {
                    return Err(ground::pooled(self.addr()));
                }
                let again = format!("SELECT {}", ground::on_ours_unheld(s, try_expr));
                let rows = self
                    .simple(&s.client, &again, COMMAND_TIMEOUT, "try the lock")
                    .await?;
                match rows.first().and_then(|r| cell(r, 0)) {
                    Some(got) => Ok(got.to_string()),
                    None => Err(ground::pooled(self.addr())),
                }
            }
        }
    }

    /// Takes `req`'s lock on `s`.
    async fn take(&self, s: &Session, req: &Request<'_>, notify: &Notify) -> anyhow::Result<()> {
        let id = advisory_id(req.key);
        let shared = if req.mode == Mode::Shared {
            "_shared"
        } else {
            ""
        };
        let got = self
            .first_try(s, req, &format!("pg_try_advisory_lock{shared}({id})"))
            .await?;
        match got.as_str() {
            "t" => return Ok(()),
            "f" => {}
            _ => {
                return Err(Unavailable(format!(
                    "{}: the server's answer to the lock request is not a boolean",
                    self.addr()
                ))
                .into());
            }
        }
        if req.waited_out() {
            let holder = self.current_holder(&s.client, id).await;
            return Err(req.busy(holder.as_ref()));
        }
        if let Some(h) = self.current_holder(&s.client, id).await {
            (req.on_holder)(&h);
        }
        // Waiting, in the server's queue, for at most the time left.
        let lock_timeout = req.deadline.remaining().map_or(0, |d| d.as_millis().max(1));
        let wait = format!(
            "SET lock_timeout = {lock_timeout}; SELECT {}; SET lock_timeout = 0",
            ground::on_ours_unheld(s, &format!("pg_advisory_lock{shared}({id})"))
        );
        let cancel = s.client.cancel_token();
        let sent = std::cell::Cell::new(false);
        let waiting = async {
            sent.set(true);
            s.client.simple_query(&wait).await
        };
        tokio::pin!(waiting);
        tokio::select! {
            r = &mut waiting => match r {
                // A void's text is empty; NULL: the statement reached another server session.
                Ok(m) => match rows::simple_rows(m).first().map(|r| cell(r, 0)) {
                    Some(None) => Err(ground::pooled(self.addr())),
                    _ => Ok(()),
                },
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                    let holder = self.current_holder(&s.client, id).await;
                    Err(req.busy(holder.as_ref()))
                }
                Err(e) => Err(self.fail("wait for the lock", e)),
            },
            _ = slots::overdue(req) => {
                // The server did not end the wait at lock_timeout: end it from here.
                self.cancel(cancel).await;
                Err(req.busy(None))
            }
            _ = notify.notified() => {
                // The session is closed by the caller, which releases anything granted; the
                // wait ends in the server first, so that no waiter of this run is left.
                if sent.get() {
                    self.cancel(cancel).await;
                }
                slots::settle(&s.client, &mut waiting, &sent).await;
                Err(Interrupted(req.interrupt.fired().unwrap_or(libc::SIGINT)).into())
            }
        }
    }
}

use super::ttl_secs_up as ttl_secs;

/// An error in words: a server error's message and code, or a transport error with its cause
/// (tokio-postgres's own text is only the kind: "error communicating with the server").
fn db_text(e: &tokio_postgres::Error) -> String {
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => format!("{} ({})", db.message(), db.code().code()),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    }
}

impl Backend for PgBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn location(&self) -> String {
        self.config.addr.clone()
    }

    fn unsupported(&self, mode: Mode) -> Option<String> {
        match mode {
            Mode::Exclusive | Mode::Shared => None,
            Mode::Limit(n) if n > slots::MAX_LIMIT => Some(format!(
                "--limit {n}: the postgres backend takes at most {}",
                slots::MAX_LIMIT
            )),
            Mode::Limit(_) => None,
        }
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let rt = self.runtime()?;
        let notify = Arc::new(Notify::new());
        let n = notify.clone();
        let guard = req.interrupt.on_fire(move || n.notify_one())?;
        if let Some(sig) = req.interrupt.fired() {
            return Err(Interrupted(sig).into());
        }
        let application = application_name(req.key);
        let result = rt.block_on(async {
            let s = tokio::select! {
                s = self.connect(&application) => s?,
                _ = notify.notified() => {
                    return Err(anyhow::Error::from(Interrupted(
                        req.interrupt.fired().unwrap_or(libc::SIGINT),
                    )));
                }
            };
            let (s, held) = match req.mode {
                Mode::Limit(n) => self.take_slot(s, req, n, &notify, &application).await?,
                _ => {
                    self.take(&s, req, &notify).await?;
                    (s, advisory_id(req.key))
                }
            };
            // The lease counts from the statement after the grant: the server's idle clock
            // (idle_session_timeout) starts when that one ends, which is after it was sent. (The
            // grant's own send time could be a whole wait earlier.)
            let sent = BootInstant::now();
            let start = req.start.filter(|_| req.mode == Mode::Exclusive);
            let ((fence, uptime, others), started) = match start {
                Some(o) => {
                    self.record_starting(&s, req.key, held, req.holder, o)
                        .await?
                }
                None => (self.record(&s, req.key, held, req.holder).await?, false),
            };
            // Holders of the key in another mode (or another --limit) are a usage error.
            let want = req.mode.limit();
            let differ: Vec<&(i32, Holder)> = others
                .iter()
                .filter(|(_, h)| h.mode.and_then(Mode::limit) != want)
                .collect();
            if !differ.is_empty() {
                let live = self.live(&s.client, req.key).await?;
                if let Some((_, h)) = differ.iter().find(|(pid, _)| live.contains(pid)) {
                    let theirs = h.mode.unwrap_or(Mode::Exclusive);
                    return Err(super::mode_mismatch(req.key, req.mode, &theirs.describe()));
                }
            }
            Ok((s, held, sent, fence, uptime, started))
        });
        drop(guard);
        // On any error the session is dropped here, which releases whatever it holds.
        let (session, held, sent, fence, uptime, started) = result?;
        let count = broken::check_sql(held);
        Ok(Box::new(PgLease {
            check: match ground::is_ours(&session) {
                Some(ours) => {
                    format!("SELECT CASE WHEN {ours} THEN c.held END, c.broken FROM ({count}) c")
                }
                None => count,
            },
            session: Some(session),
            history: (req.mode == Mode::Exclusive).then(|| req.key.clone()),
            rt,
            addr: self.addr().to_string(),
            ttl: req.ttl,
            grant: Grant {
                fence: Some(fence),
                acquired_at: sent,
                held_back_until: super::hold_back_until(uptime, req.ttl),
            },
            releasing: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            started,
        }))
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let s = self.connect("dlock status").await?;
            self.status_on(&s.client, key).await
        })
    }

    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let s = self.connect("dlock status").await?;
            let sql = format!(
                "SELECT DISTINCT h.key FROM dlock_holders h JOIN pg_locks l ON l.pid = h.pid \
                 AND l.granted AND l.locktype = 'advisory' AND l.objsubid = 1 \
                 AND {} = h.id LIMIT {}",
                locked_id("l."),
                super::MAX_LISTED
            );
            match self
                .simple(&s.client, &sql, COMMAND_TIMEOUT, "list the locks")
                .await
            {
                Ok(rows) => Ok(rows
                    .iter()
                    .filter_map(|r| Key::new(cell(r, 0)?).ok())
                    .collect()),
                Err(e) if e.to_string().contains(UNDEFINED_TABLE) => Ok(Vec::new()),
                Err(e) => Err(e),
            }
        })
    }

    fn prune(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        self.prune_keys(older_than, most)
    }

    /// Forgets a free key's fence and holder records (`dlock bench`'s own keys).
    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let rt = self.runtime()?;
        let id = advisory_id(key);
        rt.block_on(async {
            let s = self.connect("dlock bench").await?;
            let sql = format!(
                "DELETE FROM dlock_fences WHERE id = {id}; DELETE FROM dlock_holders WHERE id = {id}"
            );
            match self.simple(&s.client, &sql, COMMAND_TIMEOUT, "forget the key").await {
                Err(e) if !e.to_string().contains(UNDEFINED_TABLE) => return Err(e),
                _ => {}
            }
            self.purge_history(&s.client, key).await
        })
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

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<crate::backend::ground::Finding>> {
        self.checks(ttl)
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        self.history_of(key)
    }

    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_with_history()
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        self.end_on_new_session(key, end)
    }
}

/// `application_name` for a lock's session: "dlock KEY", cut to the 63 bytes the server keeps.
fn application_name(key: &Key) -> String {
    let mut name: String = format!("dlock {key}")
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    name.truncate(63);
    name
}
