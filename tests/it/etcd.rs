//! The etcd backend against a real etcd started by the harness, and against `etcdctl lock`.

use std::time::{Duration, Instant};

use crate::servers::{Etcd, shared_etcd};
use crate::util::*;

crate::conformance!(match shared_etcd() {
    Some(e) => TestBackend::etcd(&e.url()),
    None => return,
});

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_etcd() {
        Some(e) => TestBackend::etcd(&e.url()),
        None => return,
    });
}

/// Shared locks, semaphores, several keys and nested runs.
mod modes {
    use super::*;

    crate::modes!(match shared_etcd() {
        Some(e) => TestBackend::etcd(&e.url()),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_etcd() {
        Some(e) => TestBackend::etcd(&e.url()),
        None => return,
    });
}

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_etcd() {
            Some(e) => TestBackend::etcd(&e.url()),
            None => return,
        },
        etcd_native()
    );
}

/// The history hooks, through `etcdctl`: one key `dlock/%history/<key>/<16 hex digits>` per
/// event (the test keys need no escaping), ordered by revision.
pub(crate) fn etcd_native() -> crate::history::Native {
    use std::os::unix::ffi::OsStrExt;
    static FORGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    fn prefix(key: &str) -> String {
        assert!(!key.contains(['/', '%']));
        format!("dlock/%history/{key}/")
    }
    crate::history::Native {
        forge: |_, key, body| {
            let e = shared_etcd().unwrap();
            let n = FORGED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let name = format!("{}{:08x}{n:08x}", prefix(key), std::process::id());
            let out = e
                .etcdctl()
                .arg("put")
                .arg(&name)
                .arg(std::ffi::OsStr::from_bytes(body))
                .output()
                .unwrap();
            assert!(out.status.success(), "etcdctl put: {}", describe(&out));
        },
        count: |_, key| {
            let e = shared_etcd().unwrap();
            let out = e
                .etcdctl()
                .args(["get", "--prefix", &prefix(key), "--keys-only", "-w", "json"])
                .output()
                .unwrap();
            assert!(out.status.success(), "etcdctl get: {}", describe(&out));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["kvs"].as_array().map_or(0, Vec::len)
        },
    }
}

/// `etcdctl lock dlock/KEY` and dlock wait for each other's holders, both ways, in every dlock
/// mode (the counter through both is docs/interop.md's snippet test, in `interop.rs`).
#[test]
fn etcdctl_lock_and_dlock_wait_for_each_other() {
    let Some(e) = shared_etcd() else { return };
    let b = TestBackend::etcd(&e.url());
    let key = unique_key("etcdctl");
    let dir = scratch("etcdctl");
    // etcdctl holds (its command does not get our stdin: it ends when told by a file): dlock
    // waits (75 with --no-wait, in every mode), and status shows it.
    let inside = dir.join("inside");
    let leave = dir.join("leave");
    let holder = Proc::spawn(e.etcdctl().args([
        "lock",
        &format!("dlock/{key}"),
        "--",
        "sh",
        "-c",
        &format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
            inside.display(),
            leave.display()
        ),
    ]));
    let waited = Instant::now();
    while !inside.exists() {
        if waited.elapsed() > Duration::from_secs(10) {
            let keys = e
                .etcdctl()
                .args(["get", "--prefix", "dlock/", "-w", "json"])
                .output()
                .unwrap();
            let st = b.status(&key);
            holder.signal(libc::SIGTERM);
            let (out, _) = holder.wait(Duration::from_secs(10));
            panic!(
                "etcdctl lock never ran its command; keys {}; status: {st}; {}",
                String::from_utf8_lossy(&keys.stdout),
                describe(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
        run_code(
            &mut b.run(&key, &[mode, &["--no-wait"]].concat(), &["true"]),
            75,
        );
    }
    let st = b.status(&key);
    assert_eq!(st["held"], true, "{st}");
    assert!(st["holders"][0]["foreign"].is_string(), "{st}");
    let waiter = Proc::spawn(&mut b.run(&key, &["--wait", "30s"], &["true"]));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    std::fs::write(&leave, "").unwrap();
    let released = Instant::now();
    let (out, _) = waiter.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    holder.wait(Duration::from_secs(10));

    // dlock holds (in every mode): etcdctl waits for it.
    for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
        let mut h = b.holding(&key, mode, &dir.join("held"));
        let ran = dir.join("etcdctl-ran");
        let _ = std::fs::remove_file(&ran);
        let theirs = Proc::spawn(e.etcdctl().args([
            "lock",
            &format!("dlock/{key}"),
            "--",
            "touch",
            ran.to_str().unwrap(),
        ]));
        crate::conformance::wait_until_waiting(&b, &key, 1);
        assert!(!ran.exists(), "etcdctl lock ran beside dlock {mode:?}");
        h.close_stdin();
        h.wait(Duration::from_secs(10));
        let (out, _) = theirs.wait(Duration::from_secs(10));
        assert!(out.status.success(), "{}", describe(&out));
        assert!(ran.exists());
    }
}

/// The server stops answering (SIGSTOP) for longer than the TTL: the command is stopped before
/// the lease could have run out.
#[test]
fn server_paused_longer_than_the_ttl_stops_the_command_in_time() {
    let Some(server) = Etcd::start() else { return };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..TestBackend::etcd(&server.url())
    };
    crate::conformance::paused_server_stops_the_command_in_time(&b, |on| server.pause(on));
    // The same for the owner of an acquire-held lock.
    crate::acquire::paused_server_stops_the_owner_in_time(&b, |on| server.pause(on));
}

