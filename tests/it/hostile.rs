//! Servers that misbehave: one that accepts and never answers (stall), one that answers a byte
//! every 200 ms (drip: each byte would restart a read timeout), one that announces an enormous
//! reply and streams it as fast as it can (flood). Against each, on every network backend,
//! dlock must end on its own within a few seconds (exit 69), end at once on a signal
//! (128+N), and never hold more than a small reply in memory (dlock runs under a 1 GiB
//! address-space limit here: a reply grown to gigabytes aborts it, which fails the test).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

#[derive(Clone, Copy)]
enum Behaviour {
    /// Reads what comes, says nothing.
    Stall,
    /// Sends `preamble`, then one byte every 200 ms, for ever.
    Drip(&'static [u8]),
    /// Sends `preamble`, then bytes as fast as the client takes them, for ever.
    Flood(&'static [u8]),
}

/// A fake server on a free loopback port; stops (and closes every connection) on drop.
struct Fake {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Fake {
    fn start(behaviour: Behaviour) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let s = s.clone();
                        thread::spawn(move || serve(client, behaviour, &s));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Fake { port, stop }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(mut client: TcpStream, behaviour: Behaviour, stop: &AtomicBool) {
    // Swallow whatever the client sends, on the side.
    let mut reader = client.try_clone().unwrap();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
    });
    client
        .set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent_preamble = false;
    while !stop.load(Ordering::SeqCst) {
        let result = match behaviour {
            Behaviour::Stall => {
                thread::sleep(Duration::from_millis(50));
                Ok(())
            }
            Behaviour::Drip(pre) | Behaviour::Flood(pre) if !sent_preamble => {
                sent_preamble = true;
                client.write_all(pre)
            }
            Behaviour::Drip(_) => {
                thread::sleep(Duration::from_millis(200));
                client.write_all(b"x")
            }
            Behaviour::Flood(_) => match client.write(&chunk) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(()),
                Err(e) => Err(e),
            },
        };
        if result.is_err() {
            return; // the client left
        }
    }
}

/// What each backend's client reads first, made endless.
fn preamble(backend: &str, flood: bool) -> &'static [u8] {
    match (backend, flood) {
        // A bulk string of 2 GB (Redis speaks only when asked; the fake answers at once).
        ("redis", _) => b"$2000000000\r\n",
        // A MySQL packet header (the server greeting): 256 bytes to drip, or 16 MiB - 1 to
        // flood (more than the client takes before the handshake: refused at once).
        ("mysql", false) => &[0, 1, 0, 0],
        ("mysql", true) => &[0xff, 0xff, 0xff, 0],
        // A ZooKeeper frame (the connect response): 256 bytes to drip, or 2 GiB - 1 to flood.
        ("zookeeper", false) => &[0, 0, 1, 0],
        ("zookeeper", true) => &[0x7f, 0xff, 0xff, 0xff],
        // "No TLS" to dlock's TLS request, then a PostgreSQL message (the authentication
        // request) of 256 bytes, or of 2 GiB - 1.
        ("postgres", false) => b"NR\x00\x00\x01\x00",
        ("postgres", true) => b"NR\x7f\xff\xff\xff",
        // An HTTP reply (etcd's JSON gateway) whose body is 256 bytes to drip, or 2 GB.
        ("etcd", false) => b"HTTP/1.1 200 OK\r\nContent-Length: 256\r\n\r\n",
        ("etcd", true) => b"HTTP/1.1 200 OK\r\nContent-Length: 2000000000\r\n\r\n",
        _ => unreachable!(),
    }
}

fn url(backend: &str, port: u16) -> String {
    match backend {
        "redis" => format!("redis://127.0.0.1:{port}"),
        "mysql" => format!("mysql://root@127.0.0.1:{port}/dlock"),
        "zookeeper" => format!("zk://127.0.0.1:{port}"),
        "postgres" => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        "etcd" => format!("etcd://127.0.0.1:{port}"),
        _ => unreachable!(),
    }
}

