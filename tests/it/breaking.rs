//! `dlock break` on every backend (cases of [`crate::conformance!`]): a safe break stops the
//! holder and lets the lock pass on only once the holder's command has stopped; `--force`
//! removes the lock at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::conformance::wait_until_waiting;
use crate::util::*;

/// A command that ignores SIGTERM (so only the SIGKILL after the grace ends it) and appends the
/// time in nanoseconds to `file` every 20 ms: its last line is its last sign of life.
fn heartbeat(file: &Path) -> Vec<String> {
    sh(&format!(
        "trap '' TERM; while :; do date +%s%N >> {0}; sleep 0.02; done",
        file.display()
    ))
}

fn last_beat(file: &Path) -> u128 {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("a heartbeat")
}

pub(crate) fn break_stops_the_holder_with_79(b: &TestBackend) {
    let key = unique_key("break");
    let (p, child) = b.hold(&key, &["--kill-grace", "1s"]);
    let broke = Instant::now();
    let out = run_ok(b.cmd("break").args(["-k", &key, "--wait", "30s"]));
    let took = broke.elapsed();
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.contains("broke") && said.contains(&format!("pid {}", p.pid())),
        "{said}"
    );
    assert!(said.contains("is free of the broken holder"), "{said}");
    // --wait returned: the holder's command is gone, and so is the lock.
    assert!(!alive(child), "break --wait returned while the command ran");
    let (out, _) = p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(one_error_line(&out).contains("lost"), "{}", describe(&out));
    // The notice, the 1 s grace, and room for a busy machine.
    assert!(
        took < b.notice + Duration::from_secs(4),
        "stopped after {took:?}"
    );
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    assert!(String::from_utf8(out.stdout).unwrap().contains("not held"));
    assert!(b.is_free(&key));
}

/// The promise: after `dlock break`, the waiting holder's command starts only after the broken
/// holder's command (which ignores SIGTERM, so it is killed after the grace) has stopped — and
/// so does a newcomer that asks right after the break (on the file backend the queued waiter is
/// blocked on the old lock file's inode, so only a newcomer would see an unlinked lock free).
pub(crate) fn break_never_lets_a_waiter_start_beside_the_holder(b: &TestBackend) {
    let key = unique_key("break-waiter");
    let dir = scratch("break-waiter");
    let beats = dir.join("beats");
    let p = Proc::spawn(&mut b.run(&key, &["--kill-grace", "1s"], &heartbeat(&beats)));
    wait_until(Duration::from_secs(10), "the first heartbeat", || {
        beats.exists()
    });
    let started = |name: &str| {
        let f = dir.join(name);
        (sh(&format!("date +%s%N > {}", f.display())), f)
    };
    let (cmd, queued) = started("queued");
    let w = Proc::spawn(&mut b.run(&key, &["--wait", "60s"], &cmd));
    wait_until_waiting(b, &key, 1);
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("broke"), "{said}");
    let (cmd, newcomer) = started("newcomer");
    let n = Proc::spawn(&mut b.run(&key, &["--wait", "60s"], &cmd));
    let (out, _) = p.wait(b.ttl + b.notice + Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let last = last_beat(&beats);
    for (proc, file) in [(w, queued), (n, newcomer)] {
        let (out, _) = proc.wait(b.ttl + Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let start: u128 = std::fs::read_to_string(&file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            start > last,
            "{} started {} ms before the broken holder's last heartbeat",
            file.display(),
            (last - start) / 1_000_000
        );
    }
    assert!(b.is_free(&key));
}

/// `--force` is the old break: the lock is removed at once (so a waiter may start while the
/// broken command still runs: the output says it is forced), and the holder still stops (79).
pub(crate) fn forced_break_removes_the_lock_at_once(b: &TestBackend) {
    let key = unique_key("break-force");
    let (p, child) = b.hold(&key, &["--kill-grace", "1s"]);
    let out = run_ok(b.cmd("break").args(["-k", &key, "--force"]));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.contains("removed")
            && said.contains("forced")
            && said.contains(&format!("pid {}", p.pid())),
        "{said}"
    );
    let (out, took) = p.wait(b.notice + Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        took < b.notice + Duration::from_secs(3),
        "noticed after {took:?}"
    );
    assert!(!alive(child));
    assert!(b.is_free(&key));
}

