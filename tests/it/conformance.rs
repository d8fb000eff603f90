//! The lock semantics every backend must have, written once against the real binary and
//! instantiated per backend with [`conformance!`]. Each case takes a [`TestBackend`] and uses its
//! own unique keys, so cases run in parallel against one shared server.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

pub(crate) use crate::breaking::{
    break_never_lets_a_waiter_start_beside_the_holder, break_stops_the_holder_with_79,
    forced_break_removes_the_lock_at_once,
};
use crate::util::*;

/// Expands to one `#[test]` per conformance case for a backend, e.g.
/// `conformance!(file, TestBackend::file());`
#[macro_export]
macro_rules! conformance {
    ($make:expr) => {
        $crate::conformance!(@cases $make;
            exit_code_is_the_commands,
            child_sees_key_backend_and_token,
            unrunnable_command_is_126_or_127_and_frees_the_lock,
            no_wait_gives_the_conflict_code,
            wait_gives_up_after_its_duration,
            waiter_runs_as_soon_as_the_holder_releases,
            stdin_reaches_the_command,
            mutual_exclusion_and_growing_tokens,
            each_signal_reaches_the_command_and_frees_the_lock,
            kill_grace_escalates_to_sigkill,
            kill_9_of_dlock_kills_the_command_and_frees_the_lock,
            status_reports_the_holder,
            break_stops_the_holder_with_79,
            break_never_lets_a_waiter_start_beside_the_holder,
            forced_break_removes_the_lock_at_once,
            interrupt_while_waiting_leaves_nothing_behind,
            hostile_holder_metadata_never_reaches_the_terminal,
            status_without_a_key_lists_the_busy_locks,
            status_names_the_lock_as_the_server_knows_it,
            keys_that_share_a_prefix_are_distinct_locks,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                $crate::conformance::$case(&backend);
            }
        )*
    };
}

