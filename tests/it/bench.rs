//! `dlock bench` on every backend, called from each backend's file with a way to list what the
//! benchmark may have left on that backend (lock files, keys, rows, nodes).

use std::time::Duration;

use crate::util::*;

/// The words that name the benchmark's keys (`dlock-bench-HOST-PID-{solo,shared}`).
pub(crate) const KEY_WORD: &str = "dlock-bench-";

/// A short run measures both phases, prints sane JSON and leaves nothing behind; the table
/// form prints the two phases and a verdict; Ctrl-C in the hand-off phase exits 130 and
/// leaves nothing behind either.
pub(crate) fn measures_and_leaves_nothing_behind(
    b: &TestBackend,
    leftovers: &dyn Fn() -> Vec<String>,
) {
    let out = run_ok(
        b.cmd("bench")
            .args(["--ops", "40", "--clients", "4", "--json"]),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON line: {text}");
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["backend"], b.name, "{r}");
    assert_eq!(r["clients"], 4, "{r}");
    assert_eq!(r["uncontended"]["n"], 40, "{r}");
    // Every acquisition but the first in the hand-off phase takes over from a waiting client.
    assert!(r["handoff"]["n"].as_u64().unwrap() >= 35, "{r}");
    for phase in ["uncontended", "handoff"] {
        let p = &r[phase];
        let q: Vec<f64> = ["p50_ms", "p90_ms", "p99_ms", "max_ms"]
            .iter()
            .map(|k| p[k].as_f64().unwrap())
            .collect();
        assert!(q[0] > 0.0 && q.windows(2).all(|w| w[0] <= w[1]), "{r}");
        assert!(p["acquisitions_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        ["ok", "slow"].contains(&r["verdict"].as_str().unwrap()),
        "{r}"
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "the benchmark cleans up");

    let out = run_ok(b.cmd("bench").args(["--ops", "5", "--clients", "2"]));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with(&format!("dlock bench: {} (", b.name)),
        "{text}"
    );
    assert!(
        lines[1].starts_with("uncontended") && lines[1].contains("p99"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("hand-off") && lines[2].contains("p50"),
        "{text}"
    );
    assert!(lines[3].starts_with("verdict: "), "{text}");
    assert!(out.stderr.is_empty(), "no progress bar off a terminal");
    assert_eq!(leftovers(), Vec::<String>::new(), "the benchmark cleans up");

    // Each phase runs 3 s: the hand-off phase has begun once its key exists, and has seconds
    // to go when the interrupt comes.
    let p = Proc::spawn(b.cmd("bench").args(["--duration", "3s", "--clients", "4"]));
    wait_until(Duration::from_secs(10), "the hand-off phase", || {
        leftovers().iter().any(|k| k.contains("-shared"))
    });
    p.signal(libc::SIGINT);
    let (out, _) = p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "an interrupted benchmark cleans up"
    );
}

/// Keys of the benchmark on the Redis server at `url`.
pub(crate) fn redis_leftovers(url: &str) -> Vec<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-u", url, "--scan", "--pattern", &format!("*{KEY_WORD}*")])
        .output()
        .expect("redis-cli");
    assert!(out.status.success(), "redis-cli --scan failed");
    let mut keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    keys.sort();
    keys
}
