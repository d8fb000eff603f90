//! Redlock (`--url` given 3, 5, ... times) against real, independent redis-server processes.

use std::time::Duration;

use crate::servers::{Redis, shared_redlock};
use crate::util::*;

crate::conformance!(match shared_redlock() {
    Some(urls) => TestBackend::redlock(&urls),
    None => return,
});

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_redlock() {
            Some(urls) => TestBackend::redlock(&urls),
            None => return,
        },
        crate::history::redis_native()
    );
}

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_redlock() {
        Some(urls) => TestBackend::redlock(&urls),
        None => return,
    });
}

/// Shared locks, semaphores, several keys and nested runs.
mod modes {
    use super::*;

    crate::modes!(match shared_redlock() {
        Some(urls) => TestBackend::redlock(&urls),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_redlock() {
        Some(urls) => TestBackend::redlock(&urls),
        None => return,
    });
}

fn masters(n: usize) -> Option<Vec<Redis>> {
    (0..n).map(|_| Redis::start(&[])).collect()
}

/// With 3 masters one may be down; with two down there is no quorum: exit 69, one line.
#[test]
fn three_masters_survive_one_down_not_two() {
    let Some(mut servers) = masters(3) else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    let key = unique_key("redlock-3");
    drop(servers.pop());
    run_ok(&mut b.run(&key, &[], &["true"]));
    // Mutual exclusion still holds with one master down.
    let dir = scratch("redlock-3");
    let m = dir.join("held");
    let mut h = b.holding(&key, &[], &m);
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    h.close_stdin();
    h.wait(Duration::from_secs(5));
    drop(servers.pop());
    let out = run_code(&mut b.run(&key, &[], &["true"]), 69);
    assert!(
        one_error_line(&out).contains("only 1 of 3 Redis masters answered"),
        "{}",
        describe(&out)
    );
}

/// With 5 masters two may be down; three down is no quorum.
#[test]
fn five_masters_survive_two_down_not_three() {
    let Some(mut servers) = masters(5) else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    let key = unique_key("redlock-5");
    drop(servers.pop());
    drop(servers.pop());
    run_ok(&mut b.run(&key, &[], &["true"]));
    drop(servers.pop());
    run_code(&mut b.run(&key, &[], &["true"]), 69);
}

/// status explains why there is no fencing token.
#[test]
fn status_says_why_there_is_no_fencing_token() {
    let Some(urls) = shared_redlock() else { return };
    let b = TestBackend::redlock(&urls);
    let s = b.status(&unique_key("redlock-status"));
    assert!(
        s["notes"][0].as_str().unwrap().contains("no fencing token"),
        "{s}"
    );
}

/// A Redlock holder that loses its majority (masters restarted without persistence) stops.
#[test]
fn holder_that_loses_its_majority_is_stopped() {
    let Some(mut servers) = masters(3) else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    let key = unique_key("redlock-lost");
    let dir = scratch("redlock-lost");
    let m = dir.join("pid");
    let p = Proc::spawn(&mut b.run(
        &key,
        &[],
        &sh(&format!("echo $$ > {}; exec sleep 30", m.display())),
    ));
    let child: i32 = wait_for_file(&m, Duration::from_secs(5)).parse().unwrap();
    servers[0].restart();
    servers[1].restart();
    let (out, _) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(!alive(child));
}

/// Credentials belong in DLOCK_URL, so it takes several URLs for Redlock, space-separated.
#[test]
fn dlock_url_holds_several_space_separated_urls() {
    let Some(urls) = shared_redlock() else { return };
    let key = unique_key("redlock-env");
    let out = run_ok(
        dlock()
            .env("DLOCK_URL", urls.join(" "))
            .args(["status", "-k", &key, "--json"]),
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        s["location"].as_str().unwrap().starts_with("Redlock over"),
        "{s}"
    );
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(urls) = shared_redlock() else { return };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::redlock(&urls), &|| {
        urls.iter()
            .flat_map(|u| crate::bench::redis_leftovers(u))
            .collect()
    });
}

/// Faults while a workload contends for one key (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(match shared_redlock() {
        Some(urls) => TestBackend::redlock(&urls),
        None => return,
    });
}

/// Two of three masters stop answering for twice the TTL: no quorum, so holders stop (79) and
/// waiters fail (69) until they are back (see `faults.rs`).
#[test]
fn fault_majority_paused() {
    let servers: Vec<Redis> = (0..3).filter_map(|_| Redis::start(&[])).collect();
    if servers.len() < 3 {
        return;
    }
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    crate::faults::server_paused(&b, &|on| {
        servers[0].pause(on);
        servers[1].pause(on);
    });
}

/// Two of three masters are killed and started again at once, empty: a quorum that forgot the
/// lock must not let a new holder start while the old one may still run (`backend::hold_back_until`
/// does Redlock's "delayed restart" on the clients' side).
#[test]
fn fault_majority_killed_and_restarted() {
    let mut servers: Vec<Redis> = (0..3).filter_map(|_| Redis::start(&[])).collect();
    if servers.len() < 3 {
        return;
    }
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    crate::faults::server_killed_and_restarted(&b, &mut || {
        servers[0].restart();
        servers[1].restart();
    });
}

/// Scripts run on a master so far (EVALSHA and EVAL: the acquire, the release, …).
fn scripts_run(r: &Redis) -> u64 {
    let stats = r.cli(&["INFO", "commandstats"]);
    let count = |name: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    count("evalsha") + count("eval")
}

/// A Redlock run with history writes its start in each master's acquire script: two scripts
/// per master — the acquire, and the release with the end (a start of its own made it three) —
/// and the run is in the log, ended.
#[test]
fn a_redlock_run_records_its_start_in_each_masters_acquire() {
    let Some(servers) = masters(3) else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    // Loads the scripts (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA) on every master.
    run_ok(&mut b.run(&unique_key("redlock-fold-warm"), &[], &["true"]));
    let key = unique_key("redlock-fold");
    let before: Vec<u64> = servers.iter().map(scripts_run).collect();
    run_ok(&mut b.run(&key, &[], &["true"]));
    let after: Vec<u64> = servers.iter().map(scripts_run).collect();
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        assert_eq!(a - b, 2, "master {i}: the acquire and the release");
    }
    let runs = crate::history::log_json(&b, &key, 5);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["state"], "ended", "{runs:?}");
}

/// An attempt that one master grants and two refuse (another holder's lock is on them) does
/// not hold the lock: the start that master's acquire script recorded is taken back with the
/// grant, so no run shows that never ran.
#[test]
fn a_grant_below_the_quorum_takes_its_start_back() {
    let Some(servers) = masters(3) else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(Redis::url).collect();
    let b = TestBackend::redlock(&urls);
    let key = unique_key("redlock-undo");
    let lock = format!("dlock:{{{key}}}");
    for r in &servers[..2] {
        assert_eq!(
            r.cli(&["SET", &lock, "someone-else", "PX", "60000"]).trim(),
            "OK"
        );
    }
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    let third = &servers[2];
    assert_eq!(
        third.cli(&["EXISTS", &lock]).trim(),
        "0",
        "the grant given back"
    );
    assert_eq!(
        third.cli(&["LLEN", &format!("{lock}:runs")]).trim(),
        "0",
        "the start taken back"
    );
    assert!(crate::history::log_json(&b, &key, 5).is_empty());
}
