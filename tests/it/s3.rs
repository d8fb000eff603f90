//! The S3 backend against a real SeaweedFS started by the harness, with a signed identity; and
//! against a server that ignores conditional writes (a fake, for the refusal only).

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use crate::servers::{S3_BUCKET, S3_SECRET, SeaweedFs, shared_seaweedfs};
use crate::util::*;

/// The shared server as a test backend, under PREFIX `ci`.
fn s3_on(s: &SeaweedFs) -> TestBackend {
    TestBackend::s3(&format!("s3://{S3_BUCKET}/ci"), s.env())
}

crate::conformance!(match shared_seaweedfs() {
    Some(s) => s3_on(s),
    None => return,
});

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_seaweedfs() {
        Some(s) => s3_on(s),
        None => return,
    });
}

/// Several keys, nested runs; `--shared` and `--limit` are refused (exit 2).
mod modes {
    use super::*;

    crate::modes!(match shared_seaweedfs() {
        Some(s) => s3_on(s),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_seaweedfs() {
        Some(s) => s3_on(s),
        None => return,
    });
}

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_seaweedfs() {
            Some(s) => s3_on(s),
            None => return,
        },
        s3_native()
    );
}

/// `curl` with SigV4 on `object` (under the bucket) of the shared server: the body it prints.
fn curl_object(object: &str, extra: &[&str]) -> Vec<u8> {
    let s = shared_seaweedfs().expect("the shared SeaweedFS");
    let url = format!("http://127.0.0.1:{}/{S3_BUCKET}/{object}", s.port);
    let out = std::process::Command::new("curl")
        .args(["-s", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
        .arg(format!("{}:{S3_SECRET}", crate::servers::S3_KEY_ID))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .args(extra)
        .arg(&url)
        .output()
        .unwrap();
    out.stdout
}

/// The history hooks, with curl: the document `ci/<key>.history` (the test keys need no
/// escaping), `{"dlock":1,"events":["MS BODY", …]}`, oldest first.
pub(crate) fn s3_native() -> crate::history::Native {
    fn events(key: &str) -> Vec<serde_json::Value> {
        let doc = curl_object(&format!("ci/{key}.history"), &[]);
        serde_json::from_slice::<serde_json::Value>(&doc)
            .ok()
            .and_then(|d| d["events"].as_array().cloned())
            .unwrap_or_default()
    }
    crate::history::Native {
        forge: |_, key, body| {
            let mut all = events(key);
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            // A JSON string holds text only: bytes that are not UTF-8 become U+FFFD.
            all.push(format!("{ms} {}", String::from_utf8_lossy(body)).into());
            let doc = serde_json::json!({"dlock": 1, "events": all}).to_string();
            let path = format!("ci/{key}.history");
            curl_object(&path, &["-X", "PUT", "--data-binary", &doc]);
            assert_eq!(events(key).len(), all.len(), "the forged event is stored");
        },
        count: |_, key| events(key).len(),
    }
}

/// Faults under a contending workload (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(match shared_seaweedfs() {
        Some(s) => s3_on(s),
        None => return,
    });
}

/// The server paused for twice the TTL under a contending workload: nobody overlaps, tokens
/// grow, the workload goes on.
#[test]
fn fault_server_paused() {
    let Some(server) = SeaweedFs::start() else {
        return;
    };
    crate::faults::server_paused(&s3_on(&server), &|on| server.freeze(on));
}

/// The server killed and restarted under a contending workload (its objects are on disk): nobody
/// overlaps, tokens keep growing across the restart.
#[test]
fn fault_server_killed_and_restarted() {
    let Some(mut server) = SeaweedFs::start() else {
        return;
    };
    let b = s3_on(&server);
    crate::faults::server_killed_and_restarted(&b, &mut || server.restart());
}

/// The server stops answering (SIGSTOP) for longer than the TTL: the command is stopped before
/// a waiter could have watched a whole lease.
#[test]
fn server_paused_longer_than_the_ttl_stops_the_command_in_time() {
    let Some(server) = SeaweedFs::start() else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..s3_on(&server)
    };
    crate::conformance::paused_server_stops_the_command_in_time(&b, |on| server.freeze(on));
}

