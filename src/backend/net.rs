//! Sockets for the backends that speak their protocol over dlock's own connection (Redis, etcd):
//! every request (sending it and reading the whole reply) has one deadline, checked before every
//! read and write; a reply may take only so many bytes; and on the main thread a forwarded
//! signal ends the wait at once (see [`crate::signals::interrupts_network_waits`]).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

/// The error of a wait that a forwarded signal ended. Not `ErrorKind::Interrupted`: std's
/// `write_all` and `read_exact` (and so redis-rs) retry those, which waited out the request's
/// deadline after a Ctrl-C — or spun, once every later wait ends at once too.
#[derive(Debug)]
struct Signalled;

impl std::fmt::Display for Signalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted by a signal")
    }
}

impl std::error::Error for Signalled {}

fn signal_error() -> io::Error {
    io::Error::other(Signalled)
}

/// Whether `e` is a wait that a forwarded signal ended.
pub(crate) fn is_signalled(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Signalled>())
}

/// The socket under the protocol: plain TCP, a Unix socket, or TLS over TCP.
pub(crate) enum Stream {
    Tcp(Guarded<TcpStream>),
    Unix(Guarded<UnixStream>),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Guarded<TcpStream>>>),
}

impl Stream {
    pub(crate) fn guard(&mut self) -> &mut Limits {
        match self {
            Stream::Tcp(g) => &mut g.limits,
            Stream::Unix(g) => &mut g.limits,
            Stream::Tls(t) => &mut t.sock.limits,
        }
    }
}

/// What bounds one request.
pub(crate) struct Limits {
    /// When the current request must be done.
    pub(crate) deadline: Instant,
    /// Bytes the current reply may still take.
    pub(crate) budget: usize,
}

/// A socket whose reads and writes wait at most until [`Limits::deadline`] and read at most
/// [`Limits::budget`] bytes.
pub(crate) struct Guarded<S> {
    sock: S,
    limits: Limits,
}

impl<S: AsFd> Guarded<S> {
    pub(crate) fn new(sock: S, deadline: Instant, budget: usize) -> Guarded<S> {
        Guarded {
            sock,
            limits: Limits { deadline, budget },
        }
    }

    /// Waits until the socket is ready for `events`, the deadline passes, or (on the main
    /// thread) a forwarded signal arrives.
    fn ready(&self, events: i16) -> io::Result<()> {
        let signals = crate::signals::interrupts_network_waits();
        if signals.is_some() && crate::signals::network_wait_interrupted() {
            return Err(signal_error());
        }
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
                return Err(signal_error());
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
            return Err(io::Error::other(
                "the server's reply is larger than a lock reply can be",
            ));
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

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => {
                let handshaking = s.conn.is_handshaking();
                s.read(buf).map_err(|e| handshake_error(handshaking, e))
            }
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => {
                let handshaking = s.conn.is_handshaking();
                s.write(buf).map_err(|e| handshake_error(handshaking, e))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// An error of a TLS connection still `handshaking`, said as such (same kind, so a timeout is
/// still a timeout): a plain server given a TLS URL reads the ClientHello as the start of a
/// command and waits for the rest, and the run said only "the server did not answer in time".
/// A signal's interruption is left as it is.
fn handshake_error(handshaking: bool, e: io::Error) -> io::Error {
    if !handshaking || e.kind() == io::ErrorKind::Interrupted || is_signalled(&e) {
        return e;
    }
    let why = match e.kind() {
        io::ErrorKind::TimedOut => "no TLS handshake in time".to_string(),
        _ => format!("the TLS handshake failed ({})", crate::report::io_words(&e)),
    };
    io::Error::new(
        e.kind(),
        format!(
            "{why}: does the server speak TLS on this port? (a plain port takes the scheme \
             without TLS: redis:// rather than rediss://, etcd:// rather than etcds://)"
        ),
    )
}

impl Stream {
    /// TCP to `host:port`, with TLS (verified against the system's CAs and `SSL_CERT_FILE`)
    /// when `tls`; connected, and the TLS handshake bounded, by `deadline`; each reply may take
    /// `budget` bytes.
    pub(crate) fn tcp(
        host: &str,
        port: u16,
        tls: bool,
        deadline: Instant,
        budget: usize,
    ) -> io::Result<Stream> {
        let sock = Guarded::new(tcp(host, port, deadline)?, deadline, budget);
        if !tls {
            return Ok(Stream::Tcp(sock));
        }
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::other(format!("bad TLS server name '{host}': {e}")))?;
        let tls = rustls::ClientConnection::new(tls_config()?, name).map_err(io::Error::other)?;
        Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(tls, sock))))
    }

    /// A Unix socket.
    pub(crate) fn unix(
        path: &std::path::Path,
        deadline: Instant,
        budget: usize,
    ) -> io::Result<Stream> {
        Ok(Stream::Unix(Guarded::new(
            UnixStream::connect(path)?,
            deadline,
            budget,
        )))
    }

    /// Bounds the next request: done by `deadline`, its reply at most `budget` bytes.
    pub(crate) fn bound(&mut self, deadline: Instant, budget: usize) {
        let limits = self.guard();
        limits.deadline = deadline;
        limits.budget = budget;
    }
}

/// A TCP connection to the first address of `host` that accepts before `deadline`.
pub(crate) fn tcp(host: &str, port: u16, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"));
    for addr in (host, port).to_socket_addrs()? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                crate::trace::stage("connect");
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The TLS client configuration: the system's trusted CAs (and `SSL_CERT_FILE`/`SSL_CERT_DIR`).
pub(crate) fn tls_config() -> io::Result<Arc<rustls::ClientConfig>> {
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