fn marker(dir: &std::path::Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

pub(crate) fn exit_code_is_the_commands(b: &TestBackend) {
    let key = unique_key("exit-code");
    run_code(&mut b.run(&key, &[], &sh("exit 0")), 0);
    run_code(&mut b.run(&key, &[], &sh("exit 3")), 3);
    run_code(&mut b.run(&key, &[], &sh("exit 255")), 255);
    run_code(
        &mut b.run(&key, &[], &sh("kill -KILL $$")),
        128 + libc::SIGKILL,
    );
    run_code(
        &mut b.run(&key, &[], &sh("kill -USR1 $$")),
        128 + libc::SIGUSR1,
    );
    assert!(b.is_free(&key), "the lock is free as soon as dlock returns");
}

pub(crate) fn child_sees_key_backend_and_token(b: &TestBackend) {
    let key = format!("{} with spaces/and ünïcode", unique_key("env"));
    // A token inherited from an enclosing run is replaced, or removed where there is none.
    let out = run_ok(
        b.run(
            &key,
            &[],
            &sh("printf '%s|%s|%s' \"$DLOCK_KEY\" \"$DLOCK_BACKEND\" \"$DLOCK_FENCING_TOKEN\""),
        )
        .env("DLOCK_FENCING_TOKEN", "1"),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let parts: Vec<&str> = stdout.split('|').collect();
    assert_eq!(parts[0], key);
    assert_eq!(parts[1], b.name);
    if !b.fencing {
        assert_eq!(
            parts[2], "",
            "a backend without fencing must not set DLOCK_FENCING_TOKEN"
        );
        return;
    }
    let first: u64 = parts[2]
        .parse()
        .unwrap_or_else(|_| panic!("token is a number: {stdout:?}"));
    let out = run_ok(&mut b.run(&key, &[], &sh("printf %s \"$DLOCK_FENCING_TOKEN\"")));
    let second: u64 = String::from_utf8(out.stdout).unwrap().parse().unwrap();
    assert!(second > first, "tokens grow: {first} then {second}");
}

pub(crate) fn unrunnable_command_is_126_or_127_and_frees_the_lock(b: &TestBackend) {
    let key = unique_key("unrunnable");
    let out = run_code(
        &mut b.run(&key, &[], &["/nonexistent/dlock-test-command"]),
        127,
    );
    assert!(one_error_line(&out).contains("/nonexistent/dlock-test-command"));
    let dir = scratch("unrunnable");
    let not_exec = dir.join("script.sh");
    std::fs::write(&not_exec, "#!/bin/sh\ntrue\n").unwrap();
    let out = run_code(&mut b.run(&key, &[], &[&not_exec]), 126);
    one_error_line(&out);
    run_code(&mut b.run(&key, &[], &[&dir]), 126);
    // Searched in PATH, as execvp: not found is 127; a file without `#!` runs under /bin/sh.
    run_code(&mut b.run(&key, &[], &["dlock-test-no-such-command"]), 127);
    let plain = dir.join("plain");
    std::fs::write(&plain, "echo \"by sh: $1\"\n").unwrap();
    std::fs::set_permissions(&plain, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run_ok(b.run(&key, &[], &["plain", "x"]).env("PATH", path));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "by sh: x\n");
    assert!(b.is_free(&key));
}

pub(crate) fn no_wait_gives_the_conflict_code(b: &TestBackend) {
    let key = unique_key("no-wait");
    let dir = scratch("no-wait");
    let mut h = b.holding(&key, &[], std::path::Path::new(&marker(&dir, "held")));
    let out = run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    let line = one_error_line(&out);
    assert!(line.contains(b.name) && line.contains("busy"), "{line}");
    run_code(&mut b.run(&key, &["-n", "-E", "3"], &["true"]), 3);
    run_code(&mut b.run(&key, &["--wait", "0s"], &["true"]), 75);
    // `-E 0` makes the skip a silent success; `-q` silences the usual 75 (cron mails nothing).
    let out = run_code(&mut b.run(&key, &["-n", "-E", "0"], &sh("echo ran")), 0);
    assert!(
        out.stdout.is_empty(),
        "the command must not run without the lock"
    );
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    let out = run_code(&mut b.run(&key, &["-n", "-q"], &["true"]), 75);
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    h.close_stdin();
    let (out, _) = h.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(b.is_free(&key));
}

pub(crate) fn wait_gives_up_after_its_duration(b: &TestBackend) {
    let key = unique_key("wait-timeout");
    let dir = scratch("wait-timeout");
    let _h = b.holding(&key, &[], std::path::Path::new(&marker(&dir, "held")));
    let (out, took) = Proc::spawn(&mut b.run(&key, &["--wait", "700ms"], &["true"]))
        .wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(one_error_line(&out).contains("gave up waiting"));
    assert!(
        took >= Duration::from_millis(700),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_millis(1700), "gave up late: {took:?}");
}

pub(crate) fn waiter_runs_as_soon_as_the_holder_releases(b: &TestBackend) {
    let key = unique_key("hand-off");
    let dir = scratch("hand-off");
    let mut h = b.holding(&key, &[], std::path::Path::new(&marker(&dir, "held")));
    let ran = dir.join("waiter-ran");
    let w = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!("echo ok > {}", ran.display())),
    ));
    wait_until_waiting(b, &key, 1);
    assert!(
        !ran.exists(),
        "the waiter must not run while the lock is held"
    );
    h.close_stdin();
    let released = Instant::now();
    h.wait(Duration::from_secs(10));
    let (out, _) = w.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(ran.exists());
    let hand_off = released.elapsed();
    assert!(
        hand_off < Duration::from_secs(2),
        "hand-off took {hand_off:?}"
    );
}

