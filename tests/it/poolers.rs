//! What stands between dlock and PostgreSQL: PgBouncer in each pool mode (pools of 1 and 4,
//! over TCP and its Unix socket) and pgpool-II load-balancing over a primary and a standby.
//! A session advisory lock left on a server connection that the pooler hands to the next client
//! must never let that client run beside the holder.

use std::time::Duration;

use crate::servers::{Pooler, shared_postgres};
use crate::util::*;

/// The message of a refusal for pooling (78), from the probe or from the mark.
fn names_pooling(line: &str) -> bool {
    line.contains("pools by transaction or statement")
        || line.contains("holds another client's locks")
}

/// Over TCP the proxy is seen on connect and the pooling probed: every run is refused, 78,
/// with one line that names the pooling and the change to make.
#[test]
fn transaction_and_statement_pooling_are_refused_on_connect() {
    let Some(pg) = shared_postgres() else { return };
    for mode in ["transaction", "statement"] {
        for pool in [1, 4] {
            let Some(p) = Pooler::pgbouncer(pg, mode, pool) else {
                return;
            };
            let b = TestBackend::postgres(&p.url());
            let out = run_code(&mut b.run(&unique_key("pooled"), &["-n"], &["true"]), 78);
            let line = one_error_line(&out);
            assert!(line.contains("pools by transaction or statement"), "{line}");
            assert!(line.contains("pool_mode=session"), "{line}");
        }
    }
}

/// A second `--no-wait` run on a held key never runs beside the first, whatever the pool mode
/// and size and however dlock connects (TCP, or the pooler's Unix socket, where the backend's
/// key tells the pooler apart): 75, or 78 naming the pooling.
#[test]
fn a_second_run_never_runs_beside_the_first_through_a_pooler() {
    let Some(pg) = shared_postgres() else { return };
    for mode in ["transaction", "statement"] {
        for pool in [1, 4] {
            let Some(p) = Pooler::pgbouncer(pg, mode, pool) else {
                return;
            };
            for url in [p.url(), p.socket_url()] {
                let b = TestBackend::postgres(&url);
                let key = unique_key("beside");
                let dir = scratch("beside");
                let inside = dir.join("inside");
                let script = format!("touch {0}; read _x || true; rm -f {0}", inside.display());
                let mut first = Proc::spawn(&mut b.run(&key, &[], &sh(&script)));
                wait_until(
                    Duration::from_secs(15),
                    "the first run to hold or end",
                    || inside.exists() || first.child.try_wait().unwrap().is_some(),
                );
                let held = inside.exists();
                let probe = format!("test -e {} && echo BOTH", inside.display());
                let out = output(&mut b.run(&key, &["-n"], &sh(&probe)));
                first.close_stdin();
                let (first_out, _) = first.wait(Duration::from_secs(15));
                let what = format!("{mode} pool {pool} via {url}");
                assert!(
                    !String::from_utf8_lossy(&out.stdout).contains("BOTH"),
                    "{what}: two ran at once\n{}",
                    describe(&out)
                );
                match out.status.code() {
                    Some(75) => assert!(held, "{what}: busy, yet nobody held"),
                    Some(78) => assert!(names_pooling(&one_error_line(&out)), "{what}"),
                    _ => panic!("{what}: {}", describe(&out)),
                }
                assert!(
                    matches!(first_out.status.code(), Some(0 | 78 | 79)),
                    "{what}: {}",
                    describe(&first_out)
                );
            }
        }
    }
}

/// Session pooling is sound and keeps working: renewals through the pooler, a second run busy.
#[test]
fn session_pooling_holds_and_renews() {
    let Some(pg) = shared_postgres() else { return };
    let Some(p) = Pooler::pgbouncer(pg, "session", 4) else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_secs(2),
        ..TestBackend::postgres(&p.url())
    };
    let key = unique_key("session");
    let marker = scratch("session").join("m");
    let script = format!("touch {}; sleep 3", marker.display());
    let mut first = Proc::spawn(&mut b.run(&key, &["-v"], &sh(&script)));
    wait_until(Duration::from_secs(10), "the command to run", || {
        marker.exists() || first.child.try_wait().unwrap().is_some()
    });
    assert!(
        marker.exists(),
        "{}",
        describe(&first.wait(Duration::ZERO).0)
    );
    run_code(&mut b.run(&key, &["-n"], &["true"]), 75);
    let (out, _) = first.wait(Duration::from_secs(15));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let renewed = String::from_utf8_lossy(&out.stderr)
        .matches("renewed")
        .count();
    assert!(renewed >= 3, "{}", describe(&out));
}

/// Through a session pooler too, a run whose start is lost with its server session (a trigger
/// ends the backend on the insert; PgBouncer then drops the client) does not run its command:
/// the renewal that confirms the lock fails on the dropped connection.
#[test]
fn session_pooling_a_start_lost_with_its_session_does_not_run_the_command() {
    let Some(pg) = shared_postgres() else { return };
    let Some(p) = Pooler::pgbouncer(pg, "session", 4) else {
        return;
    };
    let db = crate::postgres::doomed_start_db(pg, "pdie", "doomed");
    let b = TestBackend::postgres(&format!("postgres://postgres@127.0.0.1:{}/{db}", p.port));
    crate::postgres::not_run_when_its_start_dies(&b, "doomed");
}

