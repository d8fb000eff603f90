//! Watching a connection's socket for its end while nothing is being read from it: a thread
//! polls a duplicate of the socket for `POLLRDHUP` (the peer closed its side: a FIN) and
//! `POLLHUP`/`POLLERR` (a reset). Data arriving is not an end (`POLLIN` is not asked for), so
//! the watch can run beside the connection's own requests and replies.
//!
//! A session lock (MySQL's `GET_LOCK`) ends on the server the moment its connection does; a
//! reset by something between (a proxy, a firewall) frees it at once. The holder learns of it
//! from this watch at once, instead of at its next check (ttl/3 later).
//!
//! The duplicate keeps the socket open while the thread runs: [`HangupWatch`]'s drop wakes the
//! thread (a byte on its pipe), which closes the duplicate and ends. Drop it before a clean
//! release, whose end of the connection is not a loss.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::raw;

/// A running watch; dropping it ends it.
pub(crate) struct HangupWatch {
    stop: io::PipeWriter,
}

impl Drop for HangupWatch {
    /// A byte, not the pipe's end: a process forked since (the acquire holder's watchdog)
    /// holds a copy of the write end, and the reader would never see it closed.
    fn drop(&mut self) {
        use std::io::Write;
        let _ = self.stop.write_all(b"x");
    }
}

impl HangupWatch {
    /// Watches socket `fd` (duplicated: the caller keeps its own) and calls `on_end` once if
    /// its connection ends before the watch is dropped.
    pub(crate) fn start(fd: RawFd, on_end: Box<dyn FnOnce() + Send>) -> io::Result<HangupWatch> {
        // Above 2: a closed standard descriptor must not become the socket.
        let copy =
            raw::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3).map_err(io::Error::from_raw_os_error)?;
        let copy = i32::try_from(copy).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: `copy` is a descriptor fcntl just made for us and nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(copy) };
        let (stop_r, stop_w) = io::pipe()?;
        std::thread::Builder::new()
            .name("dlock-hangup".into())
            .spawn(move || watch(&sock, &stop_r, on_end))?;
        Ok(HangupWatch { stop: stop_w })
    }
}

fn watch(sock: &OwnedFd, stop: &io::PipeReader, on_end: Box<dyn FnOnce() + Send>) {
    let ended = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        raw::poll(&mut fds, None);
        // Stopped wins over an end seen at the same time: a clean release closes both.
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & ended != 0 {
            on_end();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn the_peers_close_is_an_end_and_its_data_is_not() {
        use std::io::Write;
        let (c, mut s) = pair();
        let (tx, rx) = mpsc::channel();
        let _w = HangupWatch::start(c.as_raw_fd(), Box::new(move || tx.send(()).unwrap())).unwrap();
        s.write_all(b"a reply").unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "data is no end"
        );
        s.shutdown(Shutdown::Both).unwrap();
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the end seen");
    }

    #[test]
    fn a_dropped_watch_says_nothing_and_lets_the_socket_close() {
        let (c, s) = pair();
        let (tx, rx) = mpsc::channel();
        let w = HangupWatch::start(c.as_raw_fd(), Box::new(move || tx.send(()).unwrap())).unwrap();
        drop(w);
        drop(c);
        // The duplicate is closed by the thread: the peer sees the connection end.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(io::Read::read(&mut &s, &mut buf).unwrap(), 0, "EOF");
        drop(s);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    }
}
