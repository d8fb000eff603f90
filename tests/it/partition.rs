//! The asymmetric partition: the holder's connections are black-holed by a TCP proxy (they stay
//! open, nothing gets through either way) while a waiter reaches the server directly. The
//! holder's command writes a heartbeat every 20 ms; the waiter's command records when it starts.
//! Safety means the holder's last heartbeat precedes the waiter's start: the holder stopped its
//! command before the server let the lock go. Run with a fractional `--ttl` (a server timeout
//! rounded down from it once let MySQL free the lock early) and with a command that ignores
//! SIGTERM (only the SIGKILL at the deadline stops it).

use std::thread;
use std::time::Duration;

use crate::servers::*;
use crate::util::*;

/// The latest heartbeat (ns since the epoch) the command wrote to `hb`.
fn last_beat(hb: &std::path::Path) -> u128 {
    std::fs::read_to_string(hb)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap()
}

/// The case: `make` builds the backend for a URL (list); `urls` reach the servers directly.
fn partition(label: &str, urls: &[String], make: fn(&[String]) -> TestBackend, ignore_term: bool) {
    let ttl = Duration::from_millis(1900);
    let (holder_urls, proxies) = all_proxied(urls);
    let holder_b = TestBackend {
        ttl,
        ..make(&holder_urls)
    };
    let waiter_b = TestBackend { ttl, ..make(urls) };
    let key = unique_key(if ignore_term {
        "partition-term"
    } else {
        "partition"
    });
    let dir = scratch("partition");
    let (hb, start) = (dir.join("hb"), dir.join("start"));
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    let beat = format!(
        "{trap}while :; do date +%s%N >> {}; sleep 0.02; done",
        hb.display()
    );
    let holder = Proc::spawn(&mut holder_b.run(&key, &[], &sh(&beat)));
    wait_for_file(&hb, Duration::from_secs(15));
    for p in &proxies {
        p.black_hole();
    }
    let waiter = Proc::spawn(&mut waiter_b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!("date +%s%N > {}", start.display())),
    ));
    let (out, _) = holder.wait(Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let (out, _) = waiter.wait(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let last_beat = last_beat(&hb);
    let started: u128 = wait_for_file(&start, Duration::from_secs(5))
        .parse()
        .unwrap();
    let margin_ms = (started as i128 - last_beat as i128) as f64 / 1e6;
    eprintln!(
        "partition margin ({label}, ttl 1900ms{}): holder's last heartbeat -> waiter's start = {margin_ms:.0} ms",
        if ignore_term { ", SIGTERM ignored" } else { "" }
    );
    assert!(
        last_beat < started,
        "the holder's command ran {:.0} ms after the waiter's started",
        -margin_ms
    );
}

/// A short blip: holder and waiter both cut off from the server for 4 s (longer than the 2 s
/// TTL, so the holder loses its lease and stops, 79), within the waiter's `--wait 25s`. The
/// waiter must reconnect, queue again and run (0), soon after the blip, and never while the
/// holder's command may still run. Regression: the waiter exited 69 ~3.5 s into the blip.
fn blip(label: &str, urls: &[String], make: fn(&[String]) -> TestBackend) {
    let ttl = Duration::from_secs(2);
    let (via, proxies) = all_proxied(urls);
    let b = TestBackend { ttl, ..make(&via) };
    let key = unique_key("blip");
    let dir = scratch("blip");
    let (hb, start) = (dir.join("hb"), dir.join("start"));
    let beat = format!(
        "while :; do date +%s%N >> {}; sleep 0.02; done",
        hb.display()
    );
    let holder = Proc::spawn(&mut b.run(&key, &[], &sh(&beat)));
    wait_for_file(&hb, Duration::from_secs(15));
    let waiter = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "25s"],
        &sh(&format!("date +%s%N > {}", start.display())),
    ));
    crate::conformance::wait_until_waiting(&make(urls), &key, 1);
    if urls.len() > 1 {
        // Redlock: `status` counts the waiters of the master that has most, so the waiter may
        // still be waiting for the others' answers — and a waiter that has never had a quorum
        // answer it takes a cut for an unreachable server (69). Wait until every master has it.
        for u in urls {
            crate::conformance::wait_until_waiting(&TestBackend::redis(u), &key, 1);
        }
    }
    for p in &proxies {
        p.cut();
    }
    thread::sleep(Duration::from_secs(4));
    let restored = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    for p in &proxies {
        p.restore();
    }
    let (out, _) = holder.wait(Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(79), "holder: {}", describe(&out));
    let (out, _) = waiter.wait(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "waiter: {}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("lost the connection").count(),
        1,
        "said once per outage: {err}"
    );
    let started: u128 = wait_for_file(&start, Duration::from_secs(5))
        .parse()
        .unwrap();
    let last_beat = last_beat(&hb);
    assert!(
        last_beat < started,
        "the waiter ran while the holder's command still did"
    );
    let after_ms = (started as i128 - restored as i128) as f64 / 1e6;
    eprintln!("blip ({label}): the waiter ran {after_ms:.0} ms after the blip ended");
    // S3 has no session to resume: a waiter cut off watches a whole lease again (2 s and the
    // drift margin, polled up to every 500 ms) once it reaches the server (3.7 s here, idle).
    let bound_ms = if label == "s3" { 7000.0 } else { 5000.0 };
    assert!(
        after_ms < bound_ms,
        "the waiter ran {after_ms:.0} ms after the blip"
    );
}

