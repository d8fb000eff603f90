//! ZooKeeper: the run's start written in the lock node's own transaction (one `multi`), and
//! taken back when the run has to queue.

use std::time::Duration;

use crate::conformance::wait_until_waiting;
use crate::servers::shared_zookeeper;
use crate::util::*;

/// The event nodes of `key`'s history, oldest first: (data, czxid, ctime).
fn events(key: &str) -> Vec<(Vec<u8>, i64, i64)> {
    let zk = shared_zookeeper().unwrap();
    let parent = format!("/dlock-history/{key}");
    let mut names = zk.children(&parent);
    names.sort();
    zk.with_client(async |client| {
        let mut out = Vec::new();
        for n in names.iter().filter(|n| n.starts_with("e-")) {
            let (data, stat) = client
                .get_data(&format!("{parent}/{n}"))
                .await
                .expect("read an event node");
            out.push((data, stat.czxid, stat.ctime));
        }
        out
    })
}

fn json(data: &[u8]) -> serde_json::Value {
    serde_json::from_slice(data).expect("an event is JSON")
}

/// Adds an event node with `body` to `key`'s history, as another client could.
fn forge(key: &str, body: &[u8]) {
    let zk = shared_zookeeper().unwrap();
    let parent = format!("/dlock-history/{key}");
    zk.mkdirs(&parent);
    zk.with_client(async |client| {
        use zookeeper_client::{Acls, CreateMode};
        let options = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
        client
            .create(&format!("{parent}/e-"), body, &options)
            .await
            .expect("create an event node");
    })
}

/// A lone run's start is created in the same transaction as its lock node: the start's czxid is
/// the run's fencing token, its body carries none (the reader splices it in: `log` shows it).
#[test]
fn zookeeper_a_lone_runs_start_shares_its_lock_nodes_transaction() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    let key = unique_key("zk-fold");
    let dir = scratch("zk-fold");
    let marker = dir.join("token");
    let script = format!("echo $DLOCK_FENCING_TOKEN > {}", marker.display());
    run_ok(&mut b.run(&key, &[], &sh(&script)));
    let token: i64 = wait_for_file(&marker, Duration::from_secs(5))
        .parse()
        .unwrap();
    let ev = events(&key);
    assert_eq!(ev.len(), 2, "a start and an end");
    let start = json(&ev[0].0);
    assert_eq!(start["ev"], "start");
    assert!(start.get("token").is_none(), "{start}");
    assert_eq!(ev[0].1, token, "the start's czxid is the lock node's");
    let runs = crate::history::log_json(&b, &key, 5);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["state"], "ended", "{runs:?}");
    assert_eq!(runs[0]["token"], token, "{runs:?}");
}

/// A run that has to queue takes back the start it wrote with its node before it waits, and
/// writes it again when the lock is its own (after the holder's end, with its token).
#[test]
fn zookeeper_a_queued_run_has_no_start_until_it_holds() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    let key = unique_key("zk-fold-queue");
    let dir = scratch("zk-fold-queue");
    let mut holder = b.holding(&key, &[], &dir.join("held"));
    let waiter = Proc::spawn(&mut b.run(&key, &["--wait", "30s"], &["true"]));
    wait_until_waiting(&b, &key, 1);
    assert_eq!(events(&key).len(), 1, "only the holder's start");
    holder.close_stdin();
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    let (out, _) = waiter.wait(Duration::from_secs(20));
    assert!(out.status.success(), "{}", describe(&out));
    let ev = events(&key);
    let kinds: Vec<String> = ev.iter().map(|e| json(&e.0)["ev"].to_string()).collect();
    assert_eq!(
        kinds,
        ["\"start\"", "\"end\"", "\"start\"", "\"end\""],
        "the waiter's start after the holder's end"
    );
    let second = json(&ev[2].0);
    assert!(second["token"].is_u64(), "written as a holder: {second}");
    assert!(
        ev[2].2 >= ev[1].2,
        "the waiter started after the holder ended"
    );
    let runs = crate::history::log_json(&b, &key, 5);
    assert_eq!(runs.len(), 2, "{runs:?}");
}

/// `--once-per` does not count a tokenless start (one written with its lock node) made after
/// its own lock node — a run queued behind it, whose start is being taken back — but counts one
/// made before.
#[test]
fn zookeeper_once_per_ignores_the_start_of_a_run_queued_behind_it() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    // A real tokenless start to forge with.
    let sample = unique_key("zk-fold-sample");
    run_ok(&mut b.run(&sample, &[], &["true"]));
    let body = events(&sample)[0].0.clone();
    assert!(json(&body).get("token").is_none());

    let key = unique_key("zk-fold-once");
    let dir = scratch("zk-fold-once");
    let mut holder = b.holding(&key, &["--no-history"], &dir.join("held"));
    let ran = dir.join("ran");
    let once = Proc::spawn(&mut b.run(
        &key,
        &["--once-per", "1h", "--wait", "30s", "-E", "9"],
        &["touch", ran.to_str().unwrap()],
    ));
    wait_until_waiting(&b, &key, 1);
    forge(&key, &body);
    holder.close_stdin();
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    let (out, _) = once.wait(Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(ran.exists(), "a queued run's start does not count");

    let key = unique_key("zk-fold-once-before");
    forge(&key, &body);
    let ran = dir.join("ran-before");
    let out = output(&mut b.run(
        &key,
        &["--once-per", "1h", "-E", "9"],
        &["touch", ran.to_str().unwrap()],
    ));
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
    assert!(!ran.exists(), "a start made before our node counts");
}

/// A key's history node the run may not write to (made by other credentials, or read-only)
/// costs the run its start, never its lock: the lock node's transaction fails as a whole, so the
/// node is created again without the start, and the run goes on with the warning it had before
/// the start went into that transaction. (It ended in exit 69, "not authorized to create a lock
/// node".)
#[test]
fn zookeeper_a_history_it_may_not_write_does_not_cost_the_lock() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    let key = unique_key("zk-fold-noauth");
    zk.mkdirs("/dlock-history");
    zk.with_client(async |client| {
        use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission};
        let read = [Acl::new(Permission::READ, AuthId::anyone())];
        client
            .create(
                &format!("/dlock-history/{key}"),
                &[],
                &CreateMode::Persistent.with_acls(Acls::new(&read)),
            )
            .await
            .expect("create a read-only history node");
    });
    let dir = scratch("zk-fold-noauth");
    let ran = dir.join("ran");
    let out = output(&mut b.run(&key, &[], &["touch", ran.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(ran.exists(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot record the run in the history"),
        "{}",
        describe(&out)
    );
    assert!(b.is_free(&key));
}
