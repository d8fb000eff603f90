//! Every error a user can meet is one plain sentence (issue 39): what happened, where, and what
//! to do — no library type names, no `(os error N)`. One table walks the cases that said
//! otherwise, against real servers and real paths.

use std::time::Duration;

use crate::servers::{shared_mariadb, shared_redis};
use crate::util::*;

/// Words that are a library's, not the user's: type and variant names, Rust's error number.
const LIBRARY_WORDS: &[&str] = &[
    "os error",
    "Error {",
    "Kind",
    "InvalidClientConfig",
    "Incompatible type",
    "Parse error",
    "RedisError",
    "io::",
    "IO error: `",
    "Resource temporarily unavailable",
    "Custom {",
];

#[test]
fn every_error_is_one_plain_sentence_naming_where() {
    let (Some(redis), Some(mariadb)) = (shared_redis(), shared_mariadb()) else {
        return;
    };
    let redis_port = redis.rsplit(':').next().unwrap().to_string();
    let redis_addr = format!("127.0.0.1:{redis_port}");
    let mariadb_addr = format!("127.0.0.1:{}", mariadb.port);
    let dir = scratch("errors");
    let no_sock = dir.join("no.sock").display().to_string();
    let no_dir = "/proc/dlock-no-such-dir".to_string();
    // (URL, exit code, what the line must name, words it must hold)
    let cases: Vec<(String, i32, String, &str)> = vec![
        // Something that is not Redis answered (MariaDB's greeting).
        (
            format!("redis://{mariadb_addr}"),
            69,
            mariadb_addr.clone(),
            "did not answer as Redis",
        ),
        // A URL form redis-rs cannot read.
        (
            "redis:/host".into(),
            2,
            "redis:/host".into(),
            "expected redis://",
        ),
        // TLS against a plain server.
        (
            format!("rediss://{redis_addr}"),
            69,
            redis_addr.clone(),
            "TLS",
        ),
        // A plain server that is not MySQL (a Redis says nothing first).
        (
            format!("mysql://u@{redis_addr}/db"),
            69,
            redis_addr.clone(),
            "MySQL",
        ),
        // The system's errors, in words.
        (
            format!("redis+unix://{no_sock}"),
            69,
            no_sock.clone(),
            "no such file",
        ),
        (
            "redis://127.0.0.1:1".into(),
            69,
            "127.0.0.1:1".into(),
            "refused",
        ),
        (
            format!("file://{no_dir}"),
            69,
            no_dir.clone(),
            "no such file",
        ),
    ];
    std::thread::scope(|s| {
        let runs: Vec<_> = cases
            .iter()
            .map(|(url, code, names, says)| {
                s.spawn(move || {
                    let mut cmd = dlock();
                    cmd.args(["run", "-n", "--url", url, "-k", "x", "--", "true"]);
                    let p = Proc::spawn(&mut cmd);
                    let (out, took) = p.wait(Duration::from_secs(10));
                    (url, *code, names, *says, out, took)
                })
            })
            .collect();
        for run in runs {
            let (url, code, names, says, out, took) = run.join().unwrap();
            assert_eq!(out.status.code(), Some(code), "{url}: {}", describe(&out));
            let line = one_error_line(&out);
            for w in LIBRARY_WORDS {
                assert!(!line.contains(w), "{url}: {w:?} in {line}");
            }
            assert!(
                line.contains(names.as_str()),
                "{url}: the line does not name {names}: {line}"
            );
            assert!(
                line.to_lowercase().contains(&says.to_lowercase()),
                "{url}: {says:?} not in {line}"
            );
            assert!(took < Duration::from_secs(6), "{url}: {took:?}");
        }
    });
}
