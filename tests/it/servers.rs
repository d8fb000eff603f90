//! Real servers for the tests: started on a free loopback port with a temp dir, readiness polled
//! with a deadline, their log printed when they fail to start, killed on drop — and, because
//! they are spawned from one long-lived thread with `PR_SET_PDEATHSIG`, killed when the test
//! binary exits, however it exits. One shared server per backend per test binary; tests that
//! stop, kill or restart a server get their own.
//!
//! `DLOCK_TEST_REDIS_URL` points the shared server at an existing one instead. A missing server
//! binary skips the backend's tests loudly, or fails them under `DLOCK_TEST_REQUIRE_BACKENDS=1`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
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
                let _ = reply.send(cmd.spawn());
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

/// A running redis-server.
pub(crate) struct Redis {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl Redis {
    /// Starts a new server with extra arguments (e.g. `--requirepass x`), or `None` if
    /// redis-server is missing (and not required).
    pub(crate) fn start(extra: &[&str]) -> Option<Redis> {
        if !available("redis-server") {
            return None;
        }
        let mut r = Redis {
            port: free_port(),
            dir: scratch("redis"),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        // The port was free when asked; if another server took it meanwhile, ours exits: retry.
        for attempt in 1.. {
            if r.launch() {
                break;
            }
            let log = std::fs::read_to_string(r.dir.join("redis.log")).unwrap_or_default();
            assert!(
                attempt < 3,
                "redis-server exited at start, 3 times; its log:\n{log}"
            );
            r.port = free_port();
        }
        Some(r)
    }

    /// A TLS-only server with a certificate for 127.0.0.1 and localhost signed by a fresh CA;
    /// returns it with the CA's PEM file (for `SSL_CERT_FILE`).
    pub(crate) fn start_tls() -> Option<(Redis, PathBuf)> {
        if !available("redis-server") || !available("openssl") {
            return None;
        }
        let dir = scratch("redis-tls");
        make_certs(&dir);
        let port = free_port();
        let d = dir.display();
        let extra = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-auth-clients",
            "no",
            "--tls-cert-file",
            &format!("{d}/server.pem"),
            "--tls-key-file",
            &format!("{d}/server.key"),
            "--tls-ca-cert-file",
            &format!("{d}/ca.pem"),
        ];
        let mut r = Redis {
            port,
            dir: dir.clone(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&r.extra);
        cmd.arg("--dir")
            .arg(&r.dir)
            .arg("--logfile")
            .arg(r.dir.join("redis.log"));
        r.child = Some(spawn_server(cmd).expect("spawn redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(r.dir.join("redis.log")).unwrap_or_default();
                panic!("TLS redis-server not listening after 10 s; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some((r, dir.join("ca.pem")))
    }

    /// Starts the server and waits until it answers; false if it exited (port taken).
    fn launch(&mut self) -> bool {
        self.launch_from(Command::new("redis-server"))
    }

    /// [`Redis::launch`] with a configuration file first (a sentinel's: it rewrites it).
    fn launch_with_conf(&mut self, conf: &std::path::Path) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.arg(conf);
        self.launch_from(cmd)
    }

    fn launch_from(&mut self, mut cmd: Command) -> bool {
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        cmd.arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        cmd.args(&self.extra);
        self.child = Some(spawn_server(cmd).expect("spawn redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.ping() {
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                return false;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!(
                    "redis-server on port {} not ready after 10 s; its log:\n{log}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    fn ping(&self) -> bool {
        let auth = self
            .extra
            .iter()
            .position(|a| a == "--requirepass")
            .map(|i| self.extra[i + 1].clone());
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(1))).ok();
        // INFO's process_id proves the answer comes from our server, not one that won the port.
        let req = match auth {
            Some(pw) => format!("AUTH {pw}\r\nINFO server\r\n"),
            None => "INFO server\r\n".to_string(),
        };
        let want = format!("process_id:{}", self.pid());
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        let mut got = String::new();
        let deadline = Instant::now() + Duration::from_secs(1);
        while !got.contains(&want) && Instant::now() < deadline {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        got.contains(&want)
    }

    /// `redis://127.0.0.1:PORT`
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// SIGSTOP / SIGCONT: the cheapest realistic partition (connections stay open, nothing answers).
    pub(crate) fn pause(&self, on: bool) {
        // SAFETY: plain kill of our own child.
        unsafe { libc::kill(self.pid(), if on { libc::SIGSTOP } else { libc::SIGCONT }) };
    }

    /// Kills the server (no persistence: every key is gone) and starts it again on the same port.
    pub(crate) fn restart(&mut self) {
        self.restart_after(Duration::ZERO);
    }

    /// Kills the server and starts it again after `down`.
    pub(crate) fn restart_after(&mut self, down: Duration) {
        self.kill();
        std::thread::sleep(down);
        assert!(
            self.launch(),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs a command with redis-cli and returns its trimmed output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.pause(false);
        self.kill();
    }
}

/// A Redis Cluster of three primaries on loopback (no replicas), slots spread by
/// `redis-cli --cluster create`.
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<Redis>,
}

impl RedisCluster {
    pub(crate) fn start() -> Option<RedisCluster> {
        if !available("redis-server") || !available("redis-cli") {
            return None;
        }
        let mut nodes = Vec::new();
        for _ in 0..3 {
            for attempt in 1.. {
                // The cluster bus listens on PORT + 10000: both must be free.
                let port = cluster_port();
                let mut r = Redis {
                    port,
                    dir: scratch("redis-cluster"),
                    child: None,
                    extra: vec!["--cluster-enabled".into(), "yes".into()],
                };
                let conf = r.dir.join("nodes.conf");
                r.extra.push("--cluster-config-file".into());
                r.extra.push(conf.display().to_string());
                if r.launch() {
                    nodes.push(r);
                    break;
                }
                assert!(
                    attempt < 3,
                    "a cluster redis-server exited at start, 3 times"
                );
            }
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c
            .nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "the cluster is not ok after 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(c)
    }

    /// `redis://127.0.0.1:PORT` of node `i`.
    pub(crate) fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// The index of the node that owns `name`'s slot.
    pub(crate) fn owner(&self, name: &str) -> usize {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", name])
            .parse()
            .unwrap();
        let id = self.slot_owner_id(slot);
        (0..self.nodes.len())
            .find(|&i| self.node_id(i) == id)
            .expect("an owner")
    }

    /// Node `i`'s cluster id.
    pub(crate) fn node_id(&self, i: usize) -> String {
        self.nodes[i].cli(&["CLUSTER", "MYID"])
    }

    /// The id of the node that owns `slot`, as node 0 sees it.
    fn slot_owner_id(&self, slot: u16) -> String {
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            for range in f.iter().skip(8) {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) else {
                    continue;
                };
                if (a..=b).contains(&slot) {
                    return f[0].to_string();
                }
            }
        }
        panic!("no owner of slot {slot}:\n{nodes}");
    }

    /// Moves `name`'s slot, with its keys, to node `to` (as `redis-cli --cluster reshard` does:
    /// IMPORTING, MIGRATING, MIGRATE of every key, then the new owner on every node).
    pub(crate) fn migrate_slot_of(&self, name: &str, to: usize) {
        self.start_migrating(name, to);
        self.finish_migrating(name, to);
    }

    /// The first half of a migration: `name`'s slot IMPORTING on node `to` and MIGRATING on its
    /// owner. Meanwhile the owner answers a command for a key it does not have with `ASK`.
    pub(crate) fn start_migrating(&self, name: &str, to: usize) {
        let slot = self.nodes[0].cli(&["CLUSTER", "KEYSLOT", name]);
        let from = self.owner(name);
        assert_ne!(from, to);
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let ok = |out: String| assert!(out.starts_with("OK"), "{out}");
        ok(self.nodes[to].cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]));
        ok(self.nodes[from].cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]));
    }

