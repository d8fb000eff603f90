//! dlock beside the applications' own lock recipes on the servers other than ZooKeeper, with
//! their real clients: the `mariadb` client's `GET_LOCK`, `psql`'s `pg_advisory_lock`, `etcdctl
//! lock` and redis-py's `Lock`, each as docs/interop.md's snippet shows it (the ZooKeeper
//! recipes are in `interop.rs`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::interop::{app_counter_is_exact, kazoo, shell_words, snippet};
use crate::util::*;

/// The SQL snippet of docs/interop.md through the `mariadb` client: `GET_LOCK` on dlock's lock
/// name excludes dlock's runs, both ways; while it holds, every dlock mode waits (75 with
/// `--no-wait`, never a usage error) and `status` names it.
#[test]
fn mysql_get_lock_of_an_application_is_dlocks_lock() {
    let Some(m) = crate::servers::shared_mariadb() else {
        return;
    };
    let b = TestBackend::mysql(&m.url());
    let key = unique_key("app-get-lock");
    let name = b.status(&key)["server_name"].as_str().unwrap().to_string();
    let dir = scratch("app-get-lock");
    // `mariadb` as the snippet calls it, connected to the test's server.
    let mut client = m.client();
    // (The shim must not call itself: the real client by its full path.)
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("mariadb"))
        .find(|p| p.is_file())
        .unwrap();
    let args: Vec<_> = client.get_args().map(|a| a.to_owned()).collect();
    client = Command::new(real);
    client.args(args);
    let shim = dir.join("bin");
    std::fs::create_dir_all(&shim).unwrap();
    std::fs::write(
        shim.join("mariadb"),
        format!("#!/bin/sh\nexec {} \"$@\"\n", shell_words(&client)),
    )
    .unwrap();
    std::fs::set_permissions(
        shim.join("mariadb"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!("{}:{}", shim.display(), std::env::var("PATH").unwrap());
    std::fs::write(
        dir.join("mysql_lock.sh"),
        snippet("mysql").replace("dlock:nightly-report", &name),
    )
    .unwrap();
    app_counter_is_exact(&b, &key, "app-get-lock", 4, |step| {
        let mut app = Command::new("sh");
        app.arg(dir.join("mysql_lock.sh")).args(["sh", step]);
        app.env("PATH", &path);
        app
    });
    // An application holds (a client session in GET_LOCK, until its stdin closes): dlock waits
    // in every mode it has, and status shows who.
    let mut app = Proc::spawn(&mut m.client());
    let sql = format!("SELECT GET_LOCK('{name}', 60);\n");
    std::io::Write::write_all(app.child.stdin.as_mut().unwrap(), sql.as_bytes()).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the application's GET_LOCK",
        || b.status(&key)["held"] == true,
    );
    for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
        let extra = [mode, &["--no-wait"]].concat();
        let out = run_code(&mut b.run(&key, &extra, &["true"]), 75);
        assert!(
            one_error_line(&out).contains("GET_LOCK by an application"),
            "{mode:?}: {}",
            describe(&out)
        );
    }
    let s = b.status(&key);
    assert_eq!(s["held"], true, "{s}");
    assert_eq!(
        s["holders"][0]["foreign"], "GET_LOCK by an application",
        "{s}"
    );
    // (One waiter: a --limit and a --shared run on one key would be a mode mismatch for
    // whichever comes second.)
    let waiter = Proc::spawn(&mut b.run(&key, &["--limit", "2", "--wait", "30s"], &["true"]));
    crate::conformance::wait_until_waiting(&b, &key, 1);
    app.close_stdin();
    let (out, _) = waiter.wait(Duration::from_secs(30));
    assert!(out.status.success(), "{}", describe(&out));
    app.wait(Duration::from_secs(10));
}

/// An application's `GET_LOCK` on the key's name does not see dlock's shared holders and
/// semaphore slots (they hold names of their own), so it is granted beside them; dlock's keeper
/// sees it at its second renewal and stops the command (79) rather than hold on beside it.
#[test]
fn mysql_get_lock_arriving_beside_shared_and_limit_holders_stops_them() {
    let Some(m) = crate::servers::shared_mariadb() else {
        return;
    };
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..TestBackend::mysql(&m.url())
    };
    stopped_when_an_application_arrives(&b, "an application's lock", 3, |key| {
        let name = b.status(key)["server_name"].as_str().unwrap().to_string();
        let mut app = Proc::spawn(&mut m.client());
        let sql = format!("SELECT GET_LOCK('{name}', 60);\n");
        std::io::Write::write_all(app.child.stdin.as_mut().unwrap(), sql.as_bytes()).unwrap();
        app
    });
}

