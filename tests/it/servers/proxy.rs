//! A TCP proxy between dlock and a server, for faults the network makes: a black hole (the
//! connections stay open, nothing gets through either way), a blip (every connection closed at
//! once), and a delay on everything forwarded. The partition tests and the fault campaign
//! (tests/nemesis) both use it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// A TCP proxy on a free loopback port that forwards to `127.0.0.1:upstream` until
/// [`Proxy::black_hole`], and from then on reads and drops everything, both ways.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    holed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// The connections a blip closes, and whether one is under way.
    live: Arc<std::sync::Mutex<Live>>,
    /// How many blips have begun. A connection forwards nothing once one began after it was
    /// accepted, so a blip cuts every connection at the same instant: closing them one by one,
    /// the holder's first, let the server hand the lock to the waiter, and the waiter take it
    /// and start its command, before its own connection was closed (it then lost the lock, 79).
    blips: Arc<AtomicUsize>,
    /// Milliseconds every forwarded read waits before it is written on (0: none).
    #[allow(dead_code)] // set by the fault campaign (tests/nemesis) only
    delay_ms: Arc<AtomicU64>,
    /// How many reads it has forwarded, both ways (a request, a reply).
    forwarded: Arc<AtomicUsize>,
}

/// What [`Proxy::cut`] and the accepting thread share, under one lock: a connection is either
/// registered before a blip (and closed by it) or accepted after it.
#[derive(Default)]
struct Live {
    /// Set from [`Proxy::cut`] to [`Proxy::restore`]: new connections are closed at once.
    cut: bool,
    /// Both sockets of every connection accepted since the last blip.
    sockets: Vec<TcpStream>,
}

impl Proxy {
    pub(crate) fn to(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let holed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(std::sync::Mutex::new(Live::default()));
        let blips = Arc::new(AtomicUsize::new(0));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (h, s, l, b) = (holed.clone(), stop.clone(), live.clone(), blips.clone());
        let d = delay_ms.clone();
        let forwarded = Arc::new(AtomicUsize::new(0));
        let f = forwarded.clone();
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) if l.lock().unwrap().cut => drop(client),
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        // Checked again under the lock `cut` takes: a blip that began while
                        // this connection was being made closes it.
                        let mut live = l.lock().unwrap();
                        if live.cut {
                            continue;
                        }
                        live.sockets.push(client.try_clone().unwrap());
                        live.sockets.push(server.try_clone().unwrap());
                        let born = b.load(Ordering::SeqCst);
                        drop(live);
                        for (from, to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            let (h, s, b, d) = (h.clone(), s.clone(), b.clone(), d.clone());
                            let f = f.clone();
                            thread::spawn(move || pump(from, to, &h, &s, &b, born, &d, &f));
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            port,
            holed,
            stop,
            live,
            blips,
            delay_ms,
            forwarded,
        }
    }

    /// How many reads it has forwarded so far, both ways.
    #[allow(dead_code)] // the partition tests' (tests/it)
    pub(crate) fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }

    /// A blip: every connection is closed, and new ones too, until [`Proxy::restore`]. From
    /// the moment it begins nothing more gets through on any connection, however late this
    /// thread gets to closing each one.
    pub(crate) fn cut(&self) {
        let mut live = self.live.lock().unwrap();
        live.cut = true;
        self.blips.fetch_add(1, Ordering::SeqCst);
        for s in live.sockets.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The end of a blip.
    pub(crate) fn restore(&self) {
        self.live.lock().unwrap().cut = false;
    }

    /// From now on nothing gets through, and no connection is closed.
    pub(crate) fn black_hole(&self) {
        self.holed.store(true, Ordering::SeqCst);
    }

    /// The end of a black hole: every connection that went through it is closed (what it
    /// dropped left each one mid-stream), and new ones are forwarded.
    #[allow(dead_code)] // the fault campaign's (tests/nemesis)
    pub(crate) fn heal(&self) {
        self.cut();
        self.holed.store(false, Ordering::SeqCst);
        self.restore();
    }

    /// Every read forwarded from now on waits `delay` before it is written on.
    #[allow(dead_code)] // the fault campaign's (tests/nemesis)
    pub(crate) fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// `url` with `127.0.0.1:<upstream>` replaced by this proxy.
    pub(crate) fn rewrite(&self, url: &str, upstream: u16) -> String {
        url.replace(
            &format!("127.0.0.1:{upstream}"),
            &format!("127.0.0.1:{}", self.port),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Forwards `from` to `to` until either closes, or a blip begins after `born` (the count of
/// blips when the connection was accepted).
#[allow(clippy::too_many_arguments)] // the proxy's shared state, each piece its own Arc
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    holed: &AtomicBool,
    stop: &AtomicBool,
    blips: &AtomicUsize,
    born: usize,
    delay_ms: &AtomicU64,
    forwarded: &AtomicUsize,
) {
    from.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 16384];
    while !stop.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) if !holed.load(Ordering::SeqCst) => break,
            Ok(0) => thread::sleep(Duration::from_millis(100)), // a black hole closes nothing
            // Cut: what was read is dropped (it may be the server's answer to another
            // connection's close, such as a lock granted).
            Ok(_) if blips.load(Ordering::SeqCst) != born => break,
            Ok(n) if !holed.load(Ordering::SeqCst) => {
                let delay = delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    thread::sleep(Duration::from_millis(delay));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                forwarded.fetch_add(1, Ordering::SeqCst);
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    if !holed.load(Ordering::SeqCst) {
        let _ = to.shutdown(Shutdown::Write);
    }
}

/// Every `127.0.0.1:PORT` in `url` behind its own proxy.
pub(crate) fn proxied(url: &str) -> (String, Vec<Proxy>) {
    let mut out = url.to_string();
    let mut proxies = Vec::new();
    let mut rest = url;
    while let Some(i) = rest.find("127.0.0.1:") {
        rest = &rest[i + 10..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let upstream: u16 = digits.parse().unwrap();
        let p = Proxy::to(upstream);
        out = p.rewrite(&out, upstream);
        proxies.push(p);
    }
    (out, proxies)
}

/// Every URL of `urls` behind proxies (see [`proxied`]).
pub(crate) fn all_proxied(urls: &[String]) -> (Vec<String>, Vec<Proxy>) {
    let mut proxies = Vec::new();
    let via = urls
        .iter()
        .map(|u| {
            let (u, p) = proxied(u);
            proxies.extend(p);
            u
        })
        .collect();
    (via, proxies)
}
