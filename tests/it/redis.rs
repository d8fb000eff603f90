//! The redis backend against real redis-server processes: the conformance suite on a shared
//! server, and the failures only a server can cause on servers of their own.

use std::time::{Duration, Instant};

use crate::conformance::wait_until_waiting;
use crate::servers::{Redis, shared_redis};
use crate::util::*;

crate::conformance!(match shared_redis() {
    Some(url) => TestBackend::redis(&url),
    None => return,
});

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_redis() {
            Some(url) => TestBackend::redis(&url),
            None => return,
        },
        crate::history::redis_native()
    );
}

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_redis() {
        Some(url) => TestBackend::redis(&url),
        None => return,
    });
}

/// Shared locks, semaphores, several keys and nested runs.
mod modes {
    use super::*;

    crate::modes!(match shared_redis() {
        Some(url) => TestBackend::redis(&url),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_redis() {
        Some(url) => TestBackend::redis(&url),
        None => return,
    });
}

/// The server stops answering (SIGSTOP) for longer than the TTL.
/// History keys someone else wrote: of another type, or a newest start of megabytes. The run
/// goes on (a warning at most), and the lock is given back at once, never left to its TTL.
#[test]
fn hostile_history_keys_never_keep_the_lock() {
    let Some(url) = shared_redis() else { return };
    let b = TestBackend::redis(&url);
    let port = url.rsplit(':').next().unwrap();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", port])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", describe(&out));
    };
    let key = unique_key("wrongtype");
    cli(&["SET", &format!("dlock:{{{key}}}:runs"), "not a list"]);
    let out = output(&mut b.run(&key, &[], &["true"]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(b.is_free(&key), "the lock must be given back");

    let key = unique_key("huge-lastrun");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let mut huge = format!("{now} {{\"run\":\"h\",\"ev\":\"start\",\"host\":\"").into_bytes();
    huge.extend(std::iter::repeat_n(b'A', 8 << 20));
    let mut set = std::process::Command::new("redis-cli");
    set.args(["-p", port, "-x", "SET", &format!("dlock:{{{key}}}:lastrun")]);
    set.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut child = set.spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &huge).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let out = output(&mut b.run(&key, &["--once-per", "1h"], &["true"]));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("skipped: "),
        "{}",
        describe(&out)
    );
    assert!(b.is_free(&key), "the lock must be given back");
}

#[test]
fn server_paused_longer_than_the_ttl_stops_the_command_in_time() {
    let Some(server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..TestBackend::redis(&server.url())
    };
    crate::conformance::paused_server_stops_the_command_in_time(&b, |on| server.pause(on));
    // The same for the owner of an acquire-held lock.
    crate::acquire::paused_server_stops_the_owner_in_time(&b, |on| server.pause(on));
}

