//! What stands between dlock and Redis, against the real thing: twemproxy (nutcracker) in
//! front of a server, a replica, an evicting server, a server whose CONFIG is renamed away and a
//! user that may not run INFO — and `dlock doctor` on each.

use crate::servers::{Redis, shared_odd_redis, shared_redis, shared_redlock, shared_twemproxy};
use crate::util::*;

/// `dlock doctor redis` with these `--url`s.
fn doctor(urls: &[&str]) -> std::process::Command {
    let mut c = dlock();
    c.args(["doctor", "redis", "--ttl", "2s"]);
    for u in urls {
        c.arg("-u").arg(u);
    }
    c
}

/// The doctor line for `check`, asserting there is exactly one.
#[track_caller]
fn line<'a>(out: &'a str, check: &str) -> &'a str {
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(&format!("{check}:")[..]))
        .collect();
    assert_eq!(lines.len(), 1, "one '{check}' line expected:\n{out}");
    lines[0]
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// twemproxy closes the connection on CLIENT, BLPOP, SCRIPT and INFO: a run through it used to
/// fail with "unexpected end of file" — or succeed, when the backend had the scripts cached,
/// until the first contended run. Now it is refused (78) naming it, before anything is written.
#[test]
fn twemproxy_is_refused_naming_it() {
    let Some(proxy) = shared_twemproxy() else {
        return;
    };
    let direct = TestBackend::redis(&proxy.redis.url());
    let through = TestBackend::redis(&proxy.url());
    // Once with a cold script cache, once with the scripts cached by a direct run.
    for warm in [false, true] {
        if warm {
            let key = unique_key("twemproxy-warm");
            // Held back (75) or run (0) on the young server: its scripts are loaded either way.
            output(&mut direct.run(&key, &["-n"], &["true"]));
            let memory = proxy.redis.cli(&["INFO", "memory"]);
            assert!(
                !memory.contains("number_of_cached_scripts:0"),
                "the direct run loaded no script:\n{memory}"
            );
        }
        let key = unique_key("twemproxy");
        let out = run_code(&mut through.run(&key, &["-n"], &["echo", "ran"]), 78);
        let line = one_error_line(&out);
        assert!(line.contains("twemproxy (nutcracker)"), "{line}");
        assert!(line.contains("CLIENT"), "{line}");
        assert!(
            line.contains(&proxy.url()[8..]),
            "names the address: {line}"
        );
        assert!(out.stdout.is_empty(), "{}", describe(&out));
        let written = proxy.redis.cli(&["KEYS", &format!("dlock:{{{key}}}*")]);
        assert_eq!(written, "", "nothing reached the server behind the proxy");
    }
    // A waiting run too (the waiter's CLIENT ID was the first to fail).
    let key = unique_key("twemproxy-wait");
    let out = run_code(&mut through.run(&key, &["-w", "5s"], &["true"]), 78);
    one_error_line(&out);
    let out = run_code(&mut doctor(&[&proxy.url()]), 78);
    let text = stdout(&out);
    assert!(
        text.starts_with("ok      server: "),
        "{text}\n{}",
        proxy.log()
    );
    let proxy_line = line(&text, "proxy");
    assert!(proxy_line.starts_with("unsafe"), "{text}");
    for lacks in ["CLIENT", "BLPOP", "SCRIPT"] {
        assert!(proxy_line.contains(lacks), "{text}");
    }
}