pub(crate) fn stdin_reaches_the_command(b: &TestBackend) {
    let key = unique_key("stdin");
    let mut child = b
        .run(&key, &[], &["cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"line one\nline two\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(out.stdout, b"line one\nline two\n");
}

pub(crate) fn mutual_exclusion_and_growing_tokens(b: &TestBackend) {
    const PROCS: usize = 6;
    const ROUNDS: usize = 30;
    let key = unique_key("exclusion");
    let dir = scratch("exclusion");
    let counter = dir.join("counter");
    let tokens = dir.join("tokens");
    std::fs::write(&counter, "0\n").unwrap();
    // Read, pause, write: a second holder inside the window would lose an update.
    let script = format!(
        "n=$(cat {c}); sleep 0.002; echo $((n + 1)) > {c}; echo \"$DLOCK_FENCING_TOKEN\" >> {t}",
        c = counter.display(),
        t = tokens.display()
    );
    std::thread::scope(|s| {
        for _ in 0..PROCS {
            s.spawn(|| {
                for _ in 0..ROUNDS {
                    run_ok(&mut b.run(&key, &["--wait", "60s"], &sh(&script)));
                }
            });
        }
    });
    let n: usize = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(n, PROCS * ROUNDS, "lost updates: two holders at once");
    if !b.fencing {
        return;
    }
    let list: Vec<u64> = std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(|l| l.parse().expect("a token per run"))
        .collect();
    assert_eq!(list.len(), PROCS * ROUNDS);
    assert!(
        list.windows(2).all(|w| w[0] < w[1]),
        "tokens must grow in lock order: {list:?}"
    );
}

/// INT, TERM and HUP — and every other signal whose default action would end dlock (QUIT,
/// USR1 from another process, USR2, ALRM; regression: these killed dlock and left a Redis lock
/// held for its TTL) — reach the command, free the lock at once, and end dlock with 128+N.
pub(crate) fn each_signal_reaches_the_command_and_frees_the_lock(b: &TestBackend) {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
    ] {
        let key = unique_key("signal");
        let dir = scratch("signal");
        let (m, got, sleeper) = (
            marker(&dir, "started"),
            marker(&dir, "got"),
            marker(&dir, "sleeper"),
        );
        // The trap fires at once because `wait` is interruptible; the background sleep is left
        // behind when the shell exits, and dlock must not leave it running.
        let script = format!(
            "trap 'echo got > {got}; exit 0' {sig}; sleep 30 & echo $! > {sleeper}; echo $$ > {m}; wait"
        );
        let p = Proc::spawn(&mut b.run(&key, &[], &sh(&script)));
        wait_for_file(std::path::Path::new(&m), Duration::from_secs(10));
        let sleeper_pid: i32 =
            wait_for_file(std::path::Path::new(&sleeper), Duration::from_secs(1))
                .parse()
                .unwrap();
        // Until it has exec'd, the background job is a copy of the shell with the shell's trap
        // handler, which would swallow the SIGTERM dlock sends it (then only the SIGKILL after
        // the 5 s grace ends it: seen on a loaded machine).
        wait_until(Duration::from_secs(5), "the sleeper to exec", || {
            std::fs::read_to_string(format!("/proc/{sleeper_pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep")
        });
        p.signal(sig);
        let (out, _) = p.wait(Duration::from_secs(5));
        assert_eq!(
            out.status.code(),
            Some(128 + sig),
            "signal {sig}: {}",
            describe(&out)
        );
        assert_eq!(
            std::fs::read_to_string(&got).unwrap_or_default(),
            "got\n",
            "signal {sig} reached the command"
        );
        assert!(
            !alive(sleeper_pid),
            "the command's leftover process was not stopped (signal {sig})"
        );
        assert!(b.is_free(&key), "lock free at once after signal {sig}");
    }
}

pub(crate) fn kill_grace_escalates_to_sigkill(b: &TestBackend) {
    let key = unique_key("grace");
    let dir = scratch("grace");
    let m = marker(&dir, "started");
    let p = Proc::spawn(&mut b.run(
        &key,
        &["--kill-grace", "500ms"],
        &sh(&format!("trap '' TERM; echo $$ > {m}; sleep 30")),
    ));
    wait_for_file(std::path::Path::new(&m), Duration::from_secs(10));
    let sent = Instant::now();
    p.signal(libc::SIGTERM);
    let (out, _) = p.wait(Duration::from_secs(5));
    let took = sent.elapsed();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        describe(&out)
    );
    assert!(
        took >= Duration::from_millis(500),
        "SIGKILL before the grace: {took:?}"
    );
    assert!(took < Duration::from_millis(1500), "SIGKILL late: {took:?}");
    assert!(b.is_free(&key));
}

pub(crate) fn kill_9_of_dlock_kills_the_command_and_frees_the_lock(b: &TestBackend) {
    let key = unique_key("kill9");
    let dir = scratch("kill9");
    let m = marker(&dir, "pid");
    let p = Proc::spawn(&mut b.run(&key, &[], &sh(&format!("echo $$ > {m}; exec sleep 30"))));
    let child: i32 = wait_for_file(std::path::Path::new(&m), Duration::from_secs(10))
        .parse()
        .unwrap();
    p.signal(libc::SIGKILL);
    let killed = Instant::now();
    p.wait(Duration::from_secs(5));
    wait_until(
        Duration::from_secs(1),
        "the command to die with dlock",
        || !alive(child),
    );
    let wait = format!("{}ms", (b.ttl + Duration::from_secs(5)).as_millis());
    run_ok(&mut b.run(&key, &["--wait", &wait], &["true"]));
    let freed = killed.elapsed();
    assert!(
        freed < b.ttl + Duration::from_secs(1),
        "lock freed after {freed:?}, ttl {:?}",
        b.ttl
    );
}

pub(crate) fn status_reports_the_holder(b: &TestBackend) {
    let key = unique_key("status");
    let dir = scratch("status");
    let m = marker(&dir, "held");
    let mut h = b.holding(&key, &[], std::path::Path::new(&m));
    let token = std::fs::read_to_string(&m).unwrap();
    let token = token.split_whitespace().nth(1);
    let s = b.status(&key);
    assert_eq!(s["key"], key.as_str());
    assert_eq!(s["backend"], b.name);
    assert_eq!(s["held"], true, "{s}");
    let holder = &s["holders"][0];
    assert_eq!(holder["pid"], h.pid(), "{s}");
    assert!(
        holder["command"].as_str().unwrap().starts_with("sh -c"),
        "{s}"
    );
    assert!(
        holder["host"].is_string() && holder["since_ms"].is_u64(),
        "{s}"
    );
    if let Some(t) = token {
        assert_eq!(holder["fencing_token"].to_string(), t, "{s}");
    }
    let text = run_ok(b.cmd("status").args(["-k", &key]));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains(&format!("pid {}", h.pid())), "{text}");
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    let s = b.status(&key);
    assert_eq!(s["held"], false, "{s}");
    assert_eq!(s["holders"].as_array().unwrap().len(), 0, "{s}");
}

