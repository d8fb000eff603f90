//! mariadbd, with a `dlock` user and database.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::Duration;

use super::*;

/// A running mariadbd, with a `dlock`/`dlock` user (all privileges) and a `dlock` database.
pub(crate) struct Mariadb {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    pub(super) extra: Vec<String>,
}

impl Mariadb {
    /// A data directory initialised once per test binary (mariadb-install-db takes seconds);
    /// every server starts on a copy of it.
    fn template() -> PathBuf {
        static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
        TEMPLATE
            .get_or_init(|| {
                let dir = scratch("mariadb-template");
                // Its own tmpdir: concurrent installs in one /tmp collide on temporary tables.
                std::fs::create_dir_all(dir.join("tmp")).unwrap();
                let out = Command::new("mariadb-install-db")
                    .args([
                        "--no-defaults",
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                    ])
                    .args(["--skip-name-resolve", "--user=root"])
                    .arg(format!("--datadir={}", dir.join("data").display()))
                    .arg(format!("--tmpdir={}", dir.join("tmp").display()))
                    .output()
                    .expect("run mariadb-install-db");
                assert!(
                    out.status.success(),
                    "mariadb-install-db: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                dir.join("data")
            })
            .clone()
    }

    /// Starts a new server, or `None` if mariadbd is missing (and not required).
    pub(crate) fn start() -> Option<Mariadb> {
        Self::start_with(&[])
    }

    /// A server that accepts only TLS, with a certificate from a fresh CA; returns the CA's path.
    pub(crate) fn start_tls() -> Option<(Mariadb, PathBuf)> {
        if !available("openssl") {
            return None;
        }
        let certs = scratch("mariadb-certs");
        make_certs(&certs);
        let c = certs.display();
        let args = [
            format!("--ssl-ca={c}/ca.pem"),
            format!("--ssl-cert={c}/server.pem"),
            format!("--ssl-key={c}/server.key"),
            "--require-secure-transport=ON".to_string(),
        ];
        Self::start_with(&args).map(|m| (m, certs.join("ca.pem")))
    }

    /// A server whose default character set is latin1, as MariaDB's was before 11.6 (and
    /// MySQL 5.7's): the `dlock` database, and so dlock's table, are latin1.
    pub(crate) fn start_latin1() -> Option<Mariadb> {
        Self::start_with(&[
            "--character-set-server=latin1".to_string(),
            "--collation-server=latin1_swedish_ci".to_string(),
        ])
    }

    /// A server not started yet: a copy of the template's data, a free port.
    pub(super) fn prepared(extra: &[String]) -> Mariadb {
        let dir = scratch("mariadb");
        let status = Command::new("cp")
            .arg("-a")
            .arg(Self::template())
            .arg(dir.join("data"))
            .status()
            .unwrap();
        assert!(status.success());
        Mariadb {
            port: free_port(),
            dir,
            child: None,
            extra: extra.to_vec(),
        }
    }

    /// Creates the `dlock` user and database.
    pub(super) fn add_user(&self) {
        let sql = "CREATE USER IF NOT EXISTS 'dlock'@'%' IDENTIFIED BY 'dlock'; \
                   GRANT ALL ON *.* TO 'dlock'@'%'; CREATE DATABASE IF NOT EXISTS dlock;";
        let out = self.client().arg("-e").arg(sql).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The server's error log, for a failure message.
    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }

    fn start_with(extra: &[String]) -> Option<Mariadb> {
        if !available("mariadbd") {
            return None;
        }
        let mut m = Self::prepared(extra);
        for attempt in 1.. {
            if m.launch() {
                break;
            }
            let log = std::fs::read_to_string(m.dir.join("error.log")).unwrap_or_default();
            assert!(
                attempt < 3,
                "mariadbd exited at start, 3 times; its log:\n{log}"
            );
            m.port = free_port();
        }
        m.add_user();
        Some(m)
    }

    /// Starts the server and waits until it answers; false if it exited (port taken).
    pub(super) fn launch(&mut self) -> bool {
        let d = self.dir.clone();
        let mut cmd = Command::new("mariadbd");
        cmd.args([
            "--no-defaults",
            "--user=root",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
        ]);
        cmd.args([
            "--skip-log-bin",
            "--innodb-buffer-pool-size=32M",
            "--performance-schema=OFF",
        ]);
        cmd.arg(format!("--port={}", self.port));
        cmd.arg(format!("--datadir={}", d.join("data").display()));
        cmd.arg(format!("--socket={}", d.join("mysqld.sock").display()));
        cmd.arg(format!("--pid-file={}", d.join("mysqld.pid").display()));
        cmd.arg(format!("--log-error={}", d.join("error.log").display()));
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        cmd.arg(format!("--tmpdir={}", d.join("tmp").display()));
        cmd.args(&self.extra);
        self.child = Some(spawn_server(cmd).expect("spawn mariadbd"));
        let ping = || {
            Command::new("mariadb-admin")
                .args(["--no-defaults", "-uroot"])
                .arg(format!("--socket={}", d.join("mysqld.sock").display()))
                .arg("ping")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        wait_ready(self.child.as_mut().unwrap(), ping, || {
            let log = std::fs::read_to_string(d.join("error.log")).unwrap_or_default();
            format!(
                "mariadbd on port {} not ready after 30 s; its log:\n{log}",
                self.port
            )
        })
    }

    /// The `mariadb` client as root over the socket.
    pub(crate) fn client(&self) -> Command {
        let mut c = Command::new("mariadb");
        c.args(["--no-defaults", "-uroot", "-N", "-B"]);
        c.arg(format!(
            "--socket={}",
            self.dir.join("mysqld.sock").display()
        ));
        c
    }

    /// Runs SQL as root and returns the output.
    pub(crate) fn sql(&self, sql: &str) -> String {
        sql_output(self.client().arg("-e"), sql)
    }

    /// `mysql://dlock:dlock@127.0.0.1:PORT/dlock`
    pub(crate) fn url(&self) -> String {
        format!("mysql://dlock:dlock@127.0.0.1:{}/dlock", self.port)
    }

    /// Kills the server (SIGKILL: InnoDB recovers at the next start) and starts it again on
    /// the same port and data after `down`.
    pub(crate) fn restart_after(&mut self, down: Duration) {
        self.pause(false);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        std::thread::sleep(down);
        assert!(
            self.launch(),
            "mariadbd did not restart on port {}",
            self.port
        );
    }

    /// SIGSTOP / SIGCONT.
    pub(crate) fn pause(&self, on: bool) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: plain kill of our own child.
        unsafe { libc::kill(pid, if on { libc::SIGSTOP } else { libc::SIGCONT }) };
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        self.pause(false);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The shared MariaDB of this test binary (`DLOCK_TEST_MYSQL_URL`, or a server started once).
pub(crate) fn shared_mariadb() -> Option<&'static Mariadb> {
    static SHARED: OnceLock<Option<Mariadb>> = OnceLock::new();
    SHARED.get_or_init(|| aged(Mariadb::start())).as_ref()
}
