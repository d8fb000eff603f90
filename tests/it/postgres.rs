//! The postgres backend against a real PostgreSQL started by the harness.

use std::time::Duration;

use crate::servers::shared_postgres;
use crate::util::*;

crate::conformance!(match shared_postgres() {
    Some(p) => TestBackend::postgres(&p.url()),
    None => return,
});

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(match shared_postgres() {
        Some(p) => TestBackend::postgres(&p.url()),
        None => return,
    });
}

/// Shared locks, several keys and nested runs (`--limit` is refused: not supported yet).
mod modes {
    use super::*;

    crate::modes!(match shared_postgres() {
        Some(p) => TestBackend::postgres(&p.url()),
        None => return,
    });
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(match shared_postgres() {
        Some(p) => TestBackend::postgres(&p.url()),
        None => return,
    });
}

mod faults {
    use super::*;

    crate::faults!(match shared_postgres() {
        Some(p) => TestBackend::postgres(&p.url()),
        None => return,
    });
}

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(
        match shared_postgres() {
            Some(p) => TestBackend::postgres(&p.url()),
            None => return,
        },
        postgres_native()
    );
}

/// Runs `sql` (on stdin: a forged event may be longer than one argument may be) with `psql`;
/// its output, or its error.
fn psql_stdin(sql: &str) -> Result<String, String> {
    use std::io::Write;
    let pg = shared_postgres().unwrap();
    let mut c = pg.psql();
    c.args(["-v", "ON_ERROR_STOP=1"])
        .stdin(std::process::Stdio::piped())
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

/// SQL: `s` as a text value, from hex (nothing in it is SQL text).
fn pg_text(s: &str) -> String {
    let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
    format!("convert_from(decode('{hex}', 'hex'), 'UTF8')")
}

/// The postgres backend's hooks: one `dlock_runs` row per event, written and counted with
/// `psql`. The body column is text: bytes that are not UTF-8 are stored as U+FFFD (the server
/// refuses them otherwise), which keeps the record just as unreadable.
pub(crate) fn postgres_native() -> crate::history::Native {
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
            psql_stdin(&format!(
                "INSERT INTO dlock_runs (key, kind, at, body) VALUES ({}, '{kind}', now(), {});",
                pg_text(key),
                pg_text(&String::from_utf8_lossy(body))
            ))
            .unwrap();
        },
        count: |_, key| {
            let sql = format!(
                "SELECT count(*) FROM dlock_runs WHERE key = {};",
                pg_text(key)
            );
            match psql_stdin(&sql) {
                Ok(n) => n.parse().unwrap(),
                Err(e) if e.contains("does not exist") => 0,
                Err(e) => panic!("{sql}: {e}"),
            }
        },
    }
}

/// History rows dated ±infinity (a `timestamptz` can be): `log` reads them (without a time),
/// and `--once-per` counts the one from the infinite past as long ago.
#[test]
fn history_rows_dated_infinity_are_read() {
    let Some(pg) = shared_postgres() else { return };
    let b = TestBackend::postgres(&pg.url());
    let key = unique_key("infinity");
    run_ok(&mut b.run(&key, &[], &["true"]));
    for (run, at) in [("i1", "infinity"), ("i2", "-infinity")] {
        psql_stdin(&format!(
            "INSERT INTO dlock_runs (key, kind, at, body) VALUES ({}, 'start', '{at}', \
             '{{\"run\":\"{run}\",\"ev\":\"start\",\"pid\":1}}');",
            pg_text(&key)
        ))
        .unwrap();
    }
    let runs = crate::history::log_json(&b, &key, 10);
    assert_eq!(runs.len(), 3, "{runs:#?}");
    assert_eq!(runs[0]["run"], "i2", "{runs:#?}");
    assert!(runs[0]["started_ms"].is_null(), "{runs:#?}");
    run_ok(&mut b.run(&key, &["--once-per", "1h"], &["true"]));
    run_ok(b.cmd("status").args(["-k", &key]));
}

