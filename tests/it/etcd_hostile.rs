//! A fake etcd gateway that answers every request with what a test gives it: malformed HTTP
//! framings and etcd replies with fields missing. Whatever it says, dlock ends with exit 69 and
//! one `dlock:` line — never a panic (exit 134 in a release build), never the command run on a
//! lock it does not hold.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::util::*;

/// The reply to one request (by its path).
type Answer = Arc<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

/// A fake on a free loopback port, answering each request with `answer(path)`; lives as long
/// as the test binary (its threads end with it).
fn fake(answer: Answer) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let answer = answer.clone();
            thread::spawn(move || {
                let _ = client.set_read_timeout(Some(Duration::from_secs(10)));
                let mut out = client.try_clone().unwrap();
                let mut r = BufReader::new(client);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let mut length = 0;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    if out.write_all(&answer(&path)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// `dlock run -n` against the fake; its output (the command writes `ran` into `marker`).
fn run_against(port: u16, marker: &std::path::Path) -> std::process::Output {
    let p = Proc::spawn(
        dlock()
            .args(["run", "--url", &format!("etcd://127.0.0.1:{port}")])
            .args(["-k", &unique_key("etcd-hostile"), "-n", "--"])
            .args(sh(&format!("echo ran > {}", marker.display()))),
    );
    p.wait(Duration::from_secs(20)).0
}

fn assert_one_line_69(out: &std::process::Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let what = format!("{what}: {}", describe(out));
    assert_eq!(out.status.code(), Some(69), "{what}");
    assert_eq!(err.lines().count(), 1, "{what}");
    assert!(err.starts_with("dlock: "), "{what}");
    assert!(!err.contains("panicked"), "{what}");
}

/// Malformed HTTP framings of the first reply. Regression: a chunk size of
/// `fffffffffffffffe` after a 5-byte chunk wrapped `body.len() + size`, passed the size check,
/// and slicing the body panicked (exit 134).
#[test]
fn malformed_http_framing_is_69_without_a_panic() {
    let ok = r#"{"header":{"revision":"1"},"ID":"7","TTL":"60"}"#;
    let framings: Vec<(&str, Vec<u8>)> = vec![
        (
            "chunk size that wraps the length",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nfffffffffffffffe\r\nxx"
                .to_vec(),
        ),
        (
            "chunk size over 64 bits",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\nxx".to_vec(),
        ),
        (
            "negative Content-Length",
            format!("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{ok}").into_bytes(),
        ),
        (
            "overflowing Content-Length",
            format!("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n{ok}")
                .into_bytes(),
        ),
        (
            "chunk extension garbage",
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x};\x01\x7f==\r\n{ok}\r\n0\r\n\r\n",
                ok.len()
            )
            .into_bytes(),
        ),
        (
            "chunk size with a sign",
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+{:x}\r\n{ok}\r\n0\r\n\r\n",
                ok.len()
            )
            .into_bytes(),
        ),
        (
            "no CRLF after the chunk data",
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{ok}XY0\r\n\r\n",
                ok.len()
            )
            .into_bytes(),
        ),
    ];
    let dir = scratch("etcd-framing");
    for (what, reply) in framings {
        let port = fake(Arc::new(move |_| reply.clone()));
        let marker = dir.join("ran");
        let out = run_against(port, &marker);
        assert_one_line_69(&out, what);
        assert!(!marker.exists(), "{what}: the command ran");
    }
}

fn reply(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// etcd replies without the revisions the queue is ordered by. Regression: a missing field read
/// as 0, and an own key of revision 0 has no older key: "held", and the command ran.
#[test]
fn replies_without_revisions_never_run_the_command() {
    let txns = [
        (
            "a failed compare, the own key without create_revision",
            r#"{"header":{"revision":"9"},"responses":[{"response_range":{"kvs":[{"key":"eA=="}]}},{"response_range":{}}]}"#,
        ),
        (
            "a put without the header's revision",
            r#"{"header":{},"succeeded":true,"responses":[{"response_put":{}},{"response_range":{}}]}"#,
        ),
        (
            "no header",
            r#"{"succeeded":true,"responses":[{"response_put":{}},{"response_range":{}}]}"#,
        ),
        (
            "a revision that is not a number",
            r#"{"header":{"revision":"x"},"succeeded":true,"responses":[{"response_put":{}},{"response_range":{}}]}"#,
        ),
    ];
    let dir = scratch("etcd-revisions");
    for (what, txn) in txns {
        let port = fake(Arc::new(move |path| match path {
            "/v3/lease/grant" => reply(r#"{"header":{"revision":"1"},"ID":"7","TTL":"60"}"#),
            "/v3/kv/txn" => reply(txn),
            _ => reply(r#"{"header":{"revision":"1"}}"#),
        }));
        let marker = dir.join("ran");
        let out = run_against(port, &marker);
        assert!(
            !marker.exists(),
            "{what}: the command ran: {}",
            describe(&out)
        );
        assert_one_line_69(&out, what);
    }
}

/// A watch the server cancels (etcd sends `canceled` with a reason — permission denied, a
/// compacted revision — and keeps the stream open) ends the wait with exit 69 and the reason.
/// Regression: the message was taken for "nothing deleted yet", and the run waited in silence
/// until its `--wait` ran out (75).
#[test]
fn a_canceled_watch_is_an_error_not_a_silent_wait() {
    let watch = {
        let mut stream =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        for msg in [
            r#"{"result":{"header":{"revision":"5"},"created":true}}"#,
            r#"{"result":{"header":{"revision":"5"},"canceled":true,"cancel_reason":"permission denied"}}"#,
        ] {
            let line = format!("{msg}\n");
            stream.extend_from_slice(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes());
        }
        stream
    };
    let key = unique_key("etcd-canceled");
    let older = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("dlock/{key}/1"))
    };
    // Created at revision 5, behind an older key of the lock, of revision 3.
    let txn = format!(
        r#"{{"header":{{"revision":"5"}},"succeeded":true,"responses":[{{"response_put":{{}}}},
        {{"response_range":{{"kvs":[{{"key":"{older}","create_revision":"3","lease":"1"}}]}}}}]}}"#
    );
    let port = fake(Arc::new(move |path| match path {
        "/v3/lease/grant" => reply(r#"{"header":{"revision":"1"},"ID":"7","TTL":"60"}"#),
        "/v3/kv/txn" => reply(&txn),
        "/v3/watch" => watch.clone(),
        _ => reply(r#"{"header":{"revision":"5"}}"#),
    }));
    let dir = scratch("etcd-canceled");
    let marker = dir.join("ran");
    let started = std::time::Instant::now();
    let p = Proc::spawn(
        dlock()
            .args(["run", "--url", &format!("etcd://127.0.0.1:{port}")])
            .args(["-k", &key, "--wait", "5s", "--"])
            .args(sh(&format!("echo ran > {}", marker.display()))),
    );
    let (out, _) = p.wait(Duration::from_secs(20));
    assert!(!marker.exists(), "the command ran: {}", describe(&out));
    assert_one_line_69(&out, "a canceled watch");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("permission denied"),
        "{}",
        describe(&out)
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}
