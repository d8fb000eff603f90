//! `dlock acquire` and `dlock release` against the real binary: the cases every backend must
//! pass (instantiated per backend with [`acquire!`]), and the handle's security checks. The
//! recipes of the docs (shell sections, CI steps, systemd) are in `recipes.rs`.
//!
//! An *owner* here is a `sh` script that runs `eval "$(dlock acquire …)"` and records
//! `DLOCK_HANDLE`, `DLOCK_HOLDER_PID` and its own pid in a marker file. Owners lead a process
//! group of their own (as a job of a terminal's shell, a cron job or a service does), so that
//! the group the holder stops is theirs, not the test harness's.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::*;

/// Expands to one `#[test]` per acquire case for a backend.
#[macro_export]
macro_rules! acquire {
    ($make:expr) => {
        $crate::acquire!(@cases $make;
            acquire_holds_across_commands_until_release,
            owner_exit_frees_the_lock_within_a_second,
            break_stops_the_owner_group_and_release_says_79,
            max_hold_gives_the_lock_up_and_release_says_79,
            kill_9_of_the_holder_frees_the_lock_and_release_says_79,
            acquire_takes_every_mode,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                $crate::acquire::$case(&backend);
            }
        )*
    };
}

/// A private runtime directory for this test binary's handles (`XDG_RUNTIME_DIR`).
pub(crate) fn runtime_dir() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// `dlock SUB <backend args>` with this binary's runtime directory.
pub(crate) fn cmd(b: &TestBackend, sub: &str) -> Command {
    let mut c = b.cmd(sub);
    c.env("XDG_RUNTIME_DIR", runtime_dir());
    c
}

/// `dlock release --handle H`.
pub(crate) fn release(handle: &str) -> Command {
    let mut c = dlock();
    c.env("XDG_RUNTIME_DIR", runtime_dir())
        .args(["release", "--handle", handle]);
    c
}

/// A running owner script.
pub(crate) struct Owner {
    pub p: Proc,
    pub handle: String,
    pub holder: i32,
    pub pid: i32,
    /// The rest of its marker: what it saw (`DLOCK_KEY|DLOCK_FENCING_TOKEN|nested run's code`).
    pub saw: String,
}

/// Starts `sh` running `eval "$(dlock acquire <backend args> ARGS)"`, then `tail`, leading a
/// process group of its own; returns once the lock is held (the marker is written).
pub(crate) fn start_owner(b: &TestBackend, args: &[&str], tail: &str) -> Owner {
    start_owner_in(b, args, tail, true)
}

/// [`start_owner`]; `lead`: false for an owner in the test's process group (as a script run
/// by `make`, a CI runner or `sh -c` leads none).
pub(crate) fn start_owner_in(b: &TestBackend, args: &[&str], tail: &str, lead: bool) -> Owner {
    let dir = scratch("owner");
    let mark = dir.join("mark");
    let script = format!(
        r#"eval "$("$D" acquire "$@")" || exit 9
"$D" run "$@" -n -- true; nested=$?
echo "$DLOCK_HANDLE $DLOCK_HOLDER_PID $$" > "$M.tmp"
echo "$DLOCK_KEY|${{DLOCK_FENCING_TOKEN:-}}|$nested" >> "$M.tmp"
mv "$M.tmp" "$M"
{tail}"#
    );
    let mut c = Command::new("sh");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DLOCK_") {
            c.env_remove(k);
        }
    }
    for (k, v) in &b.env {
        c.env(k, v);
    }
    c.env("D", DLOCK)
        .env("M", &mark)
        .env("XDG_RUNTIME_DIR", runtime_dir())
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(&b.args)
        .args(["--ttl", &format!("{}ms", b.ttl.as_millis())])
        .args(args);
    if lead {
        c.process_group(0);
    }
    b.kernel.apply(&mut c);
    let p = Proc::spawn(&mut c);
    let text = wait_for_file(&mark, b.ttl + Duration::from_secs(15));
    let (first, saw) = text.split_once('\n').unwrap();
    let f: Vec<&str> = first.split(' ').collect();
    Owner {
        handle: f[0].to_string(),
        holder: f[1].parse().unwrap(),
        pid: f[2].parse().unwrap(),
        saw: saw.to_string(),
        p,
    }
}

