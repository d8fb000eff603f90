//! The socket under tokio-postgres: dlock connects it (TCP with keepalives, or a Unix socket)
//! and hands it over with `connect_raw`, through [`Checked`], which refuses a server message
//! that announces more than [`MAX_MESSAGE`] bytes before tokio-postgres sees its header — the
//! crate reserves a message's announced length at once, so a server announcing 2 GiB aborted
//! dlock (tests/it/hostile.rs).

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// The largest server message accepted. dlock's replies are a few rows.
pub(super) const MAX_MESSAGE: u32 = 4 << 20;

/// The most data rows one statement may return before its end (`ReadyForQuery`): a lock's
/// statements return a handful (a status one row per waiter). A server that streams more is
/// refused, as a too-large message is, instead of being held in memory.
pub(super) const MAX_ROWS: u32 = 10_000;

/// The most bytes the server may send between two `ReadyForQuery` messages (one request's
/// reply, or the startup); above [`MAX_MESSAGE`], so one whole message always fits.
pub(super) const MAX_REPLY: u64 = 8 << 20;

/// TCP or a Unix socket.
pub(super) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    /// What the first lock statement must check about the server session behind this socket
    /// (see `ground`): over TCP, also the local port, to compare with the server's view.
    pub(super) fn reached(&self) -> super::ground::Reached {
        use super::ground::Reached;
        match self {
            Socket::Tcp(t) => t
                .local_addr()
                .map_or(Reached::Unix, |a| Reached::Tcp(a.port())),
            Socket::Unix(_) => Reached::Unix,
        }
    }

    /// Connects to `host:port`, or to the socket in directory `host` (libpq's `.s.PGSQL.PORT`).
    pub(super) async fn connect(host: &super::url::Target, port: u16) -> io::Result<Socket> {
        match host {
            super::url::Target::Tcp(h) => {
                let s = TcpStream::connect((h.as_str(), port)).await?;
                s.set_nodelay(true)?;
                // A dead server is noticed within ~4 s while a waiter sits in its lock queue
                // (no request is in flight then, so nothing else would time out).
                let keepalive = socket2::TcpKeepalive::new()
                    .with_time(Duration::from_secs(2))
                    .with_interval(Duration::from_secs(1))
                    .with_retries(2);
                socket2::SockRef::from(&s).set_tcp_keepalive(&keepalive)?;
                Ok(Socket::Tcp(s))
            }
            super::url::Target::Unix(dir) => {
                let path = Path::new(dir).join(format!(".s.PGSQL.{port}"));
                Ok(Socket::Unix(UnixStream::connect(path).await?))
            }
        }
    }
}

