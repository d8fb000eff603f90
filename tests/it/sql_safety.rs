//! The SQL backends against settings and contents that broke them: values spliced into SQL
//! text, records that are not UTF-8 or are huge, names with URL syntax, a latin1 server.

use crate::servers::{Mariadb, shared_postgres};
use crate::util::*;

/// A new database on the shared PostgreSQL; its URL. `settings` are `ALTER DATABASE … SET`s.
fn pg_database(name: &str, settings: &[&str]) -> Option<(String, String)> {
    let pg = shared_postgres()?;
    let db = unique_key(name).replace(['-', '.'], "_").to_lowercase();
    pg.sql(&format!("CREATE DATABASE {db}"));
    for s in settings {
        pg.sql(&format!("ALTER DATABASE {db} SET {s}"));
    }
    Some((
        db.clone(),
        format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port),
    ))
}

/// SQL in database `db` of the shared PostgreSQL.
fn pg_sql(db: &str, sql: &str) -> String {
    let pg = shared_postgres().unwrap();
    let out = pg.psql().args(["-d", db, "-c", sql]).output().unwrap();
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// With `standard_conforming_strings = off` a backslash escapes a quote in a string literal:
/// a key spliced into SQL text ran SQL of the key's choosing. Keys are bind parameters now.
#[test]
fn postgres_keys_are_never_sql_text() {
    let Some((db, url)) = pg_database("scs", &["standard_conforming_strings = off"]) else {
        return;
    };
    let b = TestBackend::postgres(&url);
    // An earlier run creates dlock's tables.
    run_ok(&mut b.run(&unique_key("tables"), &[], &["true"]));
    for (sub, table) in [
        ("run", "pwned_run"),
        ("status", "pwned_status"),
        ("break", "pwned_break"),
        ("log", "pwned_log"),
    ] {
        let key = format!("x\\'; CREATE TABLE {table} (); --");
        let out = match sub {
            "run" => output(&mut b.run(&key, &["-n"], &["true"])),
            _ => output(b.cmd(sub).args(["-k", &key])),
        };
        assert_eq!(out.status.code(), Some(0), "{sub}: {}", describe(&out));
        let tables = pg_sql(
            &db,
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'pwned%'",
        );
        assert_eq!(tables, "0", "dlock {sub} ran SQL from the key");
    }
    // An ordinary key with a backslash and a quote works.
    let key = "a\\'b";
    let (holder, _) = b.hold(key, &[]);
    let s = b.status(key);
    assert_eq!(s["held"], true, "{s}");
    assert!(
        s["holders"][0]["pid"].is_number(),
        "the record is read back: {s}"
    );
    holder.signal(libc::SIGTERM);
    holder.wait(std::time::Duration::from_secs(10));
    run_ok(&mut b.run(key, &["-n"], &["true"]));
}

/// A holder record of more than 4 MiB (a user with access to the table can write one) made
/// `break` fail on the message-size bound; it is read capped and shown as unreadable.
#[test]
fn postgres_break_survives_a_huge_holder_record() {
    let Some((db, url)) = pg_database("huge", &[]) else {
        return;
    };
    let b = TestBackend::postgres(&url);
    let key = unique_key("huge");
    let (holder, _) = b.hold(&key, &[]);
    pg_sql(
        &db,
        "UPDATE dlock_holders SET holder = repeat('x', 5 << 20)",
    );
    let s = b.status(&key);
    assert_eq!(s["held"], true, "{s}");
    assert!(s["notes"].to_string().contains("unreadable"), "{s}");
    run_ok(b.cmd("break").args(["-k", &key]));
    let (out, _) = holder.wait(std::time::Duration::from_secs(10));
    assert_ne!(out.status.code(), Some(0), "the holder lost the lock");
}

/// A user name with '@', %-escaped in the URL, is the role's name.
#[test]
fn postgres_escaped_user_name_is_accepted() {
    let Some(pg) = shared_postgres() else { return };
    pg.sql(
        "DO $$ BEGIN CREATE ROLE \"sec@srv\" LOGIN SUPERUSER; \
            EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    );
    let url = format!("postgres://sec%40srv@127.0.0.1:{}/postgres", pg.port);
    let b = TestBackend::postgres(&url);
    let out = run_ok(&mut b.run(&unique_key("role"), &[], &["sh", "-c", "echo ok"]));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// No message shows a Rust `Debug` form of an error (`MySqlError { … }`, `Error { kind: … }`).
#[track_caller]
fn no_debug_form(out: &std::process::Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    for debug in [
        "MySqlError {",
        "IoError {",
        "DriverError {",
        "CodecError {",
        "Error {",
        "Kind(",
    ] {
        assert!(!err.contains(debug), "a Debug form in: {}", describe(out));
    }
}

/// A MariaDB whose default character set is latin1 (MariaDB before 11.6, MySQL 5.7).
#[test]
fn mysql_non_latin1_keys_and_commands_on_a_latin1_server() {
    let Some(m) = Mariadb::start_latin1() else {
        return;
    };
    let b = TestBackend::mysql(&m.url());
    for key in ["ключ", "key🔒"] {
        let out = output(&mut b.run(key, &[], &["echo", "ok"]));
        no_debug_form(&out);
        assert_eq!(out.status.code(), Some(0), "{key}: {}", describe(&out));
    }
    let cmd_key = unique_key("cmd");
    let out = output(&mut b.run(&cmd_key, &[], &["echo", "déjà vu ✓"]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    // The run history (utf8mb4 columns on a latin1 server) reads back whole.
    let runs = crate::history::log_json(&b, &cmd_key, 5);
    let command = runs[0]["command"].as_str().unwrap_or_default();
    assert!(command.contains("déjà vu ✓"), "{runs:#?}");
    assert_eq!(crate::history::log_json(&b, "key🔒", 5).len(), 1);
    // The record reads back whole, whatever the column's character set.
    let (holder, _) = b.hold("ключ", &[]);
    let s = b.status("ключ");
    assert_eq!(s["held"], true, "{s}");
    assert_eq!(s["holders"][0]["key"], "ключ", "{s}");
    holder.signal(libc::SIGTERM);
    holder.wait(std::time::Duration::from_secs(10));
    // A server error is one line in words, not the driver's Debug form.
    m.sql("REVOKE ALL ON *.* FROM 'dlock'@'%'; GRANT USAGE ON *.* TO 'dlock'@'%'");
    let out = output(&mut b.run(&unique_key("denied"), &["-n"], &["true"]));
    assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
    one_error_line(&out);
    no_debug_form(&out);
}

/// An administrator altered `holder` to a BLOB and a record holds bytes that are not UTF-8:
/// `status` and `run -n` aborted in the driver's row conversion. The record is unreadable, the
/// lock still listed.
#[test]
fn mysql_record_that_is_not_utf8() {
    // A server of its own: the test alters dlock's table.
    let Some(m) = Mariadb::start() else { return };
    let b = TestBackend::mysql(&m.url());
    let key = unique_key("blob");
    // The table exists (any earlier run made it).
    run_ok(&mut b.run(&unique_key("table"), &[], &["true"]));
    m.sql("ALTER TABLE dlock.dlock_locks MODIFY holder BLOB NOT NULL");
    let (holder, _) = b.hold(&key, &[]);
    m.sql(&format!(
        "UPDATE dlock.dlock_locks SET holder = X'ff7b22fe' WHERE name = 'dlock:{key}'"
    ));
    let out = output(b.cmd("status").args(["-k", &key, "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["held"], true, "{s}");
    let out = run_code(&mut b.run(&key, &["-n"], &["true"]), 75);
    one_error_line(&out);
    // Listed without a key, too.
    let out = run_ok(b.cmd("status").arg("--json"));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&key),
        "{}",
        describe(&out)
    );
    holder.signal(libc::SIGTERM);
    holder.wait(std::time::Duration::from_secs(10));

    // The same for a history body: a row that is not UTF-8 is an unreadable run.
    m.sql("ALTER TABLE dlock.dlock_runs MODIFY body MEDIUMBLOB NOT NULL");
    m.sql(&format!(
        "INSERT INTO dlock.dlock_runs (lock_key, kind, at, body) \
         VALUES ('{key}', 'start', UTC_TIMESTAMP(3), X'ff7b22fe')"
    ));
    let runs = crate::history::log_json(&b, &key, 5);
    assert_eq!(runs[0]["state"], "unreadable", "{runs:#?}");
    assert!(runs.len() >= 2, "the held run too: {runs:#?}");
}