macro_rules! partition_cases {
    ($name:ident, $urls:expr, $make:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn holder_stops_before_the_waiter_starts() {
                let Some(urls) = $urls else { return };
                partition(stringify!($name), &urls, $make, false);
            }

            #[test]
            fn holder_ignoring_sigterm_stops_before_the_waiter_starts() {
                let Some(urls) = $urls else { return };
                partition(stringify!($name), &urls, $make, true);
            }

            #[test]
            fn a_waiter_outlives_a_short_blip() {
                let Some(urls) = $urls else { return };
                blip(stringify!($name), &urls, $make);
            }
        }
    };
}

partition_cases!(redis, shared_redis().map(|u| vec![u]), |u| {
    TestBackend::redis(&u[0])
});
partition_cases!(mysql, shared_mariadb().map(|m| vec![m.url()]), |u| {
    TestBackend::mysql(&u[0])
});
partition_cases!(zookeeper, shared_zookeeper().map(|z| vec![z.url()]), |u| {
    TestBackend::zookeeper(&u[0])
});
partition_cases!(redlock, shared_redlock(), TestBackend::redlock);
partition_cases!(postgres, shared_postgres().map(|p| vec![p.url()]), |u| {
    TestBackend::postgres(&u[0])
});
partition_cases!(etcd, shared_etcd().map(|e| vec![e.url()]), |u| {
    TestBackend::etcd(&u[0])
});

/// A reset of the holder's connection (the proxy closes it, as a firewall or an idle-killing
/// middlebox would) frees a session lock on the server at once: another holder may have it the
/// next moment. The holder must hear of it at once, not at its next check (ttl/3: 10 s here),
/// and kill its command at once — without the 20 s `--kill-grace`: its TERM trap goes on
/// looping — and exit 79, within a few seconds. Before, MySQL's holder learned it at its
/// next check (found by the fault campaign), and both gave the command the grace.
fn a_reset_is_seen_at_once(urls: &[String], make: fn(&[String]) -> TestBackend) {
    let (via, proxies) = all_proxied(urls);
    let b = TestBackend {
        ttl: Duration::from_secs(30),
        ..make(&via)
    };
    let key = unique_key("reset");
    let dir = scratch("reset");
    let held = dir.join("held");
    let trapped = dir.join("trapped");
    let holder = Proc::spawn(&mut b.run(
        &key,
        &["--kill-grace", "20s"],
        &sh(&format!(
            "trap 'echo trapped > {}' TERM; echo held > {}; while :; do sleep 0.05; done",
            trapped.display(),
            held.display()
        )),
    ));
    // A server younger than the TTL holds the lock back (up to 30 s when this test runs alone).
    wait_until(
        Duration::from_secs(45),
        "the holder's command to start",
        || held.exists() || !alive(holder.pid()),
    );
    assert!(
        held.exists(),
        "{}",
        describe(&holder.wait(Duration::from_secs(5)).0)
    );
    // Cut just after a renewal (a request and its reply through the proxy): the next check is
    // ttl/3 away, so only a watch on the connection can see the cut within the bound.
    let before = proxies[0].forwarded();
    wait_until(Duration::from_secs(15), "a renewal", || {
        proxies[0].forwarded() >= before + 2
    });
    let cut = std::time::Instant::now();
    for p in &proxies {
        p.cut();
    }
    let (out, _) = holder.wait(Duration::from_secs(20));
    let took = cut.elapsed();
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        took < Duration::from_secs(5),
        "the holder took {took:?} to see its connection end: {}",
        describe(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connection"), "{err}");
}

#[test]
fn mysql_a_reset_of_the_holders_connection_is_seen_at_once() {
    let Some(m) = shared_mariadb() else { return };
    a_reset_is_seen_at_once(&[m.url()], |u| TestBackend::mysql(&u[0]));
}

#[test]
fn postgres_a_reset_of_the_holders_connection_is_seen_at_once() {
    let Some(p) = shared_postgres() else { return };
    a_reset_is_seen_at_once(&[p.url()], |u| TestBackend::postgres(&u[0]));
}

// S3: the endpoint in the URL (`?endpoint=`, which overrides the environment's), so that the
// proxy can stand in it. A waiter takes over only after watching one whole lease unchanged.
partition_cases!(
    s3,
    shared_seaweedfs().map(|s| vec![format!(
        "s3://{S3_BUCKET}/ci?endpoint=http://127.0.0.1:{}",
        s.port
    )]),
    |u| TestBackend::s3(&u[0], shared_seaweedfs().unwrap().env())
);
