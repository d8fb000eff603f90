//! The redis backend on a Redis Cluster of three primaries, always through the URL of node 0:
//! two keys in three live on another node, so the suites run through MOVED redirections.

use std::time::Duration;

use crate::servers::shared_redis_cluster;
use crate::util::*;

crate::conformance!(match shared_redis_cluster() {
    Some(c) => TestBackend::redis(&c.url(0)),
    None => return,
});

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_redis_cluster() {
            Some(c) => TestBackend::redis(&c.url(0)),
            None => return,
        },
        crate::history::redis_native()
    );
}

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_redis_cluster() {
        Some(c) => TestBackend::redis(&c.url(0)),
        None => return,
    });
}

/// Shared locks, semaphores, several keys (in different slots: each on its own node) and nested
/// runs.
mod modes {
    use super::*;

    crate::modes!(match shared_redis_cluster() {
        Some(c) => TestBackend::redis(&c.url(0)),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_redis_cluster() {
        Some(c) => TestBackend::redis(&c.url(0)),
        None => return,
    });
}

/// A key whose slot node 0 does not own, and keys whose `}` would end the hash tag early (`}x`
/// left an empty tag: CROSSSLOT, exit 69): each mode runs, `status` and `break` find them, and
/// `status` without a key lists locks held on every node.
#[test]
fn keys_elsewhere_and_keys_with_braces() {
    let Some(c) = shared_redis_cluster() else {
        return;
    };
    let b = TestBackend::redis(&c.url(0));
    let elsewhere = (0..)
        .map(|_| unique_key("elsewhere"))
        .find(|k| c.owner(&format!("dlock:{{{k}}}")) != 0)
        .unwrap();
    let dir = scratch("cluster-keys");
    let keys = [
        elsewhere,
        format!("}}x-{}", unique_key("brace")),
        format!("{{}}-{}", unique_key("braces")),
        format!("a}}b%7D-{}", unique_key("escape")),
    ];
    for key in &keys {
        for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
            let out = run_ok(&mut b.run(key, mode, &sh("printf %s \"$DLOCK_FENCING_TOKEN\"")));
            assert!(
                String::from_utf8(out.stdout)
                    .unwrap()
                    .parse::<u64>()
                    .is_ok(),
                "{key} {mode:?}"
            );
            run_ok(b.cmd("break").args(["--key", key]));
        }
    }
    let mut holders: Vec<Proc> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| b.holding(key, &[], &dir.join(format!("held-{i}"))))
        .collect();
    let (listed, _) = b.listed();
    for key in &keys {
        let st = b.status(key);
        assert_eq!(st["held"], true, "{key}: {st}");
        assert!(listed.contains(key), "{key} not listed: {listed:?}");
        run_code(&mut b.run(key, &["--no-wait"], &["true"]), 75);
    }
    for h in &mut holders {
        h.close_stdin();
    }
    for h in holders {
        let (out, _) = h.wait(Duration::from_secs(10));
        assert!(out.status.success(), "{}", describe(&out));
    }
}

/// The slot of a held lock migrates to another node (IMPORTING/MIGRATING, MIGRATE, SETSLOT
/// NODE): the holder's renewals follow it and it keeps the lock; a waiter queued before the
/// move still gets the lock when the holder lets go; nobody holds beside the holder meanwhile.
#[test]
fn slot_migrated_while_held() {
    let Some(c) = shared_redis_cluster() else {
        return;
    };
    let b = TestBackend::redis(&c.url(0));
    let key = unique_key("migrate");
    let name = format!("dlock:{{{key}}}");
    let dir = scratch("cluster-migrate");
    let mut holder = b.holding(&key, &[], &dir.join("held"));
    let ran = dir.join("waiter-ran");
    let waiter = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!("touch {}", ran.display())),
    ));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    let from = c.owner(&name);
    c.migrate_slot_of(&name, (from + 1) % c.nodes.len());
    assert_ne!(c.owner(&name), from);
    // Renewals every ttl/3: several of them land on the new owner.
    std::thread::sleep(b.ttl * 2);
    assert!(!ran.exists(), "the waiter ran beside the holder");
    assert_eq!(b.status(&key)["held"], true);
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    holder.close_stdin();
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert!(out.status.success(), "holder: {}", describe(&out));
    let (out, _) = waiter.wait(Duration::from_secs(15));
    assert!(out.status.success(), "waiter: {}", describe(&out));
    assert!(ran.exists());
}

