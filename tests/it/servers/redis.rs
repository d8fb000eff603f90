//! redis-server: one alone, Redlock masters, a Cluster of three primaries, a Sentinel set.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;

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
                master_field(x, "num-slaves") == "1"
                    && master_field(x, "num-other-sentinels") == "2"
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
        if let Err(e) = self.try_failover() {
            panic!("{e}");
        }
    }

    /// `failover`, or why it did not happen: refused, aborted by the sentinel that ran it (its
    /// log's `-failover-abort-…` line, e.g. `no-good-slave` when the only replica is a former
    /// primary not yet turned into a replica again), or not done in 30 s.
    pub(crate) fn try_failover(&self) -> Result<(), String> {
        let before = self.primary_port();
        let out = self.sentinels[0].cli(&["SENTINEL", "FAILOVER", "dlockp"]);
        if out != "OK" {
            return Err(format!("SENTINEL FAILOVER: {out}"));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The flag is set as FAILOVER answers and cleared by an abort or by the switch,
            // which changes the address first: read in this order, an unchanged address on a
            // cleared flag is an abort.
            let running =
                master_field(&self.sentinels[0], "flags").contains("failover_in_progress");
            if !running && self.primary_port() == before {
                let log = std::fs::read_to_string(self.sentinels[0].dir.join("redis.log"));
                let why = log.unwrap_or_default();
                let why = why.lines().rev().find(|l| l.contains("-failover-abort"));
                return Err(format!(
                    "failover aborted: {}",
                    why.unwrap_or("(no reason logged)")
                ));
            }
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
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no failover after 30 s: {named:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Field `name` of `SENTINEL MASTER dlockp` as sentinel `x` answers it ("" if absent).
fn master_field(x: &Redis, name: &str) -> String {
    let m = x.cli(&["SENTINEL", "MASTER", "dlockp"]);
    let lines: Vec<&str> = m.lines().collect();
    lines
        .iter()
        .position(|l| *l == name)
        .and_then(|i| lines.get(i + 1))
        .map(|v| v.to_string())
        .unwrap_or_default()
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

/// A shared Redis set up the way a lock server should not be: `maxmemory-policy allkeys-lru`,
/// `CONFIG` renamed away, and a user `blind` (password `blind`) that may run anything but
/// `INFO`. Aged like the other shared servers.
pub(crate) fn shared_odd_redis() -> Option<&'static Redis> {
    static SHARED: OnceLock<Option<Redis>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            aged(Redis::start(&[
                "--maxmemory-policy",
                "allkeys-lru",
                "--rename-command",
                "CONFIG",
                "",
                "--user",
                "blind",
                "on",
                ">blind",
                "~*",
                "&*",
                "+@all",
                "-info",
            ]))
        })
        .as_ref()
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