/// The issue's case: frozen 4 s under `--ttl 2s`: the command is dead within 2 s of the
/// freeze and dlock exits 79.
#[test]
fn server_frozen_4s_under_ttl_2s_ends_with_79() {
    let Some(server) = SeaweedFs::start() else {
        return;
    };
    let b = s3_on(&server);
    let (p, child) = b.hold(&unique_key("frozen"), &[]);
    server.freeze(true);
    let frozen = Instant::now();
    let died = wait_until(Duration::from_secs(4), "the command to be stopped", || {
        !alive(child)
    });
    let (out, _) = p.wait(Duration::from_secs(10));
    let waited = frozen.elapsed();
    if waited < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_secs(4) - waited);
    }
    server.freeze(false);
    assert!(
        died < Duration::from_secs(2),
        "the command lived {died:?} after the freeze"
    );
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
}

/// A wrong secret: 69, one line, and the secret is never printed (not even the wrong one).
#[test]
fn wrong_secret_is_69_and_never_printed() {
    let Some(s) = shared_seaweedfs() else { return };
    let wrong = "wrong-secret-5e1f0c";
    let mut env = s.env();
    for (k, v) in &mut env {
        if k == "AWS_SECRET_ACCESS_KEY" {
            *v = wrong.into();
        }
    }
    let b = TestBackend::s3(&format!("s3://{S3_BUCKET}/ci"), env);
    let dir = scratch("s3-wrong");
    let m = dir.join("ran");
    let out = run_code(
        &mut b.run(
            &unique_key("wrong"),
            &[],
            &sh(&format!("touch {}", m.display())),
        ),
        69,
    );
    let line = one_error_line(&out);
    assert!(line.contains("403"), "{line}");
    let all = describe(&out);
    assert!(!all.contains(wrong) && !all.contains(S3_SECRET), "{all}");
    assert!(!m.exists(), "the command ran");
    for sub in ["status", "doctor"] {
        let out = output(b.cmd(sub).args(["-k", "x"]));
        let all = describe(&out);
        assert!(
            !all.contains(wrong) && !all.contains(S3_SECRET),
            "{sub}: {all}"
        );
    }
}

/// A server that accepts `If-None-Match: *` and `If-Match` and ignores them (as several
/// S3-compatible servers do): refused with 78 before the command runs; `doctor` says why.
#[test]
fn a_server_that_ignores_conditions_is_refused_with_78() {
    // Every request 200 with an ETag, whatever its conditions (and 404 to a GET).
    let port = fake_s3(|req| match req.method.as_str() {
        "GET" => ("404 Not Found", None, Vec::new()),
        _ => ("200 OK", Some("\"abc\""), Vec::new()),
    });
    let env = vec![
        ("AWS_ACCESS_KEY_ID".to_string(), "AK".to_string()),
        ("AWS_SECRET_ACCESS_KEY".into(), "SK".into()),
        (
            "AWS_ENDPOINT_URL".into(),
            format!("http://127.0.0.1:{port}"),
        ),
    ];
    let b = TestBackend::s3("s3://careless/ci", env);
    let dir = scratch("s3-careless");
    let m = dir.join("ran");
    let out = run_code(
        &mut b.run(
            &unique_key("careless"),
            &[],
            &sh(&format!("touch {}", m.display())),
        ),
        78,
    );
    let line = one_error_line(&out);
    assert!(line.contains("ignores If-None-Match"), "{line}");
    assert!(!m.exists(), "the command ran");
    let out = output(&mut b.cmd("doctor"));
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("conditional writes"),
        "{}",
        describe(&out)
    );
}