/// `dlock acquire --owner none --max-hold MAX --format json ARGS`: (handle, holder pid).
pub(crate) fn acquire_detached(b: &TestBackend, max: &str, args: &[&str]) -> (String, i32) {
    let out = run_ok(
        cmd(b, "acquire")
            .args(["--ttl", &format!("{}ms", b.ttl.as_millis())])
            .args(["--owner", "none", "--max-hold", max, "--format", "json"])
            .args(args),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    (
        v["handle"].as_str().unwrap().to_string(),
        v["holder_pid"].as_i64().unwrap() as i32,
    )
}

pub(crate) fn acquire_holds_across_commands_until_release(b: &TestBackend) {
    let (k1, k2) = (unique_key("acq-a"), unique_key("acq-b"));
    let mut o = start_owner(
        b,
        &["-k", &k1, "-k", &k2, "--reason", "deploy v1.4"],
        "read _x || true",
    );
    // What the script saw: the first key, a token where the backend has one, and a nested run
    // on the same key that did not wait for its own lock.
    let saw: Vec<&str> = o.saw.split('|').collect();
    assert_eq!(saw[0], k1);
    assert_eq!(saw[1].parse::<u64>().is_ok(), b.fencing, "token: {saw:?}");
    assert_eq!(saw[2], "0", "a nested run waited for its own lock");

    let s = b.status(&k1);
    let h = &s["holders"][0];
    assert_eq!(h["pid"], o.holder, "{s}");
    assert_eq!(h["owner"]["pid"], o.pid, "{s}");
    assert_eq!(h["reason"], "deploy v1.4", "{s}");
    let text = run_ok(cmd(b, "status").args(["-k", &k1])).stdout;
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains(&format!("held by dlock acquire for pid {}", o.pid))
            && text.contains("reason: deploy v1.4"),
        "{text}"
    );
    assert!(!b.is_free(&k1) && !b.is_free(&k2));
    let out = run_code(cmd(b, "acquire").args(["-k", &k2, "-n"]), 75);
    assert!(
        one_error_line(&out).contains(": deploy v1.4)"),
        "the busy error gives the reason:\n{}",
        describe(&out)
    );

    let out = run_code(&mut release(&o.handle), 0);
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert!(
        b.is_free(&k1) && b.is_free(&k2),
        "free once release returns"
    );
    // It replied before it exits: gone within moments (a busy CI machine saw it still there
    // just after the reply).
    wait_until(Duration::from_secs(5), "the holder process to exit", || {
        !alive(o.holder)
    });
    let out = run_code(&mut release(&o.handle), 2);
    assert!(
        one_error_line(&out).contains("released already"),
        "{}",
        describe(&out)
    );
    assert!(alive(o.pid), "a release does not touch the owner");
    o.p.close_stdin();
    let (out, _) = o.p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

pub(crate) fn owner_exit_frees_the_lock_within_a_second(b: &TestBackend) {
    let key = unique_key("acq-owner-exit");
    let mut o = start_owner(b, &["-k", &key], "read _x || true");
    assert!(!b.is_free(&key));
    o.p.close_stdin();
    let (out, _) = o.p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let exited = Instant::now();
    wait_until(Duration::from_secs(1), "the lock to be free", || {
        b.is_free(&key)
    });
    eprintln!(
        "{}: free {:?} after the owner exited",
        b.name,
        exited.elapsed()
    );
    wait_until(Duration::from_secs(1), "the holder to exit", || {
        !alive(o.holder)
    });
    // Not held until the release: 79, saying why.
    let out = run_code(&mut release(&o.handle), 79);
    assert!(
        one_error_line(&out).contains(&format!("when its owner (pid {}) exited", o.pid)),
        "{}",
        describe(&out)
    );
    run_code(&mut release(&o.handle), 2);

    // An owner that exits leaving a process in its group: that process ran under the lock, and
    // is stopped before the lock is given back.
    let key = unique_key("acq-owner-leftover");
    let dir = scratch("acq-owner-leftover");
    let left = dir.join("left");
    let tail = format!(
        "sh -c 'echo $$ > {}; exec sleep 60' & read _x || true",
        left.display()
    );
    let mut o = start_owner(b, &["-k", &key], &tail);
    let left: i32 = wait_for_file(&left, Duration::from_secs(5))
        .parse()
        .unwrap();
    o.p.close_stdin();
    o.p.wait(Duration::from_secs(5));
    wait_until(Duration::from_secs(2), "the lock to be free", || {
        b.is_free(&key)
    });
    assert!(!alive(left), "what the owner left ran on after the release");
}

pub(crate) fn break_stops_the_owner_group_and_release_says_79(b: &TestBackend) {
    let key = unique_key("acq-break");
    let dir = scratch("acq-break");
    let child = dir.join("child");
    // A process of the owner's group that is not the owner: stopped too.
    let tail = format!(
        "sh -c 'echo $$ > {}; exec sleep 60' & exec sleep 60",
        child.display()
    );
    let o = start_owner(b, &["-k", &key, "--kill-grace", "5s"], &tail);
    let child: i32 = wait_for_file(&child, Duration::from_secs(5))
        .parse()
        .unwrap();
    run_ok(cmd(b, "break").args(["-k", &key]));
    let broken = Instant::now();
    let (out, _) = o.p.wait(b.notice + Duration::from_secs(5));
    let noticed = broken.elapsed();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "{}",
        describe(&out)
    );
    eprintln!("{}: owner got SIGTERM {noticed:?} after the break", b.name);
    assert!(
        noticed < b.notice + Duration::from_millis(700),
        "SIGTERM came {noticed:?} after the break"
    );
    wait_until(Duration::from_secs(2), "the owner's group to go", || {
        !alive(child)
    });
    wait_until(Duration::from_secs(2), "the holder to exit", || {
        !alive(o.holder)
    });
    let out = run_code(&mut release(&o.handle), 79);
    let line = one_error_line(&out);
    assert!(
        line.contains(&format!("lost the lock '{key}' at ")) && line.contains("SIGTERM"),
        "{line}"
    );
    run_code(&mut release(&o.handle), 2);
}

