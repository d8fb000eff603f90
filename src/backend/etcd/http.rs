//! etcd's JSON gateway (`POST /v3/...`, on the client port of every etcd since 3.4) over dlock's
//! own sockets ([`crate::backend::net`]): HTTP/1.1 with keep-alive, one deadline per request, a
//! bounded reply, and a forwarded signal ending any wait on the main thread. Bytes travel as
//! base64 and 64-bit integers as decimal strings, as the gateway encodes them.
//!
//! Why not the `etcd-client` crate (gRPC over tonic): it compiles etcd's `.proto` files in its
//! build script, so `cargo build` fails on a machine without `protoc`; and it is no faster here,
//! since the server dominates (docs/design.md, "Dependencies").

use std::io::{self, Write};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::backend::Reach;
use crate::backend::frame::{Conn, MAX_REPLY, Source, decode_chunks, read_body, read_head};
use crate::backend::net::Stream;

/// Connecting to one endpoint (TCP and TLS handshake).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// One unary request.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// base64 of `bytes`.
pub(super) fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A 64-bit integer field (a decimal string, or a number); 0 when missing, as the gateway
/// leaves out zero values.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the key range that holds every key starting with `prefix` (etcd's "prefix end").
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// What a request can fail with.
#[derive(Debug)]
pub(super) enum Error {
    /// No endpoint answered, or the connection broke or timed out (the outcome is unknown).
    Transport(io::Error),
    /// The server answered with an error; `retry` when it is one of a cluster in trouble (no
    /// leader, a leader change, a timed-out proposal: gRPC's UNAVAILABLE or DEADLINE_EXCEEDED,
    /// HTTP 503 or 504 through the gateway), which another try, or another member, may not have.
    Server { message: String, retry: bool },
}

impl Error {
    /// Whether the request may succeed when tried again: the connection broke, or the cluster
    /// could not serve it for now.
    pub(super) fn transient(&self) -> bool {
        matches!(
            self,
            Error::Transport(_) | Error::Server { retry: true, .. }
        )
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Transport(e) => write!(f, "{e}"),
            Error::Server { message, .. } => {
                f.write_str(&crate::report::clean(message, crate::report::MAX_FIELD))
            }
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Transport(e)
    }
}

/// Where and how to reach the cluster.
#[derive(Clone, Debug)]
pub(super) struct Endpoints {
    /// host and port of each member given.
    pub(super) hosts: Vec<(String, u16)>,
    pub(super) tls: bool,
    /// etcd's own user and password.
    pub(super) auth: Option<(String, String)>,
}

/// One keep-alive connection to one member, moving to the next member when it fails.
pub(super) struct Client {
    ends: Endpoints,
    /// The member to try first.
    current: usize,
    con: Option<Conn>,
    /// The auth token, once authenticated.
    token: Option<String>,
    /// Whether a member ever answered this process.
    pub(super) reach: Reach,
    /// How long one request may take.
    request_timeout: Duration,
}

impl Client {
    pub(super) fn new(ends: Endpoints, reach: Reach) -> Client {
        Client {
            ends,
            current: 0,
            con: None,
            token: None,
            reach,
            request_timeout: REQUEST_TIMEOUT,
        }
    }

    /// Bounds each request (connecting included) by `limit` from now on: for giving a lease
    /// back after a signal, which must not hold up the exit.
    pub(super) fn hurry(&mut self, limit: Duration) {
        self.request_timeout = limit;
    }

    /// A connection to the first member that accepts, starting with the last one that worked.
    fn connect(&mut self) -> io::Result<Conn> {
        let n = self.ends.hosts.len();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no etcd endpoint");
        for i in 0..n {
            let at = (self.current + i) % n;
            let (host, port) = &self.ends.hosts[at];
            let deadline = Instant::now() + CONNECT_TIMEOUT.min(self.request_timeout);
            match Stream::tcp(host, *port, self.ends.tls, deadline, MAX_REPLY) {
                Ok(s) => {
                    self.current = at;
                    return Ok(Conn::new(s));
                }
                Err(e) => {
                    if crate::backend::net::is_signalled(&e) {
                        return Err(e);
                    }
                    // With several members, say which failed last.
                    last = if n > 1 {
                        io::Error::new(e.kind(), format!("{host}:{port}: {e}"))
                    } else {
                        e
                    };
                }
            }
        }
        Err(last)
    }

    /// `POST path` with `body`; the reply's JSON. Transport failures close the connection (the
    /// next call connects again, to the next member first); an expired auth token is renewed
    /// once.
    pub(super) fn call(&mut self, path: &str, body: &Value) -> Result<Value, Error> {
        let mut renewed = false;
        loop {
            match self.call_once(path, body) {
                Err(Error::Server { message, .. })
                    if !renewed
                        && self.ends.auth.is_some()
                        && message.contains("invalid auth token") =>
                {
                    self.token = None;
                    renewed = true;
                }
                r => return r,
            }
        }
    }

    fn call_once(&mut self, path: &str, body: &Value) -> Result<Value, Error> {
        if self.con.is_none() {
            let con = self.connect()?;
            self.con = Some(con);
            if self.token.is_none() && self.ends.auth.is_some() {
                self.authenticate()?;
            }
        }
        let deadline = Instant::now() + self.request_timeout;
        let token = self.token.clone();
        let con = self.con.as_mut().expect("connected above");
        let result = exchange(con, path, body, token.as_deref(), deadline);
        // Answered, or connected and then not answered in time (a cluster electing a leader
        // holds requests): the cluster is there, a failure from now on is an outage that a
        // waiting run outlasts. A connection that fails at once (refused, not HTTP, a TLS
        // mismatch) is not.
        let timed_out =
            matches!(&result, Err(Error::Transport(e)) if e.kind() == io::ErrorKind::TimedOut);
        if timed_out || !matches!(result, Err(Error::Transport(_))) {
            self.reach.connected();
        }
        match result {
            Err(e) if e.transient() => {
                self.con = None;
                // The member failed, or cannot serve (no leader): the next one first next time.
                self.current = (self.current + 1) % self.ends.hosts.len();
                Err(e)
            }
            r => r,
        }
    }

