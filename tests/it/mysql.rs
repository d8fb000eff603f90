//! The mysql backend against a real MariaDB started by the harness.

use std::time::{Duration, Instant};

use crate::servers::{Mariadb, shared_mariadb};
use crate::util::*;

crate::conformance!(match shared_mariadb() {
    Some(m) => TestBackend::mysql(&m.url()),
    None => return,
});

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_mariadb() {
        Some(m) => TestBackend::mysql(&m.url()),
        None => return,
    });
}

/// Shared locks, semaphores, several keys and nested runs.
mod modes {
    use super::*;

    crate::modes!(match shared_mariadb() {
        Some(m) => TestBackend::mysql(&m.url()),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_mariadb() {
        Some(m) => TestBackend::mysql(&m.url()),
        None => return,
    });
}

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_mariadb() {
            Some(m) => TestBackend::mysql(&m.url()),
            None => return,
        },
        mysql_native()
    );
}

/// Runs `sql` (on stdin: a forged event may be longer than one argument may be) with the
/// `mariadb` client as root; its output, or its error.
fn mariadb_stdin(sql: &str) -> Result<String, String> {
    use std::io::Write;
    let m = shared_mariadb().unwrap();
    let mut c = m.client();
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The mysql backend's hooks: one `dlock.dlock_runs` row per event, written and counted with
/// the `mariadb` client. The body column is utf8mb4 text: bytes that are not UTF-8 are stored
/// as U+FFFD (the server refuses them otherwise), which keeps the record just as unreadable.
pub(crate) fn mysql_native() -> crate::history::Native {
    crate::history::Native {
        forge: |_, key, body| {
            let ev = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["ev"].as_str().map(String::from));
            let kind = if ev.as_deref() == Some("end") {
                "end"
            } else {
                "start"
            };
            let body = String::from_utf8_lossy(body);
            mariadb_stdin(&format!(
                "INSERT INTO dlock.dlock_runs (lock_key, kind, at, body) VALUES \
                 (CONVERT(X'{}' USING utf8mb4), '{kind}', UTC_TIMESTAMP(3), \
                 CONVERT(X'{}' USING utf8mb4))",
                hex(key.as_bytes()),
                hex(body.as_bytes())
            ))
            .unwrap();
        },
        count: |_, key| {
            let sql = format!(
                "SELECT COUNT(*) FROM dlock.dlock_runs WHERE \
                 lock_key = CONVERT(X'{}' USING utf8mb4) AND OCTET_LENGTH(lock_key) = {}",
                hex(key.as_bytes()),
                key.len()
            );
            match mariadb_stdin(&sql) {
                Ok(n) => n.parse().unwrap(),
                Err(e) if e.contains("doesn't exist") => 0,
                Err(e) => panic!("{sql}: {e}"),
            }
        },
    }
}

/// The holder's connection is KILLed on the server: noticed at the next ping (ttl/3), exit 79.
#[test]
fn killed_holder_connection_is_noticed_within_a_third_of_the_ttl() {
    let Some(m) = shared_mariadb() else { return };
    let b = TestBackend::mysql(&m.url());
    let key = unique_key("killed");
    let name =
        dlock_cli::internals::mysql_lock_name(&dlock_cli::internals::Key::new(&key).unwrap());
    ended_session_is_noticed(&b, &key, || {
        let id = m.sql(&format!("SELECT IS_USED_LOCK('{name}')"));
        m.sql(&format!("KILL {id}"));
    });
}

/// kill -9 of the holder's dlock: the server sees the connection close and frees the lock at once.
#[test]
fn holder_killed_frees_the_lock_at_once() {
    let Some(m) = shared_mariadb() else { return };
    let b = TestBackend::mysql(&m.url());
    let key = unique_key("kill9-now");
    let (p, _) = b.hold(&key, &[]);
    p.signal(libc::SIGKILL);
    p.wait(Duration::from_secs(5));
    let took = wait_until(Duration::from_secs(2), "the lock to be free", || {
        b.is_free(&key)
    });
    assert!(took < Duration::from_millis(500), "freed after {took:?}");
}

