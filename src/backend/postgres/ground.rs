//! What stands between dlock and PostgreSQL: a pooler that hands server connections from client
//! to client (PgBouncer in transaction or statement mode) voids a session advisory lock — the
//! lock stays on a server connection the next client gets, and `pg_try_advisory_lock` is
//! reentrant within a server session, so that client "gets" the lock too.
//!
//! The defences ride in statements dlock sends anyway:
//!
//! - **Is this a backend of its own?** The first lock statement compares `pg_backend_pid()`
//!   with the process id of the server's BackendKeyData (a pooler sends a key of its own, so
//!   it can route cancel requests), and over TCP the server's view of the client port
//!   (`inet_client_port()`) with this socket's. Both equal: a backend of its own, new, holding
//!   nothing — the statement just tries (nothing can send its statements elsewhere, so it
//!   needs no mark: setting one costs ~0.1 ms on a new session).
//! - **Otherwise nothing is taken blindly.** The first statement does nothing (it answers
//!   NULL); a second one refuses a server session that holds any advisory lock — it can only be
//!   another client's ([`foreign`], 78) — and sets the mark; a second client then probes for
//!   pooling ([`PgBackend::probe`]: it lands on the first one's server session, so it sees the
//!   mark: [`pooled`], 78); then the try, only where the mark is ours and no advisory lock is
//!   held ([`on_ours_unheld`]).
//! - **The mark.** A session that something may stand between sets `dlock.session` to a random
//!   value on its server session;
//!   every later lock statement, the lease check and the release act only where the mark is
//!   still its own ([`on_ours`], NULL otherwise): a statement a pooler sent to another
//!   server connection takes and frees nothing. PostgreSQL keeps the setting as long as the
//!   locks (a pooler's reset, `DISCARD ALL`, clears both).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::rows::cell;
use super::{PgBackend, Session};
use crate::exit::Unsound;

/// The setting that carries a session's mark.
const SETTING: &str = "dlock.session";

/// How long the probe's second client may take to connect and answer. A session pooler whose
/// pool is exhausted makes it wait: that is not transaction pooling, and the mark keeps the
/// lock sound either way.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A new session's random mark: 16 hex digits.
pub(super) fn new_mark() -> anyhow::Result<String> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)
        .map_err(|e| anyhow::anyhow!("no randomness for a session mark: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// How dlock reached the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reached {
    /// TCP from this local port, which the first statement compares with the server's view
    /// (`inet_client_port()`).
    Tcp(u16),
    /// A Unix socket.
    Unix,
}

/// A server session that already holds an advisory lock (before this session took any, so it
/// is another client's).
const HOLDS_LOCKS: &str =
    "EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory')";

/// The first lock statement's expression around `try_expr`, whose value is never NULL: NULL
/// instead means that the session is not proven to be a backend of its own, and nothing was
/// done ([`PgBackend::behind_proxy`] takes over). Proven: the backend's pid is the one the
/// server's BackendKeyData named (a pooler sends a key of its own) and, over TCP, the server
/// sees this socket's own port. A direct session gets no `pg_locks` in the statement (planning
/// a subquery on that view costs ~0.3 ms on a new session, even unrun) and no mark (setting a
/// custom setting the first time costs ~0.1 ms): nothing can send its statements elsewhere.
pub(super) fn claim(s: &Session, try_expr: &str) -> String {
    let key_pid = s.key_pid.load(Ordering::SeqCst);
    let port = match s.reached {
        Reached::Tcp(p) => format!(" OR inet_client_port() IS DISTINCT FROM {p}"),
        Reached::Unix => String::new(),
    };
    format!(
        "CASE WHEN pg_backend_pid() IS DISTINCT FROM {key_pid}{port} THEN NULL \
         ELSE {try_expr} END"
    )
}

/// For the extra sessions of a semaphore's wait: NULL where the server session holds any
/// advisory lock, else the mark is set and `try_expr` runs.
pub(super) fn claim_anywhere(s: &Session, try_expr: &str) -> String {
    s.guarded.store(true, Ordering::SeqCst);
    format!(
        "CASE WHEN {HOLDS_LOCKS} THEN NULL WHEN {} IS NULL THEN NULL ELSE {try_expr} END",
        set_mark(s)
    )
}

/// A lock statement that takes a first lock on a guarded session: `expr` only where the mark is
/// ours and the server session holds no advisory lock (another client's, which a reentrant
/// lock function would take as this one's), NULL otherwise; `expr` alone on a direct session.
pub(super) fn on_ours_unheld(s: &Session, expr: &str) -> String {
    match is_ours(s) {
        Some(ours) => format!("CASE WHEN {ours} AND NOT {HOLDS_LOCKS} THEN {expr} END"),
        None => expr.to_string(),
    }
}

/// Sets the session's mark (an expression; its value is the mark, never NULL).
fn set_mark(s: &Session) -> String {
    format!("set_config('{SETTING}', '{}', false)", s.mark)
}

/// A later statement's expression: `expr` (never NULL) where the server session carries the
/// session's mark, NULL where it does not (a pooler sent the statement to another server
/// connection); `expr` alone on a direct session.
pub(super) fn on_ours(s: &Session, expr: &str) -> String {
    match is_ours(s) {
        Some(ours) => format!("CASE WHEN {ours} THEN {expr} END"),
        None => expr.to_string(),
    }
}

/// The condition that the server session carries the session's mark; `None` on a direct
/// session (no mark: nothing stands between).
pub(super) fn is_ours(s: &Session) -> Option<String> {
    s.guarded
        .load(Ordering::SeqCst)
        .then(|| format!("current_setting('{SETTING}', true) = '{}'", s.mark))
}

/// What to tell a user whose pooler hands server connections from client to client.
const POOLING_FIX: &str = "session advisory locks need a server connection of their own: use \
    pool_mode=session, or connect to PostgreSQL directly";

/// The refusal when the server session holds another client's locks.
pub(super) fn foreign(addr: &str) -> anyhow::Error {
    Unsound(format!(
        "{addr}: the server connection dlock got holds another client's locks: a pooler \
         between dlock and PostgreSQL hands server connections from client to client \
         (PgBouncer pool_mode=transaction or statement, or a session pooler that does not \
         reset them); {POOLING_FIX}"
    ))
    .into()
}

/// The refusal when statements of one connection reach different server sessions, or a
/// second client reaches this one's.
pub(super) fn pooled(addr: &str) -> anyhow::Error {
    Unsound(format!(
        "{addr} pools by transaction or statement (PgBouncer pool_mode=transaction or \
         statement, or alike): a session advisory lock would stay on a server connection \
         that other clients get; {POOLING_FIX}"
    ))
    .into()
}

/// The loss a lease check reports when it landed on another server session.
pub(super) fn moved_loss(addr: &str) -> String {
    format!(
        "{addr}: the session's statements now reach another server connection (a pooler by \
         transaction or statement between dlock and PostgreSQL): the lock cannot be vouched for"
    )
}

/// What the probe's second client saw.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// It landed on the first client's server session: pooling by transaction or statement.
    Pooled,
    /// It did not.
    Apart,
    /// It got no server connection in time (or failed): cannot tell.
    NoAnswer,
}