/// A replica refuses the write (READONLY): exit 69 at once, even for a run that would wait,
/// with a line that says it is a replica. A writable replica (`replica-read-only no`) grants
/// the lock locally: refused too, and the lock given back. `doctor` says which primary.
#[test]
fn a_replica_is_refused_as_one() {
    let Some(primary) = Redis::start(&[]) else {
        return;
    };
    let port = primary.port.to_string();
    let replica = Redis::start(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let writable = Redis::start(&[
        "--replicaof",
        "127.0.0.1",
        &port,
        "--replica-read-only",
        "no",
    ])
    .unwrap();
    for (r, wait) in [(&replica, "-n"), (&replica, "-w10s"), (&writable, "-n")] {
        let key = unique_key("replica");
        let started = std::time::Instant::now();
        let out = run_code(
            &mut TestBackend::redis(&r.url()).run(&key, &[wait], &["echo", "ran"]),
            69,
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let line = one_error_line(&out);
        assert!(line.contains("is a replica"), "{line}");
        assert!(line.contains("point dlock at the primary"), "{line}");
        assert!(out.stdout.is_empty(), "{}", describe(&out));
        assert_eq!(r.cli(&["EXISTS", &format!("dlock:{{{key}}}")]), "0");
        // The start the writable replica's acquire recorded with the grant is taken back too.
        let history = [
            format!("dlock:{{{key}}}:runs"),
            format!("dlock:{{{key}}}:lastrun"),
        ];
        assert_eq!(r.cli(&["EXISTS", &history[0], &history[1]]), "0");
    }
    let out = run_code(&mut doctor(&[&replica.url()]), 78);
    let text = stdout(&out);
    let role = line(&text, "role");
    assert!(role.starts_with("unsafe"), "{text}");
    assert!(
        role.contains(&format!("replica of 127.0.0.1:{port}")),
        "{text}"
    );
}

/// `maxmemory-policy allkeys-lru` can evict a held lock: a run works and warns once (two keys,
/// one line), naming the policy; `doctor` says so and exits 1. CONFIG is renamed away on that
/// server: the policy still comes from INFO, and nothing fails.
#[test]
fn an_evicting_redis_warns_once_and_runs() {
    let Some(odd) = shared_odd_redis() else {
        return;
    };
    let b = TestBackend::redis(&odd.url());
    let (k1, k2) = (unique_key("evict-a"), unique_key("evict-b"));
    let out = run_ok(&mut b.run(&k1, &["-k", &k2], &["echo", "ran"]));
    assert_eq!(stdout(&out), "ran\n");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{}", describe(&out));
    assert!(
        lines[0].starts_with("dlock: warning: maxmemory-policy: ")
            && lines[0].contains("allkeys-lru")
            && lines[0].contains("noeviction"),
        "{}",
        describe(&out)
    );
    let out = run_code(&mut doctor(&[&odd.url()]), 1);
    let text = stdout(&out);
    let policy = line(&text, "maxmemory-policy");
    assert!(
        policy.starts_with("warn") && policy.contains("allkeys-lru"),
        "{text}"
    );
    // CONFIG is gone: what only CONFIG says is unknown, never a failure.
    assert!(
        line(&text, "persistence").contains("CONFIG GET not allowed"),
        "{text}"
    );
    assert!(!text.contains("unsafe"), "{text}");
}

/// A user that may run neither INFO nor CONFIG: the run works and says nothing; `doctor` could
/// not check the policy ("unknown … could not check") and warns that without INFO a restart
/// cannot be seen (exit 1), never 69.
#[test]
fn info_and_config_denied_is_could_not_check() {
    let Some(odd) = shared_odd_redis() else {
        return;
    };
    let url = format!("redis://blind:blind@127.0.0.1:{}", odd.port);
    let out =
        run_ok(&mut TestBackend::redis(&url).run(&unique_key("blind"), &[], &["echo", "ran"]));
    assert_eq!(stdout(&out), "ran\n");
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    let out = run_code(&mut doctor(&[&url]), 1);
    let text = stdout(&out);
    assert!(
        line(&text, "maxmemory-policy").starts_with("unknown maxmemory-policy: could not check"),
        "{text}"
    );
    let restart = line(&text, "restart");
    assert!(
        restart.starts_with("warn") && restart.contains("INFO"),
        "{text}"
    );
    assert!(!text.contains("blind:blind"), "no password: {text}");
}

/// The done-when of issue 38 for Redis: `doctor` exits 0 on a default server, and on Redlock
/// masters that are all fine.
#[test]
fn doctor_is_all_ok_on_a_default_redis_and_redlock() {
    let Some(url) = shared_redis() else {
        return;
    };
    let out = run_ok(&mut doctor(&[&url]));
    let text = stdout(&out);
    for check in [
        "server",
        "proxy",
        "role",
        "maxmemory-policy",
        "persistence",
        "restart",
    ] {
        assert!(line(&text, check).starts_with("ok "), "{text}");
    }
    assert!(
        line(&text, "maxmemory-policy").contains("noeviction"),
        "{text}"
    );
    let Some(urls) = shared_redlock() else {
        return;
    };
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let out = run_ok(&mut doctor(&urls));
    let text = stdout(&out);
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("ok      role:"))
            .count(),
        3,
        "{text}"
    );
}