    fn authenticate(&mut self) -> Result<(), Error> {
        let Some((user, pass)) = self.ends.auth.clone() else {
            return Ok(());
        };
        let con = self.con.as_mut().expect("connected");
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let reply = exchange(
            con,
            "/v3/auth/authenticate",
            &json!({"name": user, "password": pass}),
            None,
            deadline,
        );
        match reply {
            Ok(v) => {
                self.reach.connected();
                self.token = v["token"].as_str().map(str::to_string);
                Ok(())
            }
            Err(e) => {
                self.con = None;
                Err(e)
            }
        }
    }

    /// Opens a watch stream (its own connection) with `create_request`.
    pub(super) fn watch(&mut self, create_request: Value) -> Result<Watch, Error> {
        if self.ends.auth.is_some() && self.token.is_none() {
            // Authenticate on the unary connection first.
            self.call("/v3/maintenance/status", &json!({}))?;
        }
        let mut con = self.connect()?;
        let body = json!({ "create_request": create_request });
        con.bound(Instant::now() + REQUEST_TIMEOUT);
        // `hasleader` (as gRPC metadata, through the gateway): a member cut off from the
        // leader cancels the watch rather than leave it silent, as Go's clients ask.
        send(
            &mut con,
            "/v3/watch",
            &body,
            self.token.as_deref(),
            "Grpc-Metadata-hasleader: true\r\n",
        )?;
        let head = read_head(&mut con)?;
        if head.status != 200 {
            let body = read_body(&mut con, &head)?;
            return Err(server_error(head.status, &body));
        }
        if !head.chunked {
            return Err(io::Error::other("the watch reply is not a stream").into());
        }
        Ok(Watch {
            con,
            raw: Vec::new(),
            data: Vec::new(),
            ended: false,
        })
    }
}

/// A watch stream: messages as they come, each within a deadline.
pub(super) struct Watch {
    con: Conn,
    /// Bytes read, not yet decoded from chunks.
    raw: Vec<u8>,
    /// Decoded bytes, not yet a whole message.
    data: Vec<u8>,
    ended: bool,
}

impl Watch {
    /// The next message, or `None` when `deadline` passes first.
    pub(super) fn next(&mut self, deadline: Instant) -> Result<Option<Value>, Error> {
        loop {
            if let Some(at) = self.data.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.data.drain(..=at).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let v: Value = serde_json::from_slice(&line)
                    .map_err(|e| io::Error::other(format!("bad watch message: {e}")))?;
                if v.get("error").is_some() {
                    return Err(server_error(200, &v));
                }
                return Ok(Some(v["result"].clone()));
            }
            if self.decode()? {
                continue;
            }
            if self.ended {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server ended the watch",
                )
                .into());
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            self.con.bound(deadline);
            match self.con.available() {
                Ok([]) => self.ended = true,
                Ok(got) => {
                    let n = got.len();
                    self.raw.extend_from_slice(got);
                    self.con.consume(n);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            if self.raw.len() + self.data.len() > MAX_REPLY {
                return Err(io::Error::other("a watch message larger than a lock's").into());
            }
        }
    }

    /// Moves whole chunks from `raw` to `data`; whether it moved any.
    fn decode(&mut self) -> io::Result<bool> {
        decode_chunks(&mut self.raw, &mut self.data, &mut self.ended)
    }
}

fn server_error(status: u16, body: &Value) -> Error {
    // gRPC codes 14 (UNAVAILABLE) and 4 (DEADLINE_EXCEEDED), as the gateway maps them.
    let code = int(&body["code"]);
    let retry = matches!(status, 503 | 504) || matches!(code, 4 | 14);
    let message = body["message"]
        .as_str()
        .or_else(|| body["error"].as_str())
        .or_else(|| body["error"]["message"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| format!("HTTP status {status}"));
    Error::Server { message, retry }
}

fn send(
    con: &mut Conn,
    path: &str,
    body: &Value,
    token: Option<&str>,
    extra: &str,
) -> io::Result<()> {
    let body = body.to_string();
    let auth = token
        .map(|t| format!("Authorization: {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n{auth}{extra}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    con.s.write_all(req.as_bytes())?;
    con.s.flush()
}

/// One request and its whole reply, by `deadline`.
fn exchange(
    con: &mut Conn,
    path: &str,
    body: &Value,
    token: Option<&str>,
    deadline: Instant,
) -> Result<Value, Error> {
    con.bound(deadline);
    send(con, path, body, token, "")?;
    let head = read_head(con)?;
    let reply = read_body(con, &head)?;
    if head.status != 200 {
        return Err(server_error(head.status, &reply));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_covers_the_prefix() {
        assert_eq!(prefix_end(b"dlock/a/"), b"dlock/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn integers_come_as_strings_or_numbers() {
        assert_eq!(int(&json!("42")), 42);
        assert_eq!(int(&json!(7)), 7);
        assert_eq!(int(&Value::Null), 0);
        assert_eq!(int(&json!("x")), 0);
    }
}
