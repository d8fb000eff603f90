//! Retention (docs/history.md, "Retention"): many one-shot keys leave bounded traces once they
//! age out, on every backend that keeps some. Each backend's test gives a namespace of its own
//! (a directory, a database, a chroot, a server) and a native count of the keys that left
//! something there, written with the server's own client.
//!
//! The retention is shortened with `DLOCK_TEST_RETENTION` (with it, every run prunes) and
//! `dlock prune --older-than`. The number of one-shot keys is `DLOCK_TEST_ONE_SHOT_KEYS`
//! (default [`DEFAULT_KEYS`], to keep CI fast; the 1,000 was run by hand, see
//! bench/README.md).

use std::time::{Duration, Instant};

use crate::util::*;

/// One-shot keys per backend in CI.
const DEFAULT_KEYS: usize = 150;
/// The retention the tests age keys out with.
const AGE: Duration = Duration::from_secs(2);
const AGE_TEXT: &str = "2s";
/// The most keys one run's pruning removes (`history::retention::BATCH`).
const BATCH: usize = 64;

fn one_shot_keys() -> usize {
    std::env::var("DLOCK_TEST_ONE_SHOT_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_KEYS)
}

/// The token a one-shot run of `key` got.
fn token_of(b: &TestBackend, key: &str, env: &[(&str, &str)]) -> u64 {
    let mut c = b.run(key, &[], &sh("echo \"$DLOCK_FENCING_TOKEN\""));
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run_ok(&mut c);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no token: {}", describe(&out)))
}

/// Runs `dlock run -k PREFIX-i -- true` for i in 0..n, four at a time.
fn make_keys(b: &TestBackend, prefix: &str, n: usize, env: &[(&str, &str)]) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= n {
                        break;
                    }
                    let mut c = b.run(&format!("{prefix}-{i}"), &[], &["true"]);
                    for (k, v) in env {
                        c.env(k, v);
                    }
                    run_ok(&mut c);
                }
            });
        }
    });
}

/// The case every backend passes: `keys()` counts the keys that left anything in the
/// backend's namespace. `expires`: the server expires what keys leave (Redis), by the retention
/// in force when they were written, so the runs that write them get the short one.
pub(crate) fn one_shot_keys_age_out(b: &TestBackend, keys: &dyn Fn() -> usize, expires: bool) {
    let n = one_shot_keys();
    let prefix = unique_key("oneshot");
    let dir = scratch("retention");
    // A server that expires what it was told to at write time must not expire the first
    // keys before the last are written: a retention longer than their writing.
    let age = if expires {
        AGE + Duration::from_millis(n as u64 * 20)
    } else {
        AGE
    };
    let age_text = format!("{}ms", age.as_millis());
    let short: &[(&str, &str)] = if expires {
        &[("DLOCK_TEST_RETENTION", &age_text)]
    } else {
        &[]
    };
    let reused = format!("{prefix}-reused");
    let first = token_of(b, &reused, short);
    let held = format!("{prefix}-held");
    let mut holder = {
        let marker = dir.join("held");
        let script = format!("echo $$ > {}; read _x || true", marker.display());
        let mut c = b.run(&held, &[], &sh(&script));
        for (k, v) in short {
            c.env(k, v);
        }
        let p = Proc::spawn(&mut c);
        wait_for_file(&marker, Duration::from_secs(20));
        p
    };

    let t0 = Instant::now();
    make_keys(b, &prefix, n, short);
    let made = t0.elapsed();
    let before = keys();
    eprintln!(
        "{}: {n} one-shot keys in {:.1}s; {before} keys with traces",
        b.name,
        made.as_secs_f64()
    );
    assert!(before >= n + 2, "{before} keys with traces after {n} runs");

    // Every key is untouched for AGE from here on.
    std::thread::sleep(age + Duration::from_millis(200));

    // As dlock goes: one run (on a key of its own) prunes a batch, after it let go.
    let fresh = format!("{prefix}-fresh");
    run_ok(
        b.run(&fresh, &[], &["true"])
            .env("DLOCK_TEST_RETENTION", AGE_TEXT),
    );
    let after_one = keys();
    // The batch may have looked at the held key too, and left it.
    assert!(
        after_one + BATCH.min(n) <= before + 2,
        "one run pruned too little: {before} -> {after_one}"
    );

    // At once.
    let out = run_ok(b.cmd("prune").args(["--older-than", AGE_TEXT]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("pruned "), "{}", describe(&out));
    let after = keys();
    eprintln!(
        "{}: {before} -> {after_one} -> {after} keys with traces",
        b.name
    );
    // Left: the held key, the fresh one (younger than AGE).
    assert!(
        after <= 2,
        "{after} keys left traces after the prune: {said}"
    );

    // The held key kept its lock, and its holder runs on.
    assert!(
        !b.is_free(&held),
        "the held key was pruned from under its holder"
    );
    holder.close_stdin();
    let (out, _) = holder.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    // A key used again after it was pruned goes on from a larger token.
    if b.fencing {
        let again = token_of(b, &reused, &[]);
        assert!(again > first, "token went back: {first} then {again}");
    }
}

/// A prune racing the first use of an aged-out key: the key's token still grows, and the run
/// that took it is not disturbed.
pub(crate) fn a_prune_racing_a_reuse_keeps_tokens_growing(b: &TestBackend) {
    let key = unique_key("race");
    let mut last = token_of(b, &key, &[]);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1100));
        let prune = Proc::spawn(b.cmd("prune").args(["--older-than", "1s"]));
        let token = token_of(b, &key, &[("DLOCK_TEST_RETENTION", "1s")]);
        let (out, _) = prune.wait(Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(token > last, "token went back: {last} then {token}");
        last = token;
    }
}

