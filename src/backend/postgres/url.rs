//! `postgres://` and `postgresql://` URLs in libpq's form, and libpq's password sources.

use std::path::PathBuf;

use tokio_postgres::config::Host;

use crate::config::redact;
use crate::exit::Usage;

pub(super) const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// A host name or address.
    Tcp(String),
    /// The directory holding the server's Unix socket.
    Unix(String),
}

/// A parsed URL: the client configuration, where to connect, and the address for messages
/// (no credentials).
pub(super) struct PgConfig {
    pub(super) config: tokio_postgres::Config,
    pub(super) tls: super::stream::Tls,
    pub(super) target: Target,
    pub(super) port: u16,
    pub(super) addr: String,
}

impl PgConfig {
    /// `postgres://user:pass@host[:port]/db?sslmode=…`, or a socket directory as
    /// `postgres:///db?host=/var/run/postgresql`. Without a password in the URL: `PGPASSWORD`,
    /// then the password file (`PGPASSFILE` or `~/.pgpass`), as libpq does.
    pub(super) fn parse(url: &str) -> Result<PgConfig, Usage> {
        let bad = |why: String| Usage(format!("bad postgres URL '{}': {why}", redact(url)));
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("postgres://") || lower.starts_with("postgresql://")) {
            return Err(bad("expected postgres://…".into()));
        }
        // Usage errors are scrubbed of the URL's secrets when printed (report::usage_error).
        let (rest, tls) = take_tls_params(url).map_err(bad)?;
        let mut config: tokio_postgres::Config = rest
            .parse()
            // The cause says which parameter ("unknown option `sslmod`").
            .map_err(
                |e: tokio_postgres::Error| match std::error::Error::source(&e) {
                    Some(cause) => bad(format!("{e}: {cause}")),
                    None => bad(e.to_string()),
                },
            )?;
        if config.get_hosts().is_empty() {
            config.host("127.0.0.1");
        }
        if config.get_user().is_none() {
            config.user(std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into()));
        }
        if config.get_dbname().is_none() {
            let user = config.get_user().unwrap_or("postgres").to_string();
            config.dbname(&user);
        }
        let target = match &config.get_hosts()[0] {
            Host::Tcp(h) => Target::Tcp(h.clone()),
            Host::Unix(p) => Target::Unix(p.display().to_string()),
        };
        let host = match &target {
            Target::Tcp(h) | Target::Unix(h) => h.clone(),
        };
        // The parser splits at the first '@' anywhere: a raw '@' in a password (or in a
        // `password=` value) leaves part of it in the host, user or database name, and so in
        // messages. URL syntax left raw in a name is refused; %-escaped, it is the name's own
        // (a role `sec@srv` is `sec%40srv`), so this looks at the URL as written.
        if let Some(why) = raw_syntax(&rest) {
            return Err(bad(why));
        }
        if let Target::Tcp(h) = &target
            && h.contains(['@', '/', '?', '#', '&', '=', ' '])
        {
            return Err(bad(RAW_SYNTAX.into()));
        }
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let addr = format!("{host}:{port}/{}", config.get_dbname().unwrap_or_default());
        if config.get_password().is_none() {
            let password = std::env::var("PGPASSWORD").ok().or_else(|| {
                let user = config.get_user().unwrap_or_default();
                let db = config.get_dbname().unwrap_or_default();
                let host = match &config.get_hosts()[0] {
                    Host::Tcp(h) => h.clone(),
                    Host::Unix(_) => "localhost".into(),
                };
                pgpass(&host, port, db, user)
            });
            if let Some(p) = password {
                config.password(p);
            }
        }
        // dlock negotiates TLS itself, below tokio-postgres (see stream.rs).
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        Ok(PgConfig {
            config,
            tls,
            target,
            port,
            addr,
        })
    }
}

const RAW_SYNTAX: &str = "'@', '/', '?', '#', '&', '=' or a space in a user name, password, \
     host or database must be %-escaped";

/// Why `url` (without the TLS parameters) has URL syntax in a place where the parser would
/// split it wrongly: in the credentials (up to the first '@') the user name holds no '/', '?'
/// or '#' and the password no '?' or '#'; no second '@' follows; no raw space anywhere.
fn raw_syntax(url: &str) -> Option<String> {
    let after = url.split_once("://").map_or(url, |(_, a)| a);
    if after.contains(' ') {
        return Some(RAW_SYNTAX.into());
    }
    let (credentials, rest) = after.split_once('@')?;
    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
    if user.contains(['/', '?', '#']) || password.contains(['?', '#']) || rest.contains('@') {
        return Some(RAW_SYNTAX.into());
    }
    None
}