pub(crate) fn interrupt_while_waiting_leaves_nothing_behind(b: &TestBackend) {
    let key = unique_key("interrupt-wait");
    let dir = scratch("interrupt-wait");
    let mut h = b.holding(&key, &[], std::path::Path::new(&marker(&dir, "held")));
    let ran = dir.join("ran");
    let w = Proc::spawn(&mut b.run(&key, &[], &sh(&format!("echo > {}", ran.display()))));
    wait_until_waiting(b, &key, 1);
    ctrl_c_ends_it_at_once(w);
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    assert!(
        !ran.exists(),
        "the interrupted waiter must never run its command"
    );
    assert!(b.is_free(&key), "the interrupted waiter left the lock held");
    if let Some(n) = b.status(&key)["waiters"].as_u64() {
        assert_eq!(n, 0, "a waiter was left behind");
    }
}

/// For the server backends, on a server of the test's own that `pause(true)` stops (SIGSTOP) and
/// `pause(false)` resumes, with `b.ttl` = 1500 ms: the server stops answering for longer than
/// the TTL, and the command must be gone before the lease could have run out on the server;
/// dlock exits 79 at once, without waiting for a renewal stuck on the dead server.
pub(crate) fn paused_server_stops_the_command_in_time(b: &TestBackend, pause: impl Fn(bool)) {
    assert_eq!(b.ttl, Duration::from_millis(1500));
    let key = unique_key("paused");
    // The grace is clamped to ttl/3 (500 ms), so SIGTERM comes 500 ms before the deadline.
    // -q: the test's fresh server holds the lock back, and says so, before the command starts.
    let (p, child) = b.hold(&key, &["--kill-grace", "5s", "-q"]);
    pause(true);
    let paused = Instant::now();
    let died = wait_until(Duration::from_secs(10), "the command to be stopped", || {
        !alive(child)
    });
    let (out, exited) = {
        let (out, _) = p.wait(Duration::from_secs(10));
        (out, paused.elapsed())
    };
    pause(false);
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(one_error_line(&out).contains("lost"), "{}", describe(&out));
    // The last renewal was sent at most ttl/3 before the pause, so the lease lives on the server
    // until at least pause + 1000 ms; dlock's deadline is at most pause + 1500 ms - margin,
    // SIGTERM 500 ms earlier, and `sleep` dies of SIGTERM.
    assert!(
        died < Duration::from_millis(1050),
        "the command outlived the lease: {died:?}"
    );
    assert!(
        died > Duration::from_millis(400),
        "terminated before the lease was in danger: {died:?}"
    );
    assert!(
        exited < died + Duration::from_millis(300),
        "dlock exited {exited:?} after the pause"
    );
}

/// Waits until the backend reports at least `n` waiters on `key`.
pub(crate) fn wait_until_waiting(b: &TestBackend, key: &str, n: u64) {
    wait_until(Duration::from_secs(10), "the waiter to be queued", || {
        b.status(key)["waiters"].as_u64().is_some_and(|w| w >= n)
    });
}