/// `AsyncRead` and `AsyncWrite` for an enum of streams, by delegating to the variant's.
macro_rules! delegate_io {
    ($ty:ident { $($variant:ident),+ }) => {
        impl AsyncRead for $ty {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }

        impl AsyncWrite for $ty {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_io!(Socket { Tcp, Unix });
delegate_io!(Link { Plain, Tls });

/// A socket whose incoming bytes are followed message by message (a type byte, then a 4-byte
/// big-endian length that counts itself), failing on a length over [`MAX_MESSAGE`].
pub(super) struct Checked {
    inner: Link,
    /// Header bytes of the current message seen so far (0 to 5).
    header: [u8; 5],
    have: usize,
    /// Body bytes of the current message still to come.
    left: u64,
    /// Data rows and bytes received since the last `ReadyForQuery`.
    rows: u32,
    bytes: u64,
    /// The process id the server's BackendKeyData named (-1 until it came): a pooler sends one
    /// of its own, so it differs from `pg_backend_pid()` behind one (see `ground`).
    key_pid: Arc<AtomicI64>,
    /// The bytes of that process id seen so far, while a BackendKeyData body is read.
    key: Option<(usize, [u8; 4])>,
}

impl Checked {
    pub(super) fn new(inner: Link, key_pid: Arc<AtomicI64>) -> Checked {
        Checked {
            inner,
            header: [0; 5],
            have: 0,
            left: 0,
            rows: 0,
            bytes: 0,
            key_pid,
            key: None,
        }
    }

    /// Follows `bytes` through the message framing.
    fn follow(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = (self.left.min(bytes.len() as u64)) as usize;
                if let Some((got, pid)) = &mut self.key {
                    let take = (4 - *got).min(n);
                    pid[*got..*got + take].copy_from_slice(&bytes[..take]);
                    *got += take;
                    if *got == 4 {
                        let id = i32::from_be_bytes(*pid);
                        self.key_pid.store(i64::from(id), Ordering::SeqCst);
                        self.key = None;
                    }
                }
                self.left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            self.header[self.have] = bytes[0];
            self.have += 1;
            bytes = &bytes[1..];
            if self.have == 5 {
                self.have = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]);
                if !(4..=MAX_MESSAGE).contains(&len) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the server sent a message of {len} bytes (at most {MAX_MESSAGE} accepted)"
                        ),
                    ));
                }
                self.left = u64::from(len - 4);
                match self.header[0] {
                    b'Z' => (self.rows, self.bytes) = (0, 0),
                    b'D' => self.rows = self.rows.saturating_add(1),
                    b'K' if len >= 8 => self.key = Some((0, [0; 4])),
                    _ => {}
                }
                self.bytes = self.bytes.saturating_add(u64::from(len) + 1);
                if self.rows > MAX_ROWS || self.bytes > MAX_REPLY {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the server sent more than {MAX_ROWS} rows or {} MiB in reply to one \
                             request",
                            MAX_REPLY >> 20
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl AsyncRead for Checked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let new = buf.filled()[before..].to_vec();
        Poll::Ready(this.follow(&new))
    }
}

impl AsyncWrite for Checked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(chunks: &[&[u8]]) -> io::Result<()> {
        follow_key(chunks).map(|_| ())
    }

    /// Follows `chunks`; returns the BackendKeyData process id seen (-1: none).
    fn follow_key(chunks: &[&[u8]]) -> io::Result<i64> {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _g = rt.enter();
        let pid = Arc::new(AtomicI64::new(-1));
        let link = Link::Plain(Socket::Unix(UnixStream::from_std(a).unwrap()));
        let mut c = Checked::new(link, pid.clone());
        chunks.iter().try_for_each(|ch| c.follow(ch))?;
        Ok(pid.load(Ordering::SeqCst))
    }

    #[test]
    fn the_backend_key_data_pid_is_read_across_reads() {
        // 'K', length 12: pid 0x01020304, key; then 'Z'.
        let key: &[u8] = b"K\0\0\0\x0c\x01\x02";
        let rest: &[u8] = b"\x03\x04abcdZ\0\0\0\x05I";
        assert_eq!(follow_key(&[key, rest]).unwrap(), 0x0102_0304);
        // A pid of 0xffffffff is -1 as PostgreSQL's int4: never a real backend's.
        assert_eq!(
            follow_key(&[b"K\0\0\0\x0c\xff\xff\xff\xffabcd"]).unwrap(),
            -1
        );
        assert_eq!(follow_key(&[b"Z\0\0\0\x05I"]).unwrap(), -1);
        // A BackendKeyData too short to hold a pid is not read.
        assert_eq!(follow_key(&[b"K\0\0\0\x06ab"]).unwrap(), -1);
    }

    #[test]
    fn messages_are_followed_across_reads_and_big_ones_refused() {
        // 'Z' (ready), length 5, one byte; then 'C' split across reads.
        assert!(follow(&[b"Z\0\0\0\x05I", b"C\0\0", b"\0\x06ab"]).is_ok());
        assert!(follow(&[b"R\x7f\xff\xff\xff"]).is_err());
        assert!(follow(&[b"Z\0\0\0\x05I", b"D\0\x50", b"\0\0"]).is_err());
        assert!(
            follow(&[b"Z\0\0\0\x03"]).is_err(),
            "a length below 4 is malformed"
        );
    }

    #[test]
    fn endless_replies_are_refused_and_ready_for_query_resets_the_count() {
        let row: &[u8] = b"D\0\0\0\x06\0\0";
        let ready: &[u8] = b"Z\0\0\0\x05I";
        let mut rows = vec![row; MAX_ROWS as usize];
        assert!(follow(&rows).is_ok());
        rows.push(row);
        assert!(follow(&rows).is_err(), "one row too many");
        let mut rows = vec![row; MAX_ROWS as usize];
        rows.push(ready);
        rows.extend(vec![row; MAX_ROWS as usize]);
        assert!(follow(&rows).is_ok(), "counted per reply");
    }
}

