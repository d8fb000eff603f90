//! Where the bucket is and how to sign for it, found as the AWS CLI finds them, and one
//! keep-alive HTTP/1.1 connection ([`crate::backend::frame`]) to send signed requests on.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sign::{self, Credentials, Signing};
use crate::backend::Reach;
use crate::backend::frame::{Conn, MAX_REPLY, read_bytes, read_head};
use crate::backend::net::Stream;
use crate::exit::Usage;

/// Connecting (TCP and TLS handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A bucket and how to reach it. Its `Debug` never shows the secret ([`Credentials`]).
#[derive(Debug)]
pub(crate) struct Place {
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The `Host` header: host, and `:port` when not the scheme's.
    host_header: String,
    pub(crate) bucket: String,
    /// Object names start with this (`PREFIX/`, or nothing).
    pub(crate) prefix: String,
    /// `/BUCKET/KEY` (an endpoint URL) rather than `BUCKET.s3.REGION.amazonaws.com/KEY`.
    path_style: bool,
    region: String,
    creds: Credentials,
}

impl Place {
    /// Parses `s3://BUCKET[/PREFIX][?endpoint=URL&region=R]`, with the rest from the
    /// environment and the AWS CLI's files.
    pub(crate) fn parse(url: &str) -> anyhow::Result<Place> {
        Place::parse_with(url, &|name| std::env::var(name).ok())
    }

    pub(crate) fn parse_with(
        url: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Place> {
        let bad = |why: &str| Usage(format!("bad S3 URL: {why} (s3://BUCKET[/PREFIX])"));
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("the scheme must be s3://"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-".contains(c);
        if bucket.is_empty() || bucket.len() > 63 || !bucket.chars().all(valid) {
            return Err(bad("a bucket name is 1 to 63 of a-z, 0-9, '.' and '-'").into());
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        let (mut endpoint, mut region) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = crate::config::percent_decode(v)
                .and_then(|v| String::from_utf8(v).ok())
                .ok_or_else(|| bad("a query value is not percent-encoded UTF-8"))?;
            match k {
                "endpoint" => endpoint = Some(v),
                "region" => region = Some(v),
                _ => return Err(bad("the query takes endpoint= and region= only").into()),
            }
        }
        let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let home = env("HOME").unwrap_or_default();
        let read = |var: &str, file: &str| {
            let path = env(var).unwrap_or_else(|| format!("{home}/.aws/{file}"));
            std::fs::read_to_string(path).unwrap_or_default()
        };
        let config = read("AWS_CONFIG_FILE", "config");
        let credentials = read("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        // ~/.aws/config names a profile `[profile NAME]` (but `[default]`); credentials `[NAME]`.
        let config_section = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let from_config = |name: &str| ini_value(&config, &config_section, name);
        let from_files =
            |name: &str| ini_value(&credentials, &profile, name).or_else(|| from_config(name));
        let endpoint = endpoint
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| from_config("endpoint_url"));
        let region = region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| from_config("region"))
            .unwrap_or_else(|| "us-east-1".into());
        if region.is_empty()
            || !region
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(bad("a region is letters, digits and '-'").into());
        }
        let creds = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(key_id), Some(secret)) => Credentials {
                key_id,
                secret,
                token: env("AWS_SESSION_TOKEN"),
            },
            _ => match (
                from_files("aws_access_key_id"),
                from_files("aws_secret_access_key"),
            ) {
                (Some(key_id), Some(secret)) => Credentials {
                    key_id,
                    secret,
                    token: from_files("aws_session_token"),
                },
                _ => {
                    return Err(Usage(format!(
                        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile '{profile}' a key in ~/.aws/credentials"
                    ))
                    .into());
                }
            },
        };
        let (tls, host, port, path_style) = match endpoint {
            Some(e) => {
                let (tls, rest) = if let Some(r) = e.strip_prefix("https://") {
                    (true, r)
                } else if let Some(r) = e.strip_prefix("http://") {
                    (false, r)
                } else {
                    return Err(bad("the endpoint must be http:// or https://").into());
                };
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                if !path.is_empty() {
                    // Path-style requests go to /BUCKET/OBJECT from the host's root: a path
                    // would be dropped, and the requests go elsewhere than the user meant.
                    return Err(bad(
                        "an endpoint with a path is not supported (give scheme://host[:port])",
                    )
                    .into());
                }
                let (host, port) = split_port(authority, if tls { 443 } else { 80 })
                    .ok_or_else(|| bad("a bad endpoint host or port"))?;
                (tls, host, port, true)
            }
            // A bucket name with a dot is no single DNS label: AWS's wildcard certificate
            // does not cover it virtual-hosted, so it is addressed path-style (as the AWS CLI).
            None if bucket.contains('.') => (true, format!("s3.{region}.amazonaws.com"), 443, true),
            None => (
                true,
                format!("{bucket}.s3.{region}.amazonaws.com"),
                443,
                false,
            ),
        };
        let default_port = if tls { 443 } else { 80 };
        let host_header = if port == default_port {
            bracketed(&host)
        } else {
            format!("{}:{port}", bracketed(&host))
        };
        Ok(Place {
            tls,
            host,
            port,
            host_header,
            bucket: bucket.to_string(),
            prefix,
            path_style,
            region,
            creds,
        })
    }

    /// The endpoint and bucket, for messages: no credentials.
    pub(crate) fn describe(&self) -> String {
        format!("{}/{}", self.host_header, self.bucket)
    }

    /// The path of `object` (or of the bucket, for `""`), encoded.
    fn path(&self, object: &str) -> String {
        let object = sign::uri_encode(object, true);
        if self.path_style {
            format!("/{}/{object}", self.bucket)
        } else {
            format!("/{object}")
        }
    }
}

fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// `host[:port]` or `[v6][:port]`.
fn split_port(authority: &str, default: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(r) = authority.strip_prefix('[') {
        let (h, tail) = r.split_once(']')?;
        (h, tail.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok().filter(|&p| p != 0)?,
        None => default,
    };
    Some((host.to_string(), port))
}

/// `name` in `[section]` of an INI text as the AWS CLI writes it.
fn ini_value(text: &str, section: &str, name: &str) -> Option<String> {
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = s.trim() == section;
        } else if inside
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == name
        {
            return Some(v.trim().to_string());
        }
    }
    None
}

/// A reply: status, the headers dlock reads, and the body (at most [`MAX_REPLY`]).
#[derive(Debug)]
pub(crate) struct S3Reply {
    pub(crate) status: u16,
    pub(crate) etag: Option<String>,
    /// `Date` and `Last-Modified`, in seconds since the epoch (hints only, never decisions).
    pub(crate) date: Option<u64>,
    pub(crate) last_modified: Option<u64>,
    pub(crate) body: Vec<u8>,
}

impl S3Reply {
    /// S3's error code and message from an error body, for one line.
    pub(crate) fn error(&self) -> String {
        let code = super::record::xml_values(&self.body, "Code")
            .into_iter()
            .next();
        let message = super::record::xml_values(&self.body, "Message")
            .into_iter()
            .next();
        let text = match (code, message) {
            (Some(c), Some(m)) => format!("HTTP {} {c}: {m}", self.status),
            (Some(c), None) => format!("HTTP {} {c}", self.status),
            _ => format!("HTTP {}", self.status),
        };
        crate::report::clean(&text, crate::report::MAX_FIELD)
    }
}

/// One connection to the endpoint, made again after any failure.
pub(crate) struct Client {
    pub(crate) place: Arc<Place>,
    con: Option<Conn>,
    reach: Reach,
    timeout: Duration,
}

/// A conditional header of a write.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cond<'a> {
    None,
    /// `If-None-Match: *`: create only.
    Absent,
    /// `If-Match: ETAG`: replace only this version.
    Is(&'a str),
}

impl Client {
    pub(crate) fn new(place: Arc<Place>, reach: Reach, timeout: Duration) -> Client {
        Client {
            place,
            con: None,
            reach,
            timeout,
        }
    }

    /// GET of `object`; an idempotent read is tried again once on a new connection when a
    /// kept-alive one fails (the server may have closed it while idle).
    pub(crate) fn get(&mut self, object: &str, query: &[(&str, String)]) -> io::Result<S3Reply> {
        let reused = self.con.is_some();
        match self.exchange("GET", object, query, Cond::None, b"") {
            Err(e) if reused && !crate::backend::net::is_signalled(&e) => {
                self.exchange("GET", object, query, Cond::None, b"")
            }
            r => r,
        }
    }

    /// PUT of `body` at `object` under `cond`. Not tried again: a failure leaves the outcome
    /// unknown, for the caller to read back.
    pub(crate) fn put(&mut self, object: &str, cond: Cond<'_>, body: &[u8]) -> io::Result<S3Reply> {
        self.exchange("PUT", object, &[], cond, body)
    }

    /// DELETE of `object` (unconditional: for `purge` only).
    pub(crate) fn delete(&mut self, object: &str) -> io::Result<S3Reply> {
        self.exchange("DELETE", object, &[], Cond::None, b"")
    }

    fn exchange(
        &mut self,
        method: &str,
        object: &str,
        query: &[(&str, String)],
        cond: Cond<'_>,
        body: &[u8],
    ) -> io::Result<S3Reply> {
        let deadline = Instant::now() + self.timeout;
        let result = self.exchange_by(method, object, query, cond, body, deadline);
        match &result {
            Ok(_) => self.reach.connected(),
            Err(e) if e.kind() == io::ErrorKind::TimedOut && self.con.is_some() => {
                self.reach.connected()
            }
            Err(_) => {}
        }
        if result.is_err() {
            self.con = None;
        }
        result
    }

