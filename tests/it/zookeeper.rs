//! The zookeeper backend against real ZooKeeper servers: the conformance suite on a shared
//! server, and what only a server (or an ensemble) can do on servers of their own.

use std::time::{Duration, Instant};

use crate::conformance::wait_until_waiting;
use crate::servers::{Zookeeper, shared_zookeeper};
use crate::util::*;

crate::conformance!(match shared_zookeeper() {
    Some(zk) => TestBackend::zookeeper(&zk.url()),
    None => return,
});

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_zookeeper() {
        Some(zk) => TestBackend::zookeeper(&zk.url()),
        None => return,
    });
}

/// Shared locks, semaphores, several keys and nested runs.
mod modes {
    use super::*;

    crate::modes!(match shared_zookeeper() {
        Some(zk) => TestBackend::zookeeper(&zk.url()),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_zookeeper() {
        Some(zk) => TestBackend::zookeeper(&zk.url()),
        None => return,
    });
}

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_zookeeper() {
            Some(zk) => TestBackend::zookeeper(&zk.url()),
            None => return,
        },
        zk_native()
    );
}

/// The history hooks, through a ZooKeeper client of the test's own: one persistent-sequential
/// node `e-N` per event under `/dlock-history/<key>` (the test keys need no escaping).
pub(crate) fn zk_native() -> crate::history::Native {
    fn parent(key: &str) -> String {
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        format!("/dlock-history/{key}")
    }
    crate::history::Native {
        forge: |_, key, body| {
            let zk = shared_zookeeper().unwrap();
            zk.mkdirs(&parent(key));
            zk.with_client(async |client| {
                use zookeeper_client::{Acls, CreateMode};
                let options = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
                client
                    .create(&format!("{}/e-", parent(key)), body, &options)
                    .await
                    .expect("create an event node");
            })
        },
        count: |_, key| {
            let zk = shared_zookeeper().unwrap();
            zk.children(&parent(key))
                .iter()
                .filter(|c| c.starts_with("e-"))
                .count()
        },
    }
}

/// A chroot no other test uses, so that a test can see every node it made.
fn chroot(name: &str) -> String {
    format!("/{}", unique_key(name))
}

/// Five waiters queued one after another get the lock in that order (each watches only its
/// predecessor).
#[test]
fn waiters_get_the_lock_in_arrival_order() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    let key = unique_key("fifo");
    let dir = scratch("fifo");
    let order = dir.join("order");
    let held = dir.join("held");
    let mut h = b.holding(&key, &[], &held);
    let mut waiters = Vec::new();
    for i in 0..5 {
        waiters.push(Proc::spawn(&mut b.run(
            &key,
            &[],
            &sh(&format!("echo {i} >> {}", order.display())),
        )));
        wait_until_waiting(&b, &key, i + 1);
    }
    let s = b.status(&key);
    let queued: Vec<i64> = s["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_i64().unwrap())
        .collect();
    let spawned: Vec<i64> = waiters.iter().map(|w| w.pid() as i64).collect();
    assert_eq!(queued, spawned, "status lists the queue in order: {s}");
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    for w in waiters {
        let (out, _) = w.wait(Duration::from_secs(10));
        assert!(out.status.success(), "{}", describe(&out));
    }
    let got = std::fs::read_to_string(&order).unwrap();
    assert_eq!(got, "0\n1\n2\n3\n4\n");
}

/// The server stops answering (SIGSTOP) for longer than the session timeout.
#[test]
fn server_paused_longer_than_the_ttl_stops_the_command_in_time() {
    let Some(zk) = Zookeeper::start() else { return };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..TestBackend::zookeeper(&zk.url())
    };
    crate::conformance::paused_server_stops_the_command_in_time(&b, |on| zk.pause(0, on));
    // The same for the owner of an acquire-held lock.
    crate::acquire::paused_server_stops_the_owner_in_time(&b, |on| zk.pause(0, on));
}

