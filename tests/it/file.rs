//! The file backend: the conformance suite plus what only a lock file can get wrong.

use std::time::Duration;

use crate::conformance::wait_until_waiting;
use crate::util::*;

crate::conformance!(TestBackend::file());

/// `dlock acquire` and `dlock release` (see `acquire.rs`).
mod acquire {
    use super::*;

    crate::acquire!(TestBackend::file());
}

/// Run history and `--once-per` (see `history.rs`).
mod history {
    use super::*;

    crate::history!(TestBackend::file(), crate::history::file_native());

    #[test]
    fn starts_with_odd_times_and_torn_lines() {
        crate::history::file_starts_with_odd_times_and_torn_lines(
            &TestBackend::file(),
            &crate::history::file_native(),
        );
    }
}

/// Shared locks, semaphores, several keys and nested runs.
mod modes {
    use super::*;

    crate::modes!(TestBackend::file());
}

/// The command's whole process tree, whatever ends dlock (see `tree.rs`).
mod tree {
    use super::*;

    crate::tree!(TestBackend::file());
}

fn lock_dir(b: &TestBackend) -> std::path::PathBuf {
    std::path::PathBuf::from(b.args[3].strip_prefix("file://").unwrap())
}

/// A waiter blocked on a lock file that `break --force` unlinks must not end up holding the
/// orphaned inode while someone else holds the new file.
#[test]
fn waiter_on_a_broken_lock_file_does_not_double_hold() {
    let b = TestBackend::file();
    let key = unique_key("broken-waiter");
    let dir = scratch("broken-waiter");
    let first = Proc::spawn(&mut b.run(
        &key,
        &[],
        &sh(&format!("echo > {}/a; exec sleep 30", dir.display())),
    ));
    wait_for_file(&dir.join("a"), Duration::from_secs(5));
    let ran = dir.join("waiter-ran");
    let waiter = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!("echo > {}", ran.display())),
    ));
    wait_until_waiting(&b, &key, 1);
    run_ok(b.cmd("break").args(["-k", &key, "--force"]));
    // A newcomer takes the new lock file at once...
    let mut second = Proc::spawn(&mut b.run(
        &key,
        &["--no-wait"],
        &sh(&format!("echo > {}/b; read _x || true", dir.display())),
    ));
    wait_for_file(&dir.join("b"), Duration::from_secs(5));
    // ...the broken holder stops, which hands the orphaned inode to the waiter...
    let (out, _) = first.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    // ...which must notice and queue behind the newcomer instead of running.
    wait_until_waiting(&b, &key, 1);
    assert!(
        !ran.exists(),
        "the waiter ran while the newcomer held the lock"
    );
    second.close_stdin();
    second.wait(Duration::from_secs(5));
    let (out, _) = waiter.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(ran.exists());
}

/// Someone may plant a symlink where a lock file will be created: dlock must not follow it.
#[test]
fn symlink_at_the_lock_path_is_refused() {
    let b = TestBackend::file();
    let key = unique_key("symlink");
    let target = scratch("symlink").join("victim");
    std::fs::create_dir_all(lock_dir(&b)).unwrap();
    std::os::unix::fs::symlink(&target, lock_dir(&b).join(format!("{key}.lock"))).unwrap();
    let out = run_code(&mut b.run(&key, &[], &["true"]), 69);
    assert!(one_error_line(&out).contains("symbolic link"));
    assert!(!target.exists(), "dlock created a file through the symlink");
}

/// Keys are names, not paths: every valid key is safe and distinct.
#[test]
fn unusual_keys_are_distinct_safe_locks() {
    let b = TestBackend::file();
    let base = unique_key("keys");
    let keys = [
        format!("{base}/a"),
        format!("{base}%2Fa"),
        format!("{base} a"),
        "..".to_string(),
        format!("{base}/../../escape"),
        format!("{base}-ünïcödé-日本"),
        format!("{base}-Job"),
        format!("{base}-job"),
        format!("{base}-{}", "x".repeat(256 - base.len() - 1)),
        format!("{base}-{}", "x".repeat(256 - base.len() - 2)),
    ];
    let dir = scratch("keys");
    for (i, held) in keys.iter().enumerate() {
        let m = dir.join(format!("h{i}"));
        let mut h = b.holding(held, &[], &m);
        for other in keys.iter().filter(|k| *k != held) {
            assert!(b.is_free(other), "holding {held:?} blocked {other:?}");
        }
        assert!(!b.is_free(held));
        h.close_stdin();
        h.wait(Duration::from_secs(5));
    }
    for entry in std::fs::read_dir(lock_dir(&b)).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(
            name.len() < 255 && !name.to_string_lossy().starts_with('.'),
            "{name:?}"
        );
    }
}