/// A role that may use dlock's lock tables but not create `dlock_runs` (PostgreSQL 15 and later
/// grant no CREATE on `public`): a run runs, with one warning; `--once-per` refuses to run
/// without the history; `log` finds none.
#[test]
fn history_without_the_privilege_to_create_its_table_is_a_warning() {
    let Some(pg) = shared_postgres() else { return };
    let db = unique_key("hweak").replace(['-', '.'], "_").to_lowercase();
    pg.sql(&format!("CREATE DATABASE {db}"));
    let url = |role: &str| format!("postgres://{role}@127.0.0.1:{}/{db}", pg.port);
    // dlock's lock tables, made by a role that may.
    run_ok(&mut TestBackend::postgres(&url("postgres")).run(
        &unique_key("t"),
        &["--no-history"],
        &["true"],
    ));
    let out = pg
        .psql()
        .args(["-d", &db, "-c"])
        .arg(
            "DO $$ BEGIN CREATE ROLE hweak LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; \
             END $$; GRANT SELECT, INSERT, UPDATE, DELETE ON dlock_fences, dlock_holders TO hweak",
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let b = TestBackend::postgres(&url("hweak"));
    let key = unique_key("weak-history");
    let out = run_ok(&mut b.run(&key, &[], &["true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot record the run in the history")
            && err.contains("cannot create table dlock_runs"),
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
    assert!(crate::history::log_json(&b, &key, 5).is_empty());
}

/// A start that cannot be written because the lock's own session died (here a trigger ends its
/// backend on the insert) means the session lock went with it, to whoever asks next: the command
/// must not run. (It used to: the failure was a warning, and the command ran with its lock gone
/// — the fault campaign caught a MySQL run so, beside the next holder's.) Two keys: one key's
/// start rides in the lock's own statement, whose failure fails the acquire instead.
#[test]
fn a_start_lost_with_its_session_does_not_run_the_command() {
    let Some(pg) = shared_postgres() else { return };
    let db = doomed_start_db(pg, "hdie", "doomed");
    let b = TestBackend::postgres(&format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port));
    not_run_when_its_start_dies(&b, "doomed");
}

/// A new database (named after `tag`) with dlock's tables and a trigger that ends the server
/// session inserting the start of a run of any key that begins with `doomed`.
pub(crate) fn doomed_start_db(pg: &crate::servers::Postgres, tag: &str, doomed: &str) -> String {
    let db = unique_key(tag).replace(['-', '.'], "_").to_lowercase();
    pg.sql(&format!("CREATE DATABASE {db}"));
    let b = TestBackend::postgres(&format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port));
    run_ok(&mut b.run(&unique_key("tables"), &[], &["true"]));
    let out = pg
        .psql()
        .args(["-d", &db, "-v", "ON_ERROR_STOP=1", "-c"])
        .arg(format!(
            "CREATE FUNCTION die() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.key LIKE '{doomed}%' AND NEW.kind = 'start' THEN \
                 PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN NEW; END $$; \
             CREATE TRIGGER die BEFORE INSERT ON dlock_runs FOR EACH ROW EXECUTE FUNCTION die()"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    db
}

/// On a database of [`doomed_start_db`]: a run of a `doomed` key (and another, so that the
/// start is an insert of its own) does not run its command, exits 69, and says why first.
pub(crate) fn not_run_when_its_start_dies(b: &TestBackend, doomed: &str) {
    let (doomed, other) = (unique_key(doomed), unique_key("other"));
    let ran = scratch("hdie").join("ran");
    let out = output(&mut b.run(&doomed, &["-k", &other], &["touch", ran.to_str().unwrap()]));
    assert!(!ran.exists(), "the command ran: {}", describe(&out));
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    // The error first (the release of the dead session may add a warning after it).
    first_error_says(&out, "the lock was lost before the command could start");
}

/// The advisory key dlock takes for a key, as `dlock status --json` shows it.
pub(crate) fn advisory_id(b: &TestBackend, key: &str) -> i64 {
    let s = b.status(key);
    s["server_name"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no advisory key in {s}"))
}

/// An application's `pg_advisory_lock(<id>)` in psql and dlock exclude each other, both ways,
/// and `status` shows the application as a holder.
#[test]
fn psql_advisory_lock_and_dlock_exclude_each_other() {
    let Some(pg) = shared_postgres() else { return };
    let b = TestBackend::postgres(&pg.url());
    let key = unique_key("psql");
    let id = advisory_id(&b, &key);
    // psql holds the lock for as long as its stdin stays open.
    let mut app = Proc::spawn(&mut pg.psql());
    {
        use std::io::Write;
        let stdin = app.child.stdin.as_mut().unwrap();
        writeln!(stdin, "SELECT pg_advisory_lock({id});").unwrap();
        stdin.flush().unwrap();
    }
    wait_until(Duration::from_secs(10), "psql to hold the lock", || {
        b.status(&key)["held"] == true
    });
    let s = b.status(&key);
    assert!(
        s["notes"].to_string().contains("without a dlock record"),
        "{s}"
    );
    let out = run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    assert!(one_error_line(&out).contains("busy"), "{}", describe(&out));
    app.close_stdin();
    app.wait(Duration::from_secs(10));
    // The other way: dlock holds, psql's try fails.
    let dir = scratch("psql");
    let mut h = b.holding(&key, &[], &dir.join("held"));
    let got = pg.sql(&format!("SELECT pg_try_advisory_lock({id})"));
    assert_eq!(got, "f");
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    assert_eq!(pg.sql(&format!("SELECT pg_try_advisory_lock({id})")), "t");
}

/// The holder's session is ended on the server (`pg_terminate_backend`): noticed at once (the
/// connection closes), exit 79, well within a third of the TTL.
#[test]
fn terminated_holder_session_is_noticed_at_once() {
    let Some(pg) = shared_postgres() else { return };
    let b = TestBackend::postgres(&pg.url());
    let key = unique_key("terminated");
    let id = advisory_id(&b, &key);
    ended_session_is_noticed(&b, &key, || {
        let ended = pg.sql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND ((classid::bigint << 32) | objid::bigint) = {id}"
        ));
        assert_eq!(ended, "1");
    });
}

/// A standby refuses with 69 and says why.
#[test]
fn a_standby_is_refused() {
    let Some(mut pg) = crate::servers::Postgres::start() else {
        return;
    };
    pg.make_standby();
    let b = TestBackend::postgres(&pg.url());
    let out = run_code(&mut b.run(&unique_key("standby"), &["-q"], &["true"]), 69);
    assert!(
        one_error_line(&out).contains("standby"),
        "{}",
        describe(&out)
    );
}

/// The server's Unix socket, in libpq's URL form (`?host=<directory>`).
#[test]
fn unix_socket_url() {
    let Some(pg) = shared_postgres() else { return };
    let url = format!(
        "postgres:///postgres?host={}&port={}&user=postgres",
        pg.dir.join("sock").display(),
        pg.port
    );
    let b = TestBackend::postgres(&url);
    let out = run_ok(&mut b.run(
        &unique_key("unix"),
        &["-q"],
        &sh("echo $DLOCK_FENCING_TOKEN"),
    ));
    assert!(!out.stdout.is_empty(), "{}", describe(&out));
}

/// Password authentication (SCRAM): the password from the URL, from PGPASSWORD, or from a
/// password file; a wrong one is one line, exit 69, and never printed.
#[test]
fn scram_passwords_from_the_url_the_environment_or_a_password_file() {
    let Some(pg) = crate::servers::Postgres::start_scram() else {
        return;
    };
    let key = unique_key("scram");
    let with_password = format!("postgres://dlock:s3cret@127.0.0.1:{}/postgres", pg.port);
    let without = format!("postgres://dlock@127.0.0.1:{}/postgres", pg.port);
    run_ok(&mut TestBackend::postgres(&with_password).run(&key, &["-q"], &["true"]));
    run_ok(
        TestBackend::postgres(&without)
            .run(&key, &["-q"], &["true"])
            .env("PGPASSWORD", "s3cret"),
    );
    let dir = scratch("pgpass");
    let file = dir.join("pgpass");
    std::fs::write(&file, format!("127.0.0.1:{}:*:dlock:s3cret\n", pg.port)).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    run_ok(
        TestBackend::postgres(&without)
            .run(&key, &["-q"], &["true"])
            .env("PGPASSFILE", &file),
    );
    let wrong = format!("postgres://dlock:Wr0ngPw@127.0.0.1:{}/postgres", pg.port);
    let out = run_code(
        &mut TestBackend::postgres(&wrong).run(&key, &["-q"], &["true"]),
        69,
    );
    let line = one_error_line(&out);
    assert!(line.contains("password"), "{line}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("Wr0ngPw"),
        "{line}"
    );
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let Some(pg) = shared_postgres() else { return };
    crate::bench::measures_and_leaves_nothing_behind(&TestBackend::postgres(&pg.url()), &|| {
        let rows = pg.sql(&format!(
            "SELECT key FROM dlock_holders WHERE key LIKE '%{}%' ORDER BY key",
            crate::bench::KEY_WORD
        ));
        rows.lines().map(String::from).collect()
    });
}

/// TLS as libpq's sslmode says: verify-full with the private CA as sslrootcert; require
/// (encrypted, not verified); prefer (the default) uses it when offered; verify-full against
/// the system's CAs fails (69, one line) — and so does require against a server without TLS.
#[test]
fn tls_modes() {
    let Some((pg, ca)) = crate::servers::Postgres::start_tls() else {
        return;
    };
    let key = unique_key("pg-tls");
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    for query in [
        format!("?sslmode=verify-full&sslrootcert={}", ca.display()),
        format!("?sslmode=verify-ca&sslrootcert={}", ca.display()),
        "?sslmode=require".to_string(),
        String::new(),
    ] {
        let b = TestBackend::postgres(&format!("{base}{query}"));
        run_ok(&mut b.run(&key, &["-q"], &["true"]));
        // The holder's session is encrypted: pg_stat_ssl says so.
        let dir = scratch("pg-tls");
        let mut h = b.holding(&key, &[], &dir.join("held"));
        let pid = b.status(&key)["holders"][0]["session"]
            .as_str()
            .unwrap()
            .trim_start_matches("backend pid ")
            .to_string();
        assert_eq!(
            pg.sql(&format!("SELECT ssl FROM pg_stat_ssl WHERE pid = {pid}")),
            "t",
            "{query}"
        );
        h.close_stdin();
        h.wait(Duration::from_secs(10));
    }
    let untrusted = TestBackend::postgres(&format!("{base}?sslmode=verify-full"));
    let out = run_code(&mut untrusted.run(&key, &["-q"], &["true"]), 69);
    assert!(
        one_error_line(&out).contains("certificate"),
        "{}",
        describe(&out)
    );
    let Some(plain) = shared_postgres() else {
        return;
    };
    let b = TestBackend::postgres(&format!("{}?sslmode=require", plain.url()));
    let out = run_code(&mut b.run(&key, &["-q"], &["true"]), 69);
    assert!(one_error_line(&out).contains("TLS"), "{}", describe(&out));
}

/// Another client breaks a dlock holder the way docs/backends.md says: psql holds
/// `pg_advisory_lock(1684826978, <holder's backend pid>)`. `status` shows the holder broken while
/// it still holds; at its next check it stops its command (79), and only then lets go.
#[test]
fn a_break_by_psql_stops_the_holder_as_dlock_break_does() {
    let Some(p) = shared_postgres() else { return };
    let b = TestBackend {
        // Checks every 2 s: the stop below stays far from the lease's deadline.
        ttl: Duration::from_secs(6),
        ..TestBackend::postgres(&p.url())
    };
    let key = unique_key("psql-break");
    crate::breaking::a_client_break_stops_the_holder(&b, &key, |session| {
        let pid = session.strip_prefix("backend pid ").unwrap().to_string();
        let mut psql = p.psql();
        psql.args([
            "-c",
            &format!("SELECT pg_advisory_lock(1684826978, {pid})"),
            "-c",
            "SELECT pg_sleep(60)",
        ]);
        psql
    });
}