/// A 3-server ensemble: killing the server the holder is connected to moves the session to
/// another one and the lock stays held (same session, same token); losing the quorum stops the
/// command before the session could expire, exit 79.
#[test]
fn ensemble_keeps_the_lock_across_a_server_loss_and_stops_without_quorum() {
    let Some(mut zk) = Zookeeper::ensemble() else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_secs(3),
        ..TestBackend::zookeeper(&zk.url())
    };
    let key = unique_key("ensemble");
    let (p, child) = b.hold(&key, &["--kill-grace", "1s"]);
    let before = b.status(&key)["holders"][0].clone();
    let session = before["session"].as_str().unwrap().to_string();
    let mut on = None;
    wait_until(Duration::from_secs(5), "the holder's server", || {
        on = zk.member_with_session(&session);
        on.is_some()
    });
    let first = on.unwrap();
    zk.kill(first);
    let killed = Instant::now();
    let mut moved = None;
    wait_until(b.ttl, "the session to move to another server", || {
        moved = zk.member_with_session(&session);
        moved.is_some()
    });
    // Held through more than a whole session timeout after the loss.
    while killed.elapsed() < b.ttl + Duration::from_secs(1) {
        assert!(alive(child), "the command was stopped after a server loss");
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = b.status(&key)["holders"][0].clone();
    assert_eq!(after["session"], before["session"], "{after}");
    assert_eq!(after["fencing_token"], before["fencing_token"], "{after}");
    // Now a second server goes: one of three is no quorum.
    let second = moved.unwrap();
    assert_ne!(second, first);
    zk.kill(second);
    let lost = Instant::now();
    let (out, _) = p.wait(b.ttl + Duration::from_secs(5));
    let took = lost.elapsed();
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(!alive(child));
    assert!(
        took < b.ttl + Duration::from_millis(300),
        "stopped after {took:?}"
    );
}

/// Runs, waits that time out, --no-wait conflicts, interrupted waiters and breaks leave no lock
/// node behind, and the key's node (a container) is reaped by the server once empty.
#[test]
fn nothing_is_left_behind() {
    let Some(zk) = shared_zookeeper() else { return };
    let root = chroot("clean");
    let b = TestBackend::zookeeper(&format!("{}{root}", zk.url()));
    let key = unique_key("clean");
    let keys_left = || zk.children(&format!("{root}/dlock"));
    run_ok(&mut b.run(&key, &[], &["true"]));
    // The key's node is a container: the server reaps it once empty (every second here).
    wait_until(Duration::from_secs(5), "the key's node to go", || {
        keys_left().is_empty()
    });
    let dir = scratch("clean");
    let held = dir.join("held");
    let mut h = b.holding(&key, &[], &held);
    assert_eq!(
        output(&mut b.run(&key, &["--no-wait"], &["true"]))
            .status
            .code(),
        Some(75)
    );
    let out = output(&mut b.run(&key, &["--wait", "300ms"], &["true"]));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let w = Proc::spawn(&mut b.run(&key, &[], &["true"]));
    wait_until_waiting(&b, &key, 1);
    w.signal(libc::SIGINT);
    assert_eq!(w.wait(Duration::from_secs(5)).0.status.code(), Some(130));
    let lock_nodes = zk.children(&format!("{root}/dlock/{key}"));
    assert_eq!(
        lock_nodes.len(),
        1,
        "only the holder's node: {lock_nodes:?}"
    );
    assert!(
        lock_nodes[0].starts_with("_c_") && lock_nodes[0].contains("-lock-"),
        "Curator's protected name: {lock_nodes:?}"
    );
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    assert_eq!(
        zk.children(&format!("{root}/dlock/{key}")),
        Vec::<String>::new()
    );
    // A broken holder exits without deleting anything; its key's node is a container.
    let (p, _) = b.hold(&key, &[]);
    run_ok(b.cmd("break").args(["-k", &key]));
    assert_eq!(p.wait(Duration::from_secs(5)).0.status.code(), Some(79));
    wait_until(Duration::from_secs(5), "the key's node to go", || {
        keys_left().is_empty()
    });
}