/// A safe break of a lock held by several (`mode`: `--shared`, or `--limit 2` with two holders)
/// ends every holder the same way: `status` shows each as broken while it stops (they ignore
/// SIGTERM: only the SIGKILL after the grace ends them), both exit 79, and no waiter starts
/// before the holder it replaces has stopped: an exclusive waiter starts after the last
/// heartbeat of both; two waiting slots of two (which stay inside until both have started)
/// start each after a holder's last heartbeat — the first may run beside the holder still
/// stopping (two at once, the limit), never beside both. The holders run with `--ttl 9s` (a
/// tombstone's lease is as long): they see the break within a renewal (3 s) and stop after the
/// grace (2 s), and the waiters start then, before the leases could have run out.
/// (Not in `conformance!`: a backend opts in from its file.)
pub(crate) fn break_ends_every_holder_of_a_shared_lock(b: &TestBackend, mode: &[&str]) {
    let long = TestBackend {
        ttl: Duration::from_secs(9),
        ..b.clone()
    };
    let key = unique_key("break-shared");
    let dir = scratch("break-shared");
    let beats = [dir.join("beats0"), dir.join("beats1")];
    let holders: Vec<Proc> = beats
        .iter()
        .map(|f| {
            let extra = [mode, &["--kill-grace", "2s"]].concat();
            let p = Proc::spawn(&mut long.run(&key, &extra, &heartbeat(f)));
            wait_until(Duration::from_secs(10), "a first heartbeat", || f.exists());
            p
        })
        .collect();
    let exclusive = mode.contains(&"--shared");
    let (waiter_mode, n): (&[&str], usize) = if exclusive { (&[], 1) } else { (mode, 2) };
    let started: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("started{i}"))).collect();
    let mut waiters: Vec<Proc> = started
        .iter()
        .map(|f| {
            let script = format!(
                "date +%s%N > {}.tmp && mv {0}.tmp {0}; read _x || true",
                f.display()
            );
            Proc::spawn(&mut long.run(
                &key,
                &[waiter_mode, &["--wait", "60s"]].concat(),
                &sh(&script),
            ))
        })
        .collect();
    wait_until_waiting(b, &key, n as u64);
    let broke = Instant::now();
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("broke"), "{said}");
    let s = b.status(&key);
    let shown = s["holders"].as_array().unwrap();
    assert_eq!(shown.len(), 2, "{s}");
    assert!(shown.iter().all(|h| h["broken"] == true), "{s}");
    for p in holders {
        let (out, _) = p.wait(b.notice + Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    }
    wait_until(Duration::from_secs(20), "every waiter to start", || {
        started.iter().all(|f| f.exists())
    });
    assert!(
        broke.elapsed() < Duration::from_secs(8),
        "the waiters waited for the lease, not for the holders"
    );
    for w in &mut waiters {
        w.close_stdin();
    }
    for w in waiters {
        let (out, _) = w.wait(Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    }
    let mut starts: Vec<u128> = started
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().trim().parse().unwrap())
        .collect();
    starts.sort_unstable();
    let mut lasts: Vec<u128> = beats.iter().map(|f| last_beat(f)).collect();
    lasts.sort_unstable();
    // Which last heartbeat each start must follow: both for the exclusive waiter, one each
    // (in order) for the slots.
    let after: Vec<u128> = if exclusive {
        vec![lasts[1]]
    } else {
        lasts.clone()
    };
    let since = |t: u128| t as i128 - starts[0] as i128;
    assert!(
        starts.iter().zip(&after).all(|(s, a)| s > a),
        "a {} waiter started before the holder it replaces had stopped: starts {:?} µs, the \
         holders' last heartbeats {:?} µs (from the first start)",
        if exclusive { "exclusive" } else { "slot" },
        starts.iter().map(|&t| since(t) / 1000).collect::<Vec<_>>(),
        lasts.iter().map(|&t| since(t) / 1000).collect::<Vec<_>>(),
    );
    assert!(b.is_free(&key));
}

