//! Poolers in front of PostgreSQL: PgBouncer (any pool mode) and pgpool-II (streaming
//! replication, load balancing), run as the `postgres` user like the servers behind them.

use std::path::PathBuf;
use std::process::{Child, Command};

use super::postgres::{as_postgres, postgres_bin, postgres_user};
use super::*;

/// A running pooler: its port, its Unix socket directory, its log.
pub(crate) struct Pooler {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Pooler {
    /// PgBouncer in `mode` (session, transaction, statement) with `pool` server connections,
    /// in front of `pg`; `None` when PgBouncer is not installed (and not required).
    pub(crate) fn pgbouncer(pg: &Postgres, mode: &str, pool: u32) -> Option<Pooler> {
        let bin = pooler_bin("pgbouncer")?;
        let dir = pooler_dir("pgbouncer");
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let start = |port: u16| {
            let ini = format!(
                "[databases]\n* = host=127.0.0.1 port={pg} user=postgres\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir = {dir}\nauth_type = trust\nauth_file = {dir}/users.txt\n\
                 pool_mode = {mode}\ndefault_pool_size = {pool}\n\
                 ignore_startup_parameters = extra_float_digits,application_name,options\n",
                pg = pg.port,
                dir = dir.display(),
            );
            std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
            chown_all(&dir);
            let mut cmd = as_postgres(Command::new(&bin));
            cmd.arg(dir.join("pgbouncer.ini"));
            cmd
        };
        Some(Pooler::launch(dir.clone(), "pgbouncer", start))
    }

    /// pgpool-II in streaming-replication mode with load balancing over `primary` and
    /// `standby` (weights 1:1).
    pub(crate) fn pgpool(primary: &Postgres, standby: &Postgres) -> Option<Pooler> {
        let bin = pooler_bin("pgpool")?;
        let dir = pooler_dir("pgpool");
        std::fs::write(dir.join("pcp.conf"), "").unwrap();
        let start = |port: u16| {
            let conf = format!(
                "listen_addresses = '127.0.0.1'\nport = {port}\n\
                 unix_socket_directories = '{dir}'\npcp_listen_addresses = ''\n\
                 pcp_port = {pcp}\npcp_socket_dir = '{dir}'\n\
                 backend_clustering_mode = 'streaming_replication'\n\
                 backend_hostname0 = '127.0.0.1'\nbackend_port0 = {p0}\nbackend_weight0 = 1\n\
                 backend_flag0 = 'DISALLOW_TO_FAILOVER'\n\
                 backend_hostname1 = '127.0.0.1'\nbackend_port1 = {p1}\nbackend_weight1 = 1\n\
                 backend_flag1 = 'DISALLOW_TO_FAILOVER'\n\
                 load_balance_mode = on\nsr_check_period = 0\nsr_check_user = 'postgres'\n\
                 health_check_period = 0\nenable_pool_hba = off\nnum_init_children = 16\n\
                 max_pool = 1\npid_file_name = '{dir}/pgpool.pid'\nlogdir = '{dir}'\n\
                 log_destination = 'stderr'\n",
                pcp = free_port(),
                p0 = primary.port,
                p1 = standby.port,
                dir = dir.display(),
            );
            std::fs::write(dir.join("pgpool.conf"), conf).unwrap();
            chown_all(&dir);
            let mut cmd = as_postgres(Command::new(&bin));
            cmd.arg("-n").arg("-f").arg(dir.join("pgpool.conf"));
            cmd.arg("-F").arg(dir.join("pcp.conf"));
            cmd
        };
        Some(Pooler::launch(dir.clone(), "pgpool", start))
    }

    /// Starts `what` (its command for a port) and waits until psql gets an answer through it.
    fn launch(dir: PathBuf, what: &str, start: impl Fn(u16) -> Command) -> Pooler {
        for _ in 0..3 {
            let port = free_port();
            let mut cmd = start(port);
            let log = std::fs::File::create(dir.join("log")).unwrap();
            cmd.stdout(log.try_clone().unwrap()).stderr(log);
            let mut child = spawn_server(cmd).unwrap_or_else(|e| panic!("spawn {what}: {e}"));
            let ping = || {
                psql_via(port)
                    .args(["-c", "SELECT 1"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            let log = dir.join("log");
            if wait_ready(&mut child, ping, || {
                format!(
                    "{what} on port {port} not ready after 30 s; its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            }) {
                return Pooler {
                    port,
                    dir,
                    child: Some(child),
                };
            }
        }
        panic!(
            "{what} exited at start, 3 times; its log:\n{}",
            std::fs::read_to_string(dir.join("log")).unwrap_or_default()
        );
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, through the pooler.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// psql through the pooler (TCP), quiet and unaligned; add `-c SQL`.
    pub(crate) fn psql(&self) -> Command {
        psql_via(self.port)
    }

    /// The same through the pooler's Unix socket.
    pub(crate) fn socket_url(&self) -> String {
        format!(
            "postgres:///postgres?host={}&port={}&user=postgres",
            self.dir.display(),
            self.port
        )
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Its whole process group (spawn_server made one): pgpool-II's workers outlive a
            // SIGKILL of their parent and stayed behind, holding their ports, after a test run.
            // SAFETY: plain kill of our own child's process group.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// psql through a pooler on 127.0.0.1:`port`.
fn psql_via(port: u16) -> Command {
    let mut c = Command::new(postgres_bin().expect("PostgreSQL").join("psql"));
    c.args(["-X", "-q", "-A", "-t", "-U", "postgres", "-h", "127.0.0.1"]);
    c.args(["-p", &port.to_string(), "-d", "postgres"]);
    c
}

/// `bin` in /usr/sbin (where Debian puts poolers), else from PATH; `None` (skipped loudly, or
/// a failure under DLOCK_TEST_REQUIRE_BACKENDS=1) when it is not installed.
fn pooler_bin(bin: &str) -> Option<PathBuf> {
    let sbin = std::path::Path::new("/usr/sbin").join(bin);
    if sbin.is_file() {
        return Some(sbin);
    }
    available(bin).then(|| PathBuf::from(bin))
}

/// A fresh directory for a pooler under /tmp, owned by postgres.
fn pooler_dir(what: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = PathBuf::from(format!("/tmp/dlock-test-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Gives `dir` and everything in it to the postgres user.
fn chown_all(dir: &std::path::Path) {
    let (uid, gid) = postgres_user();
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).unwrap();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        std::os::unix::fs::chown(e.path(), Some(uid), Some(gid)).unwrap();
    }
}
