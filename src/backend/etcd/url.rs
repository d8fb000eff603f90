//! `etcd://` URLs: members, TLS and etcd's own user and password.

use super::http::Endpoints;
use crate::config::redact;
use crate::exit::Usage;

/// `url` for messages: [`redact`]ed, and a user information without `:` hidden too — etcd takes
/// no user without a password, so that is most likely a password typed alone (`etcd://PW@h`).
pub(super) fn shown(url: &str) -> String {
    let r = redact(url);
    let start = match r.find("://") {
        Some(i) => i + 3,
        None => r.find(':').map_or(0, |i| i + 1),
    };
    match r[start..].rfind('@') {
        Some(at) if !r[start..start + at].contains(':') => {
            format!("{}***{}", &r[..start], &r[start + at..])
        }
        _ => r,
    }
}

/// `etcd://[user:pass@]host[:port][,host[:port]...]`, `etcds://` for TLS.
pub(super) fn parse_url(url: &str) -> Result<Endpoints, Usage> {
    let bad = |why: &str| Usage(format!("bad etcd URL '{}': {why}", shown(url)));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "etcd" | "http" => false,
        "etcds" | "https" => true,
        _ => return Err(bad("the scheme must be etcd:// or etcds://")),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(bad("a path or options are not taken"));
    }
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((a, h)) => {
            let (u, p) = a
                .split_once(':')
                .ok_or_else(|| bad("user without password"))?;
            let dec = |s: &str| {
                crate::backend::percent_decode(s)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| bad("bad %-escape in the user or password"))
            };
            (Some((dec(u)?, dec(p)?)), h)
        }
        None => (None, rest),
    };
    let list = crate::backend::hosts::parse(hosts, 2379)
        .map_err(|why| bad(&why))?
        .into_iter()
        .map(|h| (h.host, h.port))
        .collect();
    Ok(Endpoints {
        hosts: list,
        tls,
        auth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_members_and_credentials() {
        let e = parse_url("etcds://u%40x:p%3Aw@a:1,[::1]:2,b").unwrap();
        assert!(e.tls);
        assert_eq!(e.auth, Some(("u@x".into(), "p:w".into())));
        assert_eq!(
            e.hosts,
            vec![("a".into(), 1), ("::1".into(), 2), ("b".into(), 2379)]
        );
        for bad in [
            "redis://a",
            "etcd://a/path",
            "etcd://u@a",
            "etcd://a:x",
            "etcd://",
            "etcd://a:0",
            "etcd://a,,b",
            "etcd://::1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        for url in [
            "etcd://PW@h",
            "etcds://PW@h:1,g",
            "etcd:PW@h",
            "etcd://P@W@h",
            "PW@h",
        ] {
            let e = parse_url(url).unwrap_err().0;
            assert!(!e.contains("PW") && !e.contains("W@"), "{url}: {e}");
        }
        assert_eq!(shown("etcd://u:PW@h"), "etcd://u:***@h");
        assert_eq!(shown("etcd://h:1"), "etcd://h:1");
    }
}