/// Lock names are at most 64 characters and compared case-insensitively by the server: distinct
/// keys must stay distinct locks anyway.
#[test]
fn long_and_case_different_keys_are_different_locks() {
    let Some(m) = shared_mariadb() else { return };
    let b = TestBackend::mysql(&m.url());
    let base = unique_key("names");
    let prefix = format!("{base}-{}", "p".repeat(64));
    let pairs = [
        (
            format!("{prefix}-{}", "a".repeat(130 - base.len())),
            format!("{prefix}-{}", "b".repeat(130 - base.len())),
        ),
        (format!("{base}-Job"), format!("{base}-job")),
        ("JOB".to_string(), "job".to_string()),
    ];
    let dir = scratch("names");
    for (i, (one, other)) in pairs.iter().enumerate() {
        let mk = dir.join(format!("h{i}"));
        let mut h = b.holding(one, &[], &mk);
        assert!(b.is_free(other), "holding {one:?} blocked {other:?}");
        assert!(!b.is_free(one));
        h.close_stdin();
        h.wait(Duration::from_secs(10));
    }
}

/// The server stops answering (SIGSTOP) for longer than the TTL.
#[test]
fn server_paused_longer_than_the_ttl_stops_the_command_in_time() {
    let Some(server) = Mariadb::start() else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..TestBackend::mysql(&server.url())
    };
    crate::conformance::paused_server_stops_the_command_in_time(&b, |on| server.pause(on));
    // The same for the owner of an acquire-held lock.
    crate::acquire::paused_server_stops_the_owner_in_time(&b, |on| server.pause(on));
}

/// Without the privilege to create the metadata table, a clear error, not a crash.
#[test]
fn missing_table_privilege_is_a_clear_error() {
    let Some(m) = shared_mariadb() else { return };
    let db = format!("d{}", std::process::id());
    m.sql(&format!(
        "CREATE DATABASE {db}; CREATE USER IF NOT EXISTS 'weak'@'%' IDENTIFIED BY 'weak'; \
         GRANT SELECT ON {db}.* TO 'weak'@'%';"
    ));
    let b = TestBackend::mysql(&format!("mysql://weak:weak@127.0.0.1:{}/{db}", m.port));
    let out = run_code(&mut b.run(&unique_key("weak"), &[], &["true"]), 69);
    let line = one_error_line(&out);
    assert!(
        line.contains("cannot create table dlock_locks") && line.contains("README"),
        "{line}"
    );
    assert!(!line.contains("weak:weak"));
}

/// A user who may use `dlock_locks` but not create `dlock_runs`: a run runs, with one warning;
/// `--once-per` refuses to run without the history; `log` says why it cannot read it.
#[test]
fn history_without_the_privilege_to_create_its_table_is_a_warning() {
    let Some(m) = shared_mariadb() else { return };
    let db = format!("h{}", std::process::id());
    m.sql(&format!("CREATE DATABASE {db}"));
    let url = |who: &str| format!("mysql://{who}@127.0.0.1:{}/{db}", m.port);
    // dlock's lock table, made by a user who may.
    run_ok(&mut TestBackend::mysql(&url("dlock:dlock")).run(
        &unique_key("t"),
        &["--no-history"],
        &["true"],
    ));
    m.sql(&format!(
        "CREATE USER IF NOT EXISTS 'hweak'@'%' IDENTIFIED BY 'hweak'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON {db}.dlock_locks TO 'hweak'@'%';"
    ));
    let b = TestBackend::mysql(&url("hweak:hweak"));
    let key = unique_key("weak-history");
    let out = run_ok(&mut b.run(&key, &[], &["true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot record the run in the history") && err.contains("dlock_runs"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let ran = scratch("weak-history").join("ran");
    let out = output(&mut b.run(
        &key,
        &["--once-per", "1h"],
        &["touch", ran.to_str().unwrap()],
    ));
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("--once-per"),
        "{}",
        describe(&out)
    );
    assert!(!ran.exists());
    let out = output(b.cmd("log").args(["-k", &key]));
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("dlock_runs"),
        "{}",
        describe(&out)
    );
}

/// TLS options in the URL (MySQL's names): verified against a private CA it works; without TLS
/// a server that requires it refuses (69); a bad mode is a usage error.
#[test]
fn tls_options_in_the_url() {
    let Some((server, ca)) = Mariadb::start_tls() else {
        return;
    };
    let key = unique_key("mysql-tls");
    let base = server.url();
    let ok = TestBackend::mysql(&format!(
        "{base}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        ca.display()
    ));
    let out = run_ok(&mut ok.run(&key, &[], &sh("printf %s \"$DLOCK_FENCING_TOKEN\"")));
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );
    let plain = TestBackend::mysql(&base);
    let out = run_code(&mut plain.run(&key, &[], &["true"]), 69);
    one_error_line(&out);
    let bad = TestBackend::mysql(&format!("{base}?ssl-mode=SOMETIMES"));
    let out = run_code(&mut bad.run(&key, &[], &["true"]), 2);
    assert!(one_error_line(&out).contains("ssl-mode"));
}