/// Redlock judges each master: a proxy among them refuses the run (78), a replica too (69), a
/// master given twice is one server counted twice (`doctor`: unsafe).
#[test]
fn redlock_masters_are_each_judged() {
    let (Some(urls), Some(proxy)) = (shared_redlock(), shared_twemproxy()) else {
        return;
    };
    let with =
        |third: &str| TestBackend::redlock(&[urls[0].clone(), urls[1].clone(), third.into()]);
    let out = run_code(
        &mut with(&proxy.url()).run(&unique_key("redlock-proxy"), &["-n"], &["true"]),
        78,
    );
    assert!(
        one_error_line(&out).contains("twemproxy"),
        "{}",
        describe(&out)
    );
    let Some(primary) = Redis::start(&[]) else {
        return;
    };
    let replica = Redis::start(&["--replicaof", "127.0.0.1", &primary.port.to_string()]).unwrap();
    let out = run_code(
        &mut with(&replica.url()).run(&unique_key("redlock-replica"), &["-n"], &["true"]),
        69,
    );
    assert!(
        one_error_line(&out).contains("is a replica"),
        "{}",
        describe(&out)
    );
    let out = run_code(&mut doctor(&[&urls[0], &urls[1], &urls[0]]), 78);
    let text = stdout(&out);
    assert!(line(&text, "redlock").starts_with("unsafe"), "{text}");
}

/// `doctor` on a Cluster checks each primary (through the URL of any node); through Sentinel,
/// the primary the sentinels name, with its replica.
#[test]
fn doctor_checks_every_cluster_primary_and_the_sentinels_primary() {
    use crate::servers::{shared_redis_cluster, shared_redis_sentinel};
    let Some(cluster) = shared_redis_cluster() else {
        return;
    };
    let out = run_ok(&mut doctor(&[&cluster.url(1)]));
    let text = stdout(&out);
    for n in &cluster.nodes {
        let at = format!("ok      role: 127.0.0.1:{}: primary", n.port);
        assert!(text.lines().any(|l| l.starts_with(&at)), "{text}");
    }
    let Some(sentinel) = shared_redis_sentinel() else {
        return;
    };
    let out = run_ok(&mut doctor(&[&sentinel.url()]));
    let text = stdout(&out);
    let role = line(&text, "role");
    assert!(
        role.contains(&format!(
            "127.0.0.1:{}: primary (replicas connected: 1)",
            sentinel.primary_port()
        )),
        "{text}"
    );
}

