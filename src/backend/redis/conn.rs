//! dlock's own Redis connection: redis-rs builds the commands and parses the replies, but the
//! socket is ours, because redis-rs's synchronous connection cannot bound what a server does to
//! it. With its connection, a server that answered one byte a second kept `dlock run -n` waiting
//! forever (each byte restarted the read timeout), a signal stayed unanswered until the reply or
//! the timeout, and a reply announcing a 2 GB string grew dlock to 7.8 GB. Here every request
//! (sending the command and reading the whole reply) has one deadline, checked before every
//! read and write; a reply larger than [`MAX_REPLY`] ends the connection; and on the main thread
//! a forwarded signal ends the wait at once (see [`crate::signals::interrupts_network_waits`]).
//! Every failure is an I/O error to redis-rs, so the callers' error handling is unchanged.
//!
//! On a Redis Cluster, a command for a slot another node owns is answered `MOVED slot
//! host:port` (or `ASK` while the slot migrates). The connection follows: it reconnects to that
//! node with the same credentials and TLS and sends the command again, within the request's
//! deadline, so every caller works on a cluster through the URL of any node. (redis-rs's own
//! cluster connection would bring back its sockets, and their unbounded reads.)
//!
//! A connection's first command goes out behind a `CLIENT ID` in the same write (one round
//! trip, a few bytes more): a proxy that closes the connection on a command it lacks
//! (twemproxy) closes it there, before the command behind it is read, and [`super::ground`]
//! tells that proxy from a server that went away.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, ConnectionLike, RedisResult, Value};

use crate::backend::net::Stream;

/// The most a reply may hold. A lock reply is a few integers; the largest dlock reads is a
/// `status` of a semaphore with its holders' records (each capped when written, see
/// [`crate::report`]), well under this.
pub(crate) const MAX_REPLY: usize = 4 << 20;

/// How many redirections one request follows: a cluster whose slots move more often than that
/// while one command is answered is not one to lock on.
const MAX_REDIRECTS: usize = 5;

/// A Redis error in words, for a message: redis-rs's own, but a reply that does not parse
/// ("Incompatible type - Parse error at 1\nUnexpected `33`…", from an HTTP server, say) is said
/// to be a server that does not answer as Redis does.
pub(crate) fn words(e: &redis::RedisError) -> String {
    match e.kind() {
        redis::ErrorKind::Parse => {
            "the server did not answer as Redis does (is it a Redis server, and is this its \
             port?)"
                .into()
        }
        _ => e.to_string(),
    }
}

/// One connection to one Redis server.
pub(crate) struct Connection {
    stream: Stream,
    parser: redis::Parser,
    /// How long one request may take.
    timeout: Duration,
    db: i64,
    /// False after any failure: a reply may be half read.
    open: bool,
    /// How it was opened: a redirection opens the next one alike.
    info: ConnectionInfo,
    /// How long opening may take.
    connect: Duration,
    /// Whether the first command went out, behind its `CLIENT ID` probe.
    probed: bool,
    /// The server's `CLIENT ID` for this connection, if the probe got one.
    client_id: Option<i64>,
}