/// A server that accepts connections but never answers: exit 69 within the documented bound.
#[test]
fn black_holed_server_fails_within_seconds() {
    let Some(server) = Mariadb::start() else {
        return;
    };
    let b = TestBackend::mysql(&server.url());
    server.pause(true);
    let started = Instant::now();
    let out = output(&mut b.run(&unique_key("mysql-blackhole"), &[], &["true"]));
    let took = started.elapsed();
    server.pause(false);
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    assert!(one_error_line(&out).contains("mysql"));
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(m) = shared_mariadb() else { return };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::mysql(&m.url()), &|| {
        let rows = m.sql(&format!(
            "SELECT name FROM dlock.dlock_locks WHERE name LIKE '%{}%' ORDER BY name",
            crate::bench::KEY_WORD
        ));
        rows.lines().map(String::from).collect()
    });
}

/// Faults while a workload contends for one key (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(match shared_mariadb() {
        Some(m) => TestBackend::mysql(&m.url()),
        None => return,
    });
}

/// The workload's server stops answering for twice the TTL (see `faults.rs`).
#[test]
fn fault_server_paused() {
    let Some(m) = Mariadb::start() else { return };
    let b = TestBackend::mysql(&m.url());
    crate::faults::server_paused(&b, &|on| m.pause(on));
}

/// The workload's server is killed and started again at once on the same data: its GET_LOCKs
/// are gone, and the new holder must not start its command while the one from before the
/// restart may still run (see `backend::hold_back_until`).
#[test]
fn fault_server_killed_and_restarted() {
    let Some(mut m) = Mariadb::start() else {
        return;
    };
    let b = TestBackend::mysql(&m.url());
    crate::faults::server_killed_and_restarted(&b, &mut || m.restart_after(Duration::ZERO));
}

/// `--shared` (GET_LOCK has none): a shared holder killed with `kill -9` lets the exclusive run
/// that waits for it in at once (its connection closes, and the server wakes the waiter); an
/// exclusive run interrupted while it waits for shared holders gives the key back at once (a
/// new shared run gets in); the records of shared holders that are gone do not pile up.
#[test]
fn shared_holders_gone_or_writer_interrupted_leave_nothing_behind() {
    let Some(m) = shared_mariadb() else { return };
    let b = TestBackend::mysql(&m.url());
    let key = unique_key("shared-gone");
    let dir = scratch("shared-gone");
    let (reader, _) = b.hold(&key, &["--shared"]);
    let ran = dir.join("ran");
    let writer = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!("touch {}", ran.display())),
    ));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    let st = b.status(&key);
    assert_eq!(st["mode"], "shared", "{st}");
    assert_eq!(st["holders"].as_array().unwrap().len(), 1, "{st}");
    assert!(!ran.exists());
    reader.signal(libc::SIGKILL);
    let killed = Instant::now();
    reader.wait(Duration::from_secs(5));
    let (out, _) = writer.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(ran.exists());
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );

    // A writer interrupted while it waits for a shared holder.
    let mut reader = b.holding(&key, &["--shared"], &dir.join("reader"));
    let writer = Proc::spawn(&mut b.run(&key, &["--wait", "30s"], &["true"]));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    let second = Proc::spawn(&mut b.run(&key, &["--shared", "--wait", "30s"], &["true"]));
    crate::conformance::wait_until_waiting(&b, &key, 2);
    writer.signal(libc::SIGINT);
    let (out, _) = writer.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    let (out, _) = second.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    reader.close_stdin();
    reader.wait(Duration::from_secs(10));
    assert!(b.is_free(&key));

    // Each shared run leaves a record; the next one removes those of holders that are gone.
    for _ in 0..4 {
        run_ok(&mut b.run(&key, &["--shared"], &["true"]));
    }
    let prefix =
        dlock_cli::internals::mysql_slot_prefix(&dlock_cli::internals::Key::new(&key).unwrap());
    let rows = m.sql(&format!(
        "SELECT COUNT(*) FROM dlock.dlock_locks WHERE name LIKE '{prefix}r%'"
    ));
    assert_eq!(rows.trim(), "1", "shared holders' records");
}

