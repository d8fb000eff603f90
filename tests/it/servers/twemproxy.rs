//! twemproxy (nutcracker, Debian's 0.5) in front of a redis-server: a `redis: true` pool of one
//! server. It closes the connection on every command it does not support (CLIENT, BLPOP,
//! SCRIPT, INFO, CONFIG …), which is what dlock must recognise.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use super::*;

/// A running nutcracker and the redis-server behind it.
pub(crate) struct Twemproxy {
    pub port: u16,
    pub redis: Redis,
    dir: PathBuf,
    child: Option<Child>,
}

/// The nutcracker binary: on PATH, or in /usr/sbin (where Debian puts it, not on every PATH).
fn nutcracker() -> Option<PathBuf> {
    let sbin = PathBuf::from("/usr/sbin/nutcracker");
    if sbin.is_file() {
        return Some(sbin);
    }
    available("nutcracker").then(|| PathBuf::from("nutcracker"))
}

impl Twemproxy {
    /// A proxy on a free port in front of a new redis-server, or `None` if either is missing
    /// (and not required).
    pub(crate) fn start() -> Option<Twemproxy> {
        let bin = nutcracker()?;
        let redis = Redis::start(&[])?;
        let dir = scratch("twemproxy");
        for attempt in 1.. {
            let port = free_port();
            let conf = dir.join("nutcracker.yml");
            std::fs::write(
                &conf,
                format!(
                    "dlock:\n  listen: 127.0.0.1:{port}\n  redis: true\n  hash_tag: \"{{}}\"\n  \
                     servers:\n   - 127.0.0.1:{}:1\n",
                    redis.port
                ),
            )
            .unwrap();
            let mut cmd = Command::new(&bin);
            cmd.arg("-c")
                .arg(&conf)
                .arg("-o")
                .arg(dir.join("nutcracker.log"))
                // The stats port (22222 by default) must not collide between test binaries.
                .arg("-s")
                .arg(free_port().to_string());
            let mut child = spawn_server(cmd).expect("spawn nutcracker");
            let log = dir.join("nutcracker.log");
            let ready = wait_ready(
                &mut child,
                || ping_through(port),
                || {
                    format!(
                        "nutcracker on port {port} not ready after 30 s; its log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                },
            );
            if ready {
                return Some(Twemproxy {
                    port,
                    redis,
                    dir,
                    child: Some(child),
                });
            }
            assert!(
                attempt < 3,
                "nutcracker exited at start, 3 times; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        unreachable!()
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The proxy's log, for failure messages.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nutcracker.log")).unwrap_or_default()
    }
}

/// Whether a `GET` through the proxy reaches the server behind it (a nil reply).
fn ping_through(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(1))).ok();
    // Multibulk: twemproxy does not parse inline commands.
    if s.write_all(b"*2\r\n$3\r\nGET\r\n$16\r\ndlock-test-ready\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"$-1"))
}

impl Drop for Twemproxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The shared proxy of this test binary (its server's script cache is all the tests change).
pub(crate) fn shared_twemproxy() -> Option<&'static Twemproxy> {
    static SHARED: OnceLock<Option<Twemproxy>> = OnceLock::new();
    SHARED.get_or_init(Twemproxy::start).as_ref()
}