pub(crate) fn max_hold_gives_the_lock_up_and_release_says_79(b: &TestBackend) {
    let key = unique_key("acq-max-hold");
    let started = Instant::now();
    let (handle, holder) = acquire_detached(b, "1s", &["-k", &key]);
    assert!(!b.is_free(&key));
    let freed = wait_until(Duration::from_secs(5), "the lock to be given up", || {
        b.is_free(&key)
    });
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "given up after {freed:?}"
    );
    wait_until(Duration::from_secs(2), "the holder to exit", || {
        !alive(holder)
    });
    let out = run_code(&mut release(&handle), 79);
    assert!(
        one_error_line(&out).contains("given up after --max-hold 1s"),
        "{}",
        describe(&out)
    );
}

pub(crate) fn kill_9_of_the_holder_frees_the_lock_and_release_says_79(b: &TestBackend) {
    let key = unique_key("acq-kill-9");
    let (handle, holder) = acquire_detached(b, "1m", &["-k", &key]);
    // SAFETY: plain kill of a pid we were just given, still alive (it holds the lock).
    unsafe { libc::kill(holder, libc::SIGKILL) };
    wait_until(
        b.ttl + Duration::from_secs(5),
        "the lock to free itself",
        || b.is_free(&key),
    );
    let out = run_code(&mut release(&handle), 79);
    assert!(
        one_error_line(&out).contains("holder process of this handle is gone"),
        "{}",
        describe(&out)
    );
    run_code(&mut release(&handle), 2);
}

pub(crate) fn acquire_takes_every_mode(b: &TestBackend) {
    let key = unique_key("acq-modes");
    if !b.shared {
        run_code(cmd(b, "acquire").args(["-k", &key, "--shared"]), 2);
        return;
    }
    let (r1, _) = acquire_detached(b, "1m", &["-k", &key, "--shared"]);
    let (r2, _) = acquire_detached(b, "1m", &["-k", &key, "--shared"]);
    assert!(!b.is_free(&key), "an exclusive run waits for the readers");
    run_ok(&mut release(&r1));
    run_ok(&mut release(&r2));
    assert!(b.is_free(&key));
    let key = unique_key("acq-limit");
    let (s1, _) = acquire_detached(b, "1m", &["-k", &key, "--limit", "2"]);
    let (s2, _) = acquire_detached(b, "1m", &["-k", &key, "--limit", "2"]);
    run_code(
        cmd(b, "acquire").args(["-k", &key, "--limit", "2", "-n", "--owner", "none"]),
        2,
    );
    run_code(
        cmd(b, "acquire").args(["-k", &key, "--limit", "2", "-n", "--max-hold", "1m"]),
        75,
    );
    run_ok(&mut release(&s1));
    run_ok(&mut release(&s2));
    assert!(b.is_free_in(&key, &["--limit", "2"]));
}