/// Nothing listens: exit 69 within a few seconds, the password never printed.
#[test]
fn unreachable_cluster_is_69_within_seconds() {
    let port = crate::servers::free_port();
    let b = TestBackend::etcd(&format!(
        "etcd://u:s3cret@127.0.0.1:{port},127.0.0.1:{}",
        crate::servers::free_port()
    ));
    let started = Instant::now();
    let out = run_code(&mut b.run(&unique_key("etcd-down"), &[], &["true"]), 69);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let line = one_error_line(&out);
    assert!(!line.contains("s3cret"), "{line}");
}

/// Faults while a workload contends for one key (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(match shared_etcd() {
        Some(e) => TestBackend::etcd(&e.url()),
        None => return,
    });
}

/// The workload's server stops answering for twice the TTL (see `faults.rs`).
#[test]
fn fault_server_paused() {
    let Some(server) = Etcd::start() else { return };
    let b = TestBackend::etcd(&server.url());
    crate::faults::server_paused(&b, &|on| server.pause(on));
}

/// The workload's server is killed and started again: etcd keeps its keys and leases (they
/// run from the restart with their whole TTL), so a holder from before it either renews on
/// or stops in time, and nobody overlaps (see `faults.rs`).
#[test]
fn fault_server_killed_and_restarted() {
    let Some(mut server) = Etcd::start() else {
        return;
    };
    let b = TestBackend::etcd(&server.url());
    crate::faults::server_killed_and_restarted(&b, &mut || server.restart(0));
}

/// Three members; the leader is killed (SIGKILL) while a run holds and others wait, twice.
/// The holder keeps its lock or stops its command before anyone else gets it (no overlap,
/// tokens growing); the waiters move to the other members, queue again and proceed — no run
/// fails for want of a server (the cluster keeps a quorum).
#[test]
fn cluster_leader_killed_while_held() {
    let Some(mut cluster) = Etcd::cluster(3) else {
        return;
    };
    let b = TestBackend::etcd(&cluster.url());
    let w = crate::faults::Workload::start(&b, "etcd-leader-kill", 3, "0.5");
    w.goes_on(2, Duration::from_secs(20));
    let first = cluster.leader();
    w.holder();
    cluster.kill(first);
    let second = cluster.leader();
    assert_ne!(first, second);
    w.goes_on(4, Duration::from_secs(30));
    // Back to three, then the new leader goes too.
    cluster.restart(first);
    w.holder();
    cluster.kill(second);
    w.goes_on(4, Duration::from_secs(30));
    w.finish_expecting(&[Some(0), Some(79)], "etcd leader killed twice");
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(e) = shared_etcd() else { return };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::etcd(&e.url()), &|| {
        let out = e
            .etcdctl()
            .args(["get", "--prefix", "dlock/", "--keys-only"])
            .output()
            .expect("etcdctl");
        assert!(out.status.success(), "{}", describe(&out));
        let mut keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(crate::bench::KEY_WORD))
            .map(String::from)
            .collect();
        keys.sort();
        keys
    });
}

