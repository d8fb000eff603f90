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
    "mysql-reset",
    "postgres-reset",
];

/// The fault kinds of the `-reset` backends, and only theirs among the session-lock backends
/// (MySQL, PostgreSQL): one holder's connection reset while the others reach the server. A
/// session lock cannot outlive its connection, so behind a middlebox that resets connections
/// the lock is unsafe by design (docs/backends.md, MySQL, "A connection that ends"); those runs
/// are counted on backends of their own, on servers of their own, called unsafe.
pub(crate) const RESET_KINDS: &[&str] = &["client_blip"];

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
    /// `--backend X --url Y...`: what each client passes (its own proxies' addresses).
    pub args: Vec<Vec<String>>,
    /// Why the topology is unsafe by design (Sentinel's asynchronous replication, a session
    /// lock behind a resetting middlebox), or None where it is called safe.
    pub unsafe_by_design: Option<&'static str>,
    /// A `-reset` backend: its only faults are RESET_KINDS.
    pub reset_only: bool,
    pub shared: bool,
    pub limit: bool,
    pub servers: Servers,
    /// Each client's proxies to the servers, one per server address in the URLs' order (none
    /// where a client learns the servers' addresses from the servers: Sentinel, Cluster). A
    /// client of its own has them so that one client can be cut off while the others are not.
    pub proxies: Vec<Vec<Proxy>>,
}

/// The lease of every client.
pub(crate) const TTL: Duration = Duration::from_secs(2);

/// The faults a server-side fault thread can apply to `t` (the process faults come on top).
pub(crate) fn server_kinds(t: &Target) -> Vec<&'static str> {
    let mut k = Vec::new();
    if t.proxies.iter().any(|p| !p.is_empty()) {
        k.extend(["partition", "conn_reset", "conn_blip", "delay"]);
        k.extend(["client_partition", "client_blip"]);
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

/// `t` for `clients` clients, each behind proxies of its own (`clients` 0: no proxies, one
/// set of arguments for every client).
fn target(name: &'static str, urls: Vec<String>, servers: Servers, clients: usize) -> Target {
    let words = |urls: &[String]| {
        let mut args = vec!["--backend".to_string()];
        args.push(
            match name {
                "redlock" | "sentinel" | "cluster" => "redis",
                "file" => "file",
                other => other.trim_end_matches("-reset"),
            }
            .to_string(),
        );
        for u in urls {
            args.push("--url".into());
            args.push(u.clone());
        }
        args
    };
    let (mut args, mut proxies) = (Vec::new(), Vec::new());
    for _ in 0..clients {
        let (via, p) = all_proxied(&urls);
        args.push(words(&via));
        proxies.push(p);
    }
    if clients == 0 {
        args.push(words(&urls));
    }
    Target {
        name,
        args,
        unsafe_by_design: match name {
            "sentinel" => Some("asynchronous replication: a failover can lose a lock"),
            n if n.ends_with("-reset") => {
                Some("a session lock ends with its connection, reset here for one holder")
            }
            _ => None,
        },
        reset_only: name.ends_with("-reset"),
        shared: name != "redlock",
        limit: name != "redlock",
        servers,
        proxies,
    }
}

/// Starts backend `name` (None, said on stderr, if its server is not installed).
pub(crate) fn start(name: &'static str, dir: &Path, clients: usize) -> Option<Target> {
    Some(match name {
        "file" => {
            let d = dir.join("file-locks");
            std::fs::create_dir_all(&d).ok()?;
            target(
                name,
                vec![format!("file://{}", d.display())],
                Servers::File,
                0,
            )
        }
        "redis" => {
            let r = Redis::start(&[])?;
            target(name, vec![r.url()], Servers::Redis(r), clients)
        }
        "redlock" => {
            let rs: Vec<Redis> = (0..3).map(|_| Redis::start(&[])).collect::<Option<_>>()?;
            let urls: Vec<String> = rs.iter().map(Redis::url).collect();
            target(name, urls, Servers::Redlock(rs), clients)
        }
        "sentinel" => {
            let s = RedisSentinel::start()?;
            target(name, vec![s.url()], Servers::Sentinel(s), 0)
        }
        "cluster" => {
            let c = RedisCluster::start()?;
            let url = c.url(0);
            target(name, vec![url], Servers::Cluster(c), 0)
        }
        "zookeeper" => {
            let z = Zookeeper::ensemble()?;
            target(name, vec![z.url()], Servers::Zookeeper(z), clients)
        }
        "etcd" => {
            let e = Etcd::cluster(3)?;
            target(name, vec![e.url()], Servers::Etcd(e), clients)
        }
        // The `-reset` backends have servers of their own: the other backends' server faults
        // do not reach them, and theirs (a reset) reach no one else.
        "mysql" | "mysql-reset" => {
            let m = Mariadb::start()?;
            target(name, vec![m.url()], Servers::Mysql(m), clients)
        }
        "postgres" | "postgres-reset" => {
            let pg = Postgres::start()?;
            target(name, vec![pg.url()], Servers::Postgres(pg), clients)
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
            // Redlock: one master of three; elsewhere every server address (the clients' whole
            // view). Every client's proxies to them.
            let n = t.proxies.first().map_or(0, Vec::len);
            let chosen: Vec<usize> = if t.name == "redlock" {
                vec![pick % n.max(1)]
            } else {
                (0..n).collect()
            };
            let each = |f: &dyn Fn(&Proxy)| {
                for mine in &t.proxies {
                    chosen.iter().filter_map(|&i| mine.get(i)).for_each(f);
                }
            };
            each(&|p: &Proxy| match kind {
                "partition" => p.black_hole(),
                "conn_reset" | "conn_blip" => p.cut(),
                _ => p.set_delay(Duration::from_millis(50 + (pick as u64 % 5) * 50)),
            });
            sleep();
            each(&|p: &Proxy| match kind {
                "partition" => p.heal(),
                "conn_reset" | "conn_blip" => p.restore(),
                _ => p.set_delay(Duration::ZERO),
            });
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
            // A failover that did not happen is a fault of its own (target "failed"), and the
            // schedule goes on.
            Servers::Sentinel(s) => match s.try_failover() {
                Ok(()) => "primary".into(),
                Err(e) => {
                    eprintln!("nemesis: sentinel: {e}");
                    "failed".into()
                }
            },
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// An asymmetric fault: client `c`'s connections alone are black-holed (`client_partition`)
/// or reset (`client_blip`) for `dur`, while the other clients reach the servers.
pub(crate) fn client_fault(t: &Target, kind: &str, c: usize, dur: Duration) -> String {
    let Some(mine) = t.proxies.get(c) else {
        return String::new();
    };
    for p in mine {
        if kind == "client_partition" {
            p.black_hole();
        } else {
            p.cut();
        }
    }
    std::thread::sleep(dur);
    for p in mine {
        if kind == "client_partition" {
            p.heal();
        } else {
            p.restore();
        }
    }
    format!("client {c}")
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