/// Without --url, locks live in the documented per-user directory.
#[test]
fn default_directory_is_per_user_and_private() {
    let key = unique_key("default-dir");
    let out = run_ok(dlock().args(["run", "-k", &key, "--", "true"]));
    assert!(out.stderr.is_empty());
    // SAFETY: geteuid takes no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = std::path::PathBuf::from(format!("/var/tmp/dlock-{uid}"));
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.mode() & 0o777, 0o700);
    assert!(dir.join(format!("{key}.lock")).exists());
    std::fs::remove_file(dir.join(format!("{key}.lock"))).unwrap();
}

#[test]
fn bench_measures_and_leaves_nothing_behind() {
    let b = TestBackend::file();
    let dir = lock_dir(&b);
    crate::bench::measures_and_leaves_nothing_behind(&b, &|| {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(crate::bench::KEY_WORD))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    });
}

/// Faults while a workload contends for one key (see `faults.rs`).
mod faults {
    use super::*;

    crate::faults!(TestBackend::file());
}

/// A FIFO planted where a lock file belongs: `run`, `status` and `break` refuse it at once
/// (69, one line). Regression: `status` and `break` opened it without O_NONBLOCK and blocked
/// forever.
#[test]
fn a_fifo_in_place_of_the_lock_file_is_refused_at_once() {
    let b = TestBackend::file();
    let key = unique_key("fifo");
    let path = lock_dir(&b).join(format!("{key}.lock"));
    std::fs::create_dir_all(lock_dir(&b)).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for sub in [vec!["status", "-k", &key], vec!["break", "-k", &key]] {
        let mut cmd = b.cmd(sub[0]);
        let p = Proc::spawn(cmd.args(&sub[1..]));
        let (out, took) = p.wait(Duration::from_secs(5));
        assert_eq!(out.status.code(), Some(69), "{sub:?}: {}", describe(&out));
        assert!(took < Duration::from_secs(2), "{sub:?} took {took:?}");
        assert!(one_error_line(&out).contains("not a regular file"));
    }
    let out = run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 69);
    assert!(one_error_line(&out).contains("not a regular file"));
    std::fs::remove_file(&path).unwrap();
}