/// etcds:// against a member with a certificate from a private CA: trusted through
/// SSL_CERT_FILE it works (status and the lock); untrusted it is a one-line exit 69.
#[test]
fn tls_with_a_private_ca() {
    let Some(server) = Etcd::start_tls() else {
        return;
    };
    let ca = server.tls.as_ref().unwrap().join("ca.pem");
    let b = TestBackend::etcd(&server.url());
    let token = crate::conformance::private_ca_trusted_through_ssl_cert_file(&b, &ca);
    assert!(token > 0);
}

/// etcd's own users: the right password works (run, status, break); a wrong one is a one-line
/// exit 69 that never shows it; a user without permission on `dlock/` is refused, not hung.
#[test]
fn auth_with_etcd_users() {
    let Some(server) = Etcd::start() else { return };
    let ctl = |args: &[&str]| {
        let out = server.etcdctl().args(args).output().unwrap();
        assert!(out.status.success(), "etcdctl {args:?}: {}", describe(&out));
    };
    ctl(&["user", "add", "root", "--new-user-password=r00tpw"]);
    ctl(&["user", "add", "locker", "--new-user-password=l0ck pw"]);
    ctl(&["user", "add", "nobody", "--new-user-password=n0bodypw"]);
    ctl(&["role", "add", "dlock"]);
    ctl(&[
        "role",
        "grant-permission",
        "dlock",
        "--prefix=true",
        "readwrite",
        "dlock/",
    ]);
    ctl(&["user", "grant-role", "locker", "dlock"]);
    ctl(&["auth", "enable"]);
    let port = server.ports()[0];
    let b = TestBackend::etcd(&format!("etcd://locker:l0ck%20pw@127.0.0.1:{port}"));
    let key = unique_key("etcd-auth");
    let out = run_ok(&mut b.run(&key, &[], &sh("printf %s \"$DLOCK_FENCING_TOKEN\"")));
    // The history lives under dlock/ too: the role's permission covers it.
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert_eq!(crate::history::log_json(&b, &key, 5).len(), 1);
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );
    let h = b.holding(&key, &[], &scratch("etcd-auth").join("held"));
    assert_eq!(b.status(&key)["held"], true);
    run_ok(b.cmd("break").args(["--key", &key]));
    h.wait(Duration::from_secs(10));
    for (user, pass) in [("locker", "wr0ngpw"), ("nobody", "n0bodypw")] {
        let b = TestBackend::etcd(&format!("etcd://{user}:{pass}@127.0.0.1:{port}"));
        let started = Instant::now();
        let out = run_code(&mut b.run(&key, &["--wait", "10s"], &["true"]), 69);
        assert!(started.elapsed() < Duration::from_secs(5));
        let line = one_error_line(&out);
        assert!(!line.contains(pass), "{line}");
        assert!(
            line.contains("auth") || line.contains("permission"),
            "{line}"
        );
    }
}