impl PgBackend {
    /// Behind a proxy (the first statement answered NULL, having done nothing): marks `s`'s
    /// server session — refused ([`foreign`]) if it holds any advisory lock, which can only be
    /// another client's — and probes for pooling. From here on `s` is guarded: every lock
    /// statement acts only where its mark is ([`on_ours`]).
    pub(super) async fn behind_proxy(&self, s: &Session) -> anyhow::Result<Probe> {
        let sql = format!(
            "SELECT CASE WHEN {HOLDS_LOCKS} THEN NULL ELSE {} END",
            set_mark(s)
        );
        s.guarded.store(true, Ordering::SeqCst);
        let rows = self
            .simple(&s.client, &sql, super::COMMAND_TIMEOUT, "mark the session")
            .await?;
        if rows.first().and_then(|r| cell(r, 0)).is_none() {
            return Err(foreign(self.addr()));
        }
        Ok(self.probe(s).await)
    }

    /// Behind a proxy, before anything is tried: does it pool by transaction or statement?
    /// `s` has just set its mark. A second client that sees the mark landed on `s`'s server
    /// session: pooling. (Whether `s`'s own next statement still sees it is checked by the
    /// lock statement that follows, [`on_ours`].)
    pub(super) async fn probe(&self, s: &Session) -> Probe {
        let seen = tokio::time::timeout(PROBE_TIMEOUT, async {
            let other = self.connect("dlock probe").await.ok()?;
            let sql = format!("SELECT current_setting('{SETTING}', true)");
            let rows = other.client.simple_query(&sql).await.ok()?;
            let rows = super::rows::simple_rows(rows);
            Some(rows.first().and_then(|r| cell(r, 0)) == Some(s.mark.as_str()))
        })
        .await;
        match seen {
            Ok(Some(true)) => Probe::Pooled,
            Ok(Some(false)) => Probe::Apart,
            _ => Probe::NoAnswer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_sixteen_hex_digits_and_differ() {
        let a = new_mark().unwrap();
        let b = new_mark().unwrap();
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