/// A holder whose command line carries terminal escapes and fake lines (another user's job, or
/// a forged record) is shown escaped by `status`, `break` and the "busy" error; `--json` keeps
/// it exact. Regression: they were printed raw (an operator's terminal retitled and cleared),
/// and then U+2028 (a line break to some terminals and log viewers) still was.
pub(crate) fn hostile_holder_metadata_never_reaches_the_terminal(b: &TestBackend) {
    let key = unique_key("hostile");
    let dir = scratch("hostile");
    let m = dir.join("pid");
    let evil = [
        "\x1b]0;pwned\x07\x1b[2J",
        "\nFAKE: held by nobody\r",
        "\u{2028}FAKE: a line a log viewer breaks",
    ];
    let script = format!("echo $$ > {}; exec sleep 60", m.display());
    let mut cmd = b.run(&key, &[], &["sh", "-c", &script, evil[0], evil[1], evil[2]]);
    let holder = Proc::spawn(&mut cmd);
    wait_for_file(&m, b.ttl + Duration::from_secs(10));
    let clean = |text: &[u8], what: &str| {
        let text = String::from_utf8_lossy(text);
        assert!(
            !text.contains(['\x1b', '\x07', '\r', '\u{2028}']) && !text.contains("\nFAKE"),
            "{what} printed a raw control character: {text:?}"
        );
        assert!(
            text.contains("\\x1b]0;pwned") && text.contains("\\u{2028}FAKE"),
            "{what} hides the command: {text:?}"
        );
    };
    let out = run_ok(b.cmd("status").args(["-k", &key]));
    clean(&out.stdout, "status");
    let busy = run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    let line = one_error_line(&busy);
    assert!(!line.contains('\x1b'), "busy error: {line:?}");
    let json = b.status(&key);
    let command = json["holders"][0]["command"].as_str().unwrap_or_default();
    assert!(command.contains(evil[0]), "--json is exact: {json}");
    let out = run_ok(b.cmd("break").args(["-k", &key]));
    clean(&out.stdout, "break");
    holder.wait(Duration::from_secs(10));
}

/// `dlock status` without `--key` lists the locks held now, including one stored under a hashed
/// name (a long key with capitals: hashed for files, ZooKeeper-safe, a hashed MySQL lock name),
/// and not a key that was used and released. (Other tests' locks may show up too.)
pub(crate) fn status_without_a_key_lists_the_busy_locks(b: &TestBackend) {
    let short = unique_key("listed");
    let long = format!("{}-Long-{}", unique_key("listed"), "x".repeat(200));
    let released = unique_key("listed-free");
    run_ok(&mut b.run(&released, &[], &["true"]));
    let dir = scratch("listed");
    let (m1, m2) = (dir.join("a"), dir.join("b"));
    let mut h1 = b.holding(&short, &[], &m1);
    let mut h2 = b.holding(&long, &[], &m2);
    let out = run_ok(b.cmd("status").arg("--json"));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let find = |k: &str| {
        all.as_array()
            .expect("an array")
            .iter()
            .find(|s| s["key"] == k)
            .cloned()
    };
    for (key, h) in [(&short, &h1), (&long, &h2)] {
        let s = find(key).unwrap_or_else(|| panic!("{key} not listed: {all}"));
        assert_eq!(s["held"], true, "{s}");
        assert_eq!(s["holders"][0]["pid"], h.pid(), "{s}");
    }
    assert!(find(&released).is_none(), "a free key is listed: {all}");
    let text = run_ok(&mut b.cmd("status"));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.starts_with("KEY "), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{short} ")))
        .unwrap_or_else(|| panic!("{short} not in\n{text}"));
    assert!(line.contains(&format!("pid {}", h1.pid())), "{line}");
    h1.close_stdin();
    h2.close_stdin();
    h1.wait(Duration::from_secs(10));
    h2.wait(Duration::from_secs(10));
    let out = run_ok(b.cmd("status").arg("--json"));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !all.as_array()
            .unwrap()
            .iter()
            .any(|s| s["key"] == short.as_str()),
        "released, still listed: {all}"
    );
}