/// `--no-wait` on a record whose holder died (kill -9 of the guardian's dlock leaves the record
/// held): fresh by the server's clock, busy at once; stale, the run watches the same ETag for a
/// whole lease on its own clock and then takes over — never before.
#[test]
fn no_wait_takes_over_a_dead_holder_only_after_watching_a_lease() {
    let Some(s) = shared_seaweedfs() else { return };
    let b = s3_on(s);
    let key = unique_key("no-wait-stale");
    let (p, _child) = b.hold(&key, &[]);
    p.signal(libc::SIGKILL);
    let t = Instant::now();
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let taken = Instant::now();
    let mut took = Duration::ZERO;
    wait_until(
        Duration::from_secs(20),
        "a --no-wait run to take over",
        || {
            let t = Instant::now();
            let ok = output(&mut b.run(&key, &["--no-wait"], &["true"]))
                .status
                .success();
            took = t.elapsed();
            ok
        },
    );
    assert!(
        took >= b.ttl,
        "took over after watching only {took:?} (lease {:?}; {:?} after the kill)",
        b.ttl,
        taken.elapsed()
    );
}

/// `status` shows what is left of a holder's lease by the server's clock (`Date` less the
/// record's `Last-Modified`, whole seconds): at most the lease, and not a renewal older.
#[test]
fn status_shows_the_lease_left_by_the_servers_clock() {
    let Some(s) = shared_seaweedfs() else { return };
    let b = TestBackend {
        ttl: Duration::from_secs(30),
        ..s3_on(s)
    };
    let key = unique_key("lease-left");
    let (p, _child) = b.hold(&key, &[]);
    let v = b.status(&key);
    let left = v["holders"][0]["lease_left_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no lease_left_ms: {v}"));
    // Renewed every 10 s; the server's clock counts whole seconds (one more, at a boundary).
    assert!((19_000..=30_000).contains(&left), "{left} ms: {v}");
    drop(p);
}

/// A script takes the same lock with a plain signed HTTP client (curl's SigV4, as the AWS CLI
/// would with `put-object --if-none-match '*'` / `--if-match`), by writing dlock's record: dlock
/// waits for it, and takes the lock, with the next token, once the script frees it.
#[test]
fn a_script_with_curl_takes_the_same_lock() {
    let Some(s) = shared_seaweedfs() else { return };
    let b = s3_on(s);
    let key = unique_key("curl");
    let url = format!("http://127.0.0.1:{}/{S3_BUCKET}/ci/{key}.lock", s.port);
    let curl = |extra: &[&str]| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-i", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{}:{S3_SECRET}", crate::servers::S3_KEY_ID))
            // curl 7.88 signs a body only when told how (else the server says 403).
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
            .args(extra)
            .arg(&url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let held =
        r#"{"dlock":1,"state":"held","counter":41,"beat":0,"ttl_ms":600000,"owner":"script"}"#;
    let put = curl(&["-X", "PUT", "-H", "If-None-Match: *", "--data-binary", held]);
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");
    let etag = put
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("etag:")
                .then(|| l[5..].trim().to_string())
        })
        .expect("an ETag");
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    let dir = scratch("s3-curl");
    let m = dir.join("token");
    let waiter = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!("echo $DLOCK_FENCING_TOKEN > {}", m.display())),
    ));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    let free = r#"{"dlock":1,"state":"free","counter":41,"beat":0,"ttl_ms":600000}"#;
    let put = curl(&[
        "-X",
        "PUT",
        "-H",
        &format!("If-Match: {etag}"),
        "--data-binary",
        free,
    ]);
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");
    let (out, _) = waiter.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(std::fs::read_to_string(&m).unwrap().trim(), "42");
}

