//! What an operator meets at the edges (issue 39): a `?min-replicas` wait that Ctrl-C ends, URL
//! parameters no backend knows, and the hold-back of a freshly started server.

use std::time::Duration;

use crate::servers::shared_redis;
use crate::util::*;

/// Ctrl-C while a grant waits for replicas that do not exist: exit 130 and the key free at once.
/// (It stayed held by the dead process for its TTL: the give-back ran on the connection whose
/// WAIT reply the signal had cut off.)
#[test]
fn ctrl_c_during_a_min_replicas_wait_leaves_the_key_free() {
    let Some(url) = shared_redis() else {
        return;
    };
    let key = unique_key("min-replicas-int");
    let plain = TestBackend::redis(&url);
    let with = TestBackend::redis(&format!("{url}?min-replicas=1"));
    let p = Proc::spawn(
        with.cmd("run")
            .args(["--ttl", "30s", "--wait", "30s", "-k", &key, "--", "true"]),
    );
    // The lock exists only while a grant waits for the replica (WAIT, up to 1 s): signal then.
    wait_until(
        Duration::from_secs(10),
        "a grant waiting for replicas",
        || plain.status(&key)["held"] == true,
    );
    p.signal(libc::SIGINT);
    let (out, took) = p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert!(took < Duration::from_secs(5));
    assert_eq!(
        plain.status(&key)["held"],
        false,
        "the key is free after Ctrl-C\n{}",
        describe(&out)
    );
}

/// The retry line of a grant too few replicas acknowledged says what the run waits for; the
/// connection was fine, and it used to say it was lost.
#[test]
fn min_replicas_retry_line_says_it_waits_for_replicas() {
    let Some(url) = shared_redis() else {
        return;
    };
    let key = unique_key("min-replicas-line");
    let with = TestBackend::redis(&format!("{url}?min-replicas=1"));
    let out = run_code(
        with.cmd("run")
            .args(["--ttl", "3s", "--wait", "1500ms", "-k", &key, "--", "true"]),
        75,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("waiting for replicas to acknowledge") && !err.contains("connection"),
        "{}",
        describe(&out)
    );
    assert!(
        err.lines().all(|l| l.starts_with("dlock: ")),
        "{}",
        describe(&out)
    );
    assert_eq!(TestBackend::redis(&url).status(&key)["held"], false);
}

/// A URL parameter that no backend knows (a typo such as `?min-replica=1`) is a usage error,
/// exit 2 with one line naming it, on every backend and every subcommand that takes a URL —
/// decided before anything is reached, so the closed ports here never matter.
#[test]
fn unknown_url_parameters_are_usage_errors_on_every_backend() {
    let dir = scratch("url-params");
    let file = format!("file://{}?mode=x", dir.display());
    let table: &[(&str, &str)] = &[
        (&file, "mode"),
        ("redis://127.0.0.1:1/?min-replica=1", "min-replica"),
        ("rediss://127.0.0.1:1/?timeout=1", "timeout"),
        (
            "redis+unix:///nonexistent.sock?min-replica=1",
            "min-replica",
        ),
        (
            "redis-sentinel://127.0.0.1:1/m?min-replica=1",
            "min-replica",
        ),
        ("mysql://u@127.0.0.1:1/db?sslmod=required", "sslmod"),
        ("postgres://u@127.0.0.1:1/db?sslmod=require", "sslmod"),
        ("zookeeper://127.0.0.1:1/locks?timeout=1", "zookeeper"),
        ("etcd://127.0.0.1:1/?timeout=1", "etcd"),
    ];
    for (url, named) in table {
        for (sub, rest) in [
            ("run", &["-n", "-k", "x", "--", "true"][..]),
            ("status", &["-k", "x"]),
        ] {
            let out = run_code(dlock().args([sub, "--url", url]).args(rest), 2);
            let line = one_error_line(&out);
            assert!(line.contains(named), "{url}: {}", describe(&out));
            assert!(!dir.join("x").exists() && !dir.join("x.lock").exists());
        }
    }
}

