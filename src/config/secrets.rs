//! Credentials in URLs and command lines: found, so that nothing dlock prints or stores beside
//! a lock shows them.

use crate::model::BackendKind;

/// The URL with any password replaced by `***`, for messages — whether or not it parses, since
/// a URL that does not parse is exactly the one whose password may sit where a parser would not
/// look (a raw `/`, `?`, `#` or space in it, a missing `//` or scheme):
/// - everything between the start of the authority (after `scheme://`, `scheme:` or nothing)
///   and the *last* `@` of the whole URL is user information: the user name (up to the first
///   `:`) is kept, the rest hidden;
/// - the values of query parameters that name a secret (`pass`, `password`, `passwd`, `pwd`,
///   `secret`, `token`, `auth`) are hidden.
///
/// `file:` URLs carry no credentials and are left as they are.
pub(crate) fn redact(url: &str) -> String {
    let mut out = url.to_string();
    for secret in secrets(url) {
        out = out.replacen(&secret, "***", 1);
    }
    out
}

/// `text` (a command line) with every word that holds a URL [`redact`]ed: a command stored
/// beside a lock is shown by `status` to everyone who can ask the server.
pub(crate) fn hide_credentials(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                redact(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The parts of `url` that [`redact`] hides: the password of its user information and the
/// values of secret-naming query parameters.
pub(crate) fn secrets(url: &str) -> Vec<String> {
    if url.starts_with("file:") {
        return Vec::new();
    }
    let is_scheme = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    };
    let (scheme, rest) = match url.split_once("://") {
        // (`redis:u:P://W@h`: a "scheme" with a ':' is no scheme; the password holds `://`.)
        Some((scheme, rest)) if is_scheme(scheme) => (Some(scheme), rest),
        _ => match url.split_once(':') {
            // `redis:u:PW@h`: a known scheme without `//` (in `u:PW@h`, `u` is a user).
            Some((scheme, rest)) if BackendKind::from_scheme(scheme).is_some() => {
                (Some(scheme), rest)
            }
            _ => (None, url),
        },
    };
    // Without a scheme there is no telling a user from a password; ZooKeeper and etcd take a
    // user only with a password, so a lone one is a password typed without its user.
    let lone_is_secret = match scheme {
        None => true,
        Some(s) => matches!(
            BackendKind::from_scheme(s),
            Some(BackendKind::Zookeeper | BackendKind::Etcd)
        ),
    };
    let mut found = Vec::new();
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        match userinfo.split_once(':') {
            Some((_, pw)) if !pw.is_empty() => found.push(pw.to_string()),
            Some(_) => {}
            None if lone_is_secret && !userinfo.is_empty() => found.push(userinfo.to_string()),
            None => {}
        }
    }
    found.extend(secret_query_values(rest));
    found
}

/// The values of secret-naming query parameters (see [`redact`]).
fn secret_query_values(text: &str) -> Vec<String> {
    const SECRETS: [&str; 7] = [
        "pass", "password", "passwd", "pwd", "secret", "token", "auth",
    ];
    let Some((_, query)) = text.split_once('?') else {
        return Vec::new();
    };
    // A raw '&' in a secret leaves its tail as a segment without '=': that belongs to it.
    let mut found: Vec<String> = Vec::new();
    let mut in_secret = false;
    for segment in query.split('&') {
        match segment.split_once('=') {
            Some((k, v)) => {
                in_secret = !v.is_empty() && SECRETS.iter().any(|s| k.eq_ignore_ascii_case(s));
                if in_secret {
                    found.push(v.to_string());
                }
            }
            None if in_secret => {
                if let Some(last) = found.last_mut() {
                    last.push('&');
                    last.push_str(segment);
                }
            }
            None => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// A password planted in any URL form of any scheme but `file:`, made of any printable characters
        /// (those URL parsers split on included), never survives redaction.
        #[test]
        fn no_url_form_keeps_its_password(
            pw in "[A-Z][!-~]{5,20}",
            scheme in proptest::sample::select(
                // A file URL is a path: no credentials in it.
                BackendKind::all().iter().flat_map(|k| k.schemes()).copied()
                    .filter(|s| *s != "file").collect::<Vec<_>>()
            ),
            form in 0usize..4,
        ) {
            let url = match form {
                0 => format!("{scheme}://user:{pw}@h:1/x"),
                1 => format!("{scheme}://:{pw}@h1,h2"),
                2 => format!("{scheme}://h/x?db=1&password={pw}"),
                _ => format!("{scheme}:user:{pw}@h"),
            };
            let shown = redact(&url);
            proptest::prop_assert!(!shown.contains(&pw), "{} -> {}", url, shown);
        }
    }

    #[test]
    fn commands_stored_beside_a_lock_hide_url_passwords() {
        assert_eq!(
            hide_credentials("psql postgres://u:pw@h/db -c 'select 1'"),
            "psql postgres://u:***@h/db -c 'select 1'"
        );
        assert_eq!(hide_credentials("sleep 5"), "sleep 5");
    }

    #[test]
    fn redaction_hides_passwords_only() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:secret@h"), "redis://:***@h");
        assert_eq!(redact("mysql://u:p@ss:w@rd@h/db"), "mysql://u:***@h/db");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("redis://user@h"), "redis://user@h");
        assert_eq!(redact("file:///tmp/x@y:z"), "file:///tmp/x@y:z");
    }

    #[test]
    fn redaction_works_on_urls_that_do_not_parse() {
        let pw = "PW";
        for url in [
            "redis://u:P/W@h:1/0",
            "redis://u:P?W@h",
            "redis://u:P#W@h",
            "redis://u:P W@h",
            "redis:u:PW@h",
            "u:PW@h",
            "redis+unix:///s?pass=PW",
            "postgres://u@h/db?password=PW&PW",
            "redis+unix:///s?db=1&password=PW",
            "mysql://u:PW@h/db?x=1",
            "zk://u:P@W@h/chroot",
            "rediss://:PW@@h",
        ] {
            let r = redact(url);
            assert!(!r.contains(pw), "{url} -> {r}");
            assert!(r.contains("***"), "{url} -> {r}");
        }
        assert_eq!(redact("redis://u:P/W@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(
            redact("redis+unix:///s?pass=PW&db=1"),
            "redis+unix:///s?pass=***&db=1"
        );
    }
}
