//! Every backend in the topology it has in production, started with the integration tests'
//! servers (tests/it/servers), each network one behind TCP proxies where its clients are given
//! the servers' addresses; and the server faults each one takes.

use std::path::Path;
use std::time::Duration;

use crate::servers::*;

/// The backends of the campaign, in the order of its report (the one list: `--backends` is
/// checked against it).
pub(crate) const NAMES: &[&str] = &[
    "file",
    "redis",
    "redlock",
    "sentinel",
    "cluster",
    "zookeeper",
    "etcd",
    "mysql",
    "postgres",
];

/// The started servers of one backend (kept for the faults, dropped to stop them).
pub(crate) enum Servers {
    File,
    Redis(Redis),
    Redlock(Vec<Redis>),
    Sentinel(RedisSentinel),
    Cluster(RedisCluster),
    Zookeeper(Zookeeper),
    Etcd(Etcd),
    Mysql(Mariadb),
    /// Kept so that the server lives: its faults are all the proxy's.
    Postgres(#[allow(dead_code)] Postgres),
}

/// One backend under test.
pub(crate) struct Target {
    pub name: &'static str,
    /// `--backend X --url Y...`: what every client passes.
    pub args: Vec<String>,
    /// False where the topology is unsafe by design (Sentinel's asynchronous replication).
    pub safe: bool,
    pub shared: bool,
    pub limit: bool,
    pub servers: Servers,
    /// The proxies between the clients and the servers (empty where a client learns the
    /// servers' addresses from the servers: Sentinel, Cluster).
    pub proxies: Vec<Proxy>,
}

/// The lease of every client.
pub(crate) const TTL: Duration = Duration::from_secs(2);

/// The faults a server-side fault thread can apply to `t` (the process faults come on top).
pub(crate) fn server_kinds(t: &Target) -> Vec<&'static str> {
    let mut k = Vec::new();
    if !t.proxies.is_empty() {
        k.extend(["partition", "conn_reset", "conn_blip", "delay"]);
    }
    match t.servers {
        Servers::File => {}
        Servers::Redis(_) | Servers::Redlock(_) | Servers::Mysql(_) => {
            k.extend(["server_pause", "server_restart"])
        }
        Servers::Sentinel(_) => k.extend(["server_pause", "failover"]),
        Servers::Cluster(_) => k.push("server_pause"),
        Servers::Zookeeper(_) | Servers::Etcd(_) => {
            k.extend(["server_pause", "server_restart", "leader_kill"])
        }
        Servers::Postgres(_) => {}
    }
    k
}

fn target(
    name: &'static str,
    url_args: Vec<String>,
    servers: Servers,
    proxies: Vec<Proxy>,
) -> Target {
    let mut args = vec!["--backend".to_string()];
    args.push(
        match name {
            "redlock" | "sentinel" | "cluster" => "redis",
            "file" => "file",
            other => other,
        }
        .to_string(),
    );
    for u in url_args {
        args.push("--url".into());
        args.push(u);
    }
    Target {
        name,
        args,
        safe: name != "sentinel",
        shared: name != "redlock",
        limit: name != "redlock",
        servers,
        proxies,
    }
}

/// Starts backend `name` (None, said on stderr, if its server is not installed).
pub(crate) fn start(name: &'static str, dir: &Path) -> Option<Target> {
    Some(match name {
        "file" => {
            let d = dir.join("file-locks");
            std::fs::create_dir_all(&d).ok()?;
            target(
                name,
                vec![format!("file://{}", d.display())],
                Servers::File,
                Vec::new(),
            )
        }
        "redis" => {
            let r = Redis::start(&[])?;
            let (url, p) = proxied(&r.url());
            target(name, vec![url], Servers::Redis(r), p)
        }
        "redlock" => {
            let rs: Vec<Redis> = (0..3).map(|_| Redis::start(&[])).collect::<Option<_>>()?;
            let urls: Vec<String> = rs.iter().map(Redis::url).collect();
            let (urls, p) = all_proxied(&urls);
            target(name, urls, Servers::Redlock(rs), p)
        }
        "sentinel" => {
            let s = RedisSentinel::start()?;
            target(name, vec![s.url()], Servers::Sentinel(s), Vec::new())
        }
        "cluster" => {
            let c = RedisCluster::start()?;
            let url = c.url(0);
            target(name, vec![url], Servers::Cluster(c), Vec::new())
        }
        "zookeeper" => {
            let z = Zookeeper::ensemble()?;
            let (url, p) = proxied(&z.url());
            target(name, vec![url], Servers::Zookeeper(z), p)
        }
        "etcd" => {
            let e = Etcd::cluster(3)?;
            let (url, p) = proxied(&e.url());
            target(name, vec![url], Servers::Etcd(e), p)
        }
        "mysql" => {
            let m = Mariadb::start()?;
            let (url, p) = proxied(&m.url());
            target(name, vec![url], Servers::Mysql(m), p)
        }
        "postgres" => {
            let pg = Postgres::start()?;
            let (url, p) = proxied(&pg.url());
            target(name, vec![url], Servers::Postgres(pg), p)
        }
        _ => return None,
    })
}