/// A lock a freshly started server holds back: `status` shows it held back, with the time left
/// and the server's age, not as a command that runs (its command has not started); once the
/// hold-back ends the command runs. `b` is a server started just now, with a TTL of a few
/// seconds.
fn status_shows_a_held_back_lock(b: &TestBackend) {
    let key = unique_key("held-back");
    let ran = scratch("held-back").join("ran");
    let holder = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "20s"],
        &sh(&format!("touch {}", ran.display())),
    ));
    wait_until(Duration::from_secs(10), "the lock held", || {
        b.status(&key)["held"] == true
    });
    let st = b.status(&key);
    let span = b.ttl.as_millis() as u64 + 1000;
    let left = st["holders"][0]["held_back_ms"].as_u64();
    assert!(
        left.is_some_and(|ms| ms > 0 && ms <= span)
            && st["server_up_s"].as_u64().is_some_and(|s| s * 1000 < span),
        "{}: {st}",
        b.name
    );
    let text = run_ok(b.cmd("status").args(["-k", &key]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("(held back)") && text.contains("more before its command starts"),
        "{}: {text}",
        b.name
    );
    assert!(
        !ran.exists(),
        "{}: the command started during the hold-back",
        b.name
    );
    let (out, _) = holder.wait(Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(ran.exists());
}

#[test]
fn held_back_lock_shows_in_status_redis() {
    let Some(server) = crate::servers::Redis::start(&[]) else {
        return;
    };
    status_shows_a_held_back_lock(&TestBackend {
        ttl: Duration::from_secs(3),
        ..TestBackend::redis(&server.url())
    });
}

#[test]
fn held_back_lock_shows_in_status_redlock() {
    let servers: Vec<_> = (0..3)
        .filter_map(|_| crate::servers::Redis::start(&[]))
        .collect();
    if servers.len() < 3 {
        return;
    }
    let urls: Vec<String> = servers.iter().map(crate::servers::Redis::url).collect();
    status_shows_a_held_back_lock(&TestBackend {
        ttl: Duration::from_secs(3),
        ..TestBackend::redlock(&urls)
    });
}

#[test]
fn held_back_lock_shows_in_status_mysql() {
    let Some(server) = crate::servers::Mariadb::start() else {
        return;
    };
    status_shows_a_held_back_lock(&TestBackend {
        ttl: Duration::from_secs(4),
        ..TestBackend::mysql(&server.url())
    });
}

#[test]
fn held_back_lock_shows_in_status_postgres() {
    let Some(server) = crate::servers::Postgres::start() else {
        return;
    };
    status_shows_a_held_back_lock(&TestBackend {
        ttl: Duration::from_secs(4),
        ..TestBackend::postgres(&server.url())
    });
}

/// The hold-back's own `--wait`: shorter than the hold-back, the run keeps the lock until
/// `--wait` runs out (not giving up at once, as it did), then exits 75 having given it back.
#[test]
fn a_wait_shorter_than_the_hold_back_is_waited_out() {
    let Some(server) = crate::servers::Redis::start(&[]) else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_secs(5),
        ..TestBackend::redis(&server.url())
    };
    let key = unique_key("held-back-wait");
    let p = Proc::spawn(&mut b.run(&key, &["--wait", "1500ms"], &["true"]));
    let (out, took) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("longer than --wait") && err.contains("held back for"),
        "{}",
        describe(&out)
    );
    assert_eq!(b.status(&key)["held"], false, "given back");
}

/// `status`, `log` and `break` with a mistyped `file://` path say so in one line (exit 69) and
/// create nothing (the directory used to be made, and the lock shown free); `run` creates it.
#[test]
fn a_mistyped_file_directory_is_not_created_by_status_log_or_break() {
    let dir = scratch("typo").join("no").join("such");
    let url = format!("file://{}", dir.display());
    for sub in [
        &["status", "-k", "x"][..],
        &["status"],
        &["log", "-k", "x"],
        &["break", "-k", "x"],
    ] {
        let out = run_code(dlock().args(sub).args(["--url", &url]), 69);
        let line = one_error_line(&out);
        assert!(
            line.contains("no lock directory") && line.contains(&dir.display().to_string()),
            "{sub:?}: {line}"
        );
        assert!(
            !dir.exists() && !dir.parent().unwrap().exists(),
            "{sub:?} created it"
        );
    }
    run_ok(dlock().args(["run", "--url", &url, "-k", "x", "--", "true"]));
    assert!(dir.is_dir());
    run_ok(dlock().args(["status", "--url", &url, "-k", "x"]));
}

/// `log` counts runs with `-r` (`--runs`): `-n` is `--no-wait` in `run` and `acquire`. The old
/// `log -n N` still works, with one warning line naming the new spelling.
#[test]
fn log_runs_is_dash_r_and_dash_n_still_works_with_a_warning() {
    let b = TestBackend::file();
    let key = unique_key("log-r");
    for _ in 0..3 {
        run_ok(&mut b.run(&key, &[], &["true"]));
    }
    let runs = |flag: &str| {
        let out = run_ok(b.cmd("log").args(["-k", &key, "--json", flag, "2"]));
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (all.as_array().unwrap().len(), out)
    };
    let (n, out) = runs("-r");
    assert_eq!(n, 2);
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    let (n, out) = runs("-n");
    assert_eq!(n, 2);
    let line = one_error_line(&out);
    assert!(line.contains("-r") && line.contains("--no-wait"), "{line}");
}

/// `--help` fits 80 columns when piped (into a pager): no line is longer, and each example's
/// command stands whole on its own line (they wrapped mid-phrase, the description run into the
/// command's line).
#[test]
fn help_fits_80_columns_and_examples_stand_whole() {
    for sub in [
        "", "run", "acquire", "release", "status", "log", "break", "doctor", "bench",
    ] {
        let out = run_ok(dlock().args([sub, "--help"].iter().filter(|a| !a.is_empty())));
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{sub} --help: {line:?}");
        }
    }
    let out = run_ok(dlock().arg("--help"));
    let text = String::from_utf8_lossy(&out.stdout);
    let examples = text
        .split("Examples:\n")
        .nth(1)
        .expect("an Examples section");
    let commands: Vec<&str> = examples
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .map(str::trim)
        .collect();
    assert!(commands.len() >= 5, "{examples}");
    for c in commands {
        assert!(c.starts_with("dlock ") || c.starts_with("eval "), "{c:?}");
    }
}

/// A grant given back (here: too few replicas) takes the start it recorded back without taking
/// the previous run's with it: `--once-per` reads the newest start from `lastrun`, and the
/// take-back used to delete it, so a run an hour's `--once-per` had to skip ran again.
#[test]
fn a_grant_given_back_leaves_the_previous_start_to_once_per() {
    let Some(url) = shared_redis() else {
        return;
    };
    let key = unique_key("given-back-lastrun");
    let plain = TestBackend::redis(&url);
    run_ok(&mut plain.run(&key, &["--once-per", "1h"], &["true"]));
    let with = TestBackend::redis(&format!("{url}?min-replicas=1"));
    run_code(
        with.cmd("run")
            .args(["--ttl", "3s", "--no-wait", "-k", &key, "--", "true"]),
        69,
    );
    let out = output(&mut plain.run(&key, &["--once-per", "1h"], &["true"]));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("skipped: "),
        "{}",
        describe(&out)
    );
}