impl Connection {
    /// Connects within `connect` (TCP, TLS and AUTH/SELECT together); each request then has
    /// `timeout`.
    pub(crate) fn open(
        info: &ConnectionInfo,
        connect: Duration,
        timeout: Duration,
    ) -> RedisResult<Connection> {
        let deadline = Instant::now() + connect;
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                Stream::tcp(host, *port, false, deadline, MAX_REPLY)?
            }
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                if *insecure {
                    return Err(io::Error::other(
                        "dlock does not skip certificate checks (#insecure); trust the server's CA with SSL_CERT_FILE",
                    )
                    .into());
                }
                Stream::tcp(host, *port, true, deadline, MAX_REPLY)?
            }
            ConnectionAddr::Unix(path) => Stream::unix(path, deadline, MAX_REPLY)?,
            _ => return Err(io::Error::other("unsupported Redis address").into()),
        };
        let settings = info.redis_settings();
        let mut con = Connection {
            stream,
            parser: redis::Parser::new(),
            timeout: connect,
            db: settings.db(),
            open: true,
            info: info.clone(),
            connect,
            probed: false,
            client_id: None,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            con.request_until(&auth.get_packed_command(), deadline)?
                .extract_error()?;
        }
        if settings.db() != 0 {
            con.request_until(
                &redis::cmd("SELECT").arg(settings.db()).get_packed_command(),
                deadline,
            )?
            .extract_error()?;
        }
        con.timeout = timeout;
        Ok(con)
    }

    /// Sets how long each later request may take (send and whole reply).
    pub(crate) fn set_read_timeout(&mut self, timeout: Option<Duration>) -> RedisResult<()> {
        self.timeout = timeout.unwrap_or(Duration::from_secs(3600));
        Ok(())
    }

    /// The server's `CLIENT ID` for this connection, if the first command's probe got one.
    pub(crate) fn client_id(&self) -> Option<i64> {
        self.client_id
    }

    /// Sends `cmd` alone (no probe, no redirection) and reads its reply, within the request
    /// timeout: for [`super::ground`]'s probes.
    pub(crate) fn request_plain(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        self.probed = true;
        self.request_until(&cmd.get_packed_command(), Instant::now() + self.timeout)
    }

    /// The server this connection talks to now (after a `MOVED`, the slot's owner).
    pub(crate) fn addr(&self) -> &ConnectionAddr {
        self.info.addr()
    }

    /// A connection like this one to `target` (`host:port` of a `MOVED` or `ASK`).
    fn redirected(&self, target: &str) -> RedisResult<Connection> {
        let addr = redirect_addr(self.info.addr(), target)
            .ok_or_else(|| io::Error::other(format!("bad redirection to '{target}'")))?;
        let mut con = Connection::open(
            &self.info.clone().set_addr(addr),
            self.connect,
            self.timeout,
        )?;
        con.timeout = self.timeout;
        Ok(con)
    }

    /// Sends `cmd` and reads its reply, following a cluster's redirections, by `deadline`.
    fn request_redirected(&mut self, cmd: &[u8], deadline: Instant) -> RedisResult<Value> {
        let mut reply = if self.probed {
            self.request_until(cmd, deadline)?
        } else {
            self.request_probed(cmd, deadline)?
        };
        for _ in 0..MAX_REDIRECTS {
            let Value::ServerError(e) = &reply else {
                return Ok(reply);
            };
            let kind = e.kind();
            let target = match (kind, e.details()) {
                (
                    Some(redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask),
                    Some(details),
                ) => details.split_ascii_whitespace().nth(1).map(str::to_string),
                _ => None,
            };
            let Some(target) = target else {
                return Ok(reply);
            };
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "redirected too long").into());
            }
            let mut next = self.redirected(&target)?;
            if kind == Some(redis::ServerErrorKind::Ask) {
                // The slot is migrating and this key is already there: ask once, on a
                // connection of its own; the slot's owner stays this one.
                next.request_until(&redis::cmd("ASKING").get_packed_command(), deadline)?
                    .extract_error()?;
                return next.request_until(cmd, deadline);
            }
            *self = next;
            reply = self.request_until(cmd, deadline)?;
        }
        Err(io::Error::other("too many cluster redirections").into())
    }

    /// The first command: `CLIENT ID` and `cmd` in one write, both replies read by `deadline`.
    /// The probe's reply is kept (an id) or dropped (an error: the command renamed or denied by
    /// an ACL); a connection closed before it is judged by [`super::ground::closed_on_probe`].
    fn request_probed(&mut self, cmd: &[u8], deadline: Instant) -> RedisResult<Value> {
        self.probed = true;
        let probe = probe_command();
        let alone = cmd == probe;
        let mut both = Vec::with_capacity(probe.len() + cmd.len());
        if !alone {
            both.extend_from_slice(probe);
        }
        both.extend_from_slice(cmd);
        let first = match self.request_until(&both, deadline) {
            Ok(v) => v,
            Err(e) => return Err(super::ground::closed_on_probe(&self.info, self.connect, e)),
        };
        if let Value::Int(id) = first {
            self.client_id = Some(id);
        }
        if alone {
            return Ok(first);
        }
        self.stream.guard().budget = MAX_REPLY;
        let result = read_reply(&mut self.stream, &mut self.parser);
        if result.is_err() {
            self.open = false;
        }
        result
    }

    /// Sends `cmd` and reads one reply, all before `deadline`.
    fn request_until(&mut self, cmd: &[u8], deadline: Instant) -> RedisResult<Value> {
        if !self.open {
            return Err(
                io::Error::new(io::ErrorKind::NotConnected, "the connection broke before").into(),
            );
        }
        self.stream.bound(deadline, MAX_REPLY);
        let result = send_and_read(&mut self.stream, &mut self.parser, cmd);
        if result.is_err() {
            self.open = false;
        }
        result
    }
}