mod file {
    use super::*;

    fn keys_in(dir: &std::path::Path) -> usize {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| {
                n.strip_suffix(".lock")
                    .or_else(|| n.strip_suffix(".history"))
                    .or_else(|| n.strip_suffix(".lock.broken"))
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        names.dedup();
        names.len()
    }

    fn own_dir() -> (TestBackend, std::path::PathBuf) {
        let dir = scratch("retention-file");
        let mut b = TestBackend::file();
        b.args[3] = format!("file://{}", dir.display());
        (b, dir)
    }

    #[test]
    fn file_one_shot_keys_age_out() {
        let (b, dir) = own_dir();
        one_shot_keys_age_out(&b, &|| keys_in(&dir), false);
        // The floor is all that stays, beside the live keys.
        assert!(dir.join("dlock.floor").exists());
    }

    #[test]
    fn file_a_prune_racing_a_reuse_keeps_tokens_growing() {
        let (b, _dir) = own_dir();
        a_prune_racing_a_reuse_keeps_tokens_growing(&b);
    }
}

/// A name for a database of one test: letters, digits and `_` only.
fn db_name(name: &str) -> String {
    unique_key(name).replace('-', "_")
}

mod postgres {
    use super::*;
    use crate::servers::shared_postgres;

    /// A database of its own on the shared server, and a backend on it.
    fn own_db() -> Option<(TestBackend, String)> {
        let pg = shared_postgres()?;
        let db = db_name("retain");
        pg.sql(&format!("CREATE DATABASE {db}"));
        let url = format!("{}/{db}", pg.url().strip_suffix("/postgres").unwrap());
        Some((TestBackend::postgres(&url), db))
    }