/// A server that enforces both conditions but gives every version of an object the same ETag
/// (as an ETag made of size and second, or a gateway's constant, can): `If-Match` is then no
/// compare-and-swap, a holder's renewals leave the ETag as it was, and a waiter that watched it
/// for a lease takes over while the holder's command runs. The probe must refuse such a server
/// (78) before any command runs.
#[test]
fn a_server_whose_etag_never_changes_is_refused() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    // Both conditions enforced, but every version of an object has the ETag `"same"`.
    let store: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
    let port = fake_s3(move |req| {
        let mut objects = store.lock().unwrap();
        let same = Some("\"same\"");
        match req.method.as_str() {
            _ if req.target.contains('?') => (
                "200 OK",
                same,
                b"<ListBucketResult></ListBucketResult>".to_vec(),
            ),
            "GET" => match objects.get(&req.target) {
                Some(b) => ("200 OK", same, b.clone()),
                None => ("404 Not Found", same, Vec::new()),
            },
            "PUT" => {
                let exists = objects.contains_key(&req.target);
                let refused = (req.if_none_match && exists)
                    || req
                        .if_match
                        .as_ref()
                        .is_some_and(|m| !exists || m != "\"same\"");
                if refused {
                    ("412 Precondition Failed", same, Vec::new())
                } else {
                    objects.insert(req.target.clone(), req.body.clone());
                    ("200 OK", same, Vec::new())
                }
            }
            _ => {
                objects.remove(&req.target);
                ("204 No Content", same, Vec::new())
            }
        }
    });
    let env = vec![
        ("AWS_ACCESS_KEY_ID".to_string(), "AK".to_string()),
        ("AWS_SECRET_ACCESS_KEY".into(), "SK".into()),
        (
            "AWS_ENDPOINT_URL".into(),
            format!("http://127.0.0.1:{port}"),
        ),
    ];
    let b = TestBackend::s3("s3://same/ci", env);
    let dir = scratch("s3-same-etag");
    let (ran, done, overlap) = (dir.join("ran"), dir.join("done"), dir.join("overlap"));
    let key = unique_key("same-etag");
    let holder = Proc::spawn(&mut b.run(
        &key,
        &[],
        &sh(&format!(
            "touch {}; sleep 4; touch {}",
            ran.display(),
            done.display()
        )),
    ));
    let mut waiter = b.run(
        &key,
        &["--wait", "10s"],
        &sh(&format!(
            "test -e {} || touch {}",
            done.display(),
            overlap.display()
        )),
    );
    // The holder runs its command, or is refused (then so is the waiter).
    wait_until(Duration::from_secs(10), "the holder runs or ends", || {
        ran.exists() || !alive(holder.pid())
    });
    let waited = output(&mut waiter);
    let (held, _) = holder.wait(Duration::from_secs(15));
    assert!(
        !overlap.exists(),
        "the waiter's command ran while the holder's did\nholder: {}\nwaiter: {}",
        describe(&held),
        describe(&waited)
    );
    assert_eq!(held.status.code(), Some(78), "{}", describe(&held));
    assert_eq!(waited.status.code(), Some(78), "{}", describe(&waited));
    assert!(!ran.exists(), "the holder's command ran");
}