/// Digest credentials from DLOCK_URL: the key's nodes are theirs alone (others cannot see, take or
/// break the lock, exit 69, one line), other keys stay open to others, no password is printed.
#[test]
fn digest_credentials_guard_the_key_and_are_never_printed() {
    let Some(zk) = shared_zookeeper() else { return };
    let root = chroot("digest");
    let hosts = zk.hosts();
    let as_user = |user: &str| TestBackend {
        args: vec!["--backend".into(), "zk".into()],
        env: vec![("DLOCK_URL".into(), format!("zk://{user}@{hosts}{root}"))],
        ..TestBackend::zookeeper("")
    };
    let alice = as_user("alice:alice-pw");
    let key = unique_key("digest");
    let (p, _) = alice.hold(&key, &[]);
    let s = alice.status(&key);
    assert_eq!(s["held"], true, "{s}");
    assert!(!s.to_string().contains("alice-pw"), "{s}");
    let anonymous = TestBackend::zookeeper(&format!("zk://{hosts}{root}"));
    for b in [
        &anonymous,
        &as_user("alice:wrong-pw"),
        &as_user("bob:bob-pw"),
    ] {
        let mut status = b.cmd("status");
        let mut brk = b.cmd("break");
        for c in [
            status.args(["-k", &key]),
            brk.args(["-k", &key]),
            &mut b.run(&key, &["--no-wait"], &["true"]),
        ] {
            let out = output(c);
            assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
            let line = one_error_line(&out);
            assert!(line.contains("not authorized"), "{line}");
            assert!(!line.contains("-pw"), "{line}");
        }
        // Other keys are open to anyone.
        run_ok(&mut b.run(&unique_key("other"), &[], &["true"]));
    }
    assert_eq!(alice.status(&key)["held"], true);
    p.signal(libc::SIGTERM);
    p.wait(Duration::from_secs(5));
    assert!(alice.is_free(&key));
}

/// Nobody listening, and a server that accepts but never answers: one line, exit 69, quickly.
#[test]
fn unreachable_and_black_holed_servers_fail_within_seconds() {
    let port = crate::servers::free_port();
    let b = TestBackend::zookeeper(&format!("zk://127.0.0.1:{port}"));
    let started = Instant::now();
    let out = output(&mut b.run(&unique_key("unreachable"), &[], &["true"]));
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("cannot connect"),
        "{}",
        describe(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let Some(zk) = Zookeeper::start() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    zk.pause(0, true);
    let started = Instant::now();
    let out = output(&mut b.run(&unique_key("blackhole"), &[], &["true"]));
    let took = started.elapsed();
    zk.pause(0, false);
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

/// A --ttl below the server's minimum session timeout (1 s here) is raised by the server; dlock
/// says so with -v and keeps the lease by the negotiated timeout.
#[test]
fn session_timeout_is_what_the_server_negotiates() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend {
        ttl: Duration::from_millis(300),
        ..TestBackend::zookeeper(&zk.url())
    };
    let out = run_ok(&mut b.run(&unique_key("negotiated"), &["-v"], &["sleep", "1.5"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("session timeout to 1s"), "{err}");
}

/// A TCP proxy to `upstream` that, once, cuts the connection right after forwarding a request
/// that creates a lock node — so the create happens on the server but its reply is lost.
/// Returns the proxy's port and a flag that tells whether the cut happened.
fn proxy_losing_a_create_reply(
    upstream: u16,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cut = std::sync::Arc::new(AtomicBool::new(false));
    let flag = cut.clone();
    // Replies stop on the connection that is being cut (the only one open at that moment).
    let flag_for_replies = |cut: &std::sync::Arc<AtomicBool>| {
        let cut = cut.clone();
        let at_start = cut.load(Ordering::SeqCst);
        move || !at_start && cut.load(Ordering::SeqCst)
    };
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let replies_stop = flag_for_replies(&cut);
            let cut = cut.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_in.read(&mut buf) {
                    let chunk = &buf[..n];
                    let creates = chunk.windows(6).any(|w| w == b"-lock-")
                        && chunk.windows(3).any(|w| w == b"_c_");
                    // From here on, nothing more reaches the client on this connection.
                    let cutting = creates && !cut.swap(true, Ordering::SeqCst);
                    if n == 0 || s_out.write_all(chunk).is_err() {
                        break;
                    }
                    if cutting {
                        // Let the server apply it, then lose the reply.
                        std::thread::sleep(Duration::from_millis(200));
                        let _ = c_in.shutdown(Shutdown::Both);
                        let _ = s_out.shutdown(Shutdown::Both);
                        break;
                    }
                }
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 || replies_stop() || c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    (port, flag)
}

/// The connection drops after the create reached the server but before its reply came back:
/// dlock finds its own node (by its uuid, owned by its session) instead of creating a second
/// one, and holds the lock with exactly one node (CURATOR-498).
#[test]
fn a_create_whose_reply_is_lost_leaves_no_duplicate_node() {
    let Some(zk) = shared_zookeeper() else { return };
    let (port, cut) = proxy_losing_a_create_reply(zk.members[0].port);
    let root = chroot("lost-reply");
    let b = TestBackend {
        ttl: Duration::from_secs(4),
        ..TestBackend::zookeeper(&format!("zk://127.0.0.1:{port}{root}"))
    };
    // The parents first (persistent: never reaped), so that the first create is the lock node's
    // (with the run's start in the same multi: the history's node must be there too).
    zk.mkdirs(&format!("{root}/dlock/k"));
    zk.mkdirs(&format!("{root}/dlock-history/k"));
    assert!(!cut.load(std::sync::atomic::Ordering::SeqCst));
    let dir = scratch("lost-reply");
    let held = dir.join("held");
    let mut h = b.holding("k", &["-v"], &held);
    assert!(
        cut.load(std::sync::atomic::Ordering::SeqCst),
        "the proxy never cut"
    );
    let nodes = zk.children(&format!("{root}/dlock/k"));
    assert_eq!(nodes.len(), 1, "one lock node, ours: {nodes:?}");
    h.close_stdin();
    let (out, _) = h.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("found our node"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        zk.children(&format!("{root}/dlock/k")),
        Vec::<String>::new()
    );
    // The start went with the node whose reply was lost: it is found (same czxid) and taken
    // back, and the run's start is written once the lock is known to be ours — one start.
    assert_eq!(
        zk.children(&format!("{root}/dlock-history/k")).len(),
        2,
        "one start and one end"
    );
    let runs = crate::history::log_json(&b, "k", 5);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["state"], "ended", "{runs:?}");
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(zk) = shared_zookeeper() else { return };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::zookeeper(&zk.url()), &|| {
        let mut nodes: Vec<String> = zk
            .children("/dlock")
            .into_iter()
            .filter(|n| n.contains(crate::bench::KEY_WORD))
            .collect();
        nodes.sort();
        nodes
    });
}

/// Faults while a workload contends for one key (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(match shared_zookeeper() {
        Some(zk) => TestBackend::zookeeper(&zk.url()),
        None => return,
    });
}

