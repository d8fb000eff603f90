//! Run history and `--once-per` against the real binary: the cases every backend must pass,
//! instantiated per backend with [`history!`]. "Many hosts" are several processes; a host whose
//! clock or cron is late is a start delay. Each backend gives two native hooks, written with
//! the server's own client (never dlock): [`Native::forge`] stores an event as dlock would, for
//! the hostile-record case, and [`Native::count`] counts the events stored for a key, to show
//! that pruning bounds them.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::*;

/// A backend's native access to its stored history (see the module comment).
pub(crate) struct Native {
    /// Stores `body` as one more (the newest) event of `key`'s history.
    pub forge: fn(&TestBackend, &str, &[u8]),
    /// How many events `key`'s history holds on the server.
    pub count: fn(&TestBackend, &str) -> usize,
}

/// At most this many events per key (100 runs); a backend may prune a few runs late.
const MAX_STORED_EVENTS: usize = 220;

/// Expands to one `#[test]` per history case for a backend: `history!(backend, native)`.
#[macro_export]
macro_rules! history {
    ($make:expr, $native:expr) => {
        $crate::history!(@cases $make, $native;
            once_per_lets_one_run_per_window_across_hosts,
            a_waiter_that_gets_the_lock_after_the_windows_run_skips,
            log_shows_every_ending_newest_first,
            history_keeps_only_the_newest_runs,
            forged_history_records_are_shown_escaped_and_capped,
            no_history_leaves_no_record,
            acquire_once_per_and_its_runs_in_the_log,
            a_start_with_a_huge_command_still_counts,
        );
    };
    (@cases $make:expr, $native:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                $crate::history::$case(&backend, &$native);
            }
        )*
    };
}

