//! `dlock check` and `dlock metrics` (docs/monitoring.md) on every backend with a history, on the
//! servers this binary shares: one test per backend walks every state — OK after a fresh run
//! and while a run holds the lock, WARNING and CRITICAL by age (waited for, never slept for),
//! CRITICAL for a failed run, a key that never ran and a holder killed with `kill -9`, the
//! worst of several keys, UNKNOWN for a backend that does not answer and for a usage error — and
//! passes the metrics of hostile key names through `promtool check metrics`.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::servers::*;
use crate::util::*;

/// `dlock check <backend> ARGS…`: (exit code, the stdout line).
fn check(b: &TestBackend, args: &[&str]) -> (i32, String) {
    let out = output(b.cmd("check").args(args));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        text.lines().count(),
        1,
        "check prints one line:\n{}",
        describe(&out)
    );
    assert!(
        text.starts_with("DLOCK ") && !text.trim_end().contains('\n'),
        "{}",
        describe(&out)
    );
    (out.status.code().unwrap_or(-1), text.trim_end().to_string())
}

fn check_is(b: &TestBackend, args: &[&str], code: i32, word: &str) -> String {
    let (got, line) = check(b, args);
    assert_eq!(got, code, "{args:?}: {line}");
    assert!(
        line.starts_with(&format!("DLOCK {word} - ")),
        "{args:?}: {line}"
    );
    line
}

/// `promtool check metrics` on `text` (when `promtool` is there): panics with its complaints
/// unless it passes.
fn promtool_passes(promtool: bool, text: &[u8]) {
    use std::io::Write;
    if !promtool {
        return;
    }
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    p.stdin.take().unwrap().write_all(text).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}\non:\n{}",
        describe(&out),
        String::from_utf8_lossy(text)
    );
}

/// The same backend at an address where nothing answers.
fn unreachable(b: &TestBackend) -> TestBackend {
    let args = b
        .args
        .iter()
        .map(|a| match a.split_once("://") {
            Some(("file", _)) => format!("file:///nonexistent-{}", std::process::id()),
            Some((scheme, _)) => {
                let p = free_port();
                match scheme {
                    "redis-sentinel" => format!("redis-sentinel://127.0.0.1:{p}#dlockp"),
                    "mysql" => format!("mysql://root@127.0.0.1:{p}/dlock"),
                    "postgres" | "postgresql" => format!("postgres://postgres@127.0.0.1:{p}/x"),
                    "s3" => format!("s3://{S3_BUCKET}/ci?endpoint=http://127.0.0.1:{p}"),
                    s => format!("{s}://127.0.0.1:{p}"),
                }
            }
            None => a.clone(),
        })
        .collect();
    // S3's credentials stay (signed requests to a port where nothing answers).
    let s3 = b.args.iter().any(|a| a.starts_with("s3://"));
    TestBackend {
        args,
        env: if s3 { b.env.clone() } else { Vec::new() },
        ..b.clone()
    }
}

/// A backend's native hook that stores an event as dlock would (`history::Native::forge`).
type Forge = fn(&TestBackend, &str, &[u8]);