/// Holders in `--shared` and `--limit 2` (a key each, with `b`'s TTL), and an application
/// started by `arrive(key)` that takes the key without seeing them: dlock stops each command
/// (exit 79, stderr saying `says`) within `within_s` seconds of the application's start. The
/// application is then told to end (stdin closed) and must exit 0.
fn stopped_when_an_application_arrives(
    b: &TestBackend,
    says: &str,
    within_s: u64,
    arrive: impl Fn(&str) -> Proc,
) {
    for mode in [&["--shared"][..], &["--limit", "2"]] {
        // A key each: a holder that lost its lock may leave its entry to expire.
        let key = unique_key("app-beside");
        let (holder, _) = b.hold(&key, mode);
        let mut app = arrive(&key);
        let arrived = Instant::now();
        let (out, _) = holder.wait(Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(79), "{mode:?}: {}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{mode:?}: {}",
            describe(&out)
        );
        let took = arrived.elapsed();
        assert!(took < Duration::from_secs(within_s), "{mode:?}: {took:?}");
        app.close_stdin();
        let (out, _) = app.wait(Duration::from_secs(10));
        assert!(out.status.success(), "{}", describe(&out));
    }
}

/// The psql snippet of docs/interop.md: `pg_advisory_lock` on dlock's advisory key.
#[test]
fn postgres_snippet_of_the_docs_shares_dlocks_lock() {
    let Some(p) = crate::servers::shared_postgres() else {
        return;
    };
    let b = TestBackend::postgres(&p.url());
    let key = unique_key("app-advisory");
    let id = b.status(&key)["server_name"].as_str().unwrap().to_string();
    let dir = scratch("app-advisory");
    std::fs::write(dir.join("pg_lock.sh"), snippet("postgres")).unwrap();
    let psql = p.psql();
    let bin = Path::new(psql.get_program()).parent().unwrap();
    let args: Vec<String> = psql
        .get_args()
        .map(|a| a.to_str().unwrap().to_string())
        .collect();
    let after = |flag: &str| args[args.iter().position(|a| a == flag).unwrap() + 1].clone();
    app_counter_is_exact(&b, &key, "app-advisory", 4, |step| {
        let mut app = Command::new("sh");
        app.arg(dir.join("pg_lock.sh")).args([&id, "sh", step]);
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        app.env("PATH", path)
            .env("PGHOST", after("-h"))
            .env("PGPORT", after("-p"))
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres");
        app
    });
}

/// The etcdctl snippet of docs/interop.md: `etcdctl lock dlock/KEY` (`/` and `%` in KEY escaped)
/// is dlock's lock on etcd.
#[test]
fn etcdctl_snippet_of_the_docs_shares_dlocks_lock() {
    let Some(e) = crate::servers::shared_etcd() else {
        return;
    };
    let b = TestBackend::etcd(&e.url());
    // A key with `/` and `%`: the snippet escapes them as dlock does.
    let key = format!("{}/x%y", unique_key("app-etcdctl"));
    let dir = scratch("app-etcdctl");
    std::fs::write(dir.join("etcd_lock.sh"), snippet("etcdctl")).unwrap();
    let ends = e
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    app_counter_is_exact(&b, &key, "app-etcdctl", 5, |step| {
        let mut app = Command::new("sh");
        app.arg(dir.join("etcd_lock.sh"))
            .args([&key, "sh", step])
            .env("ETCDCTL_ENDPOINTS", &ends);
        app
    });
}

/// The redis-py snippet of docs/interop.md: redis-py's `Lock` on `dlock:{KEY}` is dlock's
/// exclusive lock.
#[test]
fn redis_py_snippet_of_the_docs_shares_dlocks_lock() {
    let Some(url) = crate::servers::shared_redis() else {
        return;
    };
    let Some(python) = kazoo() else { return };
    let b = TestBackend::redis(&url);
    let key = unique_key("app-redis");
    let dir = scratch("app-redis");
    std::fs::write(dir.join("redis_lock.py"), snippet("redis-py")).unwrap();
    let app = |key: &str, args: &[&str]| {
        let mut app = Command::new(python);
        app.arg(dir.join("redis_lock.py")).arg(key).args(args);
        app.env("REDIS_URL", &url);
        app
    };
    app_counter_is_exact(&b, &key, "app-redis", 3, |step| app(&key, &["sh", step]));

    // redis-py holds: every dlock mode waits (75 with --no-wait, never a mode mismatch), and a
    // waiting one gets in once it lets go.
    let inside = dir.join("inside");
    let holder = Proc::spawn(&mut app(
        &key,
        &["sh", "-c", &format!("touch {}; sleep 1", inside.display())],
    ));
    let waited = Instant::now();
    while !inside.exists() {
        if waited.elapsed() > Duration::from_secs(10) {
            // Say who held the key, and what redis-py printed.
            let st = b.status(&key);
            let (out, _) = holder.wait(Duration::from_secs(90));
            panic!(
                "redis-py never got the lock; status: {st}; {}",
                describe(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
        let out = run_code(
            &mut b.run(&key, &[mode, &["--no-wait"]].concat(), &["true"]),
            75,
        );
        one_error_line(&out);
    }
    run_ok(&mut b.run(&key, &["--limit", "2", "--wait", "30s"], &["true"]));
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));

    // redis-py arrives while dlock's shared or --limit holder holds: it does not see them and
    // takes the key, so dlock stops its command at its next renewal (ttl/3).
    let b = TestBackend {
        ttl: Duration::from_millis(1500),
        ..b
    };
    stopped_when_an_application_arrives(&b, "not dlock", 2, |key| {
        Proc::spawn(&mut app(key, &["sleep", "1"]))
    });
}