/// Someone deletes the lock key: the holder's next renewal sees it and stops the command.
#[test]
fn lock_deleted_behind_the_holders_back_is_lost() {
    let Some(url) = shared_redis() else { return };
    let b = TestBackend::redis(&url);
    let key = unique_key("deleted");
    let (p, child) = b.hold(&key, &[]);
    let port = url.rsplit(':').next().unwrap();
    let out = std::process::Command::new("redis-cli")
        .args(["-p", port, "DEL", &format!("dlock:{{{key}}}")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    let deleted = Instant::now();
    let (out, _) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        deleted.elapsed() < b.notice + Duration::from_millis(500),
        "noticed after {:?}",
        deleted.elapsed()
    );
    assert!(!alive(child));
}

/// A restart without persistence loses every key: the holder must notice, not re-take the lock.
#[test]
fn server_restart_without_persistence_loses_the_lock() {
    let Some(mut server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend::redis(&server.url());
    let key = unique_key("restart");
    let (p, child) = b.hold(&key, &[]);
    let token_before = b.status(&key)["holders"][0]["fencing_token"]
        .as_u64()
        .unwrap();
    server.restart();
    let (out, _) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(!alive(child));
    // Fencing tokens still grow after the counter was lost with the restart.
    let out = run_ok(&mut b.run(&key, &[], &sh("printf %s \"$DLOCK_FENCING_TOKEN\"")));
    let after: u64 = String::from_utf8(out.stdout).unwrap().parse().unwrap();
    assert!(
        after > token_before,
        "token went back from {token_before} to {after}"
    );
}

/// Twenty waiters on one key: each release wakes one waiter, not all of them. Counts the server's
/// commands over twenty hand-offs; a herd would cost ~20 acquire attempts per hand-off.
#[test]
fn each_release_wakes_one_waiter() {
    let Some(server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_secs(10),
        ..TestBackend::redis(&server.url())
    };
    let key = unique_key("herd");
    let dir = scratch("herd");
    let m = dir.join("held");
    let mut holder = b.holding(&key, &[], &m);
    let waiters: Vec<Proc> = (0..20)
        .map(|_| Proc::spawn(&mut b.run(&key, &["--wait", "60s"], &["true"])))
        .collect();
    wait_until_waiting(&b, &key, 20);
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    holder.close_stdin();
    holder.wait(Duration::from_secs(10));
    for w in waiters {
        let (out, _) = w.wait(Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    }
    // Redis also counts the commands run inside scripts; the client's round trips are the
    // EVALSHA (acquire attempts and releases) and BLPOP calls.
    let stats = server.cli(&["INFO", "commandstats"]);
    let calls = |name: &str| -> u64 {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let round_trips = calls("evalsha") + calls("blpop");
    let per_hand_off = round_trips as f64 / 20.0;
    eprintln!("{round_trips} round trips for 20 hand-offs ({per_hand_off:.1} each):\n{stats}");
    assert!(
        per_hand_off <= 5.0,
        "{per_hand_off:.1} round trips per hand-off: a herd?\n{stats}"
    );
}

/// A server that accepts connections but never answers: exit 69 within the documented bound.
#[test]
fn black_holed_server_fails_within_seconds() {
    let Some(server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend::redis(&server.url());
    server.pause(true);
    let started = Instant::now();
    let out = output(&mut b.run(&unique_key("blackhole"), &[], &["true"]));
    let took = started.elapsed();
    server.pause(false);
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    assert!(one_error_line(&out).contains("redis"));
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// Credentials work from DLOCK_URL, and a wrong password is exit 69 without printing it. (A
/// short TTL: a server up for less than the TTL and a second holds back every lock it grants.)
#[test]
fn password_from_the_environment_and_never_printed() {
    let Some(server) = Redis::start(&["--requirepass", "right-pw"]) else {
        return;
    };
    let key = unique_key("auth");
    let with = |pw: &str| {
        let mut c = dlock();
        c.env(
            "DLOCK_URL",
            format!("redis://:{pw}@127.0.0.1:{}", server.port),
        );
        c.args(["run", "--ttl", "2s", "-k", &key, "--", "true"]);
        output(&mut c)
    };
    assert_eq!(with("right-pw").status.code(), Some(0));
    // An ACL user (user:pass@) works too.
    let acl = server.cli(&[
        "-a",
        "right-pw",
        "--no-auth-warning",
        "ACL",
        "SETUSER",
        "alice",
        "on",
        ">alice-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    assert_eq!(acl, "OK");
    let mut c = dlock();
    c.env(
        "DLOCK_URL",
        format!("redis://alice:alice-pw@127.0.0.1:{}", server.port),
    );
    c.args(["run", "--ttl", "2s", "-k", &key, "--", "true"]);
    run_ok(&mut c);
    let out = with("wrong-pw");
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    let line = one_error_line(&out);
    assert!(
        !line.contains("wrong-pw") && !line.contains("right-pw"),
        "{line}"
    );
}

/// rediss:// against a server with a certificate from a private CA: trusted through
/// SSL_CERT_FILE it works, untrusted it is a one-line exit 69.
#[test]
fn tls_with_a_private_ca() {
    let Some((server, ca)) = Redis::start_tls() else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.port);
    crate::conformance::private_ca_trusted_through_ssl_cert_file(&TestBackend::redis(&url), &ca);
}

/// The unix-socket form of the URL.
#[test]
fn unix_socket_url() {
    let dir = scratch("redis-unix");
    let sock = dir.join("redis.sock");
    let Some(_server) = Redis::start(&[
        "--unixsocket",
        sock.to_str().unwrap(),
        "--unixsocketperm",
        "700",
    ]) else {
        return;
    };
    let b = TestBackend::redis(&format!("redis+unix://{}", sock.display()));
    let key = unique_key("unix");
    run_ok(&mut b.run(&key, &[], &["true"]));
    let s = b.status(&key);
    assert_eq!(s["location"], sock.display().to_string());
}

/// Regression: while dlock waited out --kill-grace after a SIGTERM, the lease deadline was not
/// enforced; a command slow to stop could outlive a lease whose renewals had begun to fail.
#[test]
fn lease_deadline_still_holds_during_a_signal_grace() {
    let Some(server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..TestBackend::redis(&server.url())
    };
    let key = unique_key("grace-deadline");
    let dir = scratch("grace-deadline");
    let m = dir.join("pid");
    let script = format!("trap '' TERM; echo $$ > {}; exec sleep 30", m.display());
    let p = Proc::spawn(&mut b.run(&key, &["--kill-grace", "20s"], &sh(&script)));
    let child: i32 = wait_for_file(&m, Duration::from_secs(10)).parse().unwrap();
    p.signal(libc::SIGTERM);
    // Renewals still succeed: the grace runs, the command (ignoring TERM) lives on.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(alive(child), "killed although the lease was being renewed");
    server.pause(true);
    let died = wait_until(Duration::from_secs(10), "the command to be killed", || {
        !alive(child)
    });
    server.pause(false);
    let (out, _) = p.wait(Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        describe(&out)
    );
    // The last renewal was at most ttl/3 before the pause; SIGKILL at its deadline.
    assert!(
        died < Duration::from_millis(1550),
        "the command outlived the lease: {died:?}"
    );
    assert!(
        died > Duration::from_millis(900),
        "killed before the lease was in danger: {died:?}"
    );
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(url) = shared_redis() else { return };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::redis(&url), &|| {
        crate::bench::redis_leftovers(&url)
    });
}

/// Faults while a workload contends for one key (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(match shared_redis() {
        Some(url) => TestBackend::redis(&url),
        None => return,
    });
}

/// The workload's server stops answering for twice the TTL (see `faults.rs`).
#[test]
fn fault_server_paused() {
    let Some(server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend::redis(&server.url());
    crate::faults::server_paused(&b, &|on| server.pause(on));
}

/// The workload's server is killed and started again at once, with no keys (no persistence):
/// the new holder must not start its command while the one from before the restart may still
/// run (see `backend::hold_back_until`).
#[test]
fn fault_server_killed_and_restarted() {
    let Some(mut server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend::redis(&server.url());
    crate::faults::server_killed_and_restarted(&b, &mut || server.restart());
}

/// A lock granted by a server up for less than the TTL is held back until the server has been
/// up for a TTL (a holder from before a restart may still run), and renewed meanwhile: the
/// command then runs for longer than a TTL on that lease. A signal in the hold-back ends it
/// (143) and gives every key back. The hold-back is announced at once; a run that cannot wait
/// for it is busy (regression: a fresh server stalled even --no-wait runs, silently).
#[test]
fn a_restarted_server_holds_the_lock_back() {
    let Some(mut server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_secs(3),
        ..TestBackend::redis(&server.url())
    };
    let (k1, k2) = (unique_key("young-a"), unique_key("young-b"));

    server.restart();
    let p = Proc::spawn(&mut b.run(&k1, &["-k", &k2], &["true"]));
    wait_until(Duration::from_secs(5), "the keys held back", || {
        b.status(&k1)["held"] == true && b.status(&k2)["held"] == true
    });
    p.signal(libc::SIGTERM);
    let (out, took) = p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(143), "{}", describe(&out));
    assert!(
        took < Duration::from_secs(1),
        "the hold-back ignored the signal: {took:?}"
    );
    for k in [&k1, &k2] {
        assert_eq!(b.status(k)["held"], false, "{k} given back");
    }

    // The worst case for an uptime in whole seconds: the server starts late in a second and
    // grants the lock just after the next second begins, saying it has been up for 1 s when it
    // has been up for ~0.1 s.
    let before = wall_clock_at_ms(800);
    server.restart();
    wall_clock_at_ms(20);
    let script = "date +%s%N; sleep 4";
    let out = run_ok(&mut b.run(&k1, &["-v"], &sh(script)));
    let started_ns: u128 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let before_ns = before
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    assert!(
        started_ns >= before_ns + b.ttl.as_nanos(),
        "the command started {} ms after the restart began, within the TTL",
        (started_ns - before_ns) / 1_000_000
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("restarted") && err.contains("held back for"),
        "{err}"
    );

    // Said at once, on one line, without -v; --no-wait is busy (75) at once and a --wait shorter
    // than the hold-back when it runs out (it is honoured: the operator asked to wait that
    // long), naming the restart, and leave nothing held.
    server.restart();
    let p = Proc::spawn(&mut b.run(&k1, &[], &["true"]));
    let (out, took) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(took >= b.ttl, "{took:?}");
    let line = one_error_line(&out);
    assert!(
        line.contains("restarted") && line.contains("before the command starts"),
        "{line}"
    );
    server.restart();
    for (extra, at_least) in [(vec!["--no-wait"], 0), (vec!["--wait", "1s"], 1000)] {
        let p = Proc::spawn(&mut b.run(&k1, &extra, &["true"]));
        let (out, took) = p.wait(Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(75), "{extra:?}: {}", describe(&out));
        let at_least = Duration::from_millis(at_least);
        assert!(
            took >= at_least && took < at_least + Duration::from_secs(1),
            "{extra:?} took {took:?}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("dlock: ") && last.contains("restarted"),
            "{}",
            describe(&out)
        );
        assert_eq!(b.status(&k1)["held"], false, "given back");
    }
}

/// Sleeps until the wall clock is `ms` milliseconds into a second; returns that time.
fn wall_clock_at_ms(ms: u32) -> std::time::SystemTime {
    let now = std::time::SystemTime::now();
    let into = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    std::thread::sleep(Duration::from_millis(u64::from((ms + 1000 - into) % 1000)));
    std::time::SystemTime::now()
}

/// `dlock status` without `--key` counts only what is held or waited for: 12,000 keys' fence
/// counters left by past runs do not push the two held locks out of the list (regression: the
/// 10,000 candidates were mostly fences, and held locks were missing, without a word). A
/// backend with more busy keys than the list takes says that the list is cut.
#[test]
fn status_lists_every_held_lock_past_stale_keys_and_says_when_cut() {
    let Some(server) = Redis::start(&[]) else {
        return;
    };
    let b = TestBackend::redis(&server.url());
    let pipe = |commands: String| {
        let mut cli = std::process::Command::new("redis-cli")
            .args(["-p", &server.port.to_string(), "--pipe"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        cli.stdin
            .take()
            .unwrap()
            .write_all(commands.as_bytes())
            .unwrap();
        assert!(cli.wait().unwrap().success());
    };
    pipe(
        (0..12_000)
            .map(|i| format!("SET dlock:{{stale-{i}}}:fence 5\r\n"))
            .collect(),
    );
    let dir = scratch("listed-past-stale");
    let keys = [unique_key("listed-a"), unique_key("listed-b")];
    let mut holders: Vec<Proc> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| b.holding(k, &[], &dir.join(format!("held-{i}"))))
        .collect();
    let (listed, out) = b.listed();
    for k in &keys {
        assert!(listed.contains(k), "{k} not listed: {listed:?}");
    }
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    // 10,000 more keys held (by an application, in dlock's naming): the list is cut, and says so.
    pipe(
        (0..10_000)
            .map(|i| format!("SET dlock:{{app-{i}}} x PX 60000\r\n"))
            .collect(),
    );
    let out = run_ok(b.cmd("status").arg("--json"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the list stops at"),
        "{}",
        describe(&out)
    );
    for h in &mut holders {
        h.close_stdin();
    }
    for h in holders {
        let (out, _) = h.wait(Duration::from_secs(10));
        assert!(out.status.success(), "{}", describe(&out));
    }
}

/// A SIGUSR1 from another process (which dlock forwards, 128+10) ends a wait at once too, like
/// Ctrl-C: the waiter's `BLPOP` read ends at it by itself. (Without that it waited out the
/// `BLPOP`: the holder's remaining TTL, up to 5 s.)
#[test]
fn sigusr1_ends_a_wait_at_once() {
    let Some(url) = shared_redis() else { return };
    let b = TestBackend {
        ttl: Duration::from_secs(6),
        ..TestBackend::redis(&url)
    };
    let key = unique_key("usr1-wait");
    let dir = scratch("usr1-wait");
    let mut h = b.holding(&key, &[], &dir.join("held"));
    let ran = dir.join("ran");
    let w = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "60s"],
        &sh(&format!("echo > {}", ran.display())),
    ));
    wait_until_waiting(&b, &key, 1);
    signal_ends_it_at_once(w, libc::SIGUSR1);
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    assert!(!ran.exists(), "the interrupted waiter ran its command");
    assert_eq!(b.status(&key)["waiters"].as_u64(), Some(0));
}