/// A key deeper under a lock's prefix — `etcdctl lock dlock/K/b` types a raw `/`, and so did a
/// dlock from before names were escaped — is in the range of `dlock/K/` but no lock of key `K`:
/// `K` is free, not shown as held, and `break -k K` leaves it alone.
#[test]
fn a_raw_slash_key_below_a_prefix_is_not_that_keys_lock() {
    let Some(e) = shared_etcd() else { return };
    let b = TestBackend::etcd(&e.url());
    let key = unique_key("deeper");
    let dir = scratch("deeper");
    let (inside, leave) = (dir.join("inside"), dir.join("leave"));
    let holder = Proc::spawn(e.etcdctl().args([
        "lock",
        &format!("dlock/{key}/b"),
        "--",
        "sh",
        "-c",
        &format!(
            "echo in > {}; while [ ! -e {} ]; do sleep 0.02; done",
            inside.display(),
            leave.display()
        ),
    ]));
    wait_for_file(&inside, Duration::from_secs(10));
    assert!(b.is_free(&key), "etcdctl's dlock/{key}/b makes {key} busy");
    let st = b.status(&key);
    assert_eq!(st["held"], false, "{st}");
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("not held"), "{said}");
    assert!(alive(holder.pid()), "break -k {key} ended etcdctl's lock");
    std::fs::write(&leave, "").unwrap();
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
}

/// A safe break of a shared lock, and of a semaphore's slots, ends every holder, and the waiter
/// starts only after they all have stopped (see `breaking.rs`).
#[test]
fn break_ends_every_shared_holder_and_every_slot() {
    let Some(e) = shared_etcd() else { return };
    let b = TestBackend::etcd(&e.url());
    crate::breaking::break_ends_every_holder_of_a_shared_lock(&b, &["--shared"]);
    crate::breaking::break_ends_every_holder_of_a_shared_lock(&b, &["--limit", "2"]);
}

/// A holder whose key is moved onto another lease while its own lease lives on (a break whose
/// revoke did not get through) still stops: its renewal reads its key's lease, not only its own
/// keep-alive. The moved key keeps the lock (its create revision, its place) until deleted.
#[test]
fn a_holder_whose_key_moved_to_another_lease_stops() {
    let Some(e) = shared_etcd() else { return };
    let b = TestBackend::etcd(&e.url());
    let key = unique_key("moved");
    let (p, child) = b.hold(&key, &["--kill-grace", "1s"]);
    let st = b.status(&key);
    let node = st["holders"][0]["node"].as_str().unwrap().to_string();
    let granted = e.etcdctl().args(["lease", "grant", "30"]).output().unwrap();
    let granted = String::from_utf8(granted.stdout).unwrap();
    let lease = granted
        .split_whitespace()
        .nth(1)
        .expect("lease ID")
        .to_string();
    let moved = e
        .etcdctl()
        .args(["put", "--ignore-value", &format!("--lease={lease}"), &node])
        .output()
        .unwrap();
    assert!(moved.status.success(), "{}", describe(&moved));
    let (out, took) = p.wait(b.notice + Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("dlock break told it to stop"),
        "{}",
        describe(&out)
    );
    assert!(
        took < b.notice + Duration::from_secs(3),
        "noticed after {took:?}"
    );
    assert!(!alive(child));
    // It deleted its tombstone on the way out: free now, not when the 30 s lease runs out.
    assert!(b.is_free(&key));
    let _ = e.etcdctl().args(["lease", "revoke", &lease]).output();
}

/// `etcdctl lock` cannot be told to stop: a safe break refuses it and changes nothing;
/// `--force` revokes its lease.
#[test]
fn break_refuses_an_etcdctl_lock() {
    let Some(e) = shared_etcd() else { return };
    let b = TestBackend::etcd(&e.url());
    let key = unique_key("break-etcdctl");
    let dir = scratch("break-etcdctl");
    let (inside, leave) = (dir.join("inside"), dir.join("leave"));
    let holder = Proc::spawn(e.etcdctl().args([
        "lock",
        &format!("dlock/{key}"),
        "--",
        "sh",
        "-c",
        &format!(
            "echo in > {}; while [ ! -e {} ]; do sleep 0.02; done",
            inside.display(),
            leave.display()
        ),
    ]));
    wait_for_file(&inside, Duration::from_secs(10));
    crate::breaking::foreign_holder_is_refused_then_forced(&b, &key, || {
        b.status(&key)["held"] == true
    });
    assert!(b.is_free(&key));
    std::fs::write(&leave, "").unwrap();
    holder.wait(Duration::from_secs(10));
}
