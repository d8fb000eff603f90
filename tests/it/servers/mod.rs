//! Real servers for the tests: started on a free loopback port with a temp dir, readiness polled
//! with a deadline, their log printed when they fail to start, killed on drop — and, because
//! they are spawned from one long-lived thread with `PR_SET_PDEATHSIG`, killed when the test
//! binary exits, however it exits. One shared server per backend per test binary; tests that
//! stop, kill or restart a server get their own.
//!
//! `DLOCK_TEST_REDIS_URL` points the shared server at an existing one instead. A missing server
//! binary skips the backend's tests loudly, or fails them under `DLOCK_TEST_REQUIRE_BACKENDS=1`.

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::util::*;

/// Whether a missing server must fail the tests (CI) rather than skip them.
pub(crate) fn required() -> bool {
    std::env::var_os("DLOCK_TEST_REQUIRE_BACKENDS").is_some_and(|v| v == "1")
}

/// Whether `bin` is on PATH; if not, skips loudly (returns false) or panics under CI.
pub(crate) fn available(bin: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()));
    if !found {
        assert!(
            !required(),
            "{bin} is not installed, and DLOCK_TEST_REQUIRE_BACKENDS=1"
        );
        eprintln!(
            "SKIPPED: {bin} is not installed (set DLOCK_TEST_REQUIRE_BACKENDS=1 to fail instead)"
        );
    }
    found
}

/// Runs a database client with `sql` as its last argument; its output, trimmed. Panics with
/// the client's errors if it fails.
fn sql_output(client: &mut Command, sql: &str) -> String {
    let out = client.arg(sql).output().unwrap();
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns server processes from a thread that lives as long as the test binary, so that
/// `PR_SET_PDEATHSIG` (which fires when the spawning *thread* exits) kills them only at the end.
///
/// Each server gets a process group of its own. Fault tests stop servers (SIGSTOP); a stopped
/// process in the test binary's own group made that group one "with stopped jobs", and when
/// the group then became orphaned (a process of another group that was the parent of one of
/// its members exited — a dlock run's guardian), the kernel sent SIGHUP to the whole group:
/// cargo and the test binary died without a word, twice in CI (after `etcd::faults`).
fn spawn_server(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                use std::os::unix::process::CommandExt;
                // SAFETY: prctl is async-signal-safe.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                        Ok(())
                    });
                }
                let _ = reply.send(cmd.process_group(0).spawn());
            }
        });
        Mutex::new(tx)
    });
    let (reply, rx) = mpsc::channel();
    // Servers write their own log files (printed when they fail to start).
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    tx.lock().unwrap().send((cmd, reply)).unwrap();
    rx.recv().unwrap()
}

/// Waits until `ping` succeeds (true), or `child` exits (false: the port was taken, say);
/// panics with `why()` after 30 s.
fn wait_ready(child: &mut Child, mut ping: impl FnMut() -> bool, why: impl Fn() -> String) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if ping() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(Instant::now() < deadline, "{}", why());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; servers bind it right after).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes ca.pem, server.pem and server.key (for 127.0.0.1 and localhost) into `dir`.
pub(crate) fn make_certs(dir: &std::path::Path) {
    let sh = |script: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj '/CN=dlock test CA'",
    );
    sh(
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj '/CN=localhost'",
    );
    sh(
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext.cnf && openssl x509 -req -in server.csr \
        -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext.cnf",
    );
}

/// A shared server is handed out once it has been up for the usual test TTL (2 s) plus the second
/// of uptime rounding: a younger Redis or MySQL holds every first lock back (see
/// `backend::hold_back_until`), which would stretch the timing of whichever tests come first.
/// The tests of the hold-back start servers of their own.
fn aged<T>(server: Option<T>) -> Option<T> {
    if server.is_some() {
        std::thread::sleep(Duration::from_secs(3));
    }
    server
}

mod etcd;
mod galera;
mod mariadb;
mod poolers;
mod postgres;
mod proxy;
mod redis;
mod seaweedfs;
mod twemproxy;
mod zookeeper;

pub(crate) use self::etcd::*;
pub(crate) use self::galera::*;
pub(crate) use self::mariadb::*;
pub(crate) use self::poolers::*;
pub(crate) use self::postgres::*;
pub(crate) use self::proxy::*;
pub(crate) use self::redis::*;
pub(crate) use self::seaweedfs::*;
pub(crate) use self::twemproxy::*;
pub(crate) use self::zookeeper::*;