/// Every case on one backend (see the module comment). `forge`: the backend's native hook to
/// store an event as dlock would, for a run whose host is hostile (a newline, quotes).
fn every_state(b: &TestBackend, forge: Option<Forge>) {
    // Without promtool (and not required), the exposition is still checked below, by hand.
    let promtool = available("promtool");
    let ok = unique_key("mon-ok");
    let failed = unique_key("mon-failed");
    let never = unique_key("mon-never");
    let killed = unique_key("mon-killed");
    let forged = unique_key("mon-forged");
    // A leading space sorts it first, within the 200 keys `metrics` lists on a shared server.
    let hostile = format!(" {} q\"u\\o'te é 🔒 a=b|c", unique_key("mon"));
    run_ok(&mut b.run(&ok, &[], &["true"]));
    run_code(&mut b.run(&failed, &[], &sh("exit 3")), 3);
    run_ok(&mut b.run(&hostile, &[], &["true"]));

    // OK, with perfdata.
    let line = check_is(b, &["-k", &ok, "--max-age", "1h"], 0, "OK");
    assert!(line.contains(" ran ") && line.contains("(exit 0"), "{line}");
    assert!(
        line.contains(" | age=") && line.contains(";;3600;0 duration="),
        "{line}"
    );
    // CRITICAL: a failed run (exit 3), a key that never ran; the worst of several wins.
    let line = check_is(b, &["-k", &failed, "--max-age", "1h"], 2, "CRITICAL");
    assert!(line.contains("exit 3"), "{line}");
    let line = check_is(b, &["-k", &never, "-c", "1h"], 2, "CRITICAL");
    assert!(line.contains("never ran"), "{line}");
    let line = check_is(
        b,
        &["-k", &ok, "-k", &failed, "-k", &hostile, "-c", "1h"],
        2,
        "CRITICAL",
    );
    assert!(
        line.contains(&format!("'{failed}' failed")),
        "worst first: {line}"
    );
    assert!(
        line.contains("o''te é 🔒 a_b_c age'="),
        "a quote in a label is doubled, = and | are _: {line}"
    );
    assert!(!line[..line.find(" | ").unwrap()].contains('|'), "{line}");

    // A run that holds the lock is OK by its start; once killed with -9 it is CRITICAL.
    let dir = scratch("mon");
    let holder = b.holding(&killed, &[], &dir.join("m"));
    let line = check_is(b, &["-k", &killed, "-c", "1h"], 0, "OK");
    assert!(line.contains("is running"), "{line}");
    let held = output(b.cmd("metrics").args(["-k", &killed]));
    let held = String::from_utf8_lossy(&held.stdout).to_string();
    assert!(
        held.contains(&format!("dlock_lock_held{{key=\"{killed}\"}} 1"))
            && held.contains(&format!("dlock_last_run_running{{key=\"{killed}\"}} 1")),
        "{held}"
    );
    holder.signal(libc::SIGKILL);
    let _ = holder.wait(Duration::from_secs(10));
    let line = check_is(b, &["-k", &killed, "-c", "1h"], 2, "CRITICAL");
    assert!(line.contains("no end was recorded"), "{line}");

    // WARNING past --warn-age, CRITICAL past --max-age: waited for by the check's own age.
    // (Asked every 100 ms: each check is a process and a connection.)
    wait_until(Duration::from_secs(10), "the run to age past 1s", || {
        let warned = check(b, &["-k", &ok, "--warn-age", "1s", "--max-age", "1h"]).0 == 1;
        if !warned {
            std::thread::sleep(Duration::from_millis(100));
        }
        warned
    });
    let line = check_is(b, &["-k", &ok, "-w", "1s", "-c", "1h"], 1, "WARNING");
    assert!(
        line.contains("longer ago than 1s") && line.contains(";1;3600;0"),
        "{line}"
    );
    let line = check_is(b, &["-k", &ok, "--max-age", "1s"], 2, "CRITICAL");
    assert!(line.contains("longer ago than 1s"), "{line}");

    // UNKNOWN: a backend that does not answer; a usage error (never 2).
    let dead = unreachable(b);
    let line = check_is(&dead, &["-k", &ok, "-c", "1h"], 3, "UNKNOWN");
    assert!(!line.contains("password"), "{line}");
    check_is(b, &["-k", &ok], 3, "UNKNOWN");
    check_is(b, &["-k", &ok, "-c", "1h", "--bogus"], 3, "UNKNOWN");
    check_is(b, &["-k", &ok, "-c", "1h", "-w", "2h"], 3, "UNKNOWN");

    // Metrics: promtool accepts them, hostile names included; the failed run's code is 3.
    if let Some(forge) = forge {
        let body = serde_json::json!({"run": "forged0000000001", "ev": "start",
            "host": "evil\nhost \"x\" \\ é\u{1b}[2J", "pid": 1, "host_ms": 1});
        forge(b, &forged, body.to_string().as_bytes());
    }
    let out = run_ok(b.cmd("metrics").args([
        "-k", &ok, "-k", &failed, "-k", &never, "-k", &hostile, "-k", &forged,
    ]));
    promtool_passes(promtool, &out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    let escaped = hostile.replace('\\', "\\\\").replace('"', "\\\"");
    for want in [
        format!("dlock_last_run_exit_code{{key=\"{failed}\"}} 3\n"),
        format!("dlock_last_run_success{{key=\"{failed}\"}} 0\n"),
        format!("dlock_last_run_success{{key=\"{ok}\"}} 1\n"),
        format!("dlock_history_runs{{key=\"{never}\"}} 0\n"),
        format!("dlock_lock_held{{key=\"{escaped}\"}} 0\n"),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
    if forge.is_some() {
        assert!(
            text.contains("host=\"evil\\\\nhost \\\"x\\\" \\\\ é"),
            "{text}"
        );
    }
    // Every key with a history, and a file written atomically.
    let file = dir.join("dlock.prom");
    run_ok(b.cmd("metrics").arg("--write").arg(&file));
    let written = std::fs::read(&file).unwrap();
    promtool_passes(promtool, &written);
    let listed = format!("dlock_history_runs{{key=\"{escaped}\"}} 1\n");
    assert!(
        String::from_utf8_lossy(&written).contains(&listed),
        "every key with a history, so {listed:?}:\n{}",
        String::from_utf8_lossy(&written)
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A backend that does not answer: `dlock_backend_up 0`, exit 69.
    let out = output(dead.cmd("metrics").args(["-k", &ok]));
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    promtool_passes(promtool, &out.stdout);
    assert!(String::from_utf8_lossy(&out.stdout).contains("dlock_backend_up{backend="));
}

#[test]
fn file() {
    every_state(
        &TestBackend::file(),
        Some(crate::history::file_native().forge),
    );
}

#[test]
fn redis() {
    let Some(url) = shared_redis() else { return };
    every_state(
        &TestBackend::redis(&url),
        Some(crate::history::redis_native().forge),
    );
}

#[test]
fn redlock() {
    let Some(urls) = shared_redlock() else { return };
    every_state(
        &TestBackend::redlock(&urls),
        Some(crate::history::redis_native().forge),
    );
}

#[test]
fn redis_sentinel() {
    let Some(s) = shared_redis_sentinel() else {
        return;
    };
    every_state(
        &TestBackend::redis(&s.url()),
        Some(crate::history::sentinel_native().forge),
    );
}

#[test]
fn redis_cluster() {
    let Some(c) = shared_redis_cluster() else {
        return;
    };
    every_state(
        &TestBackend::redis(&c.url(0)),
        Some(crate::history::redis_native().forge),
    );
}

#[test]
fn mariadb() {
    let Some(m) = shared_mariadb() else { return };
    every_state(
        &TestBackend::mysql(&m.url()),
        Some(crate::mysql::mysql_native().forge),
    );
}

#[test]
fn postgres() {
    let Some(p) = shared_postgres() else { return };
    every_state(
        &TestBackend::postgres(&p.url()),
        Some(crate::postgres::postgres_native().forge),
    );
}

#[test]
fn zookeeper() {
    let Some(z) = shared_zookeeper() else { return };
    every_state(
        &TestBackend::zookeeper(&z.url()),
        Some(crate::zookeeper::zk_native().forge),
    );
}

#[test]
fn etcd() {
    let Some(e) = shared_etcd() else { return };
    every_state(
        &TestBackend::etcd(&e.url()),
        Some(crate::etcd::etcd_native().forge),
    );
}

#[test]
fn s3() {
    let Some(s) = shared_seaweedfs() else { return };
    every_state(
        &TestBackend::s3(&format!("s3://{S3_BUCKET}/ci"), s.env()),
        Some(crate::s3::s3_native().forge),
    );
}

/// A key on the server that is not UTF-8 (`dlock:{\xff\xfe}:runs`, which dlock never writes but
/// anyone may) is skipped: `dlock metrics` still lists every key with a history, and `dlock
/// status` every lock. (A server of its own: the junk key stays.)
#[test]
fn redis_a_key_name_that_is_not_utf8_is_skipped() {
    let Some(r) = Redis::start(&[]) else { return };
    let b = TestBackend::redis(&r.url());
    let key = unique_key("mon-utf8");
    run_ok(&mut b.run(&key, &[], &["true"]));
    let junk = "for _, s in ipairs({':runs', '', ':holders'}) do \
                redis.call('SET', 'dlock:{' .. string.char(255, 254) .. '}' .. s, 'x') end \
                return 1";
    assert_eq!(r.cli(&["EVAL", junk, "0"]), "1");
    let out = run_ok(&mut b.cmd("metrics"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("dlock_history_runs{{key=\"{key}\"}} 1\n")),
        "{text}"
    );
    run_ok(&mut b.cmd("status"));
}

/// A key whose history cannot be read (here another program's string at `dlock:{KEY}:runs`:
/// WRONGTYPE) is UNKNOWN, and does not hide a key already judged CRITICAL: the worst state
/// still wins. (A server of its own: the junk key stays.)
#[test]
fn redis_an_unreadable_key_does_not_hide_a_critical_one() {
    let Some(r) = Redis::start(&[]) else { return };
    let b = TestBackend::redis(&r.url());
    let failed = unique_key("mon-failed");
    let broken = unique_key("mon-broken");
    run_code(&mut b.run(&failed, &[], &sh("exit 3")), 3);
    assert_eq!(
        r.cli(&["SET", &format!("dlock:{{{broken}}}:runs"), "x"]),
        "OK"
    );
    let line = check_is(
        &b,
        &["-k", &failed, "-k", &broken, "-c", "1h"],
        2,
        "CRITICAL",
    );
    assert!(
        line.contains(&format!("'{failed}' failed")) && line.contains(&format!("'{broken}'")),
        "{line}"
    );
    check_is(&b, &["-k", &broken, "-c", "1h"], 3, "UNKNOWN");
}

/// A key whose history cannot be read (WRONGTYPE, as above) does not take the other keys'
/// metrics with it: they are reported, it is `dlock_key_readable 0`, and the exit is 69 (said
/// on stderr). (A server of its own: the junk key stays.)
#[test]
fn redis_metrics_report_the_keys_that_read_past_one_that_does_not() {
    let Some(r) = Redis::start(&[]) else { return };
    let b = TestBackend::redis(&r.url());
    // Listed in byte order: "a…" is read before "b…", "c…" after.
    let (first, broken, last) = (
        unique_key("a-mon"),
        unique_key("b-mon"),
        unique_key("c-mon"),
    );
    run_ok(&mut b.run(&first, &[], &["true"]));
    run_ok(&mut b.run(&last, &[], &["true"]));
    assert_eq!(
        r.cli(&["SET", &format!("dlock:{{{broken}}}:runs"), "x"]),
        "OK"
    );
    let out = output(&mut b.cmd("metrics"));
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    promtool_passes(available("promtool"), &out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "dlock_backend_up{backend=\"redis\"} 1\n".to_string(),
        format!("dlock_history_runs{{key=\"{first}\"}} 1\n"),
        format!("dlock_key_readable{{key=\"{first}\"}} 1\n"),
        format!("dlock_key_readable{{key=\"{broken}\"}} 0\n"),
        format!("dlock_key_readable{{key=\"{last}\"}} 0\n"),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
    assert!(
        !text.contains(&format!("dlock_history_runs{{key=\"{broken}\"}}")),
        "{text}"
    );
}