    fn exchange_by(
        &mut self,
        method: &str,
        object: &str,
        query: &[(&str, String)],
        cond: Cond<'_>,
        body: &[u8],
        deadline: Instant,
    ) -> io::Result<S3Reply> {
        let p = &self.place;
        if self.con.is_none() {
            let connect = Instant::now() + CONNECT_TIMEOUT.min(self.timeout);
            self.con = Some(Conn::new(Stream::tcp(
                &p.host, p.port, p.tls, connect, MAX_REPLY,
            )?));
        }
        let path = p.path(object);
        let mut extra: Vec<(&str, String)> = Vec::new();
        match cond {
            Cond::None => {}
            Cond::Absent => extra.push(("if-none-match", "*".into())),
            Cond::Is(etag) => extra.push(("if-match", etag.to_string())),
        }
        let payload = sign::sha256_hex(body);
        let amz_date = sign::amz_date(std::time::SystemTime::now());
        let signed = sign::sign(
            &Signing {
                method,
                path: &path,
                query,
                headers: &extra,
                host: &p.host_header,
                region: &p.region,
                amz_date: &amz_date,
                payload_sha256: &payload,
            },
            &p.creds,
        );
        let q = sign::canonical_query(query);
        let target = if q.is_empty() {
            path
        } else {
            format!("{path}?{q}")
        };
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\n", p.host_header);
        for (k, v) in extra
            .iter()
            .map(|(k, v)| (*k, v))
            .chain(signed.iter().map(|(k, v)| (k.as_str(), v)))
        {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if method == "PUT" {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let con = self.con.as_mut().expect("connected above");
        con.bound(deadline);
        con.s.write_all(head.as_bytes())?;
        con.s.write_all(body)?;
        con.s.flush()?;
        let reply = read_head(con)?;
        let bytes = if method == "HEAD" {
            Vec::new()
        } else {
            read_bytes(con, &reply)?
        };
        if reply
            .field("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            self.con = None;
        }
        Ok(S3Reply {
            status: reply.status,
            etag: reply.field("etag").map(str::to_string),
            date: reply.field("date").and_then(sign::http_date),
            last_modified: reply.field("last-modified").and_then(sign::http_date),
            body: bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn endpoint_url_is_path_style_and_aws_is_virtual_hosted() {
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "AK"),
            ("AWS_SECRET_ACCESS_KEY", "SEKRIT"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:8333"),
            ("HOME", "/nonexistent"),
        ]);
        let p = Place::parse_with("s3://b/locks/ci/", &env).unwrap();
        assert_eq!((p.host.as_str(), p.port, p.tls), ("127.0.0.1", 8333, false));
        assert_eq!(p.prefix, "locks/ci/");
        assert_eq!(p.path("locks/ci/a%2F.lock"), "/b/locks/ci/a%252F.lock");
        assert!(!format!("{p:?}").contains("SEKRIT"));
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "AK"),
            ("AWS_SECRET_ACCESS_KEY", "S"),
            ("AWS_REGION", "eu-west-1"),
        ]);
        let p = Place::parse_with("s3://b", &env).unwrap();
        assert_eq!(p.host, "b.s3.eu-west-1.amazonaws.com");
        assert_eq!(p.path("x.lock"), "/x.lock");
        let p = Place::parse_with(
            "s3://b?region=us-west-2&endpoint=https%3A%2F%2Fh%3A9000",
            &env,
        )
        .unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.region.as_str()),
            ("h", 9000, "us-west-2")
        );
        // A dotted bucket on AWS: path-style on the regional host (the certificate's).
        let p = Place::parse_with("s3://a.b", &env).unwrap();
        assert_eq!(p.host, "s3.eu-west-1.amazonaws.com");
        assert_eq!(p.path("x.lock"), "/a.b/x.lock");
        // An endpoint with a path would lose it: refused.
        let e = Place::parse_with("s3://b?endpoint=https%3A%2F%2Fh%2Fs3", &env).unwrap_err();
        assert!(format!("{e:#}").contains("path"), "{e:#}");
    }

    #[test]
    fn bad_urls_and_missing_credentials_are_usage_errors() {
        let env = env_of(&[("AWS_ACCESS_KEY_ID", "AK"), ("AWS_SECRET_ACCESS_KEY", "S")]);
        for url in [
            "s3://",
            "s3://Bad_Bucket",
            "redis://x",
            "s3://b?x=1",
            "s3://b?region=a/b",
        ] {
            assert!(Place::parse_with(url, &env).is_err(), "{url}");
        }
        let none = env_of(&[("HOME", "/nonexistent")]);
        let e = Place::parse_with("s3://b", &none).unwrap_err();
        assert!(e.to_string().contains("no S3 credentials"), "{e}");
    }

    #[test]
    fn profiles_are_read_as_the_aws_cli_reads_them() {
        let creds = "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n[ci]\naws_access_key_id=C\naws_secret_access_key=CS\naws_session_token = T\n";
        let config = "[profile ci]\nregion = ap-south-1\n";
        assert_eq!(
            ini_value(creds, "ci", "aws_session_token").as_deref(),
            Some("T")
        );
        assert_eq!(
            ini_value(creds, "default", "aws_access_key_id").as_deref(),
            Some("D")
        );
        assert_eq!(
            ini_value(config, "profile ci", "region").as_deref(),
            Some("ap-south-1")
        );
        assert_eq!(ini_value(config, "ci", "region"), None);
    }
}