/// Takes libpq's `sslmode` and `sslrootcert` out of the URL's query (tokio-postgres knows only
/// three of the six modes, and dlock negotiates TLS itself); the rest of the URL is returned.
/// Without `sslmode`: `prefer`, as libpq.
fn take_tls_params(url: &str) -> Result<(String, super::stream::Tls), String> {
    use super::stream::{SslMode, Tls};
    let mut tls = Tls {
        mode: SslMode::Prefer,
        root: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), tls));
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = crate::backend::percent_decode(v)
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| format!("bad %-escape in {k}"))?;
        match k {
            "sslmode" => {
                tls.mode = match v.as_str() {
                    "disable" => SslMode::Disable,
                    "allow" | "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => return Err(format!("unknown sslmode '{other}'")),
                }
            }
            // Absolute now: the acquire holder leaves the caller's directory, and connects again
            // from `/` (a relative file would not be found there).
            "sslrootcert" => tls.root = Some(crate::backend::absolute(PathBuf::from(v))),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, tls))
}

/// The password for (host, port, db, user) from the password file, as libpq reads it: lines
/// `host:port:database:user:password`, `*` matching anything, `\:` and `\\` escaped, the first
/// match wins; ignored unless the file is readable by its owner only.
///
/// The file's path is made absolute at the first look (in the caller's directory), and kept:
/// `acquire`'s holder works in `/` and parses the URL again when it connects anew.
fn pgpass(host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    static PATH: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let path = PATH
        .get_or_init(|| {
            std::env::var_os("PGPASSFILE")
                .map(|f| crate::backend::absolute(PathBuf::from(f)))
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))
        })
        .as_ref()?;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 || meta.len() > 1 << 20 {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    pgpass_lookup(&text, host, port, db, user)
}

/// The password `text` (a `.pgpass` file) gives for host, port, database and user: the first
/// line whose four fields match (`*` matches anything), as libpq reads it.
fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    let want = [host, port.as_str(), db, user];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass(line);
            if fields.len() != 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(want)
                .all(|(f, w)| f == "*" || f == w);
            matches.then(|| fields[4].clone())
        })
}

/// One line's fields, `\` escaping the next character.
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().expect("never empty").push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("never empty").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_split_like_libpq() {
        assert_eq!(
            split_pgpass(r"h:5432:*:u:pa\:ss:word"),
            vec!["h", "5432", "*", "u", "pa:ss:word"]
        );
        assert_eq!(
            split_pgpass(r"a\\b:1:d:u:p"),
            vec![r"a\b", "1", "d", "u", "p"]
        );
    }

    proptest::proptest! {
        /// Any `.pgpass` text gives a password or none, never a panic; a line written with
        /// every `:` and `\\` escaped gives back exactly its password.
        #[test]
        fn any_pgpass_text_is_read(
            text in "\\PC*|[a-z:*\\\\\n#]{0,80}",
            pw in "\\PC{0,30}",
            host in "[a-z0-9.]{1,20}",
        ) {
            let _ = pgpass_lookup(&text, "h", 5432, "db", "u");
            let escaped = pw.replace('\\', "\\\\").replace(':', "\\:");
            let line = format!("{host}:5432:*:u:{escaped}");
            proptest::prop_assert_eq!(pgpass_lookup(&line, &host, 5432, "db", "u"), Some(pw));
        }
    }

    #[test]
    fn urls() {
        let c = PgConfig::parse("postgres://u:secret@db.example:6543/app").unwrap();
        assert_eq!(c.addr, "db.example:6543/app");
        assert!(!c.addr.contains("secret"));
        let c = PgConfig::parse("postgresql:///app?host=/run/postgresql").unwrap();
        assert_eq!(c.addr, "/run/postgresql:5432/app");
        let c = PgConfig::parse(
            "postgres://u:p@h/db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(c.tls.mode, super::super::stream::SslMode::VerifyFull);
        assert_eq!(c.tls.root.as_deref(), Some(std::path::Path::new("/ca.pem")));
        // A relative CA file is resolved against the directory of the parse (the caller's): the
        // acquire holder later connects from `/`.
        let c = PgConfig::parse("postgres://u:p@h/db?sslmode=verify-ca&sslrootcert=certs/ca.pem")
            .unwrap();
        let here = std::env::current_dir().unwrap();
        assert_eq!(c.tls.root, Some(here.join("certs/ca.pem")));
        assert!(PgConfig::parse("postgres://u:p@h/db?sslmode=sometimes").is_err());
        let Err(e) = PgConfig::parse("postgres://u:s3cr3t@h:notaport/db") else {
            panic!("a bad port parsed");
        };
        assert!(!e.0.contains("s3cr3t"), "{}", e.0);
    }

    #[test]
    fn escaped_syntax_in_names_is_the_names_own() {
        let c = PgConfig::parse("postgres://sec%40srv:p%2Fw@h/d%3Fb").unwrap();
        assert_eq!(c.config.get_user(), Some("sec@srv"));
        assert_eq!(c.config.get_dbname(), Some("d?b"));
        for raw in [
            "postgres://u:p@ss@h/db",
            "postgres://h/db?password=a@b",
            "postgres://u:p w@h/db",
        ] {
            let Err(e) = PgConfig::parse(raw) else {
                panic!("{raw} parsed");
            };
            assert!(e.0.contains("%-escaped"), "{raw}: {}", e.0);
        }
    }
}
