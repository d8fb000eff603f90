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
#[cfg(any(feature = "redis", feature = "postgres", feature = "etcd"))]
pub(crate) fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    roots
}

/// The key an [`escape_key`]d name stands for, if it is one.
pub(crate) fn unescape_key(name: &str) -> Option<Key> {
    let bytes = percent_decode(name)?;
    Key::new(std::str::from_utf8(&bytes).ok()?).ok()
}

/// Decodes `%XX` escapes (as in a URL's path or credentials); `None` for a malformed escape.
pub(crate) fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// This host's name, or "localhost" if it has none.
pub(crate) fn hostname() -> String {
    crate::sys::hostname()
}