/// The server stops answering while an acquire-held lock's owner runs: the owner is stopped
/// (SIGTERM) before the lease can have run out on the server, and `release` says 79. The
/// backend's TTL must be 1.5 s (see `conformance::paused_server_stops_the_command_in_time`).
pub(crate) fn paused_server_stops_the_owner_in_time(b: &TestBackend, pause: impl Fn(bool)) {
    assert_eq!(b.ttl, Duration::from_millis(1500));
    let key = unique_key("acq-paused");
    let o = start_owner(
        b,
        &["-k", &key, "--kill-grace", "5s", "-q"],
        "exec sleep 60",
    );
    pause(true);
    let paused = Instant::now();
    let (out, _) = o.p.wait(Duration::from_secs(10));
    let died = paused.elapsed();
    pause(false);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "{}",
        describe(&out)
    );
    eprintln!("{}: owner got SIGTERM {died:?} after the pause", b.name);
    // As for `dlock run`: the lease lives on the server until at least pause + 1000 ms; the
    // holder's deadline is at most pause + 1500 ms - margin, and SIGTERM comes 500 ms earlier.
    assert!(
        died < Duration::from_millis(1050),
        "the owner outlived the lease: {died:?}"
    );
    assert!(
        died > Duration::from_millis(400),
        "stopped before the lease was in danger: {died:?}"
    );
    wait_until(Duration::from_secs(5), "the holder to exit", || {
        !alive(o.holder)
    });
    let out = run_code(&mut release(&o.handle), 79);
    assert!(one_error_line(&out).contains("lost"), "{}", describe(&out));
}