/// `dlock run` against the fake, under a 1 GiB address-space limit.
fn dlock_against(backend: &str, port: u16, extra: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -v 1048576 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_dlock"))
        .args(["run", "--backend", backend, "--url", &url(backend, port)])
        .args(["--key", &unique_key("hostile")])
        .args(extra)
        .args(["--", "true"]);
    cmd
}

const BACKENDS: [&str; 5] = ["redis", "mysql", "zookeeper", "postgres", "etcd"];

/// Each misbehaving server makes dlock fail on its own, in a bounded time, with exit 69 and
/// one line saying what went wrong.
#[test]
fn misbehaving_servers_fail_within_a_bound() {
    // The bound: Redis and ZooKeeper give a request 2 s after a 2 s connect, etcd 3 s after
    // 1 s; MySQL's backstop is 8 s for the handshake. A second of slack each.
    let cases = [("stall", false), ("drip", false), ("flood", true)];
    let mut threads = Vec::new();
    for backend in BACKENDS {
        for (name, flood) in cases {
            threads.push(thread::spawn(move || {
                let behaviour = match name {
                    "stall" => Behaviour::Stall,
                    "drip" => Behaviour::Drip(preamble(backend, false)),
                    _ => Behaviour::Flood(preamble(backend, flood)),
                };
                let fake = Fake::start(behaviour);
                let limit = if backend == "mysql" { 11 } else { 6 };
                let start = Instant::now();
                let p = Proc::spawn(&mut dlock_against(backend, fake.port, &["-n"]));
                let (out, took) = p.wait(Duration::from_secs(limit + 10));
                let err = String::from_utf8_lossy(&out.stderr).to_string();
                let what = format!("{backend} {name}: took {took:?}, {}", describe(&out));
                assert_eq!(out.status.code(), Some(69), "{what}");
                assert!(start.elapsed() < Duration::from_secs(limit), "{what}");
                assert_eq!(err.lines().count(), 1, "{what}");
                assert!(err.starts_with("dlock: "), "{what}");
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// A signal ends a run that is connecting to (or waiting on) a misbehaving server at once, with
/// 128+N, instead of being held until a reply or a timeout.
#[test]
fn signals_end_a_run_stuck_on_a_misbehaving_server() {
    let mut threads = Vec::new();
    for backend in BACKENDS {
        for (name, sig) in [("stall", libc::SIGTERM), ("drip", libc::SIGINT)] {
            threads.push(thread::spawn(move || {
                let behaviour = match name {
                    "stall" => Behaviour::Stall,
                    _ => Behaviour::Drip(preamble(backend, false)),
                };
                let fake = Fake::start(behaviour);
                let p = Proc::spawn(&mut dlock_against(backend, fake.port, &[]));
                // Give it time to connect and send its first request.
                thread::sleep(Duration::from_millis(700));
                assert!(alive(p.pid()), "{backend} {name}: ended before the signal");
                let sent = Instant::now();
                p.signal(sig);
                let (out, _) = p.wait(Duration::from_secs(10));
                let what = format!("{backend} {name}: {}", describe(&out));
                assert_eq!(out.status.code(), Some(128 + sig), "{what}");
                assert!(
                    sent.elapsed() < Duration::from_millis(700),
                    "{what}: took {:?}",
                    sent.elapsed()
                );
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// A MySQL connect stopped by a signal (the driver's calls cannot be interrupted: the process
/// ends from the signal handler) said nothing; it says one `dlock:` line, like every other end.
#[test]
fn mysql_connect_ended_by_a_signal_says_why() {
    let fake = Fake::start(Behaviour::Stall);
    let p = Proc::spawn(&mut dlock_against("mysql", fake.port, &[]));
    thread::sleep(Duration::from_millis(500));
    p.signal(libc::SIGTERM);
    let (out, _) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(143), "{}", describe(&out));
    let line = one_error_line(&out);
    assert!(line.contains("SIGTERM"), "{line}");
}
