//! What several backends share that is not the backend contract: lock names as path segments
//! (and %-escapes), the async runtime of the async clients, the system's TLS roots, the host
//! name.

use crate::model::Key;

/// A key as one path segment (a file name, a znode name): bytes outside `[A-Za-z0-9_.-]` become
/// `%XX`, and so does a leading dot, so no name is hidden, `.` or `..`. Distinct keys get distinct
/// segments, and `%` never stands for itself.
pub(crate) fn escape_key(key: &Key) -> String {
    let mut name = String::new();
    for (i, &b) in key.as_str().as_bytes().iter().enumerate() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            name.push(b as char);
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    name
}

/// A number drawn evenly from `lo..=hi` (`lo` if the system has no randomness to give): the
/// jitter of a retry, so that clients that failed together do not retry together.
#[cfg(any(feature = "redis", feature = "s3"))]
pub(crate) fn jitter_ms(lo: u64, hi: u64) -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() || hi <= lo {
        return lo;
    }
    lo + u64::from_le_bytes(b) % (hi - lo + 1)
}

/// The async runtime of a backend whose client crate is async (ZooKeeper, PostgreSQL): one
/// worker thread, made on first use and kept in `cell`; `name` names its threads and errors.
#[cfg(any(feature = "zookeeper", feature = "postgres"))]
pub(crate) fn async_runtime(
    cell: &std::sync::OnceLock<std::sync::Arc<tokio::runtime::Runtime>>,
    name: &str,
) -> anyhow::Result<std::sync::Arc<tokio::runtime::Runtime>> {
    if let Some(rt) = cell.get() {
        return Ok(rt.clone());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .thread_name(format!("dlock-{name}"))
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the {name} client's runtime: {e}"))?;
    Ok(cell.get_or_init(|| std::sync::Arc::new(rt)).clone())
}

/// The system's trusted CA certificates (`SSL_CERT_FILE`/`SSL_CERT_DIR` honoured), for the
/// backends that do TLS with rustls themselves (Redis, PostgreSQL).
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "s3"
))]
///
/// Read once per process: `SSL_CERT_FILE` and `SSL_CERT_DIR` may be relative to the caller's
/// directory, which the acquire holder leaves once it holds the lock (it reconnects from `/`).
pub(crate) fn system_roots() -> rustls::RootCertStore {
    static ROOTS: std::sync::OnceLock<rustls::RootCertStore> = std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            roots
        })
        .clone()
}

#[cfg(any(feature = "mysql", feature = "postgres"))]
/// `path` made absolute against the current directory (as it is now), unchanged if that
/// cannot be read: a path read again later, after the acquire holder moved to `/`.
pub(crate) fn absolute(path: std::path::PathBuf) -> std::path::PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// The key an [`escape_key`]d name stands for, if it is one.
pub(crate) fn unescape_key(name: &str) -> Option<Key> {
    let bytes = crate::config::percent_decode(name)?;
    Key::new(std::str::from_utf8(&bytes).ok()?).ok()
}

/// This host's name, or "localhost" if it has none.
pub(crate) fn hostname() -> String {
    crate::sys::hostname()
}

/// SQL backends (MySQL, PostgreSQL): the largest body a history read sends whole; a longer one
/// is sent as its first [`SQL_EVENT_HEAD`] characters and its length, since no reader parses
/// it (see [`sql_event`]).
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) const SQL_EVENT_WHOLE: usize = crate::history::MAX_EVENT_BYTES;
/// How many characters of a longer body a history read sends.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) const SQL_EVENT_HEAD: usize = 256;
/// One history row of an SQL backend as a [`Stored`](crate::history::Stored) event, from
/// untrusted cells: `at_ms` (the server's clock, ms since the epoch), `len` (the body's length
/// in bytes) and `body` (whole when `len` <= [`SQL_EVENT_WHOLE`], else its head). A body that
/// was cut (or says it was) becomes its head padded to one byte over
/// [`MAX_EVENT_BYTES`](crate::history::MAX_EVENT_BYTES): never parsed, shown by `dlock log` as
/// "unreadable record (over the 4096-byte cap: HEAD…)" — so a forged row of megabytes never
/// crosses the wire, nor takes more memory than a real event.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) fn sql_event(
    at_ms: Option<i64>,
    len: Option<i64>,
    mut body: Vec<u8>,
) -> crate::history::Stored {
    let over = crate::history::MAX_EVENT_BYTES + 1;
    let len = len
        .and_then(|l| usize::try_from(l).ok())
        .unwrap_or(body.len());
    if len > body.len() || body.len() > over {
        body.truncate(over);
        body.resize(over, b' ');
    }
    crate::history::Stored {
        at_ms: at_ms.and_then(|ms| u64::try_from(ms).ok()),
        body,
    }
}

#[cfg(all(test, any(feature = "mysql", feature = "postgres")))]
mod tests {
    use super::*;
    use crate::history::MAX_EVENT_BYTES;

    #[test]
    fn sql_events_whole_or_cut() {
        let s = sql_event(Some(5), Some(3), b"abc".to_vec());
        assert_eq!((s.at_ms, s.body.as_slice()), (Some(5), &b"abc"[..]));
        // Cut by the server: the head, standing for LEN bytes.
        let s = sql_event(Some(-1), Some(60_036), b"{\"run\":".to_vec());
        assert_eq!(s.at_ms, None);
        assert_eq!(s.body.len(), MAX_EVENT_BYTES + 1);
        assert!(s.body.starts_with(b"{\"run\":"));
        let runs = crate::history::merge(&[s], 5);
        assert_eq!(runs[0].state, "unreadable");
        assert!(
            runs[0]
                .unreadable
                .as_deref()
                .unwrap()
                .starts_with("over the 4096-byte cap: {\"run\":"),
            "{runs:?}"
        );
        // A length that lies short, or absurdly long: bounded, never parsed as cut.
        assert_eq!(sql_event(None, Some(1), b"abcd".to_vec()).body, b"abcd");
        assert_eq!(
            sql_event(None, Some(i64::MAX), vec![b'x'; 10]).body.len(),
            MAX_EVENT_BYTES + 1
        );
        assert_eq!(
            sql_event(None, Some(MAX_EVENT_BYTES as i64 - 1), b"x".to_vec())
                .body
                .len(),
            MAX_EVENT_BYTES + 1
        );
    }

    proptest::proptest! {
        #[test]
        fn any_sql_row_is_a_bounded_event(
            at in proptest::option::of(proptest::num::i64::ANY),
            len in proptest::option::of(proptest::num::i64::ANY),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            let s = sql_event(at, len, body.clone());
            proptest::prop_assert!(s.body.len() <= MAX_EVENT_BYTES + 1);
            proptest::prop_assert!(s.body.starts_with(&body[..body.len().min(MAX_EVENT_BYTES + 1)]));
            // A body sent whole is the body; one sent cut is never read as an event.
            if s.body.len() != body.len() {
                proptest::prop_assert!(crate::history::RunEvent::read(&s).is_none());
            }
            proptest::prop_assert_eq!(s.at_ms, at.and_then(|a| u64::try_from(a).ok()));
        }
    }
}