/// A shared lock directory (mode 1777, like /tmp) used by two users: the second user's dlock
/// waits for the lock (75 with --no-wait), takes it when free, and the first user takes it back
/// from a file the second user created. Regression: lock files were created 0644 (the umask),
/// and the second user got 69 "Permission denied". Needs root (to run as `nobody`).
#[test]
fn a_shared_directory_works_for_every_user() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !crate::servers::available("runuser") {
        eprintln!("skipped: needs root and runuser to act as a second user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::PathBuf::from(format!("/tmp/dlock-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let url = format!("file://{}", dir.display());
    let as_nobody = |args: &[&str]| {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "nobody", "--", DLOCK, "run", "--url", &url])
            .args(args);
        c
    };
    for key in [unique_key("shared-dir"), unique_key("shared-dir-limit")] {
        let limit: &[&str] = if key.contains("limit") {
            &["--limit", "2"]
        } else {
            &[]
        };
        // root creates the lock file (umask 022) and holds it...
        let root = TestBackend {
            args: vec!["--url".into(), url.clone()],
            ..TestBackend::file()
        };
        let (holder, _) = root.hold(&key, limit);
        // ...nobody is told it is busy, not refused...
        if limit.is_empty() {
            let out = output(as_nobody(&["-k", &key, "--no-wait", "--", "true"]).args(limit));
            assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
        }
        drop(holder);
        // In the holder's mode: until the guardian has seen the command's tree go, the lock is
        // still held as --limit 2, and an exclusive probe would be refused, not told "busy".
        wait_until(Duration::from_secs(5), "the holder gone", || {
            root.is_free_in(&key, limit)
        });
        // ...takes it when free...
        let mut args = vec!["-k", key.as_str()];
        args.extend_from_slice(limit);
        args.extend(["--", "true"]);
        let out = output(&mut as_nobody(&args));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        // ...and root still can, after nobody.
        run_ok(&mut root.run(&key, limit, &["true"]));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// In a shared directory (1777) every user can write the lock files, fencing counter included.
/// A counter another user rewinds (`{"fence":5}`) must not make tokens go backwards: it is
/// overtaken by the clock. One pushed to the end of the range is refused (69, one line), not
/// followed to a token that stops growing or wraps. Regression: the next token was 6.
#[test]
fn a_counter_another_user_rewinds_does_not_make_tokens_go_backwards() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !crate::servers::available("runuser") {
        eprintln!("skipped: needs root and runuser to act as a second user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::PathBuf::from(format!("/tmp/dlock-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let b = TestBackend {
        args: vec!["--url".into(), format!("file://{}", dir.display())],
        ..TestBackend::file()
    };
    let key = unique_key("rewind");
    let token = |b: &TestBackend| -> u64 {
        let out = run_ok(&mut b.run(&key, &[], &sh("printf %s \"$DLOCK_FENCING_TOKEN\"")));
        String::from_utf8(out.stdout).unwrap().parse().unwrap()
    };
    let first = token(&b);
    let lock = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        .unwrap()
        .path();
    // Another user rewrites the counter: the file is theirs to write, as it must be.
    let forge = |text: &str| {
        let out = output(
            std::process::Command::new("runuser")
                .args(["-u", "nobody", "--", "sh", "-c"])
                .arg(format!("printf '%s' '{text}' > '{}'", lock.display())),
        );
        assert!(
            out.status.success(),
            "nobody could not write the lock file: {}",
            describe(&out)
        );
    };
    forge(r#"{"fence":5}"#);
    let second = token(&b);
    assert!(second > first, "token went from {first} back to {second}");
    forge(&format!(r#"{{"fence":{}}}"#, u64::MAX));
    let out = run_code(&mut b.run(&key, &[], &["true"]), 69);
    assert!(
        one_error_line(&out).contains("ahead of the clock"),
        "{}",
        describe(&out)
    );
    // Removing the file (as the message says) starts the counter again from the clock, still
    // above every token handed out.
    std::fs::remove_file(&lock).unwrap();
    let third = token(&b);
    assert!(third > second, "token went from {second} back to {third}");
}

/// `dlock status` without `--key` lists every held lock in a directory of 30,000 lock files
/// left by past runs (lock files stay: see docs/backends.md). Regression: the first 10,000
/// directory entries were the candidates, and held locks past them were left out, without a word.
#[test]
fn status_lists_every_held_lock_among_stale_lock_files() {
    let dir = scratch("stale-lock-files");
    let b = TestBackend {
        args: vec![
            "--backend".into(),
            "file".into(),
            "--url".into(),
            format!("file://{}", dir.display()),
        ],
        ..TestBackend::file()
    };
    for i in 0..30_000 {
        std::fs::write(dir.join(format!("stale-{i:05}.lock")), b"").unwrap();
    }
    let keys: Vec<String> = (0..5).map(|i| format!("held-{i}")).collect();
    let mut holders: Vec<Proc> = keys
        .iter()
        .map(|k| b.holding(k, &[], &dir.join(format!("{k}.marker"))))
        .collect();
    let out = run_ok(b.cmd("status").arg("--json"));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["key"].as_str())
        .collect();
    assert_eq!(listed, keys, "{}", describe(&out));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    for h in &mut holders {
        h.close_stdin();
    }
    for h in holders {
        let (out, _) = h.wait(Duration::from_secs(10));
        assert!(out.status.success(), "{}", describe(&out));
    }
}

/// In a shared directory (1777), another user hard-links a file of the victim's (here one
/// writable by all, which `fs.protected_hardlinks` lets anyone link) at the paths of a key's
/// lock file and history file. The victim's `dlock run` refuses them (69, one line) and leaves
/// the file's mode and content as they were. Regression: the mode became 0666 and the content
/// `{"fence":…,"holder":null}`. Needs root (to act as `nobody`).
#[test]
fn a_file_hard_linked_into_a_shared_directory_keeps_its_mode_and_content() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !crate::servers::available("runuser") {
        eprintln!("skipped: needs root and runuser to act as a second user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::PathBuf::from(format!("/tmp/dlock-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let b = TestBackend {
        args: vec!["--url".into(), format!("file://{}", dir.display())],
        ..TestBackend::file()
    };
    for (i, what) in ["lock", "history"].iter().enumerate() {
        let key = unique_key("links");
        let lock = std::path::PathBuf::from(b.status(&key)["server_name"].as_str().unwrap());
        let target = if *what == "lock" {
            lock.clone()
        } else {
            lock.with_extension("history")
        };
        let victim = scratch("links").join(format!("victim-{i}"));
        std::fs::write(&victim, "the victim's data\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o606)).unwrap();
        std::fs::set_permissions(
            victim.parent().unwrap(),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let linked = std::process::Command::new("runuser")
            .args(["-u", "nobody", "--", "ln"])
            .arg(&victim)
            .arg(&target)
            .status()
            .unwrap();
        assert!(linked.success(), "nobody could not link the victim's file");
        let out = output(&mut b.run(&key, &[], &["true"]));
        if *what == "lock" {
            assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
            assert!(
                one_error_line(&out).contains("hard links"),
                "{}",
                describe(&out)
            );
        }
        let meta = std::fs::metadata(&victim).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            0o606,
            "{what}: mode changed"
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "the victim's data\n",
            "{what}: content changed"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
