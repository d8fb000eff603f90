//! MySQL's own TLS options in the URL (`ssl-mode`, `ssl-ca`), which the client crate does not
//! parse.

use crate::exit::Usage;

/// Takes MySQL's own TLS parameter names out of the URL (the client crate does not know them):
/// `ssl-mode=DISABLED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY` and `ssl-ca=/path/ca.pem`. A CA without
/// a mode means VERIFY_IDENTITY; no parameter means no TLS.
pub(super) fn split_tls_params(url: &str) -> Result<(String, Option<mysql::SslOpts>), Usage> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let (mut mode, mut ca, mut rest) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("ssl-mode" | "ssl_mode" | "sslmode", v)) => mode = Some(v.to_ascii_uppercase()),
            // Absolute now: see `postgres/url.rs` (the acquire holder runs in `/`).
            Some(("ssl-ca" | "ssl_ca" | "sslca", v)) => {
                ca = Some(crate::backend::absolute(std::path::PathBuf::from(v)))
            }
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