/// The ZooKeeper member that leads now, if one says so.
fn zk_leader(z: &Zookeeper) -> usize {
    (0..z.members.len())
        .find(|&i| z.four(i, "srvr").contains("Mode: leader"))
        .unwrap_or(0)
}

/// Applies server fault `kind` to `t` for `dur` (`pick` chooses a member or proxy), then heals
/// it; returns what it was aimed at.
pub(crate) fn server_fault(t: &mut Target, kind: &str, dur: Duration, pick: usize) -> String {
    let sleep = || std::thread::sleep(dur);
    match kind {
        "partition" | "conn_reset" | "conn_blip" | "delay" => {
            // Redlock: one master of three; elsewhere every proxy (the clients' whole view).
            let chosen: Vec<usize> = if t.name == "redlock" {
                vec![pick % t.proxies.len()]
            } else {
                (0..t.proxies.len()).collect()
            };
            for &i in &chosen {
                let p = &t.proxies[i];
                match kind {
                    "partition" => p.black_hole(),
                    "conn_reset" | "conn_blip" => p.cut(),
                    _ => p.set_delay(Duration::from_millis(50 + (pick as u64 % 5) * 50)),
                }
            }
            sleep();
            for &i in &chosen {
                let p = &t.proxies[i];
                match kind {
                    "partition" => p.heal(),
                    "conn_reset" | "conn_blip" => p.restore(),
                    _ => p.set_delay(Duration::ZERO),
                }
            }
            format!("proxies {chosen:?}")
        }
        "server_pause" => match &mut t.servers {
            Servers::Redis(r) => pause_one(r, dur),
            Servers::Mysql(m) => pause_one(m, dur),
            Servers::Redlock(rs) => {
                let i = pick % rs.len();
                pause_one(&rs[i], dur);
                format!("master {i}")
            }
            Servers::Sentinel(s) => {
                let port = s.primary_port();
                let r = s
                    .servers
                    .iter()
                    .find(|r| r.port == port)
                    .unwrap_or(&s.servers[0]);
                pause_one(r, dur);
                format!("primary :{port}")
            }
            Servers::Cluster(c) => {
                let i = pick % c.nodes.len();
                pause_one(&c.nodes[i], dur);
                format!("node {i}")
            }
            Servers::Zookeeper(z) => {
                let i = pick % z.members.len();
                z.pause(i, true);
                sleep();
                z.pause(i, false);
                format!("member {i}")
            }
            Servers::Etcd(e) => {
                e.pause(true);
                sleep();
                e.pause(false);
                "all members".into()
            }
            _ => String::new(),
        },
        "server_restart" => match &mut t.servers {
            Servers::Redis(r) => {
                r.restart_after(dur);
                "server".into()
            }
            Servers::Mysql(m) => {
                m.restart_after(dur);
                "server".into()
            }
            Servers::Redlock(rs) => {
                let i = pick % rs.len();
                rs[i].restart_after(dur);
                format!("master {i}")
            }
            Servers::Zookeeper(z) => {
                let i = pick % z.members.len();
                zk_restart(z, i, dur);
                format!("member {i}")
            }
            Servers::Etcd(e) => {
                let i = pick % e.ports().len();
                e.kill(i);
                sleep();
                e.restart(i);
                format!("member {i}")
            }
            _ => String::new(),
        },
        "leader_kill" => match &mut t.servers {
            Servers::Zookeeper(z) => {
                let i = zk_leader(z);
                zk_restart(z, i, dur);
                format!("leader {i}")
            }
            Servers::Etcd(e) => {
                let i = e.leader();
                e.kill(i);
                sleep();
                e.restart(i);
                format!("leader {i}")
            }
            _ => String::new(),
        },
        "failover" => match &t.servers {
            Servers::Sentinel(s) => {
                s.failover();
                "primary".into()
            }
            _ => String::new(),
        },
        _ => String::new(),
    }
}

fn zk_restart(z: &mut Zookeeper, i: usize, dur: Duration) {
    z.kill(i);
    std::thread::sleep(dur);
    z.launch(i);
    z.wait_serving(i);
}

/// SIGSTOP, `dur`, SIGCONT.
fn pause_one<S: Pausable>(s: &S, dur: Duration) -> String {
    s.stop(true);
    std::thread::sleep(dur);
    s.stop(false);
    "server".into()
}

/// A server that can be stopped and continued.
trait Pausable {
    fn stop(&self, on: bool);
}

impl Pausable for Redis {
    fn stop(&self, on: bool) {
        self.pause(on);
    }
}

impl Pausable for Mariadb {
    fn stop(&self, on: bool) {
        self.pause(on);
    }
}