/// A safe break through a session pooler: the holder's guarded session sees the mark (its
/// `pg_backend_pid()` is the server session's, the pid break marks), stops its command (79), and
/// only then lets go; `break --wait` returns once it has.
#[test]
fn session_pooling_a_safe_break_stops_the_holder() {
    let Some(pg) = shared_postgres() else { return };
    let Some(p) = Pooler::pgbouncer(pg, "session", 4) else {
        return;
    };
    let b = TestBackend::postgres(&p.url());
    let key = unique_key("session-break");
    let (holder, child) = b.hold(&key, &[]);
    let out = run_ok(b.cmd("break").args(["-k", &key, "--wait", "20s"]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("is free of the broken holder"), "{said}");
    assert!(!alive(child), "break --wait returned while the command ran");
    let (out, _) = holder.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .last()
            .unwrap_or_default()
            .contains("dlock break told it to stop"),
        "{}",
        describe(&out)
    );
    assert!(b.is_free(&key));
}

/// `dlock doctor`: 0 on a direct connection and on session pooling, 78 naming the pool mode on
/// transaction and statement pooling.
#[test]
fn doctor_names_the_pool_mode() {
    let Some(pg) = shared_postgres() else { return };
    let direct = TestBackend::postgres(&pg.url());
    let out = run_ok(&mut direct.cmd("doctor"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ok      pooling: a direct connection"),
        "{text}"
    );
    let Some(session) = Pooler::pgbouncer(pg, "session", 2) else {
        return;
    };
    let out = run_ok(&mut TestBackend::postgres(&session.url()).cmd("doctor"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("session pooling"));
    for mode in ["transaction", "statement"] {
        let p = Pooler::pgbouncer(pg, mode, 2).unwrap();
        let b = TestBackend::postgres(&p.url());
        let out = run_code(&mut b.cmd("doctor"), 78);
        let text = String::from_utf8_lossy(&out.stdout);
        let want = format!(
            "unsafe  pooling: {} pools by {mode}",
            p.url().trim_start_matches("postgres://postgres@")
        );
        assert!(text.contains(&want), "{want}\n{text}");
        let out = run_code(b.cmd("doctor").arg("--json"), 78);
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(all["exit"], 78);
        let pooling = all["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "pooling")
            .unwrap();
        assert_eq!(pooling["verdict"], "unsafe");
        assert!(
            pooling["fix"]
                .as_str()
                .unwrap()
                .contains("pool_mode=session")
        );
    }
}

/// pgpool-II balancing reads over a primary and a standby: every lock statement reaches the
/// primary (a standby would be refused, 69), a held key is busy, doctor names pgpool.
#[test]
fn pgpool_sends_the_lock_statements_to_the_primary() {
    let Some(pg) = shared_postgres() else { return };
    let standby = pg.standby();
    let Some(p) = Pooler::pgpool(pg, &standby) else {
        return;
    };
    let b = TestBackend::postgres(&p.url());
    for _ in 0..8 {
        run_ok(&mut b.run(&unique_key("pgpool"), &["-n"], &["true"]));
    }
    let key = unique_key("pgpool-busy");
    let marker = scratch("pgpool").join("m");
    let mut first = b.holding(&key, &[], &marker);
    run_code(&mut b.run(&key, &["-n"], &["true"]), 75);
    first.close_stdin();
    let (out, _) = first.wait(Duration::from_secs(15));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = run_ok(&mut b.cmd("doctor"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ok      pooling: pgpool-II"), "{text}");
}

/// An application's advisory lock left on a server connection (taken through a pooler by
/// transaction, which keeps it there after the application is gone) is another client's: dlock
/// landing on that server connection through the Unix socket, where no proxy can be told apart,
/// does not take it as its own (pg_try_advisory_lock is reentrant), it refuses (78).
#[test]
fn an_applications_lock_left_on_a_server_connection_is_not_taken() {
    let Some(pg) = shared_postgres() else { return };
    let Some(p) = Pooler::pgbouncer(pg, "transaction", 1) else {
        return;
    };
    let key = unique_key("left");
    let direct = TestBackend::postgres(&pg.url());
    let id = crate::postgres::advisory_id(&direct, &key);
    let out = p
        .psql()
        .args(["-c", &format!("SELECT pg_advisory_lock({id})")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    // Held on the server, by the pooler's one server connection.
    assert!(!direct.is_free(&key));
    let b = TestBackend::postgres(&p.socket_url());
    let dir = scratch("left");
    let ran = dir.join("ran");
    let out = run_code(
        &mut b.run(&key, &["-n"], &sh(&format!("touch {}", ran.display()))),
        78,
    );
    assert!(names_pooling(&one_error_line(&out)));
    assert!(!ran.exists());
}

/// `dlock doctor` on a server that cannot be reached: 69, one line, nothing on stdout; a
/// backend name it does not know: 2.
#[test]
fn doctor_without_a_server_exits_69() {
    let port = crate::servers::free_port();
    let b = TestBackend::postgres(&format!("postgres://postgres@127.0.0.1:{port}/postgres"));
    let out = run_code(&mut b.cmd("doctor"), 69);
    let line = one_error_line(&out);
    assert!(line.contains("cannot check the server"), "{line}");
    assert!(out.stdout.is_empty());
    let out = run_code(dlock().args(["doctor", "nosuch"]), 2);
    one_error_line(&out);
}
