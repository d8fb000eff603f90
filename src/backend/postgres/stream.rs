//! The socket under tokio-postgres: dlock connects it (TCP with keepalives, or a Unix socket)
//! and hands it over with `connect_raw`, through [`Checked`], which refuses a server message
//! that announces more than [`MAX_MESSAGE`] bytes before tokio-postgres sees its header — the
//! crate reserves a message's announced length at once, so a server announcing 2 GiB aborted
//! dlock (tests/it/hostile.rs).

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// The largest server message accepted. dlock's replies are a few rows.
pub(super) const MAX_MESSAGE: u32 = 4 << 20;

/// TCP or a Unix socket.
pub(super) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
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

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A socket whose incoming bytes are followed message by message (a type byte, then a 4-byte
/// big-endian length that counts itself), failing on a length over [`MAX_MESSAGE`].
pub(super) struct Checked {
    inner: Socket,
    /// Header bytes of the current message seen so far (0 to 5).
    header: [u8; 5],
    have: usize,
    /// Body bytes of the current message still to come.
    left: u64,
}

impl Checked {
    pub(super) fn new(inner: Socket) -> Checked {
        Checked {
            inner,
            header: [0; 5],
            have: 0,
            left: 0,
        }
    }

    /// Follows `bytes` through the message framing.
    fn follow(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = (self.left.min(bytes.len() as u64)) as usize;
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
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _g = rt.enter();
        let mut c = Checked::new(Socket::Unix(UnixStream::from_std(a).unwrap()));
        chunks.iter().try_for_each(|ch| c.follow(ch))
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
}
