//! The redis backend through Sentinel (`redis-sentinel://…#dlockp`): a primary, a replica and
//! three sentinels. The suites run through the sentinels; a failover happens under a workload.

use std::time::Duration;

use crate::servers::{RedisSentinel, shared_redis_sentinel};
use crate::util::*;

crate::conformance!(match shared_redis_sentinel() {
    Some(s) => TestBackend::redis(&s.url()),
    None => return,
});

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_redis_sentinel() {
            Some(s) => TestBackend::redis(&s.url()),
            None => return,
        },
        crate::history::sentinel_native()
    );
}

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_redis_sentinel() {
        Some(s) => TestBackend::redis(&s.url()),
        None => return,
    });
}

/// Shared locks, semaphores, several keys and nested runs, through the sentinels.
mod modes {
    use super::*;

    crate::modes!(match shared_redis_sentinel() {
        Some(s) => TestBackend::redis(&s.url()),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_redis_sentinel() {
        Some(s) => TestBackend::redis(&s.url()),
        None => return,
    });
}

/// `SENTINEL FAILOVER` while one run holds and others wait, twice (there and back): no two
/// commands inside at once, tokens growing, and the waiters proceed on the new primary. A
/// holder keeps its lock when the new primary has its token (a graceful failover waits for the
/// replica), or stops its command (79); nothing else fails (a waiter outlasts the switch).
#[test]
fn failover_while_held_and_waited_for() {
    let Some(s) = RedisSentinel::start() else {
        return;
    };
    let b = TestBackend::redis(&s.url());
    let w = crate::faults::Workload::start(&b, "sentinel-failover", 3, "0.3");
    for _ in 0..2 {
        w.goes_on(2, Duration::from_secs(20));
        w.holder();
        s.failover();
        w.goes_on(3, Duration::from_secs(30));
    }
    w.finish_expecting(&[Some(0), Some(79)], "sentinel failover twice");
}

/// A sentinel URL whose primary name no sentinel knows: one line, 69, quickly.
#[test]
fn unknown_primary_name_is_69() {
    let Some(s) = shared_redis_sentinel() else {
        return;
    };
    let url = s.url().replace("#dlockp", "#nosuch");
    let out = run_code(
        &mut TestBackend::redis(&url).run(&unique_key("sentinel-name"), &[], &["true"]),
        69,
    );
    assert!(one_error_line(&out).contains("nosuch"));
}

/// `?min-replicas=N`: with the replica up, a run passes; with more replicas asked for than
/// exist, or the replica stopped, the grant is given back and the run fails (69 with
/// `--no-wait`, 75 when `--wait` runs out), leaving the lock free; once the replica is back,
/// runs pass again.
#[test]
fn min_replicas_waits_for_the_replica() {
    let Some(primary) = crate::servers::Redis::start(&[]) else {
        return;
    };
    let port = primary.port.to_string();
    let Some(replica) = crate::servers::Redis::start(&["--replicaof", "127.0.0.1", &port]) else {
        return;
    };
    wait_until(Duration::from_secs(20), "the replica in sync", || {
        replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    let key = unique_key("min-replicas");
    let with = |n: u32| TestBackend::redis(&format!("{}?min-replicas={n}", primary.url()));
    run_ok(&mut with(1).run(&key, &[], &["true"]));
    let out = run_code(&mut with(2).run(&key, &["--no-wait"], &["true"]), 69);
    assert!(
        one_error_line(&out).contains("min-replicas"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        with(1).status(&key)["held"],
        false,
        "the grant was given back"
    );
    replica.pause(true);
    let ran = scratch("min-replicas").join("ran");
    let cmd = sh(&format!("touch {}", ran.display()));
    run_code(&mut with(1).run(&key, &["--no-wait"], &cmd), 69);
    run_code(&mut with(1).run(&key, &["--wait", "2s"], &cmd), 75);
    assert!(
        !ran.exists(),
        "the command ran without the replica's acknowledgement"
    );
    assert_eq!(with(1).status(&key)["held"], false);
    replica.pause(false);
    run_ok(&mut with(1).run(&key, &["--wait", "10s"], &cmd));
    assert!(ran.exists());
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(s) = shared_redis_sentinel() else {
        return;
    };
    let primary = format!("redis://127.0.0.1:{}", s.primary_port());
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::redis(&s.url()), &|| {
        crate::bench::redis_leftovers(&primary)
    });
}
