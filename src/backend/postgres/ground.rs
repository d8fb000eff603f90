//! What stands between dlock and PostgreSQL: a pooler that hands server connections from client
//! to client (PgBouncer in transaction or statement mode) voids a session advisory lock — the
//! lock stays on a server connection the next client gets, and `pg_try_advisory_lock` is
//! reentrant within a server session, so that client "gets" the lock too.
//!
//! Two defences, both in statements dlock sends anyway:
//!
//! - **A mark on the server session.** The first lock statement of a connection reads the
//!   setting `dlock.session`: another dlock session's mark on a server session that holds
//!   advisory locks means the server connection came from another client, and no lock is tried
//!   there ([`FOREIGN`], exit 78). Otherwise it sets its own random mark and tries. Every later
//!   lock statement, the lease check and the release act only where the mark is still ours
//!   ([`MOVED`] otherwise): a statement that landed on another server connection takes and frees
//!   nothing. This closes the window whatever a pooler does, for PostgreSQL keeps the setting
//!   exactly as long as the locks (a pooler's reset, `DISCARD ALL`, clears both).
//! - **Detection on connect.** Over TCP, the server's view of the client port
//!   (`inet_client_port()`) is compared with this socket's: on a direct connection they are the
//!   same. When they differ, something stands between (a pooler, a proxy, a NAT that changes
//!   ports), no lock is tried in that statement ([`PROXIED`]) and [`PgBackend::probe`] asks
//!   whether it pools by transaction: a second client that lands on this connection's server
//!   session (it sees the mark), or this connection's next statement that does not, means
//!   pooling, refused with 78. Session pooling and plain proxies pass, at the cost of that
//!   second connection (only behind a proxy). Over a Unix socket there is no port to compare:
//!   the mark alone keeps the lock sound there.

use std::time::Duration;

use super::rows::cell;
use super::{PgBackend, Session};
use crate::exit::Unsound;

/// The setting that carries a session's mark.
const SETTING: &str = "dlock.session";

/// A lock statement's answer when the server session is another client's and holds locks.
pub(super) const FOREIGN: &str = "dlock:foreign";
/// The first lock statement's answer when something stands between (nothing was tried).
pub(super) const PROXIED: &str = "dlock:proxied";
/// A later statement's answer when it reached a server session without this session's mark.
pub(super) const MOVED: &str = "dlock:moved";

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

/// Refuses a server session that already holds an advisory lock (no lock statement of this
/// session ran there yet, so any is another client's).
fn holds_locks() -> &'static str {
    "EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory')"
}

/// How much the first lock statement must check about the server session it lands on.
#[derive(Clone, Copy, Debug)]
pub(super) enum Reached {
    /// TCP from this local port: the statement compares it with the server's view
    /// (`inet_client_port()`) and tries nothing when they differ ([`PROXIED`]). A session that
    /// passes is a backend of its own, new, holding nothing.
    Tcp(u16),
    /// A Unix socket whose peer is a postmaster: a backend of its own too.
    Postmaster,
    /// A Unix socket to something else (a pooler), or a peer that cannot be seen: the session
    /// may be a server connection other clients used, so one holding any advisory lock is
    /// refused ([`FOREIGN`]) — the only case that reads `pg_locks` (~0.5 ms on a new session).
    Unproven,
}

/// The first lock statement's expression around `try_expr` (any type; the answer is text):
/// [`FOREIGN`] on another client's server session that holds advisory locks (any advisory
/// lock, where `reached` is [`Reached::Unproven`]), else the mark is set; then [`PROXIED`]
/// behind a proxy; else `try_expr`. CASE evaluates its branches in order and lazily: the
/// pg_locks read happens only on a marked (or unproven) session, the try only after the mark
/// is set.
pub(super) fn claim(mark: &str, reached: Reached, try_expr: &str) -> String {
    let foreign = match reached {
        Reached::Unproven => holds_locks().to_string(),
        _ => format!(
            "coalesce(current_setting('{SETTING}', true), '') NOT IN ('', '{mark}') AND {}",
            holds_locks()
        ),
    };
    let proxied = match reached {
        Reached::Tcp(p) => {
            format!("WHEN inet_client_port() IS DISTINCT FROM {p} THEN '{PROXIED}' ")
        }
        _ => String::new(),
    };
    format!(
        "CASE WHEN {foreign} THEN '{FOREIGN}' \
         WHEN set_config('{SETTING}', '{mark}', false) = '' THEN '' \
         {proxied}ELSE ({try_expr})::text END"
    )
}

/// The try after the probe, behind a proxy that keeps one server connection per client: on
/// the server session that carries `mark` ([`MOVED`] otherwise) and holds no advisory lock
/// ([`FOREIGN`] otherwise; nothing of this session's was taken yet).
pub(super) fn retry(mark: &str, try_expr: &str) -> String {
    format!(
        "CASE WHEN current_setting('{SETTING}', true) IS DISTINCT FROM '{mark}' THEN '{MOVED}' \
         WHEN {} THEN '{FOREIGN}' ELSE ({try_expr})::text END",
        holds_locks()
    )
}

/// A later statement's expression: `expr` (as text) where the server session carries `mark`,
/// else [`MOVED`].
pub(super) fn on_ours(mark: &str, expr: &str) -> String {
    format!(
        "CASE WHEN current_setting('{SETTING}', true) = '{mark}' THEN ({expr})::text \
         ELSE '{MOVED}' END"
    )
}

/// The condition (for a WHERE) that the server session carries `mark`.
pub(super) fn is_ours(mark: &str) -> String {
    format!("current_setting('{SETTING}', true) = '{mark}'")
}

/// What to tell a user whose pooler hands server connections from client to client.
const POOLING_FIX: &str = "session advisory locks need a server connection of their own: use \
    pool_mode=session, or connect to PostgreSQL directly";

/// The refusal for [`FOREIGN`]: the server session holds another client's locks.
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

    #[test]
    fn the_proxy_check_is_there_only_with_a_port() {
        let tcp = claim("ab", Reached::Tcp(5), "true");
        assert!(tcp.contains("inet_client_port() IS DISTINCT FROM 5"));
        assert!(!claim("ab", Reached::Postmaster, "true").contains("inet_client_port"));
    }

    #[test]
    fn only_an_unproven_session_is_refused_for_any_lock() {
        let unproven = claim("ab", Reached::Unproven, "true");
        assert!(unproven.starts_with(&format!("CASE WHEN {} THEN", holds_locks())));
        let tcp = claim("ab", Reached::Tcp(5), "true");
        assert!(tcp.starts_with("CASE WHEN coalesce(current_setting"));
    }
}