/// A run on one Redis is two scripts — the acquire, which records the start when it takes the
/// lock, and the release, which records the end — and its start carries the fencing token the
/// command saw. (With a start of its own it was three.)
#[test]
fn a_redis_run_records_its_start_in_the_acquire() {
    let Some(r) = Redis::start(&[]) else {
        return;
    };
    let key = unique_key("fold");
    let dir = scratch("redis-fold");
    let marker = dir.join("token");
    let b = TestBackend::redis(&r.url());
    let calls = || -> u64 {
        let stats = r.cli(&["INFO", "commandstats"]);
        let count = |name: &str| {
            stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        count("evalsha") + count("eval")
    };
    // A server younger than the TTL holds a lock back (renewing it meanwhile): wait that out,
    // and load the scripts (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA) with a first run.
    wait_until(
        std::time::Duration::from_secs(10),
        "the server's uptime",
        || {
            r.cli(&["INFO", "server"])
                .lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_some_and(|up| up > b.ttl.as_secs())
        },
    );
    run_ok(&mut b.run(&unique_key("fold-warm"), &[], &["true"]));
    let before = calls();
    let script = format!("echo $DLOCK_FENCING_TOKEN > {}", marker.display());
    run_ok(&mut b.run(&key, &[], &sh(&script)));
    // (INFO's own call does not count: it is not a script.)
    assert_eq!(calls() - before, 2, "the acquire and the release");
    let token = wait_for_file(&marker, std::time::Duration::from_secs(5));
    let start = r.cli(&["GET", &format!("dlock:{{{key}}}:lastrun")]);
    let body: serde_json::Value =
        serde_json::from_str(start.split_once(' ').expect("MS BODY").1).expect("JSON");
    assert_eq!(body["ev"], "start");
    assert_eq!(body["token"].to_string(), token, "{start}");
    let runs = crate::history::log_json(&b, &key, 5);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["state"], "ended", "{runs:?}");
}

/// A TCP proxy to `upstream` that, once, forwards the acquire that carries a run's start and
/// drops the server's reply (one with `-NOSCRIPT` excepted: the script did not run), cutting the connection: the script
/// ran, its answer never came. Returns the proxy's port and whether the cut happened.
fn proxy_losing_a_starting_acquire_reply(
    upstream: u16,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cut = Arc::new(AtomicBool::new(false));
    let armed = Arc::new(AtomicBool::new(false));
    let flag = cut.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_in, mut c_out) = (server, client);
            let (cut_up, armed_up) = (cut.clone(), armed.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_in.read(&mut buf) {
                    let chunk = &buf[..n];
                    if n == 0 {
                        break;
                    }
                    if !cut_up.load(Ordering::SeqCst)
                        && chunk.windows(12).any(|w| w == br#""ev":"start""#)
                    {
                        armed_up.store(true, Ordering::SeqCst);
                    }
                    if s_out.write_all(chunk).is_err() {
                        break;
                    }
                }
                let _ = s_out.shutdown(Shutdown::Write);
            });
            let (cut, armed) = (cut.clone(), armed.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let noscript = buf[..n].windows(9).any(|w| w == b"-NOSCRIPT");
                    if armed.swap(false, Ordering::SeqCst) && !noscript {
                        cut.store(true, Ordering::SeqCst);
                        let _ = c_out.shutdown(Shutdown::Both);
                        let _ = s_in.shutdown(Shutdown::Both);
                        return;
                    }
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_out.shutdown(Shutdown::Write);
            });
        }
    });
    (port, flag)
}

/// An acquire whose reply is lost gives back what it may have taken — the lock, and the run's
/// start its script recorded with it: no run that never happened is left in the history (it
/// read as killed, and `--once-per` skipped on it).
#[test]
fn a_lost_acquire_reply_takes_its_start_back() {
    let Some(r) = Redis::start(&[]) else {
        return;
    };
    let (port, cut) = proxy_losing_a_starting_acquire_reply(r.port);
    let key = unique_key("lost-fold");
    let b = TestBackend::redis(&format!("redis://127.0.0.1:{port}"));
    let out = output(&mut b.run(&key, &["--no-wait"], &["true"]));
    assert!(
        cut.load(std::sync::atomic::Ordering::SeqCst),
        "the proxy never cut: {}",
        describe(&out)
    );
    assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
    let history = [
        format!("dlock:{{{key}}}:runs"),
        format!("dlock:{{{key}}}:lastrun"),
    ];
    assert_eq!(
        r.cli(&[
            "EXISTS",
            &format!("dlock:{{{key}}}"),
            &history[0],
            &history[1]
        ]),
        "0",
        "{}",
        describe(&out)
    );
}