/// `status --json` names the lock as the server knows it (`server_name`), so that an
/// application can take the same lock: checked against the server's own view where the test can
/// see it (the lock file exists; the Redis key and the ZooKeeper path are what the docs say).
pub(crate) fn status_names_the_lock_as_the_server_knows_it(b: &TestBackend) {
    let key = unique_key("server-name");
    let dir = scratch("server-name");
    let mut h = b.holding(&key, &[], &dir.join("held"));
    let s = b.status(&key);
    let name = s["server_name"]
        .as_str()
        .unwrap_or_else(|| panic!("no server_name: {s}"));
    match b.name {
        "file" => {
            assert!(name.ends_with(".lock"), "{s}");
            assert!(std::path::Path::new(name).exists(), "{s}");
        }
        "redis" => assert_eq!(name, format!("dlock:{{{key}}}"), "{s}"),
        "zookeeper" => assert!(name.ends_with(&format!("/dlock/{key}")), "{s}"),
        "mysql" => assert_eq!(name, format!("dlock:{key}"), "{s}"),
        "postgres" => assert!(name.parse::<i64>().is_ok(), "{s}"),
        "etcd" => assert_eq!(name, format!("dlock/{key}/"), "{s}"),
        // The harness's bucket and PREFIX (tests/it/s3.rs).
        "s3" => assert_eq!(name, format!("s3://dlock-test/ci/{key}.lock"), "{s}"),
        other => panic!("no expectation for {other}"),
    }
    h.close_stdin();
    h.wait(Duration::from_secs(10));
}

/// A server whose certificate comes from a private CA: trusted through `SSL_CERT_FILE=ca` a
/// run works (its token is returned); untrusted it is a one-line exit 69 about the certificate.
pub(crate) fn private_ca_trusted_through_ssl_cert_file(
    b: &TestBackend,
    ca: &std::path::Path,
) -> u64 {
    let key = unique_key("tls");
    let out = run_ok(
        b.run(&key, &[], &sh("printf %s \"$DLOCK_FENCING_TOKEN\""))
            .env("SSL_CERT_FILE", ca),
    );
    let token = String::from_utf8(out.stdout).unwrap().parse::<u64>();
    assert!(token.is_ok(), "{token:?}");
    let out = run_code(
        b.run(&key, &[], &["true"])
            .env("SSL_CERT_FILE", "/dev/null"),
        69,
    );
    assert!(one_error_line(&out).contains("certificate"));
    token.unwrap()
}

/// `K`, `K/`, `K/b`, `K:b` and keys with an escape character (`%`, `%2F` spelled out) are
/// distinct locks: holding one does not make another busy, `status` of another does not show
/// it, `break` of another leaves it alone, and the listing names it by its own key.
/// Regression: on etcd `K`'s prefix range `dlock/K/` held `dlock/K/b/<lease>`, so `K` was
/// busy, showed and broke `K/b`'s holder.
pub(crate) fn keys_that_share_a_prefix_are_distinct_locks(b: &TestBackend) {
    let base = unique_key("distinct");
    let keys = [
        base.clone(),
        format!("{base}/"),
        format!("{base}/b"),
        format!("{base}:b"),
        format!("{base}%2Fb"),
        format!("{base}%"),
    ];
    let dir = scratch("distinct");
    for (i, held) in keys.iter().enumerate() {
        let m = dir.join(format!("held-{i}"));
        let mut h = b.holding(held, &[], &m);
        for other in keys.iter().filter(|k| *k != held) {
            assert!(b.is_free(other), "{other:?} is busy while {held:?} is held");
            let s = b.status(other);
            assert_eq!(s["held"], false, "status {other:?} with {held:?} held: {s}");
            let out = run_ok(b.cmd("break").args(["-k", other]));
            let said = String::from_utf8(out.stdout).unwrap();
            assert!(
                said.contains("not held"),
                "break {other:?} with {held:?} held: {said}"
            );
        }
        let s = b.status(held);
        assert_eq!(s["holders"][0]["pid"], h.pid(), "{held:?}: {s}");
        let out = run_ok(b.cmd("status").arg("--json"));
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
        let mine: Vec<_> = all
            .as_array()
            .expect("an array")
            .iter()
            .filter(|s| keys.iter().any(|k| s["key"] == k.as_str()))
            .collect();
        assert_eq!(mine.len(), 1, "only {held:?} is held: {all}");
        assert_eq!(mine[0]["key"], held.as_str(), "{all}");
        assert_eq!(mine[0]["holders"][0]["pid"], h.pid(), "{all}");
        h.close_stdin();
        let (out, _) = h.wait(Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(0), "{held:?}: {}", describe(&out));
    }
}