/// While a slot migrates, its old owner answers `ASK` for keys it does not have, and the
/// importing node refuses a script over several keys it does not all have (`TRYAGAIN`). A new
/// lock asked for then follows the `ASK` (only the importing node can refuse so), fails
/// with `--no-wait` (69), waits with `--wait` — an outage it outlasts — and gets the lock on the
/// new owner once the migration ends.
#[test]
fn a_lock_asked_for_while_its_slot_migrates() {
    let Some(c) = shared_redis_cluster() else {
        return;
    };
    let b = TestBackend::redis(&c.url(0));
    let key = unique_key("ask");
    let name = format!("dlock:{{{key}}}");
    let from = c.owner(&name);
    let to = (from + 1) % c.nodes.len();
    c.start_migrating(&name, to);
    let out = run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 69);
    // The old owner has none of the new lock's keys, so it answers ASK, never TRYAGAIN: a
    // TRYAGAIN comes from the importing node, after ASKING.
    let line = one_error_line(&out);
    assert!(
        line.contains("TryAgain"),
        "not refused by the importing node: {line}"
    );
    let waiter = Proc::spawn(&mut b.run(&key, &["--wait", "30s"], &["true"]));
    std::thread::sleep(Duration::from_millis(500));
    c.finish_migrating(&name, to);
    let (out, _) = waiter.wait(Duration::from_secs(15));
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(c.owner(&name), to);
    assert_eq!(b.status(&key)["held"], false);
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(c) = shared_redis_cluster() else {
        return;
    };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::redis(&c.url(0)), &|| {
        let mut keys: Vec<String> = (0..c.nodes.len())
            .flat_map(|i| crate::bench::redis_leftovers(&c.url(i)))
            .collect();
        keys.sort();
        keys
    });
}

/// A cluster that names redirect targets without a host (`cluster-preferred-endpoint-type
/// unknown-endpoint`, as behind a load balancer: `-MOVED 3999 :6380`, "the host you asked"):
/// dlock follows them to the host of its URL — lock, renewals, waiters, `status`, `break`.
/// Regression: refused as a bad redirection (exit 69).
#[test]
fn redirects_without_a_host_go_to_the_host_asked() {
    let Some(c) = crate::servers::RedisCluster::start() else {
        return;
    };
    for n in &c.nodes {
        let set = ["CONFIG", "SET", "cluster-preferred-endpoint-type"];
        assert_eq!(n.cli(&[&set[..], &["unknown-endpoint"]].concat()), "OK");
    }
    let b = TestBackend::redis(&c.url(0));
    let key = (0..)
        .map(|_| unique_key("hostless"))
        .find(|k| c.owner(&format!("dlock:{{{k}}}")) != 0)
        .unwrap();
    let moved = c.nodes[0].cli(&["GET", &format!("dlock:{{{key}}}")]);
    assert!(moved.contains("MOVED") && moved.contains(" :"), "{moved}");
    let dir = scratch("hostless");
    let mut holder = b.holding(&key, &[], &dir.join("held"));
    let st = b.status(&key);
    assert_eq!(st["held"], true, "{st}");
    let (listed, _) = b.listed();
    assert!(listed.contains(&key), "{key} not listed: {listed:?}");
    let waiter = b.holding_later(&key, &dir.join("waited"));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    // Renewals (every TTL/3) go through the redirect too: the holder outlives its TTL.
    std::thread::sleep(b.ttl * 2);
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    holder.close_stdin();
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    wait_for_file(&dir.join("waited"), Duration::from_secs(10));
    run_ok(b.cmd("break").args(["--key", &key]));
    let (out, _) = waiter.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
}