/// A read-only server (a replica): a run by a user that bypasses `read_only` goes on and warns
/// once; `dlock doctor` says `warn read_only` and exits 1.
#[test]
fn a_read_only_server_warns_once_and_doctor_says_so() {
    let Some(m) = Mariadb::start() else { return };
    m.sql("SET GLOBAL read_only = ON");
    let b = TestBackend::mysql(&m.url());
    let out = run_ok(&mut b.run(&unique_key("read-only"), &[], &["true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("warning: read_only: ON").count(),
        1,
        "{}",
        describe(&out)
    );
    let out = run_code(dlock().args(["doctor", "mysql", "-u", &m.url()]), 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("warn    read_only: ON"), "{}", describe(&out));
}

/// Another client breaks a dlock holder the way docs/backends.md says: `mariadb` holds
/// `GET_LOCK('dlock!broken:<holder's connection id>', 0)`. `status` shows the holder broken while
/// it still holds; at its next renewal it stops its command (79), and only then lets go.
#[test]
fn a_break_by_the_mariadb_client_stops_the_holder_as_dlock_break_does() {
    let Some(m) = shared_mariadb() else { return };
    let b = TestBackend {
        // Renews every 2 s: the stop below stays far from the lease's deadline.
        ttl: Duration::from_secs(6),
        ..TestBackend::mysql(&m.url())
    };
    let key = unique_key("client-break");
    crate::breaking::a_client_break_stops_the_holder(&b, &key, |session| {
        let id = session.strip_prefix("connection ").unwrap().to_string();
        let mut client = m.client();
        client.arg("-e").arg(format!(
            "SELECT GET_LOCK('dlock!broken:{id}', 0); SELECT SLEEP(60)"
        ));
        client
    });
}

/// The fault campaign's case: `dlock acquire`'s start is an insert of its own after the lock,
/// and when it fails because the lock's connection died (here a trigger KILLs the connection
/// inserting the start), the lock went with the connection: acquire must not answer that it
/// holds it. Exit 69, the reason first, and nobody holds the key.
#[test]
fn acquire_whose_start_dies_with_its_connection_does_not_hold() {
    let Some(m) = shared_mariadb() else { return };
    let db = format!("hdie{}", std::process::id());
    m.sql(&format!("CREATE DATABASE {db}"));
    let b = TestBackend::mysql(&format!("mysql://dlock:dlock@127.0.0.1:{}/{db}", m.port));
    run_ok(&mut b.run(&unique_key("tables"), &[], &["true"]));
    let out = m
        .client()
        .args(["--delimiter=//", &db, "-e"])
        .arg(
            "CREATE TRIGGER die BEFORE INSERT ON dlock_runs FOR EACH ROW BEGIN \
               IF NEW.kind = 'start' AND NEW.lock_key LIKE 'doomed%' THEN \
                 KILL CONNECTION_ID(); END IF; END",
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let key = unique_key("doomed");
    let out = output(
        crate::acquire::cmd(&b, "acquire")
            .args(["-k", &key, "--owner", "none", "--max-hold", "1m"])
            .args(["--ttl", &format!("{}ms", b.ttl.as_millis())]),
    );
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    first_error_says(&out, "the lock was lost before the command could start");
    assert_eq!(b.status(&key)["held"], false, "{}", describe(&out));
}