    fn sql(db: &str, sql: &str) -> String {
        let pg = shared_postgres().unwrap();
        let out = pg.psql().args(["-d", db, "-c", sql]).output().unwrap();
        assert!(out.status.success(), "{sql}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Keys with a history or a fencing counter (the floor is not a key).
    fn keys(db: &str) -> usize {
        let n = sql(
            db,
            "SELECT greatest((SELECT count(DISTINCT key) FROM dlock_runs), \
             (SELECT count(*) FROM dlock_fences WHERE id <> '-9223372036854775808'::bigint))",
        );
        n.parse().unwrap()
    }

    #[test]
    fn postgres_one_shot_keys_age_out() {
        let Some((b, db)) = own_db() else { return };
        one_shot_keys_age_out(&b, &|| keys(&db), false);
        // The floor holds the largest token removed.
        let floor = sql(
            &db,
            "SELECT fence FROM dlock_fences WHERE id = '-9223372036854775808'::bigint",
        );
        assert!(floor.parse::<u64>().is_ok(), "no floor: {floor:?}");
    }

    #[test]
    fn postgres_a_prune_racing_a_reuse_keeps_tokens_growing() {
        let Some((b, _db)) = own_db() else { return };
        a_prune_racing_a_reuse_keeps_tokens_growing(&b);
    }

    /// The floor, not the clock, lifts a reused key: a counter removed while far ahead of the
    /// clock (as after the server's clock stepped back) is still exceeded.
    #[test]
    fn postgres_a_reused_key_starts_above_the_floor() {
        let Some((b, db)) = own_db() else { return };
        let key = unique_key("floor");
        token_of(&b, &key, &[]);
        let ahead: u64 = 9_000_000_000_000_000;
        // What a prune of that counter leaves.
        sql(
            &db,
            &format!(
                "DELETE FROM dlock_fences; INSERT INTO dlock_fences VALUES \
                 ('-9223372036854775808'::bigint, {ahead})"
            ),
        );
        assert!(token_of(&b, &key, &[]) > ahead);
    }
}

mod mysql {
    use super::*;
    use crate::servers::shared_mariadb;

    /// A database of its own on the shared server, and a backend on it.
    fn own_db() -> Option<(TestBackend, String)> {
        let m = shared_mariadb()?;
        let db = db_name("retain");
        m.sql(&format!("CREATE DATABASE {db}"));
        let url = format!("{}/{db}", m.url().strip_suffix("/dlock").unwrap());
        Some((TestBackend::mysql(&url), db))
    }

    fn sql(db: &str, sql: &str) -> String {
        shared_mariadb().unwrap().sql(&format!("USE {db}; {sql}"))
    }

    /// Keys with a history or a counter row (the floor is not a key).
    fn keys(db: &str) -> usize {
        sql(
            db,
            "SELECT GREATEST((SELECT COUNT(DISTINCT lock_key) FROM dlock_runs), \
             (SELECT COUNT(*) FROM dlock_locks WHERE name <> 'dlock!floor'))",
        )
        .trim()
        .parse()
        .unwrap()
    }

    #[test]
    fn mysql_one_shot_keys_age_out() {
        let Some((b, db)) = own_db() else { return };
        one_shot_keys_age_out(&b, &|| keys(&db), false);
        let floor = sql(
            &db,
            "SELECT fence FROM dlock_locks WHERE name = 'dlock!floor'",
        );
        assert!(floor.trim().parse::<u64>().is_ok(), "no floor: {floor:?}");
    }

    #[test]
    fn mysql_a_prune_racing_a_reuse_keeps_tokens_growing() {
        let Some((b, _db)) = own_db() else { return };
        a_prune_racing_a_reuse_keeps_tokens_growing(&b);
    }

    /// The floor, not the clock, lifts a reused key (see the PostgreSQL case).
    #[test]
    fn mysql_a_reused_key_starts_above_the_floor() {
        let Some((b, db)) = own_db() else { return };
        let key = unique_key("floor");
        token_of(&b, &key, &[]);
        let ahead: u64 = 9_000_000_000_000_000;
        sql(
            &db,
            &format!(
                "DELETE FROM dlock_locks; INSERT INTO dlock_locks VALUES ('dlock!floor', {ahead}, '', 0)"
            ),
        );
        assert!(token_of(&b, &key, &[]) > ahead);
    }
}

mod zookeeper {
    use super::*;
    use crate::servers::shared_zookeeper;

    /// A chroot of its own on the shared ensemble, and a backend in it.
    fn own_chroot() -> Option<(TestBackend, String)> {
        let zk = shared_zookeeper()?;
        let chroot = format!("/{}", unique_key("retain"));
        Some((
            TestBackend::zookeeper(&format!("{}{chroot}", zk.url())),
            chroot,
        ))
    }

    /// Keys with a history node or a lock node.
    fn keys(chroot: &str) -> usize {
        let zk = shared_zookeeper().unwrap();
        let mut names = zk.children(&format!("{chroot}/dlock-history"));
        names.extend(zk.children(&format!("{chroot}/dlock")));
        names.sort();
        names.dedup();
        names.len()
    }

    #[test]
    fn zookeeper_one_shot_keys_age_out() {
        let Some((b, chroot)) = own_chroot() else {
            return;
        };
        one_shot_keys_age_out(&b, &|| keys(&chroot), false);
    }

    #[test]
    fn zookeeper_a_prune_racing_a_reuse_keeps_tokens_growing() {
        let Some((b, _)) = own_chroot() else { return };
        a_prune_racing_a_reuse_keeps_tokens_growing(&b);
    }
}

mod etcd {
    use super::*;
    use crate::servers::Etcd;

    /// Keys with events under `dlock/%history/`, or lock keys under `dlock/`.
    fn keys(e: &Etcd) -> usize {
        let out = e
            .etcdctl()
            .args(["get", "--prefix", "dlock/", "--keys-only"])
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl get: {}", describe(&out));
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                let rest = l.strip_prefix("dlock/")?;
                let rest = rest.strip_prefix("%history/").unwrap_or(rest);
                Some(rest.split('/').next()?.to_string())
            })
            .collect();
        names.sort();
        names.dedup();
        names.len()
    }

    // A server of its own: every key of an etcd is under `dlock/`, and this prunes them all.
    #[test]
    fn etcd_one_shot_keys_age_out() {
        let Some(e) = Etcd::start() else { return };
        let b = TestBackend::etcd(&e.url());
        one_shot_keys_age_out(&b, &|| keys(&e), false);
    }

    #[test]
    fn etcd_a_prune_racing_a_reuse_keeps_tokens_growing() {
        let Some(e) = Etcd::start() else { return };
        a_prune_racing_a_reuse_keeps_tokens_growing(&TestBackend::etcd(&e.url()));
    }
}

mod redis {
    use super::*;
    use crate::servers::Redis;

    /// Lock names with any key left (`dlock:{KEY}…`); `KEYS` leaves out the expired ones.
    fn keys(r: &Redis) -> usize {
        let mut names: Vec<String> = r
            .cli(&["--raw", "KEYS", "dlock:*"])
            .lines()
            .filter_map(|l| Some(l.split_once('{')?.1.split_once('}')?.0.to_string()))
            .collect();
        names.sort();
        names.dedup();
        names.len()
    }

    // A server of its own: what one test writes with a short retention is gone in seconds.
    // Redlock, Sentinel and Cluster run these same scripts (the fence counter and the history
    // are written by `scripts::acquire_script` and history.rs for every Redis topology).
    #[test]
    fn redis_one_shot_keys_age_out() {
        let Some(r) = Redis::start(&[]) else { return };
        let b = TestBackend::redis(&r.url());
        one_shot_keys_age_out(&b, &|| keys(&r), true);
    }
}