/// Handles that are missing, malformed, of another form or already used are refused with one
/// line and exit 2.
#[test]
fn release_refuses_bad_handles() {
    let no_handle = run_code(dlock().arg("release"), 2);
    assert!(one_error_line(&no_handle).contains("no handle"));
    for bad in [
        "garbage",
        "/etc/passwd",
        "/tmp/h-0123456789abcdef.sock",
        "/tmp/x/../h-0123456789abcdef.sock",
    ] {
        let out = run_code(&mut release(bad), 2);
        assert!(
            one_error_line(&out).starts_with("dlock: bad handle"),
            "{bad}: {}",
            describe(&out)
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let stale = runtime_dir().join("dlock").join("h-0123456789abcdef.sock");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::set_permissions(
        stale.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let out = run_code(&mut release(stale.to_str().unwrap()), 2);
    assert!(one_error_line(&out).contains("no lock is held under handle"));
}

/// Another user (`nobody`) can neither release a lock through its handle nor reach its holder.
#[test]
fn another_user_cannot_release_the_lock() {
    if !as_root_for_nobody() {
        return;
    }
    let b = TestBackend::file();
    let key = unique_key("acq-other-user");
    let (handle, holder) = acquire_detached(&b, "1m", &["-k", &key]);
    let out = run_code(
        Command::new(DLOCK)
            .args(["release", "--handle", &handle])
            .env_remove("DLOCK_HANDLE")
            .uid(65534)
            .gid(65534),
        2,
    );
    assert!(
        one_error_line(&out).contains("another user"),
        "{}",
        describe(&out)
    );
    assert!(alive(holder) && !b.is_free(&key), "still held");
    run_ok(&mut release(&handle));
}

/// Owners that cannot be: init (whose descendants are every process), nobody without a bound,
/// no number, no process.
#[test]
fn acquire_refuses_bad_owners() {
    let b = TestBackend::file();
    let key = unique_key("acq-bad-owner");
    for (owner, says) in [
        (&["--owner", "1"][..], "pid 1"),
        (&["--owner", "none"][..], "--max-hold"),
        (&["--owner", "shell"][..], "neither a process id"),
        (&["--owner", "2147483000"][..], "no such process"),
    ] {
        let out = run_code(cmd(&b, "acquire").args(["-k", &key]).args(owner), 2);
        assert!(one_error_line(&out).contains(says), "{}", describe(&out));
    }
    assert!(b.is_free(&key), "nothing was taken");
}

/// Another user made `/tmp/dlock-<uid>` first (cron and CI have no `XDG_RUNTIME_DIR`): acquire
/// passes over it for a directory of its own, and release finds the holder there. Regression:
/// every acquire of that uid failed ("refusing /tmp/dlock-…: not a directory of uid …").
#[test]
fn a_squatted_handle_directory_does_not_stop_acquire_or_release() {
    if !as_root_for_nobody() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let squatted = Path::new("/tmp/dlock-65534");
    let _ = std::fs::remove_dir_all(squatted);
    std::fs::create_dir(squatted).unwrap();
    std::fs::set_permissions(squatted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let locks = PathBuf::from(format!("/tmp/dlock-squat-locks-{}", std::process::id()));
    std::fs::create_dir_all(&locks).unwrap();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new(DLOCK);
        c.args(args)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("DLOCK_HANDLE")
            .current_dir("/")
            .uid(65534)
            .gid(65534);
        c
    };
    let url = format!("file://{}", locks.display());
    let out = run_ok(&mut as_nobody(&[
        "acquire",
        "-u",
        &url,
        "-k",
        "squat",
        "--owner",
        "none",
        "--max-hold",
        "1m",
        "--format",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let handle = v["handle"].as_str().unwrap().to_string();
    assert!(
        !handle.starts_with("/tmp/dlock-65534/"),
        "the handle is in the squatted directory: {handle}"
    );
    run_ok(&mut as_nobody(&["release", "--handle", &handle]));
    let _ = std::fs::remove_dir_all(squatted);
    let _ = std::fs::remove_dir_all(&locks);
}

/// A cleaner (systemd-tmpfiles, logind) removed the handle's socket: the holder puts it back,
/// and release still reaches it. Regression: release said "no lock is held" while it was.
#[test]
fn a_removed_handle_socket_is_put_back() {
    let b = TestBackend::file();
    let key = unique_key("acq-socket-gone");
    let (handle, holder) = acquire_detached(&b, "1m", &["-k", &key]);
    std::fs::remove_file(&handle).unwrap();
    wait_until(Duration::from_secs(15), "the socket to be back", || {
        Path::new(&handle).exists()
    });
    run_ok(&mut release(&handle));
    wait_until(Duration::from_secs(5), "the holder to exit", || {
        !alive(holder)
    });
    assert!(b.is_free(&key));
}

/// `eval "$(timeout 60 dlock acquire …)"`: the wrapper exits as soon as the handle is printed,
/// so the lock is held for the shell above it. Regression: `timeout` was the owner, and the lock
/// was given back at once while acquire said 0.
#[test]
fn a_wrapper_between_the_shell_and_acquire_is_not_the_owner() {
    let b = TestBackend::file();
    let key = unique_key("acq-wrapper");
    let script = format!(
        "set -e; eval \"$(timeout 60 \"$D\" acquire {} -k {key})\"; sleep 1.5; \
         env -u DLOCK_HELD \"$D\" run {} -k {key} -n -- true && echo PROBE-GOT-IT; \
         \"$D\" release",
        b.args.join(" "),
        b.args.join(" ")
    );
    let out = output(
        Command::new("bash")
            .args(["-c", &script])
            .env("D", DLOCK)
            .env("XDG_RUNTIME_DIR", runtime_dir()),
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("PROBE-GOT-IT"),
        "the lock was given back when the wrapper exited: {}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(b.is_free(&key));
}

/// The holder keeps nothing the caller left open for dlock: a script's `exec 9>file; flock 9`
/// is not held on by the holder after the script closed its own descriptor. Regression: the
/// flock stayed until `release`.
#[test]
fn the_holder_keeps_no_descriptor_of_the_caller() {
    let b = TestBackend::file();
    let key = unique_key("acq-fds");
    let other = scratch("acq-fds").join("other.lock");
    let script = format!(
        "set -e; exec 9>{f}; flock 9; eval \"$(\"$D\" acquire {args} -k {key})\"; exec 9>&-; \
         flock -n {f} true && echo FREE; \"$D\" release",
        f = other.display(),
        args = b.args.join(" "),
    );
    let out = output(
        Command::new("bash")
            .args(["-c", &script])
            .env("D", DLOCK)
            .env("XDG_RUNTIME_DIR", runtime_dir()),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("FREE"),
        "the holder kept the caller's flock: {}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

/// `acquire -E 0` is refused: a busy lock would look taken to `eval "$(dlock acquire …)"`, and a
/// `set -e` script would run its section without the lock. The `(exit 2)` ends the eval.
#[test]
fn acquire_refuses_a_conflict_code_of_0() {
    let out = run_code(dlock().args(["acquire", "-E", "0", "-n", "-k", "x"]), 2);
    assert!(one_error_line(&out).contains("-E 0"), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "(exit 2)\n");
}

/// Whatever the arguments, a failing `acquire` ends a shell's `eval` unless clap itself parsed a
/// format that is not for a shell. Regression: a hand-made reading took `--format shell`, `-f SH`
/// and `--reason -fjson` for other formats and printed nothing, and `eval ""` succeeds.
#[test]
fn a_failing_acquire_ends_the_eval_whatever_its_arguments() {
    let script = |args: &str| {
        let out = Command::new("bash")
            .args([
                "-c",
                &format!("set -e; eval \"$({DLOCK} acquire -k x {args})\"; echo UNLOCKED"),
            ])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    for args in ["--format shell", "-f SH", "--reason -fjson", "-E 0 -n"] {
        let (code, said) = script(args);
        assert_eq!(code, Some(2), "{args}: {said}");
        assert!(!said.contains("UNLOCKED"), "{args}: {said}");
    }
    let out = run_code(
        dlock().args(["acquire", "-k", "x", "--format", "json", "-E", "0"]),
        2,
    );
    assert!(out.stdout.is_empty(), "{}", describe(&out));
}