/// `dlock log --json -n N` parsed.
pub(crate) fn log_json(b: &TestBackend, key: &str, n: usize) -> Vec<serde_json::Value> {
    let out = run_ok(
        b.cmd("log")
            .args(["-k", key, "--json", "-r", &n.to_string()]),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("log --json is JSON");
    v.as_array().expect("an array").clone()
}

/// Starts `count` runs of a 20 ms command with `--once-per DUR`, the i-th after `offsets[i]`;
/// returns each one's (pid, exit code, stderr).
fn window(
    b: &TestBackend,
    key: &str,
    once_per: &str,
    offsets_ms: &[u64],
    extra: &[&[&str]],
) -> Vec<(i32, i32, String)> {
    let t0 = Instant::now();
    let mut procs = Vec::new();
    for (i, off) in offsets_ms.iter().enumerate() {
        let until = t0 + Duration::from_millis(*off);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let mut args = vec!["--once-per", once_per, "--wait", "20s"];
        args.extend_from_slice(extra.get(i).copied().unwrap_or(&[]));
        procs.push(Proc::spawn(&mut b.run(key, &args, &sh("sleep 0.02"))));
    }
    procs
        .into_iter()
        .map(|p| {
            let pid = p.pid();
            let (out, _) = p.wait(Duration::from_secs(30));
            (
                pid,
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .collect()
}

/// Five runs started up to DUR/2 apart (hosts whose cron or clock is late) run the command once;
/// the others skip with 75 (or -E's code), naming the run that counted. The next window, DUR
/// later, runs it once more.
pub(crate) fn once_per_lets_one_run_per_window_across_hosts(b: &TestBackend, _n: &Native) {
    let key = unique_key("once-per");
    let offsets = [0, 250, 500, 750, 1000]; // DUR/2 = 1 s
    let mut ran_total = 0;
    for round in 0..2 {
        let e3: &[&str] = &["-E", "3"];
        let extra: Vec<&[&str]> = vec![&[], &[], &[], e3, e3];
        let started = Instant::now();
        let results = window(b, &key, "2s", &offsets, &extra);
        let ran: Vec<_> = results.iter().filter(|r| r.1 == 0).collect();
        assert_eq!(
            ran.len(),
            1,
            "round {round}: exactly one run must run the command: {results:#?}"
        );
        let winner = ran[0].0;
        for (i, (_, code, err)) in results.iter().enumerate() {
            if *code == 0 {
                continue;
            }
            let want = if i >= 3 { 3 } else { 75 };
            assert_eq!(*code, want, "round {round}, run {i}: {err}");
            assert!(
                err.contains(&format!("skipped: '{key}' started"))
                    && err.contains(&format!("pid {winner}"))
                    && err.contains("(once per 2s)"),
                "round {round}, run {i} must name the run that counted (pid {winner}): {err}"
            );
            assert_eq!(err.lines().count(), 1, "one line: {err}");
        }
        // For the record (`--nocapture`): who ran, and what the others said.
        let said: Vec<String> = results
            .iter()
            .map(|(_, code, err)| match code {
                0 => "ran".to_string(),
                _ => format!("{code}: {}", err.trim()),
            })
            .collect();
        eprintln!("{} once-per round {round}: {said:#?}", b.name);
        ran_total += 1;
        // The next window: DUR after this one's run started, by any clock.
        let next = started + Duration::from_millis(2300);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let runs = log_json(b, &key, 10);
    assert_eq!(
        runs.len(),
        ran_total,
        "only runs that ran are recorded: {runs:#?}"
    );
    // -q: nothing but errors, and a skip is not one.
    let quiet = output(&mut b.run(&key, &["--once-per", "1h", "-q"], &["true"]));
    assert_eq!(quiet.status.code(), Some(75), "{}", describe(&quiet));
    assert!(quiet.stderr.is_empty(), "{}", describe(&quiet));
}

/// A run that waited for the lock and got it after another host's run started within DUR does
/// not run its command.
pub(crate) fn a_waiter_that_gets_the_lock_after_the_windows_run_skips(
    b: &TestBackend,
    _n: &Native,
) {
    let key = unique_key("once-per-wait");
    let dir = scratch("once-per-wait");
    let marker = dir.join("first");
    let first = b.holding(&key, &["--once-per", "1m"], &marker);
    let second_ran = dir.join("second");
    let mut waiter = b.run(
        &key,
        &["--once-per", "1m", "--wait", "30s", "-E", "9"],
        &["touch", second_ran.to_str().unwrap()],
    );
    let waiter = Proc::spawn(&mut waiter);
    // The waiter waits (the lock is busy) until the first run ends.
    wait_until(Duration::from_secs(10), "the waiter to queue", || {
        !b.is_free(&key)
    });
    let mut first = first;
    let first_pid = first.pid();
    first.close_stdin();
    let (out, _) = first.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let (out, _) = waiter.wait(Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
    assert!(!second_ran.exists(), "the waiter must not run its command");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("pid {first_pid}")), "{err}");
    assert!(b.is_free(&key), "a skipping run gives the lock back");
}

/// `dlock log` after runs that exited 0, 3 and 143, one that was broken (79) and one whose dlock
/// was killed with SIGKILL: each outcome, newest first.
pub(crate) fn log_shows_every_ending_newest_first(b: &TestBackend, _n: &Native) {
    let key = unique_key("log");
    for code in [0, 3, 143] {
        run_code(&mut b.run(&key, &[], &sh(&format!("exit {code}"))), code);
    }
    let dir = scratch("log");
    let broken = b.holding(&key, &[], &dir.join("broken"));
    run_ok(b.cmd("break").args(["-k", &key]));
    let (out, _) = broken.wait(b.notice + Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let killed = b.holding(&key, &[], &dir.join("killed"));
    let killed_pid = killed.pid();
    killed.signal(libc::SIGKILL);
    let _ = killed.wait(Duration::from_secs(10));
    // Its lease may live on until it runs out, but the run is over: not "running".
    let newest = &log_json(b, &key, 1)[0];
    assert_eq!(newest["state"], "no end recorded", "{newest:#?}");
    wait_until(
        b.ttl + Duration::from_secs(10),
        "the killed run's lock to free",
        || b.is_free(&key),
    );

    let runs = log_json(b, &key, 10);
    // The last is_free probe ran too.
    let runs: Vec<_> = runs
        .into_iter()
        .filter(|r| r["command"].as_str() != Some("true"))
        .collect();
    assert_eq!(runs.len(), 5, "{runs:#?}");
    assert_eq!(runs[0]["state"], "no end recorded", "{:#?}", runs[0]);
    assert_eq!(runs[0]["pid"], killed_pid, "{:#?}", runs[0]);
    assert_eq!(runs[1]["ending"]["code"], 79, "{:#?}", runs[1]);
    assert!(runs[1]["ending"]["lost"].is_string(), "{:#?}", runs[1]);
    for (run, code) in runs[2..].iter().zip([143, 3, 0]) {
        assert_eq!(run["state"], "ended", "{run:#?}");
        assert_eq!(run["ending"]["code"], code, "{run:#?}");
        assert!(run["duration_ms"].is_u64(), "{run:#?}");
        assert!(
            run["started_ms"].is_u64() && run["host"].is_string(),
            "{run:#?}"
        );
    }
    let started: Vec<u64> = runs
        .iter()
        .map(|r| r["started_ms"].as_u64().unwrap())
        .collect();
    assert!(
        started.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {started:?}"
    );

    let text = run_ok(b.cmd("log").args(["-k", &key]));
    let text = String::from_utf8_lossy(&text.stdout);
    for want in [
        "no end recorded",
        "lock lost (exit 79)",
        "exit 143",
        "exit 3",
        "exit 0",
    ] {
        assert!(text.contains(want), "log must show '{want}':\n{text}");
    }
    // status shows the last run.
    let status = b.status(&key);
    assert_eq!(status["last_run"]["command"], "true", "{status:#}");
}

/// More runs than the history keeps: `log` shows the newest, and the server holds no more than
/// the bound.
pub(crate) fn history_keeps_only_the_newest_runs(b: &TestBackend, n: &Native) {
    // 115 runs leave 230 events unpruned: more than a backend may keep, even one that prunes
    // only every few runs.
    let key = unique_key("cap");
    for i in 1..=115 {
        run_ok(&mut b.run(&key, &[], &["true", &i.to_string()]));
    }
    let runs = log_json(b, &key, 100);
    assert_eq!(runs.len(), 100);
    assert_eq!(runs[0]["command"], "true 115");
    assert_eq!(runs[99]["command"], "true 16");
    let stored = (n.count)(b, &key);
    assert!(
        (200..=MAX_STORED_EVENTS).contains(&stored),
        "{stored} events stored for 115 runs"
    );
}

/// A forged record — oversized, or with terminal escapes — is shown escaped and capped: no
/// control character reaches the terminal, no line grows without bound, nothing panics.
pub(crate) fn forged_history_records_are_shown_escaped_and_capped(b: &TestBackend, n: &Native) {
    let key = unique_key("forged");
    run_ok(&mut b.run(&key, &[], &["true"]));
    let evil = "\u{1b}[2J\u{1b}]0;pwned\u{7}\u{202e}";
    let start = serde_json::json!({
        "run": "f00", "ev": "start", "host": format!("{evil}host"),
        "pid": 1, "command": format!("{evil}{}", "x".repeat(3000)), "reason": evil,
    });
    let end = serde_json::json!({
        "run": "f00", "ev": "end", "ending": {"code": 7, "lost": evil, "signal": -5}
    });
    (n.forge)(b, &key, start.to_string().as_bytes());
    (n.forge)(b, &key, end.to_string().as_bytes());
    let huge = format!(
        "{{\"run\":\"f01\",\"ev\":\"start\",\"host\":\"{}\"}}",
        "h".repeat(60_000)
    );
    (n.forge)(b, &key, huge.as_bytes());
    (n.forge)(b, &key, b"\x1b[31mnot json at all\xff\xfe");

    for args in [&["log", "-k"][..], &["status", "-k"][..]] {
        let out = run_ok(b.cmd(args[0]).args(&args[1..]).arg(&key));
        let text = String::from_utf8(out.stdout.clone()).expect("UTF-8 text");
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "control characters reached the terminal:\n{text:?}"
        );
        assert!(text.lines().all(|l| l.chars().count() < 2000), "{text}");
        assert!(out.stderr.is_empty(), "{}", describe(&out));
    }
    let text = String::from_utf8(run_ok(b.cmd("log").args(["-k", &key])).stdout).unwrap();
    assert!(text.contains("\\x1b[2J"), "escaped, not dropped:\n{text}");
    assert!(
        text.contains("unreadable record (over the 4096-byte cap: {\"run\""),
        "{text}"
    );
    assert!(text.contains(" bytes: \\x1b[31mnot json at all"), "{text}");
    let runs = log_json(b, &key, 10);
    assert_eq!(runs.len(), 4, "{runs:#?}");
    assert_eq!(runs[0]["state"], "unreadable");
    assert_eq!(runs[1]["state"], "unreadable");
    assert_eq!(runs[2]["run"], "f00");
    assert_eq!(runs[2]["ending"]["code"], 7);
    assert!(runs[2]["command"].as_str().unwrap().chars().count() <= 257);
    assert_eq!(runs[3]["command"], "true");
}

/// `--no-history` and `DLOCK_NO_HISTORY=1` leave nothing; `--once-per` refuses to work without
/// history.
pub(crate) fn no_history_leaves_no_record(b: &TestBackend, n: &Native) {
    let key = unique_key("no-history");
    run_ok(&mut b.run(&key, &["--no-history"], &["true"]));
    run_ok(b.run(&key, &[], &["true"]).env("DLOCK_NO_HISTORY", "1"));
    assert_eq!((n.count)(b, &key), 0);
    assert!(log_json(b, &key, 5).is_empty());
    let out = output(&mut b.run(&key, &["--no-history", "--once-per", "1m"], &["true"]));
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    run_ok(b.run(&key, &[], &["true"]).env("DLOCK_NO_HISTORY", "0"));
    assert_eq!(log_json(b, &key, 5).len(), 1);
    // --once-per on the command line wins over a global DLOCK_NO_HISTORY.
    let mut once = b.run(&key, &["--once-per", "1h"], &["true"]);
    let out = output(once.env("DLOCK_NO_HISTORY", "1"));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
}

/// `dlock acquire --once-per`: a section held and released is one run ("released", exit 0);
/// a second acquire within DUR fails with 75 and names it; `break` is a loss (79).
pub(crate) fn acquire_once_per_and_its_runs_in_the_log(b: &TestBackend, _n: &Native) {
    use crate::acquire::{acquire_detached, cmd, release};
    let key = unique_key("acquire-once");
    let (handle, holder) = acquire_detached(b, "1m", &["-k", &key, "--once-per", "1h"]);
    run_ok(&mut release(&handle));
    let ttl = format!("{}ms", b.ttl.as_millis());
    let out = output(cmd(b, "acquire").args([
        "-k",
        &key,
        "--ttl",
        &ttl,
        "--once-per",
        "1h",
        "--owner",
        "none",
        "--max-hold",
        "1m",
    ]));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    // (A young test server's hold-back may say so first.)
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("dlock: skipped: ") && last.contains(&format!("pid {holder}")),
        "{}",
        describe(&out)
    );
    assert!(b.is_free(&key), "a skipped acquire holds nothing");
    let (handle, _) = acquire_detached(b, "1m", &["-k", &key]);
    run_ok(b.cmd("break").args(["-k", &key]));
    wait_until(
        b.notice + Duration::from_secs(10),
        "the holder to notice",
        || log_json(b, &key, 1)[0]["state"] == "ended",
    );
    let _ = output(&mut release(&handle));
    let runs = log_json(b, &key, 10);
    let runs: Vec<_> = runs
        .iter()
        .filter(|r| r["command"].as_str() != Some("true"))
        .collect();
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert_eq!(runs[0]["ending"]["code"], 79, "{:#?}", runs[0]);
    assert!(runs[0]["ending"]["lost"].is_string(), "{:#?}", runs[0]);
    assert_eq!(runs[1]["ending"]["code"], 0, "{:#?}", runs[1]);
    assert_eq!(runs[1]["pid"], holder, "{:#?}", runs[1]);
}

/// A command line that escapes to more than the event cap (1,024 control characters, 6 bytes
/// each in JSON) is cut until its start fits: it still reads as a start, and `--once-per` sees it.
pub(crate) fn a_start_with_a_huge_command_still_counts(b: &TestBackend, _n: &Native) {
    let key = unique_key("huge-command");
    let arg = "\u{1}".repeat(2000);
    run_ok(&mut b.run(&key, &["--once-per", "1h"], &["true", &arg]));
    let out = output(&mut b.run(&key, &["--once-per", "1h"], &["true"]));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let runs = log_json(b, &key, 5);
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["state"], "ended", "{runs:#?}");
}

/// The file backend's hooks: `NAME.history` beside the lock file, one `MS BODY` line per event.
pub(crate) fn file_native() -> Native {
    fn path(b: &TestBackend, key: &str) -> std::path::PathBuf {
        let url = b.args.iter().find(|a| a.starts_with("file://")).unwrap();
        Path::new(url.trim_start_matches("file://")).join(format!("{key}.history"))
    }
    Native {
        forge: |b, key, body| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(path(b, key))
                .unwrap();
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            let mut line = format!("{ms} ").into_bytes();
            line.extend_from_slice(body);
            line.push(b'\n');
            f.write_all(&line).unwrap();
        },
        count: |b, key| {
            std::fs::read(path(b, key))
                .map(|t| t.split(|&c| c == b'\n').filter(|l| !l.is_empty()).count())
                .unwrap_or(0)
        },
    }
}

/// The Redis ports a backend's `--url`s name (one, or each Redlock master's).
fn redis_ports(b: &TestBackend) -> Vec<String> {
    b.args
        .iter()
        .filter(|a| a.starts_with("redis://"))
        .filter_map(|a| {
            a.rsplit(':')
                .next()
                .map(|p| p.trim_end_matches('/').to_string())
        })
        .collect()
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// `redis-cli` (following Cluster redirections) on `port`.
fn redis_cli(port: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-c", "-p", port])
        .args(args)
        .output()
        .expect("redis-cli");
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn redis_forge(port: &str, key: &str, body: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let mut entry = format!("{} ", now_ms()).into_bytes();
    entry.extend_from_slice(body);
    let list = format!("dlock:{{{key}}}:runs");
    redis_cli(
        port,
        &[
            "LPUSH".as_ref(),
            list.as_ref(),
            std::ffi::OsStr::from_bytes(&entry),
        ],
    );
}

fn redis_count(port: &str, key: &str) -> usize {
    let list = format!("dlock:{{{key}}}:runs");
    redis_cli(port, &["LLEN".as_ref(), list.as_ref()])
        .parse()
        .unwrap()
}

/// Redis, a Cluster (through its first node) or Redlock (every master) named by `--url`: the
/// list `dlock:{KEY}:runs`, with `redis-cli`.
pub(crate) fn redis_native() -> Native {
    Native {
        forge: |b, key, body| {
            for port in redis_ports(b) {
                redis_forge(&port, key, body);
            }
        },
        count: |b, key| redis_count(&redis_ports(b)[0], key),
    }
}

/// Redis behind Sentinel: the same list on the current primary.
pub(crate) fn sentinel_native() -> Native {
    fn port() -> String {
        crate::servers::shared_redis_sentinel()
            .unwrap()
            .primary_port()
            .to_string()
    }
    Native {
        forge: |_, key, body| redis_forge(&port(), key, body),
        count: |_, key| redis_count(&port(), key),
    }
}

/// A start dated in the future: more than DUR ahead (a clock that went back) it does not count;
/// less far ahead it counts as just now. A start without a time does not count. An event
/// appended to a file whose last line is torn (no newline) is still read.
pub(crate) fn file_starts_with_odd_times_and_torn_lines(b: &TestBackend, n: &Native) {
    let key = unique_key("odd-times");
    let start = |dt_ms: i128| {
        let at = now_ms() as i128 + dt_ms;
        format!("{at} {{\"run\":\"x{at}\",\"ev\":\"start\",\"host\":\"h\",\"pid\":1}}\n")
    };
    let path = {
        let url = b.args.iter().find(|a| a.starts_with("file://")).unwrap();
        Path::new(url.trim_start_matches("file://")).join(format!("{key}.history"))
    };
    std::fs::write(&path, start(86_400_000)).unwrap();
    run_ok(&mut b.run(&key, &["--once-per", "1h"], &["true"]));
    std::fs::write(&path, start(10_000)).unwrap();
    run_code(&mut b.run(&key, &["--once-per", "1h"], &["true"]), 75);
    std::fs::write(&path, "garbage {\"run\":\"y\",\"ev\":\"start\"}\n").unwrap();
    run_ok(&mut b.run(&key, &["--once-per", "1h"], &["true"]));
    // Torn: no newline at the end.
    std::fs::write(&path, "1700000000000 {\"run\":\"z\",\"ev\":\"st").unwrap();
    run_ok(&mut b.run(&key, &["--once-per", "1h"], &["true", "after-torn"]));
    run_code(&mut b.run(&key, &["--once-per", "1h"], &["true"]), 75);
    assert_eq!(log_json(b, &key, 5)[0]["command"], "true after-torn");
    assert_eq!(
        (n.count)(b, &key),
        3,
        "the torn line, the start and the end"
    );
}

/// A run's record carries its effective uid beside the user its environment names: `$USER`
/// is anyone's to set.
#[test]
fn the_log_carries_the_effective_uid_whatever_user_says() {
    let b = TestBackend::file();
    let key = unique_key("log-uid");
    run_ok(b.run(&key, &[], &["true"]).env("USER", "mallory"));
    let runs = log_json(&b, &key, 1);
    assert_eq!(runs[0]["user"], "mallory", "{:?}", runs[0]);
    // SAFETY: geteuid takes nothing and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(runs[0]["uid"], uid, "{:?}", runs[0]);
}