/// libpq's `sslmode` (and `sslrootcert`): whether to use TLS and what to verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SslMode {
    /// Never.
    Disable,
    /// If the server offers it, without verifying the server (libpq's default; `allow` too).
    Prefer,
    /// Always, without verifying the server (verifying the chain when a root is given).
    Require,
    /// Always, verifying the chain but not the host name.
    VerifyCa,
    /// Always, verifying the chain and the host name.
    VerifyFull,
}

/// The TLS settings of a URL.
#[derive(Clone, Debug)]
pub(super) struct Tls {
    pub(super) mode: SslMode,
    /// `sslrootcert`: the CAs to trust instead of the system's.
    pub(super) root: Option<std::path::PathBuf>,
}

/// Both kinds of socket, with TLS or without.
pub(super) enum Link {
    Plain(Socket),
    Tls(Box<tokio_rustls::client::TlsStream<Socket>>),
}

impl Link {
    /// PostgreSQL's TLS negotiation on `socket` (an `SSLRequest`, one byte of answer, then the
    /// handshake), as `tls` asks. Never on a Unix socket (as libpq).
    pub(super) async fn negotiate(mut socket: Socket, host: &str, tls: &Tls) -> io::Result<Link> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if tls.mode == SslMode::Disable || matches!(socket, Socket::Unix(_)) {
            return Ok(Link::Plain(socket));
        }
        // Length 8, then the code 1234/5679.
        socket
            .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
            .await?;
        let mut answer = [0u8; 1];
        socket.read_exact(&mut answer).await?;
        match answer[0] {
            b'S' => {}
            b'N' if tls.mode == SslMode::Prefer => return Ok(Link::Plain(socket)),
            b'N' => {
                return Err(io::Error::other(
                    "the server does not offer TLS, and the URL's sslmode requires it",
                ));
            }
            _ => {
                return Err(io::Error::other(
                    "the server answered the TLS request with nonsense",
                ));
            }
        }
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::other(format!("bad TLS server name '{host}': {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(client_config(tls)?);
        Ok(Link::Tls(Box::new(connector.connect(name, socket).await?)))
    }
}

/// The rustls configuration for `tls`'s mode and roots.
fn client_config(tls: &Tls) -> io::Result<Arc<rustls::ClientConfig>> {
    use std::sync::Arc;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verify_chain = match tls.mode {
        SslMode::VerifyCa | SslMode::VerifyFull => true,
        SslMode::Require => tls.root.is_some(), // libpq: a root file given means verify-ca
        SslMode::Prefer | SslMode::Disable => false,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?;
    let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> = if verify_chain {
        let mut roots = rustls::RootCertStore::empty();
        match &tls.root {
            // sslrootcert replaces the system's CAs, as in libpq.
            Some(path) => {
                use rustls::pki_types::pem::PemObject;
                let certs =
                    rustls::pki_types::CertificateDer::pem_file_iter(path).map_err(|e| {
                        io::Error::other(format!("cannot read sslrootcert {}: {e}", path.display()))
                    })?;
                for cert in certs {
                    let cert = cert.map_err(|e| {
                        io::Error::other(format!("bad sslrootcert {}: {e}", path.display()))
                    })?;
                    roots.add(cert).map_err(io::Error::other)?;
                }
            }
            None => roots = crate::backend::system_roots(),
        }
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(io::Error::other)?;
        Arc::new(Verifier {
            chain: Some(webpki),
            check_name: tls.mode == SslMode::VerifyFull,
            provider,
        })
    } else {
        Arc::new(Verifier {
            chain: None,
            check_name: false,
            provider,
        })
    };
    Ok(Arc::new(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

/// libpq's verification levels: none (`require`: encryption only), the chain (`verify-ca`), or
/// the chain and the name (`verify-full`). The handshake's signatures are always checked.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    check_name: bool,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
