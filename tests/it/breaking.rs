//! `dlock break` on every backend (cases of [`crate::conformance!`]): a safe break stops the
//! holder and lets the lock pass on only once the holder's command has stopped; `--force`
//! removes the lock at once.

use std::path::Path;
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
    let dir = scratch("break");
    let m = dir.join("pid");
    let p = Proc::spawn(&mut b.run(
        &key,
        &["--kill-grace", "1s"],
        &sh(&format!("echo $$ > {}; exec sleep 30", m.display())),
    ));
    let child: i32 = wait_for_file(&m, Duration::from_secs(10)).parse().unwrap();
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
    assert!(
        took < b.notice + Duration::from_secs(2),
        "stopped after {took:?}"
    );
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    assert!(String::from_utf8(out.stdout).unwrap().contains("not held"));
    assert!(b.is_free(&key));
}

/// The promise: after `dlock break`, the waiting holder's command starts only after the broken
/// holder's command (which ignores SIGTERM, so it is killed after the grace) has stopped.
pub(crate) fn break_never_lets_a_waiter_start_beside_the_holder(b: &TestBackend) {
    let key = unique_key("break-waiter");
    let dir = scratch("break-waiter");
    let beats = dir.join("beats");
    let started = dir.join("started");
    let p = Proc::spawn(&mut b.run(&key, &["--kill-grace", "1s"], &heartbeat(&beats)));
    wait_until(Duration::from_secs(10), "the first heartbeat", || {
        beats.exists()
    });
    let w = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "60s"],
        &sh(&format!("date +%s%N > {}", started.display())),
    ));
    wait_until_waiting(b, &key, 1);
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("broke"), "{said}");
    let (out, _) = p.wait(b.ttl + b.notice + Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let (out, _) = w.wait(b.ttl + Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let start: u128 = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let last = last_beat(&beats);
    assert!(
        start > last,
        "the waiter started {} ms before the broken holder's last heartbeat",
        (last - start) / 1_000_000
    );
    assert!(b.is_free(&key));
}

/// `--force` is the old break: the lock is removed at once (so a waiter may start while the
/// broken command still runs: the output says it is forced), and the holder still stops (79).
pub(crate) fn forced_break_removes_the_lock_at_once(b: &TestBackend) {
    let key = unique_key("break-force");
    let dir = scratch("break-force");
    let m = dir.join("pid");
    let p = Proc::spawn(&mut b.run(
        &key,
        &["--kill-grace", "1s"],
        &sh(&format!("echo $$ > {}; exec sleep 30", m.display())),
    ));
    let child: i32 = wait_for_file(&m, Duration::from_secs(10)).parse().unwrap();
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