/// Another writer of the history object (a script, or a dlock whose lease was lost) appends
/// events with `If-Match` as fast as it can while runs of the key go on: the runs' writes meet
/// 412s, read again and retry, and no event is lost on either side (an unconditional write of
/// the document would drop the other writer's events).
#[test]
fn racing_history_writes_lose_no_event() {
    let Some(s) = shared_seaweedfs() else { return };
    let b = s3_on(s);
    let key = unique_key("history-race");
    let object = format!("ci/{key}.history");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = {
        let (done, object) = (done.clone(), object.clone());
        std::thread::spawn(move || {
            let mut written = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) && written < 80 {
                let reply = curl_object(&object, &["-i"]);
                let reply = String::from_utf8_lossy(&reply).into_owned();
                let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
                let etag = head.lines().find_map(|l| {
                    let (name, v) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("etag")
                        .then(|| v.trim().to_string())
                });
                let mut events = serde_json::from_str::<serde_json::Value>(body)
                    .ok()
                    .and_then(|d| d["events"].as_array().cloned())
                    .unwrap_or_default();
                let ev = format!(r#"1 {{"run":"other{written:03}","ev":"end"}}"#);
                events.push(ev.into());
                let doc = serde_json::json!({"dlock": 1, "events": events}).to_string();
                let cond = match &etag {
                    Some(e) => format!("If-Match: {e}"),
                    None => "If-None-Match: *".to_string(),
                };
                let put = curl_object(
                    &object,
                    &["-i", "-X", "PUT", "-H", &cond, "--data-binary", &doc],
                );
                if put.starts_with(b"HTTP/1.1 200") {
                    written += 1;
                }
            }
            written
        })
    };
    for _ in 0..20 {
        run_ok(&mut b.run(&key, &[], &["true"]));
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = other.join().unwrap();
    let doc = curl_object(&object, &[]);
    let doc: serde_json::Value = serde_json::from_slice(&doc).unwrap();
    let events: Vec<String> = doc["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    let count = |what: &str| events.iter().filter(|e| e.contains(what)).count();
    assert!(written > 0, "the other writer never wrote");
    assert_eq!(count("\"run\":\"other"), written, "{events:#?}");
    assert_eq!(count("\"ev\":\"start\""), 20, "{events:#?}");
    assert_eq!(count("\"ev\":\"end\"") - written, 20, "{events:#?}");
}

/// An object at the history's name that is not dlock's document: `log` shows it as one
/// unreadable record; `--once-per` cannot tell and refuses to run (69; the command never runs); a
/// run without it replaces the object with a new history.
#[test]
fn a_foreign_history_object_refuses_once_per_and_is_replaced_by_a_run() {
    let Some(s) = shared_seaweedfs() else { return };
    let b = s3_on(s);
    let key = unique_key("foreign-history");
    let object = format!("ci/{key}.history");
    curl_object(
        &object,
        &["-X", "PUT", "--data-binary", "\u{1b}[31mterraform state"],
    );
    let text = String::from_utf8(run_ok(b.cmd("log").args(["-k", &key])).stdout).unwrap();
    assert!(
        text.contains("unreadable record") && text.contains("\\x1b[31m"),
        "{text}"
    );
    let dir = scratch("s3-foreign-history");
    let m = dir.join("ran");
    let out = output(&mut b.run(
        &key,
        &["--once-per", "1h"],
        &sh(&format!("touch {}", m.display())),
    ));
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("not dlock's"),
        "{}",
        describe(&out)
    );
    assert!(!m.exists(), "the command ran");
    run_ok(&mut b.run(&key, &[], &["true"]));
    let runs = crate::history::log_json(&b, &key, 5);
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["state"], "ended", "{runs:#?}");
}

/// A request to [`fake_s3`]: what the fakes look at.
struct FakeRequest {
    method: String,
    target: String,
    if_match: Option<String>,
    if_none_match: bool,
    body: Vec<u8>,
}

/// A fake S3 server on a free loopback port (returned): each request read (HTTP/1.1, keep-alive,
/// `Content-Length` bodies) is answered with what `answer` says — status line, ETag, body. For
/// servers that break S3's promises, which the probe must refuse; signatures are not checked.
fn fake_s3(
    answer: impl Fn(&FakeRequest) -> (&'static str, Option<&'static str>, Vec<u8>)
    + Send
    + Sync
    + 'static,
) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for con in listener.incoming() {
            let Ok(con) = con else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(con.try_clone().unwrap());
                let mut w = con;
                while let Some(req) = read_request(&mut r) {
                    let (status, etag, out) = answer(&req);
                    let etag = etag.map(|e| format!("ETag: {e}\r\n")).unwrap_or_default();
                    let head = format!(
                        "HTTP/1.1 {status}\r\n{etag}Content-Length: {}\r\n\r\n",
                        out.len()
                    );
                    if w.write_all(head.as_bytes()).is_err() || w.write_all(&out).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// One request from `r`; `None` at the connection's end.
fn read_request(r: &mut impl BufRead) -> Option<FakeRequest> {
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    let (mut length, mut if_match, mut if_none_match) = (0usize, None, false);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 {
            return None;
        }
        if h.trim().is_empty() {
            break;
        }
        let h = h.to_ascii_lowercase();
        if let Some(v) = h.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = h.strip_prefix("if-match:") {
            if_match = Some(v.trim().to_string());
        } else if h.starts_with("if-none-match:") {
            if_none_match = true;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some(FakeRequest {
        method,
        target,
        if_match,
        if_none_match,
        body,
    })
}