/// A holder that is not dlock cannot be told to stop: a safe break refuses it (exit 1, naming
/// it) and changes nothing; `--force` removes the lock.
pub(crate) fn foreign_holder_is_refused_then_forced(
    b: &TestBackend,
    key: &str,
    still_held: impl Fn() -> bool,
) {
    let s = b.status(key);
    assert!(s["holders"][0]["foreign"].is_string(), "{s}");
    let out = run_code(b.cmd("break").args(["-k", key]), 1);
    let line = one_error_line(&out);
    assert!(
        line.contains("cannot be told to stop") && line.contains("--force"),
        "{line}"
    );
    assert!(still_held(), "a refused break changed the lock");
    let out = run_ok(b.cmd("break").args(["-k", key, "--force"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("forced"));
}

#[test]
fn file_break_refuses_a_flock_that_is_not_dlock() {
    let b = TestBackend::file();
    let key = unique_key("break-flock");
    let path = b.status(&key)["server_name"].as_str().unwrap().to_string();
    let mut f = Proc::spawn(
        std::process::Command::new("flock")
            .args(["-x", &path, "sh", "-c", "read _x || true"])
            .stdin(std::process::Stdio::piped()),
    );
    wait_until(Duration::from_secs(10), "flock(1) to hold", || {
        b.status(&key)["held"] == true
    });
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    foreign_holder_is_refused_then_forced(&b, &key, || b.status(&key)["held"] == true);
    f.close_stdin();
    f.wait(Duration::from_secs(10));
}

#[test]
fn redis_break_refuses_a_key_set_by_another_client() {
    let Some(url) = crate::servers::shared_redis() else {
        return;
    };
    let b = TestBackend::redis(&url);
    let key = unique_key("break-foreign");
    let name = b.status(&key)["server_name"].as_str().unwrap().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-u", &url])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // As redis-py's Lock without a timeout does: a token, no expiry, no dlock record.
    assert_eq!(cli(&["SET", &name, "their-token"]), "OK");
    foreign_holder_is_refused_then_forced(&b, &key, || cli(&["GET", &name]) == "their-token");
    assert!(b.is_free(&key));
}

/// Another client breaks a dlock holder the way docs/backends.md says: `client` is given the
/// holder's session as `status` names it and returns the command that takes the mark and keeps
/// it. `status` shows the holder broken while it still holds (its dlock is stopped meanwhile, so
/// the mark alone shows); at its next renewal it stops its command (79), and only then lets go.
/// `b.ttl` should be long (6 s): the stop stays far from the lease's deadline.
pub(crate) fn a_client_break_stops_the_holder(
    b: &TestBackend,
    key: &str,
    client: impl FnOnce(&str) -> std::process::Command,
) {
    let (holder, child) = b.hold(key, &[]);
    let s = b.status(key);
    let session = s["holders"][0]["session"].as_str().unwrap().to_string();
    holder.signal(libc::SIGSTOP);
    let app = Proc::spawn(&mut client(&session));
    wait_until(
        Duration::from_secs(10),
        "status to show the holder broken",
        || b.status(key)["holders"][0]["broken"] == true,
    );
    assert!(alive(child));
    holder.signal(libc::SIGCONT);
    let (out, _) = holder.wait(b.ttl / 3 + Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    // (A young server's hold-back may have said a line before.)
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .last()
            .unwrap_or_default()
            .contains("dlock break told it to stop"),
        "{}",
        describe(&out)
    );
    assert!(!alive(child));
    assert!(b.is_free(key));
    drop(app);
}
