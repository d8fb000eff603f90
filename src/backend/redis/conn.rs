//! dlock's own Redis connection: redis-rs builds the commands and parses the replies, but the
//! socket is ours, because redis-rs's synchronous connection cannot bound what a server does to
//! it. With its connection, a server that answered one byte a second kept `dlock run -n` waiting
//! forever (each byte restarted the read timeout), a signal stayed unanswered until the reply or
//! the timeout, and a reply announcing a 2 GB string grew dlock to 7.8 GB. Here every request
//! (sending the command and reading the whole reply) has one deadline, checked before every
//! read and write; a reply larger than [`MAX_REPLY`] ends the connection; and on the main thread
//! a forwarded signal ends the wait at once (see [`crate::signals::interrupts_network_waits`]).
//! Every failure is an I/O error to redis-rs, so the callers' error handling is unchanged.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, ConnectionLike, RedisResult, Value};

/// The most a reply may hold. A lock reply is a few integers; the largest dlock reads is a
/// `status` of a semaphore with its holders' records (each capped when written, see
/// [`crate::report`]), well under this.
pub(crate) const MAX_REPLY: usize = 4 << 20;

/// The socket under the protocol: plain TCP, a Unix socket, or TLS over TCP.
enum Stream {
    Tcp(Guarded<TcpStream>),
    Unix(Guarded<UnixStream>),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Guarded<TcpStream>>>),
}

impl Stream {
    fn guard(&mut self) -> &mut Limits {
        match self {
            Stream::Tcp(g) => &mut g.limits,
            Stream::Unix(g) => &mut g.limits,
            Stream::Tls(t) => &mut t.sock.limits,
        }
    }
}

/// What bounds one request.
struct Limits {
    /// When the current request must be done.
    deadline: Instant,
    /// Bytes the current reply may still take.
    budget: usize,
}

/// A socket whose reads and writes wait at most until [`Limits::deadline`] and read at most
/// [`Limits::budget`] bytes.
struct Guarded<S> {
    sock: S,
    limits: Limits,
}

impl<S: AsFd> Guarded<S> {
    fn new(sock: S, deadline: Instant) -> Guarded<S> {
        Guarded {
            sock,
            limits: Limits {
                deadline,
                budget: MAX_REPLY,
            },
        }
    }

    /// Waits until the socket is ready for `events`, the deadline passes, or (on the main
    /// thread) a forwarded signal arrives.
    fn ready(&self, events: i16) -> io::Result<()> {
        let signals = crate::signals::interrupts_network_waits();
        loop {
            let left = self
                .limits
                .deadline
                .saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the server did not answer in time",
                ));
            }
            let (ready, signalled) =
                crate::sys::poll_ready(self.sock.as_fd(), events, signals, left)?;
            if signalled && crate::signals::take_for_network_wait() {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    "interrupted by a signal",
                ));
            }
            if ready {
                return Ok(());
            }
        }
    }
}

impl<S: AsFd + Read> Read for Guarded<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.limits.budget == 0 {
            return Err(io::Error::other(format!(
                "the server's reply is larger than {} MiB; a lock reply is small",
                MAX_REPLY >> 20
            )));
        }
        self.ready(libc::POLLIN)?;
        let want = buf.len().min(self.limits.budget);
        let n = self.sock.read(&mut buf[..want])?;
        self.limits.budget -= n;
        Ok(n)
    }
}

impl<S: AsFd + Write> Write for Guarded<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.ready(libc::POLLOUT)?;
        self.sock.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
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
                Stream::Tcp(Guarded::new(tcp(host, *port, deadline)?, deadline))
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
                let sock = Guarded::new(tcp(host, *port, deadline)?, deadline);
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| io::Error::other(format!("bad TLS server name '{host}': {e}")))?;
                let tls =
                    rustls::ClientConnection::new(tls_config()?, name).map_err(io::Error::other)?;
                Stream::Tls(Box::new(rustls::StreamOwned::new(tls, sock)))
            }
            ConnectionAddr::Unix(path) => {
                Stream::Unix(Guarded::new(UnixStream::connect(path)?, deadline))
            }
            _ => return Err(io::Error::other("unsupported Redis address").into()),
        };
        let settings = info.redis_settings();
        let mut con = Connection {
            stream,
            parser: redis::Parser::new(),
            timeout: connect,
            db: settings.db(),
            open: true,
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

    /// Sends `cmd` and reads one reply, all before `deadline`.
    fn request_until(&mut self, cmd: &[u8], deadline: Instant) -> RedisResult<Value> {
        if !self.open {
            return Err(
                io::Error::new(io::ErrorKind::NotConnected, "the connection broke before").into(),
            );
        }
        let limits = self.stream.guard();
        limits.deadline = deadline;
        limits.budget = MAX_REPLY;
        let result = self.exchange(cmd);
        if result.is_err() {
            self.open = false;
        }
        result
    }

    fn exchange(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match &mut self.stream {
            Stream::Tcp(s) => send_and_read(s, &mut self.parser, cmd),
            Stream::Unix(s) => send_and_read(s, &mut self.parser, cmd),
            Stream::Tls(s) => send_and_read(s.as_mut(), &mut self.parser, cmd),
        }
    }
}

fn send_and_read(
    s: &mut impl ReadWrite,
    parser: &mut redis::Parser,
    cmd: &[u8],
) -> RedisResult<Value> {
    s.write_all(cmd)?;
    s.flush()?;
    loop {
        match parser.parse_value(&mut *s)? {
            Value::Push { .. } => continue, // not a reply (RESP3 only)
            v => return Ok(v),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

impl ConnectionLike for Connection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.request_until(cmd, Instant::now() + self.timeout)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        // dlock sends no pipelines; kept correct anyway: one deadline for all the replies.
        let deadline = Instant::now() + self.timeout;
        let first = self.request_until(cmd, deadline)?;
        let mut replies = vec![first];
        for _ in 1..offset + count {
            let limits = self.stream.guard();
            limits.budget = MAX_REPLY;
            match &mut self.stream {
                Stream::Tcp(s) => replies.push(self.parser.parse_value(s)?),
                Stream::Unix(s) => replies.push(self.parser.parse_value(s)?),
                Stream::Tls(s) => replies.push(self.parser.parse_value(s.as_mut())?),
            }
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

/// A TCP connection to the first address of `host` that accepts before `deadline`.
fn tcp(host: &str, port: u16, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"));
    for addr in (host, port).to_socket_addrs()? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The TLS client configuration: the system's trusted CAs (and `SSL_CERT_FILE`/`SSL_CERT_DIR`).
fn tls_config() -> io::Result<Arc<rustls::ClientConfig>> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = crate::backend::system_roots();
            if roots.is_empty() {
                return Err("no trusted CA certificates found (set SSL_CERT_FILE)".into());
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(io::Error::other)
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("redis::Connection")
    }
}
