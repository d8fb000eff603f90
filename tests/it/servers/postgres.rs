//! PostgreSQL, run as the `postgres` user.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;

use super::*;

/// The newest installed PostgreSQL's `bin` directory (Debian: /usr/lib/postgresql/N/bin).
pub(super) fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, b)| b)
}

/// A running PostgreSQL (it refuses to run as root: it runs as the `postgres` user, in a
/// directory of its own under /tmp), trust authentication on loopback.
pub(crate) struct Postgres {
    pub port: u16,
    pub dir: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
    /// Extra `-c name=value` settings.
    extra: Vec<String>,
}

impl Postgres {
    /// Starts a new server, or `None` if PostgreSQL is not installed (and not required).
    pub(crate) fn start() -> Option<Postgres> {
        Self::start_with(&["-A", "trust"])
    }

    /// A server whose TCP connections need a password (SCRAM-SHA-256) for the user `dlock`
    /// (password `s3cret`); the socket still trusts `postgres`.
    pub(crate) fn start_scram() -> Option<Postgres> {
        let pg = Self::start_with(&["--auth-local=trust", "--auth-host=scram-sha-256"])?;
        pg.sql("CREATE ROLE dlock LOGIN PASSWORD 's3cret'; GRANT CREATE ON SCHEMA public TO dlock");
        Some(pg)
    }

    /// A server that offers TLS with a certificate for 127.0.0.1 from a private CA; returns
    /// it and the CA file.
    pub(crate) fn start_tls() -> Option<(Postgres, PathBuf)> {
        let certs = scratch("pg-certs");
        make_certs(&certs);
        let extra = |pg: &Postgres| {
            let (uid, gid) = postgres_user();
            for f in ["server.pem", "server.key"] {
                let to = pg.dir.join(f);
                std::fs::copy(certs.join(f), &to).unwrap();
                std::os::unix::fs::chown(&to, Some(uid), Some(gid)).unwrap();
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .unwrap();
            }
            vec![
                "ssl=on".to_string(),
                format!("ssl_cert_file={}", pg.dir.join("server.pem").display()),
                format!("ssl_key_file={}", pg.dir.join("server.key").display()),
            ]
        };
        let pg = Self::start_configured(&["-A", "trust"], &extra)?;
        Some((pg, certs.join("ca.pem")))
    }

    fn start_with(auth: &[&str]) -> Option<Postgres> {
        Self::start_configured(auth, &|_| Vec::new())
    }

    fn start_configured(
        auth: &[&str],
        extra: &dyn Fn(&Postgres) -> Vec<String>,
    ) -> Option<Postgres> {
        let Some(bin) = postgres_bin() else {
            assert!(
                !required(),
                "PostgreSQL is not installed, and DLOCK_TEST_REQUIRE_BACKENDS=1"
            );
            eprintln!("SKIPPED: PostgreSQL is not installed");
            return None;
        };
        let dir = server_dir("pg");
        let out = as_postgres(Command::new(bin.join("initdb")))
            .args(auth)
            .args(["-U", "postgres", "--no-sync", "-D"])
            .arg(dir.join("data"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Postgres {
            port: free_port(),
            dir,
            bin,
            child: None,
            extra: Vec::new(),
        };
        pg.extra = extra(&pg);
        for _ in 0..3 {
            if pg.launch() {
                return Some(pg);
            }
            pg.port = free_port();
        }
        let log = std::fs::read_to_string(pg.dir.join("log")).unwrap_or_default();
        panic!("postgres exited at start, 3 times; its log:\n{log}");
    }

    /// Starts the server and waits until it answers; false if it exited (port taken).
    fn launch(&mut self) -> bool {
        let mut cmd = as_postgres(Command::new(self.bin.join("postgres")));
        cmd.arg("-D").arg(self.dir.join("data"));
        cmd.args(["-p", &self.port.to_string(), "-k"]);
        cmd.arg(self.dir.join("sock"));
        cmd.args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]);
        cmd.args(["-c", "max_connections=200", "-c", "logging_collector=off"]);
        for e in &self.extra {
            cmd.arg("-c").arg(e);
        }
        cmd.arg("-c")
            .arg(format!("log_directory={}", self.dir.display()));
        self.child = Some(spawn_server(cmd).expect("spawn postgres"));
        let port = self.port;
        let mut child = self.child.take().unwrap();
        let ping = || {
            self.psql()
                .args(["-c", "SELECT 1"])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let ready = wait_ready(&mut child, ping, || {
            format!("postgres on port {port} not ready after 30 s")
        });
        self.child = Some(child);
        ready
    }

    /// `psql` as postgres over the socket, quiet and unaligned.
    pub(crate) fn psql(&self) -> Command {
        let mut c = Command::new(self.bin.join("psql"));
        c.args(["-X", "-q", "-A", "-t", "-U", "postgres", "-h"]);
        c.arg(self.dir.join("sock"));
        c.args(["-p", &self.port.to_string(), "-d", "postgres"]);
        c
    }

    /// Runs SQL and returns its output.
    pub(crate) fn sql(&self, sql: &str) -> String {
        sql_output(self.psql().arg("-c"), sql)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A new server streaming from this one (`pg_basebackup -R`): a standby, in recovery.
    pub(crate) fn standby(&self) -> Postgres {
        let dir = server_dir("pgs");
        let out = as_postgres(Command::new(self.bin.join("pg_basebackup")))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-R", "-X", "stream", "-D"])
            .arg(dir.join("data"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_basebackup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Postgres {
            port: free_port(),
            dir,
            bin: self.bin.clone(),
            child: None,
            extra: Vec::new(),
        };
        for _ in 0..3 {
            if pg.launch() {
                return pg;
            }
            pg.port = free_port();
        }
        panic!("the standby did not start");
    }

    /// Restarts the server as a standby (in recovery, read-only).
    pub(crate) fn make_standby(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill of our own child: a fast shutdown.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let _ = c.wait();
        }
        let signal = self.dir.join("data").join("standby.signal");
        std::fs::write(&signal, "").unwrap();
        let (uid, gid) = postgres_user();
        std::os::unix::fs::chown(&signal, Some(uid), Some(gid)).unwrap();
        assert!(self.launch(), "postgres did not restart as a standby");
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill of our own child: SIGCONT, then an immediate shutdown.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGCONT);
                libc::kill(c.id() as i32, libc::SIGQUIT);
            }
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new directory for a server, /tmp/dlock-test-WHAT-PID-N with a `sock` directory in it,
/// both owned by the postgres user.
fn server_dir(what: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = PathBuf::from(format!("/tmp/dlock-test-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sock")).unwrap();
    let (uid, gid) = postgres_user();
    for d in [dir.clone(), dir.join("sock")] {
        std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
    }
    dir
}

/// The `postgres` user's uid and gid.
pub(super) fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("a postgres user (Debian's postgresql package creates it)");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// `cmd`, run as the `postgres` user.
pub(super) fn as_postgres(mut cmd: Command) -> Command {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = postgres_user();
    cmd.uid(uid).gid(gid).env("HOME", "/tmp");
    cmd
}

/// The shared PostgreSQL of this test binary.
pub(crate) fn shared_postgres() -> Option<&'static Postgres> {
    static SHARED: OnceLock<Option<Postgres>> = OnceLock::new();
    SHARED.get_or_init(|| aged(Postgres::start())).as_ref()
}