    /// The second half: every key of the slot moved to node `to`, which then owns it.
    pub(crate) fn finish_migrating(&self, name: &str, to: usize) {
        let slot = self.nodes[0].cli(&["CLUSTER", "KEYSLOT", name]);
        let from = self.owner(name);
        let to_id = self.node_id(to);
        let ok = |out: String| assert!(out.starts_with("OK"), "{out}");
        loop {
            let keys = self.nodes[from].cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = self.nodes[to].port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            ok(self.nodes[from].cli(&args));
        }
        for n in &self.nodes {
            ok(n.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]));
        }
    }
}

/// A free port whose cluster bus port (+10000, so at most 55535) is free too.
fn cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p <= 55535 && std::net::TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

/// A primary, a replica and three sentinels on loopback, the primary named `dlockp`.
pub(crate) struct RedisSentinel {
    pub(crate) servers: Vec<Redis>,
    pub(crate) sentinels: Vec<Redis>,
}

impl RedisSentinel {
    pub(crate) fn start() -> Option<RedisSentinel> {
        if !available("redis-server") || !available("redis-cli") {
            return None;
        }
        let primary = Redis::start(&[])?;
        let replica_of = ["--replicaof", "127.0.0.1", &primary.port.to_string()];
        let replica = Redis::start(&replica_of)?;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            for attempt in 1.. {
                let mut r = Redis {
                    port: free_port(),
                    dir: scratch("redis-sentinel"),
                    child: None,
                    extra: Vec::new(),
                };
                let conf = r.dir.join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "sentinel monitor dlockp 127.0.0.1 {p} 2\n\
                         sentinel down-after-milliseconds dlockp 2000\n\
                         sentinel failover-timeout dlockp 10000\n",
                        p = primary.port
                    ),
                )
                .unwrap();
                // The config file comes first; launch() adds --port and the rest.
                r.extra = vec!["--sentinel".into()];
                if r.launch_with_conf(&conf) {
                    sentinels.push(r);
                    break;
                }
                assert!(attempt < 3, "a sentinel exited at start, 3 times");
            }
        }
        let s = RedisSentinel {
            servers: vec![primary, replica],
            sentinels,
        };
        // Ready when every sentinel knows the replica (a failover needs one) and the other
        // sentinels (a quorum), and the replica is in sync.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = s.sentinels.iter().all(|x| {
                let m = x.cli(&["SENTINEL", "MASTER", "dlockp"]);
                let field = |name: &str| {
                    let lines: Vec<&str> = m.lines().collect();
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1))
                        .map(|v| v.to_string())
                        .unwrap_or_default()
                };
                field("num-slaves") == "1" && field("num-other-sentinels") == "2"
            }) && s.servers[1]
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up");
            if ready {
                return Some(s);
            }
            assert!(Instant::now() < deadline, "sentinels not ready after 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3#dlockp`
    pub(crate) fn url(&self) -> String {
        let s: Vec<String> = self
            .sentinels
            .iter()
            .map(|x| format!("127.0.0.1:{}", x.port))
            .collect();
        format!("redis-sentinel://{}#dlockp", s.join(","))
    }

    /// The port of the primary the first sentinel names.
    pub(crate) fn primary_port(&self) -> u16 {
        let out = self.sentinels[0].cli(&["SENTINEL", "get-master-addr-by-name", "dlockp"]);
        out.lines().nth(1).unwrap_or_default().parse().unwrap_or(0)
    }

    /// `SENTINEL FAILOVER`, then waits until every sentinel names the other server and it says
    /// it is a primary.
    pub(crate) fn failover(&self) {
        let before = self.primary_port();
        let out = self.sentinels[0].cli(&["SENTINEL", "FAILOVER", "dlockp"]);
        assert_eq!(out, "OK", "SENTINEL FAILOVER: {out}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let named: Vec<String> = self
                .sentinels
                .iter()
                .map(|x| x.cli(&["SENTINEL", "get-master-addr-by-name", "dlockp"]))
                .collect();
            let now = self.primary_port();
            let new = self.servers.iter().find(|r| r.port == now);
            if now != before
                && named.iter().all(|n| n == &named[0])
                && new.is_some_and(|r| r.cli(&["ROLE"]).starts_with("master"))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no failover after 30 s: {named:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The shared Sentinel set-up of this test binary (never failed over).
pub(crate) fn shared_redis_sentinel() -> Option<&'static RedisSentinel> {
    static SHARED: OnceLock<Option<RedisSentinel>> = OnceLock::new();
    SHARED.get_or_init(|| aged(RedisSentinel::start())).as_ref()
}

/// The shared cluster of this test binary.
pub(crate) fn shared_redis_cluster() -> Option<&'static RedisCluster> {
    static SHARED: OnceLock<Option<RedisCluster>> = OnceLock::new();
    SHARED.get_or_init(|| aged(RedisCluster::start())).as_ref()
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

/// The shared Redis URL of this test binary (`DLOCK_TEST_REDIS_URL`, or a server started once).
pub(crate) fn shared_redis() -> Option<String> {
    if let Ok(url) = std::env::var("DLOCK_TEST_REDIS_URL") {
        return Some(url);
    }
    static SHARED: OnceLock<Option<Redis>> = OnceLock::new();
    SHARED
        .get_or_init(|| aged(Redis::start(&[])))
        .as_ref()
        .map(Redis::url)
}

/// Three shared Redis masters for Redlock (`DLOCK_TEST_REDLOCK_URLS`, space-separated, or started
/// once).
pub(crate) fn shared_redlock() -> Option<Vec<String>> {
    if let Ok(urls) = std::env::var("DLOCK_TEST_REDLOCK_URLS") {
        return Some(urls.split_whitespace().map(String::from).collect());
    }
    static SHARED: OnceLock<Option<Vec<Redis>>> = OnceLock::new();
    SHARED
        .get_or_init(|| aged((0..3).map(|_| Redis::start(&[])).collect()))
        .as_ref()
        .map(|servers| servers.iter().map(Redis::url).collect())
}

/// A running mariadbd, with a `dlock`/`dlock` user (all privileges) and a `dlock` database.
pub(crate) struct Mariadb {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
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

    fn start_with(extra: &[String]) -> Option<Mariadb> {
        if !available("mariadbd") {
            return None;
        }
        let dir = scratch("mariadb");
        let status = Command::new("cp")
            .arg("-a")
            .arg(Self::template())
            .arg(dir.join("data"))
            .status()
            .unwrap();
        assert!(status.success());
        let mut m = Mariadb {
            port: free_port(),
            dir,
            child: None,
            extra: extra.to_vec(),
        };
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
        let sql = "CREATE USER IF NOT EXISTS 'dlock'@'%' IDENTIFIED BY 'dlock'; \
                   GRANT ALL ON *.* TO 'dlock'@'%'; CREATE DATABASE IF NOT EXISTS dlock;";
        let out = m.client().arg("-e").arg(sql).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(m)
    }

    /// Starts the server and waits until it answers; false if it exited (port taken).
    fn launch(&mut self) -> bool {
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

/// Debian's ZooKeeper: the server jar, and the two log4j jars without which it prints nothing.
const ZK_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:\
/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";

/// One ZooKeeper server of a [`Zookeeper`] (standalone, or a member of an ensemble).
pub(crate) struct ZkMember {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

/// A running ZooKeeper: one standalone server, or an ensemble of three on loopback. Short
/// ticks (500 ms) so that session timeouts from 1 s are allowed.
pub(crate) struct Zookeeper {
    pub members: Vec<ZkMember>,
}

impl Zookeeper {
    /// A standalone server, or `None` if ZooKeeper is not installed (and not required).
    pub(crate) fn start() -> Option<Zookeeper> {
        Self::start_n(1)
    }

    /// A three-server ensemble.
    pub(crate) fn ensemble() -> Option<Zookeeper> {
        Self::start_n(3)
    }

    fn start_n(n: usize) -> Option<Zookeeper> {
        if !available("java") {
            return None;
        }
        let jar = std::path::Path::new("/usr/share/java/zookeeper.jar");
        if !jar.exists() {
            assert!(
                !required(),
                "zookeeper is not installed, and DLOCK_TEST_REQUIRE_BACKENDS=1"
            );
            eprintln!("SKIPPED: zookeeper is not installed (apt-get install zookeeper)");
            return None;
        }
        // Client, quorum and election port per member.
        let ports: Vec<[u16; 3]> = (0..n)
            .map(|_| [free_port(), free_port(), free_port()])
            .collect();
        let mut zk = Zookeeper {
            members: Vec::new(),
        };
        for (i, p) in ports.iter().enumerate() {
            let dir = scratch("zookeeper");
            std::fs::create_dir_all(dir.join("data")).unwrap();
            let mut cfg = format!(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\nminSessionTimeout=1000\n\
                 maxSessionTimeout=60000\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n",
                dir.join("data").display(),
                p[0]
            );
            if n > 1 {
                std::fs::write(dir.join("data/myid"), format!("{}\n", i + 1)).unwrap();
                for (j, q) in ports.iter().enumerate() {
                    cfg.push_str(&format!("server.{}=127.0.0.1:{}:{}\n", j + 1, q[1], q[2]));
                }
            }
            std::fs::write(dir.join("zoo.cfg"), cfg).unwrap();
            zk.members.push(ZkMember {
                port: p[0],
                dir,
                child: None,
            });
        }
        for i in 0..n {
            zk.launch(i);
        }
        for i in 0..n {
            zk.wait_serving(i);
        }
        Some(zk)
    }

    /// Starts member `i` (again).
    pub(crate) fn launch(&mut self, i: usize) {
        let m = &mut self.members[i];
        let d = m.dir.display();
        // The server logs to stdout; the shell sends that to a file and execs the JVM (so the
        // death signal still reaches it). Containers empty for a second are reaped.
        let script = format!(
            "exec java -Xms32m -Xmx192m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
             -cp {ZK_CLASSPATH} -Dzookeeper.root.logger=INFO,CONSOLE \
             -Dlog4j.configuration=file:/etc/zookeeper/conf/log4j.properties \
             -Dznode.container.checkIntervalMs=1000 \
             org.apache.zookeeper.server.quorum.QuorumPeerMain {d}/zoo.cfg >> {d}/zk.log 2>&1"
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        m.child = Some(spawn_server(cmd).expect("spawn java"));
    }

    /// Waits until member `i` serves clients (`srvr` shows a Mode: it is in a quorum).
    pub(crate) fn wait_serving(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.four(i, "srvr").contains("Mode: ") {
            let m = &mut self.members[i];
            let exited = m.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(m.dir.join("zk.log")).unwrap_or_default();
                panic!("zookeeper on port {} not serving; its log:\n{log}", m.port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A four-letter-word command to member `i`, its answer ("" if none).
    pub(crate) fn four(&self, i: usize, word: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.members[i].port)) else {
            return String::new();
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        if s.write_all(word.as_bytes()).is_err() {
            return String::new();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// The member that has a client connection of session `id` ("0x..."), if any.
    pub(crate) fn member_with_session(&self, id: &str) -> Option<usize> {
        let sid = format!("sid={id}");
        (0..self.members.len()).find(|&i| self.four(i, "cons").contains(&sid))
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,...`
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// `host:port,...` for a client.
    pub(crate) fn hosts(&self) -> String {
        self.url().trim_start_matches("zk://").to_string()
    }

    fn pid(&self, i: usize) -> i32 {
        self.members[i].child.as_ref().unwrap().id() as i32
    }

    /// SIGSTOP / SIGCONT member `i`.
    pub(crate) fn pause(&self, i: usize, on: bool) {
        // SAFETY: plain kill of our own child.
        unsafe { libc::kill(self.pid(i), if on { libc::SIGSTOP } else { libc::SIGCONT }) };
    }

    /// Kills member `i` (SIGKILL: its connections drop at once).
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            // SAFETY: plain kill of our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `f` with a client of our own.
    fn with_client<T>(&self, f: impl AsyncFnOnce(&zookeeper_client::Client) -> T) -> T {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(5))
                .connect(&self.hosts())
                .await
                .expect("connect to zookeeper");
            f(&client).await
        })
    }

    /// The children of `path` (empty if it does not exist).
    pub(crate) fn children(&self, path: &str) -> Vec<String> {
        self.with_client(async |client| match client.list_children(path).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {path}: {e}"),
        })
    }

    /// Creates `path` and its missing ancestors as persistent, open nodes.
    pub(crate) fn mkdirs(&self, path: &str) {
        use zookeeper_client::{Acls, CreateMode};
        self.with_client(async |client| {
            let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
            client.mkdir(path, &options).await.expect("mkdir");
        })
    }
}

impl Drop for Zookeeper {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// The shared ZooKeeper of this test binary (a server started once).
pub(crate) fn shared_zookeeper() -> Option<&'static Zookeeper> {
    static SHARED: OnceLock<Option<Zookeeper>> = OnceLock::new();
    SHARED.get_or_init(Zookeeper::start).as_ref()
}

/// The newest installed PostgreSQL's `bin` directory (Debian: /usr/lib/postgresql/N/bin).
fn postgres_bin() -> Option<PathBuf> {
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
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = PathBuf::from(format!("/tmp/dlock-test-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sock")).unwrap();
        let (uid, gid) = postgres_user();
        for d in [dir.clone(), dir.join("sock")] {
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
        }
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

/// The `postgres` user's uid and gid.
fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("a postgres user (Debian's postgresql package creates it)");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// `cmd`, run as the `postgres` user.
fn as_postgres(mut cmd: Command) -> Command {
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

/// An etcd cluster on loopback (Debian's etcd-server): one member, or three for the failover
/// test; each member's data in a scratch directory.
pub(crate) struct Etcd {
    members: Vec<EtcdMember>,
    /// The directory of ca.pem, server.pem and server.key when clients speak TLS.
    pub(crate) tls: Option<PathBuf>,
}

struct EtcdMember {
    name: String,
    port: u16,
    peer: u16,
    dir: PathBuf,
    cluster: String,
    tls: Option<PathBuf>,
    child: Option<Child>,
}

impl EtcdMember {
    fn spawn(&mut self) {
        let mut cmd = Command::new("etcd");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.port);
        if let Some(certs) = &self.tls {
            cmd.arg("--cert-file")
                .arg(certs.join("server.pem"))
                .arg("--key-file")
                .arg(certs.join("server.key"));
        }
        let peer_url = format!("http://127.0.0.1:{}", self.peer);
        cmd.args(["--name", &self.name, "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &self.cluster])
            .args(["--log-outputs", "stderr", "--logger", "zap"])
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("etcd.log"))
                    .unwrap(),
            );
        self.child = Some(spawn_server(cmd).expect("spawn etcd"));
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().unwrap().is_some())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill of our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Etcd {
    /// Starts a one-member cluster and waits until it answers; `None` if etcd is missing (and
    /// not required).
    pub(crate) fn start() -> Option<Etcd> {
        Etcd::cluster(1)
    }

    /// Starts an `n`-member cluster and waits until every member answers.
    pub(crate) fn cluster(n: usize) -> Option<Etcd> {
        Etcd::start_with(n, false)
    }

    /// One member whose clients speak TLS, with a certificate of a CA of the test's own.
    pub(crate) fn start_tls() -> Option<Etcd> {
        Etcd::start_with(1, true)
    }

    fn start_with(n: usize, tls: bool) -> Option<Etcd> {
        if !available("etcd") || !available("openssl") {
            return None;
        }
        let certs = tls.then(|| {
            let dir = scratch("etcd-certs");
            make_certs(&dir);
            dir
        });
        for _ in 0..3 {
            let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            let cluster = ports
                .iter()
                .enumerate()
                .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut e = Etcd {
                members: ports
                    .iter()
                    .enumerate()
                    .map(|(i, &(port, peer))| EtcdMember {
                        name: format!("m{i}"),
                        port,
                        peer,
                        dir: scratch("etcd"),
                        cluster: cluster.clone(),
                        tls: certs.clone(),
                        child: None,
                    })
                    .collect(),
                tls: certs.clone(),
            };
            for m in &mut e.members {
                m.spawn();
            }
            if e.wait_ready(Duration::from_secs(30)) {
                return Some(e);
            }
            for m in &e.members {
                let log = std::fs::read_to_string(m.dir.join("etcd.log")).unwrap_or_default();
                eprintln!("etcd {} did not start; its log:\n{log}", m.name);
            }
        }
        panic!("etcd did not start, 3 times");
    }

    /// Waits until every running member answers a read (through the leader, so the cluster
    /// has one); false when a member exited (a port was taken meanwhile) or time ran out.
    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let ready = (0..self.members.len())
                .filter(|&i| self.members[i].child.is_some())
                .all(|i| {
                    self.etcdctl_at(&[i])
                        .args(["get", "ready-check"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success())
                });
            if ready {
                return true;
            }
            let running: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].child.is_some())
                .collect();
            if running.iter().any(|&i| self.members[i].exited()) || Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `etcdctl` (API v3) pointed at every member.
    pub(crate) fn etcdctl(&self) -> Command {
        self.etcdctl_at(&(0..self.members.len()).collect::<Vec<_>>())
    }

    fn etcdctl_at(&self, members: &[usize]) -> Command {
        let ends: Vec<String> = members
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.members[i].port))
            .collect();
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", ends.join(",")))
            .arg("--dial-timeout=2s");
        if let Some(certs) = &self.tls {
            c.arg(format!("--cacert={}", certs.join("ca.pem").display()));
        }
        c
    }

    /// `etcd://127.0.0.1:PORT[,127.0.0.1:PORT...]`, every member.
    pub(crate) fn url(&self) -> String {
        let ends: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", ends.join(","))
    }

    /// The client ports, one per member.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.port).collect()
    }

    /// Which member leads now, as a running member sees it.
    pub(crate) fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                let Ok(out) = self
                    .etcdctl_at(&[i])
                    .args(["endpoint", "status", "-w", "json"])
                    .output()
                else {
                    continue;
                };
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                    continue;
                };
                let st = &v[0]["Status"];
                let (me, leader) = (&st["header"]["member_id"], &st["leader"]);
                if leader.is_u64() && me == leader {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "the etcd cluster has no leader");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills member `i` (SIGKILL).
    pub(crate) fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Kills member `i` and starts it again on its data (its keys and leases survive).
    pub(crate) fn restart(&mut self, i: usize) {
        self.members[i].kill();
        self.members[i].spawn();
        assert!(
            self.wait_ready(Duration::from_secs(30)),
            "etcd did not come back"
        );
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) every member.
    pub(crate) fn pause(&self, on: bool) {
        let sig = if on { libc::SIGSTOP } else { libc::SIGCONT };
        for c in self.members.iter().filter_map(|m| m.child.as_ref()) {
            // SAFETY: plain kill of our own child.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }
}

/// The shared etcd of this test binary.
pub(crate) fn shared_etcd() -> Option<&'static Etcd> {
    static SHARED: OnceLock<Option<Etcd>> = OnceLock::new();
    SHARED.get_or_init(Etcd::start).as_ref()
}
