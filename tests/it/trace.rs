//! `DLOCK_TRACE=stages` (docs/design.md, "Where the time goes") and the `run` parser's short
//! path: the stages come in order, once each, only when asked; help, version and errors of
//! `dlock run` are the whole parser's.

use crate::servers::shared_redis;
use crate::util::*;

/// The stages of a run's stderr, as (name, micros since the previous one, at).
fn stages(stderr: &[u8]) -> Vec<(String, u64, u64)> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("dlock: stage ")?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(words.len(), 5, "a stage line: {l}");
            assert_eq!((words[2], words[3]), ("us", "(at"), "{l}");
            let at = words[4].strip_suffix(')').unwrap().parse().unwrap();
            Some((words[0].to_string(), words[1].parse().unwrap(), at))
        })
        .collect()
}

fn names(s: &[(String, u64, u64)]) -> Vec<&str> {
    s.iter().map(|s| s.0.as_str()).collect()
}

/// Each `at` is the previous one plus the stage's micros, and the stages span the run.
fn adds_up(s: &[(String, u64, u64)]) {
    assert_eq!(s[0].1, 0, "{s:?}");
    for w in s.windows(2) {
        assert_eq!(w[1].2, w[0].2 + w[1].1, "{s:?}");
    }
}

#[test]
fn a_run_prints_its_stages_in_order_only_when_asked() {
    let b = TestBackend::file();
    let key = unique_key("trace");
    let out = run_ok(b.run(&key, &[], &["true"]).env("DLOCK_TRACE", "stages"));
    let s = stages(&out.stderr);
    assert_eq!(
        names(&s),
        [
            "start", "parse", "setup", "lock", "history", "guardian", "spawn", "command",
            "release", "done"
        ],
        "{}",
        describe(&out)
    );
    adds_up(&s);
    // Every line is a stage's: nothing else is printed.
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().count(),
        s.len()
    );

    // Without a history the stage is there all the same (and takes nothing): tables of runs
    // with and without line up.
    let no_history = run_ok(
        b.run(&key, &["--no-history"], &["true"])
            .env("DLOCK_TRACE", "stages"),
    );
    assert_eq!(
        names(&stages(&no_history.stderr)),
        names(&s),
        "{}",
        describe(&no_history)
    );

    for off in [None, Some("1"), Some("stage")] {
        let mut c = b.run(&key, &[], &["true"]);
        if let Some(v) = off {
            c.env("DLOCK_TRACE", v);
        }
        let out = run_ok(&mut c);
        assert!(
            out.stderr.is_empty(),
            "DLOCK_TRACE={off:?}: {}",
            describe(&out)
        );
    }
}

#[test]
fn a_network_run_notes_its_connection_once() {
    let Some(url) = shared_redis() else { return };
    let b = TestBackend::redis(&url);
    let out = run_ok(
        b.run(&unique_key("trace"), &[], &["true"])
            .env("DLOCK_TRACE", "stages"),
    );
    let s = stages(&out.stderr);
    assert_eq!(
        names(&s),
        [
            "start", "parse", "setup", "connect", "lock", "history", "guardian", "spawn",
            "command", "release", "done"
        ],
        "{}",
        describe(&out)
    );
    adds_up(&s);
}

/// The short path parses `run` alone; whatever it does not accept is the whole parser's.
#[test]
fn run_help_version_and_errors_come_from_the_whole_parser() {
    let out = run_ok(dlock().args(["run", "-k", "x", "--help"]));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("guardian process kills"),
        "run's long help: {help}"
    );
    assert!(help.contains("Exit status"), "{help}");

    let out = run_ok(dlock().args(["run", "-V"]));
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.starts_with("dlock-run "), "{}", describe(&out));

    let out = run_code(dlock().args(["run", "--kye", "x", "--", "true"]), 2);
    let line = one_error_line(&out);
    assert!(line.contains("did you mean '--key'?"), "{line}");
    let out = run_code(dlock().args(["run", "-k", "x"]), 2);
    assert!(
        one_error_line(&out).contains("COMMAND"),
        "{}",
        describe(&out)
    );
}