/// The node a `MOVED` or `ASK` from the node at `like` names: `host:port`, or `:port` for "the
/// host you asked" (a cluster with `cluster-preferred-endpoint-type unknown-endpoint`, e.g.
/// behind a load balancer), reached like `like`.
pub(crate) fn redirect_addr(like: &ConnectionAddr, target: &str) -> Option<ConnectionAddr> {
    let Some(port) = target.strip_prefix(':') else {
        return addr_like(like, target);
    };
    let host = match like {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host,
        _ => return None,
    };
    addr_like(like, &format!("[{host}]:{port}"))
}

/// The address `target` (`host:port`, as a cluster names its nodes) reached like `like`: TLS
/// if that is, with its certificate settings. `None` for a malformed target or a Unix socket.
pub(crate) fn addr_like(like: &ConnectionAddr, target: &str) -> Option<ConnectionAddr> {
    let (host, port) = target.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|&p| p > 0)?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return None;
    }
    match like {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => Some(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        }),
        ConnectionAddr::Tcp(..) => Some(ConnectionAddr::Tcp(host, port)),
        _ => None,
    }
}

/// `CLIENT ID`, packed: the probe sent before a connection's first command.
fn probe_command() -> &'static [u8] {
    static PROBE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    PROBE.get_or_init(|| redis::cmd("CLIENT").arg("ID").get_packed_command())
}

fn send_and_read(s: &mut Stream, parser: &mut redis::Parser, cmd: &[u8]) -> RedisResult<Value> {
    s.write_all(cmd)?;
    s.flush()?;
    read_reply(s, parser)
}

/// The next reply (push messages skipped).
fn read_reply(s: &mut Stream, parser: &mut redis::Parser) -> RedisResult<Value> {
    loop {
        match parser.parse_value(&mut *s)? {
            Value::Push { .. } => continue, // not a reply (RESP3 only)
            v => return Ok(v),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.request_redirected(cmd, Instant::now() + self.timeout)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        // A few small pipelines (waiter bookkeeping) on connections already in use; kept
        // correct anyway: one deadline for all the replies. No probe in front.
        self.probed = true;
        let deadline = Instant::now() + self.timeout;
        let first = self.request_until(cmd, deadline)?;
        let mut replies = vec![first];
        for _ in 1..offset + count {
            self.stream.guard().budget = MAX_REPLY;
            replies.push(self.parser.parse_value(&mut self.stream)?);
        }
        Ok(replies.split_off(offset))
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("redis::Connection")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tcp(host: &str, port: u16) -> ConnectionAddr {
        ConnectionAddr::Tcp(host.to_string(), port)
    }

    /// Where a redirect from `like` to `target` goes, as (host, port).
    fn to(like: &ConnectionAddr, target: &str) -> Option<(String, u16)> {
        match redirect_addr(like, target)? {
            ConnectionAddr::Tcp(host, port) => Some((host, port)),
            other => panic!("not TCP: {other:?}"),
        }
    }

    fn hp(host: &str, port: u16) -> Option<(String, u16)> {
        Some((host.to_string(), port))
    }

    #[test]
    fn redirect_with_an_empty_host_is_to_the_host_asked() {
        let like = tcp("10.0.0.7", 7000);
        assert_eq!(to(&like, ":6380"), hp("10.0.0.7", 6380));
        let v6 = tcp("::1", 7000);
        assert_eq!(to(&v6, ":6380"), hp("::1", 6380));
        assert_eq!(to(&like, "[::1]:6380"), hp("::1", 6380));
        for bad in ["", ":", ":x", "h:", "h:65536", "h", ":-1", "h:0", ":0"] {
            assert_eq!(to(&like, bad), None, "{bad:?}");
        }
    }

    proptest! {
        /// Any redirect target: an address or `None`, never a panic.
        #[test]
        fn any_redirect_target_is_an_address_or_refused(target in "\\PC*") {
            let _ = redirect_addr(&tcp("h", 1), &target);
        }

        /// `host:port` names that host and port; `:port` the host asked, at that port. (Port 0
        /// is refused: `redirect_with_an_empty_host_is_to_the_host_asked`. Drawn from all of
        /// u16, it failed one run in a few hundred.)
        #[test]
        fn redirect_targets_round_trip(host in "[a-z0-9][a-z0-9.-]{0,30}", port in 1u16..) {
            let like = tcp("asked.example", 1);
            prop_assert_eq!(to(&like, &format!("{host}:{port}")), hp(&host, port));
            prop_assert_eq!(to(&like, &format!(":{port}")), hp("asked.example", port));
        }
    }
}
