//! etcd: one member, or three for the failover tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;

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

    /// Which member leads now, as a running member sees it. An election takes about a second
    /// (etcd's default election timeout); on this 2-core machine under the whole suite one was
    /// once not seen within 20 s, so the wait is a minute and a failure says what each member
    /// answered last.
    pub(crate) fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last: Vec<String> = vec![String::new(); self.members.len()];
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                let out = self
                    .etcdctl_at(&[i])
                    .args(["--command-timeout=3s", "endpoint", "status", "-w", "json"])
                    .output();
                let Ok(out) = out else {
                    continue;
                };
                last[i] = describe(&out);
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                    continue;
                };
                let st = &v[0]["Status"];
                let (me, leader) = (&st["header"]["member_id"], &st["leader"]);
                if leader.is_u64() && me == leader {
                    return i;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the etcd cluster has no leader; the members' last answers:\n{}",
                last.join("\n")
            );
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