/// The workload's server stops answering for twice the TTL (see `faults.rs`).
#[test]
fn fault_server_paused() {
    let Some(zk) = Zookeeper::start() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    crate::faults::server_paused(&b, &|on| zk.pause(0, on));
}

/// The workload's server is killed and started again at once: sessions and nodes are on disk,
/// so a holder whose session survives keeps its lock (see `faults.rs`).
#[test]
fn fault_server_killed_and_restarted() {
    let Some(mut zk) = Zookeeper::start() else {
        return;
    };
    let b = TestBackend::zookeeper(&zk.url());
    crate::faults::server_killed_and_restarted(&b, &mut || {
        zk.kill(0);
        zk.launch(0);
        zk.wait_serving(0);
    });
}

/// A safe break of a shared lock, and of a semaphore's slots, ends every holder, and the waiter
/// starts only after they all have stopped (see `breaking.rs`).
#[test]
fn break_ends_every_shared_holder_and_every_slot() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    crate::breaking::break_ends_every_holder_of_a_shared_lock(&b, &["--shared"]);
    crate::breaking::break_ends_every_holder_of_a_shared_lock(&b, &["--limit", "2"]);
}

/// Another recipe's lock node (Curator's mutex names it `…lock-N`, its data no dlock record)
/// cannot be told to stop: a safe break refuses it and leaves it; `--force` leaves it too (its
/// client would not notice a deletion), with a note.
#[test]
fn break_refuses_a_curator_lock_node() {
    let Some(zk) = shared_zookeeper() else { return };
    let b = TestBackend::zookeeper(&zk.url());
    let key = unique_key("break-curator");
    let parent = format!("/dlock/{key}");
    zk.mkdirs(&parent);
    let node = zk.with_client(async |client| {
        use zookeeper_client::{Acls, CreateMode};
        let options = CreateMode::PersistentSequential.with_acls(Acls::anyone_all());
        let (_, seq) = client
            .create(&format!("{parent}/_c_curator-lock-"), b"10.0.0.9", &options)
            .await
            .expect("create a Curator-like lock node");
        format!("{parent}/_c_curator-lock-{seq}")
    });
    let held = || zk.children(&parent).len() == 1;
    crate::breaking::foreign_holder_is_refused_then_forced(&b, &key, held);
    assert!(held(), "--force deleted another recipe's node");
    zk.with_client(async |client| client.delete(&node, None).await.expect("delete"));
}
