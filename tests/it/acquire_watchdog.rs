//! The acquire holder's watchdog (`src/hold/watchdog.rs`): a `kill -9` of the holder never lets
//! a waiter's command start while the owner's group still runs — on the file backend and
//! PostgreSQL (whose locks end with the holder's descriptors and connections) and on Redis
//! (whose lease runs out later) — and a `kill -9` of the watchdog alone gets it replaced, the
//! lock kept. Also: the holder and its watchdog keep no caller's directory (issue 40 item 7).
//! The simulated old kernels (`kernels.rs`) run the first case too.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use crate::acquire::{start_owner, start_owner_in};
use crate::servers::{shared_postgres, shared_redis};
use crate::util::*;

/// The holder's watchdog: its only child. (Not found by its name, `d-lock-guard`: while it
/// executes dlock anew, 20 ms after it started, its name is the binary's for a moment.)
pub(crate) fn watchdog_of(holder: i32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{holder}/task/{holder}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|&p| alive(p))
}

/// Where the owner and its SIGTERM-ignoring child are, as to process groups.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The owner leads a group, and its child is in it (a terminal's job, a cron job).
    OwnGroup,
    /// The owner leads no group (a script run by `make`, a CI runner, `sh -c`): the child is in
    /// the group of the owner's parent (the test's).
    ParentsGroup,
    /// The owner leads a group; its child made a session of its own (`setsid`).
    ChildOwnSession,
}

/// Starts an owner whose background child ignores SIGTERM: (owner, the child's pid).
pub(crate) fn owner_with_stubborn_child(
    b: &TestBackend,
    key: &str,
    dir: &Path,
    shape: Shape,
) -> (crate::acquire::Owner, i32) {
    let child = dir.join("child");
    let setsid = if shape == Shape::ChildOwnSession {
        "setsid "
    } else {
        ""
    };
    let tail = format!(
        "{setsid}sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 0.1; done' & wait",
        child.display()
    );
    let o = start_owner_in(b, &["-k", key], &tail, shape != Shape::ParentsGroup);
    let child: i32 = wait_for_file(&child, Duration::from_secs(5))
        .parse()
        .unwrap();
    (o, child)
}

/// Kills the holder with SIGKILL while a waiter `dlock run --wait` is queued whose command
/// records the owner's child's state as it starts: it must find it dead (a zombie or gone).
fn kill_holder_and_check_the_waiter(
    b: &TestBackend,
    key: &str,
    dir: &Path,
    holder: i32,
    child: i32,
) {
    let seen = dir.join("seen");
    let script = format!(
        "s=$(cut -d' ' -f3 /proc/{child}/stat 2>/dev/null); echo \"${{s:-gone}}\" > {f}.tmp; \
         mv {f}.tmp {f}",
        f = seen.display()
    );
    let waiter = Proc::spawn(&mut b.run(key, &["--wait", "60s"], &sh(&script)));
    assert!(watchdog_of(holder).is_some(), "the holder has a watchdog");
    // SAFETY: kill takes two integers; `holder` is the live holder of this test's lock.
    unsafe { libc::kill(holder, libc::SIGKILL) };
    let state = wait_for_file(&seen, b.ttl + Duration::from_secs(15));
    assert!(
        state == "Z" || state == "X" || state == "gone",
        "on {}: the waiter's command started while the owner's child ({child}) ran (state {state})",
        b.kernel.name()
    );
    let (out, _) = waiter.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    wait_until(
        Duration::from_secs(3),
        "the owner's child to be gone",
        || !alive(child),
    );
}

/// `kill -9` of the holder: the watchdog kills the owner's group (its SIGTERM-ignoring child
/// included) before the lock can pass to a waiter.
pub(crate) fn kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts(b: &TestBackend) {
    kill_9_of_the_holder_kills_the_owners_tree(b, Shape::OwnGroup);
}

/// `kill -9` of the holder of an owner that leads no group: its child (in another group) is
/// killed before the lock can pass to a waiter. Before, only the owner was.
pub(crate) fn kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group(b: &TestBackend) {
    kill_9_of_the_holder_kills_the_owners_tree(b, Shape::ParentsGroup);
}

/// `kill -9` of the holder: the owner's child that made a session of its own is killed too.
pub(crate) fn kill_9_of_the_holder_kills_a_child_in_a_session_of_its_own(b: &TestBackend) {
    kill_9_of_the_holder_kills_the_owners_tree(b, Shape::ChildOwnSession);
}

fn kill_9_of_the_holder_kills_the_owners_tree(b: &TestBackend, shape: Shape) {
    let key = unique_key("wd-kill9");
    let dir = scratch("wd-kill9");
    let (o, child) = owner_with_stubborn_child(b, &key, &dir, shape);
    kill_holder_and_check_the_owner(b, &key, &dir, o, child);
}

/// [`kill_holder_and_check_the_waiter`], then the owner must have died of SIGKILL.
fn kill_holder_and_check_the_owner(
    b: &TestBackend,
    key: &str,
    dir: &Path,
    o: crate::acquire::Owner,
    child: i32,
) {
    kill_holder_and_check_the_waiter(b, key, dir, o.holder, child);
    let (out, _) = o.p.wait(Duration::from_secs(5));
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        describe(&out)
    );
}

/// `kill -9` of the watchdog alone: the holder, which still holds the lock, starts a new one
/// (the lock is kept, nothing is stopped), and that one guards the owner as the first did.
pub(crate) fn kill_9_of_the_watchdog_gets_a_new_one_and_the_lock_is_kept(b: &TestBackend) {
    let key = unique_key("wd-replaced");
    let dir = scratch("wd-replaced");
    let (o, child) = owner_with_stubborn_child(b, &key, &dir, Shape::OwnGroup);
    let first = watchdog_of(o.holder).expect("a watchdog");
    // SAFETY: kill takes two integers; `first` is the holder's watchdog, just read.
    unsafe { libc::kill(first, libc::SIGKILL) };
    wait_until(Duration::from_secs(3), "a new watchdog", || {
        watchdog_of(o.holder).is_some_and(|w| w != first)
    });
    assert!(
        alive(o.holder) && alive(o.pid) && alive(child),
        "nothing was stopped"
    );
    assert!(!b.is_free(&key), "the lock is still held");
    kill_holder_and_check_the_waiter(b, &key, &dir, o.holder, child);
}

/// The holder frozen (SIGSTOP) past its lease: its watchdog, at the lease's deadline, kills
/// the owner's group (its SIGTERM-ignoring child included) before a waiter's command can start.
/// Before, the watchdog's kill at the deadline went to pid 0 — its own process group — and it
/// died killing nobody: the owner ran on beside the next holder (found by the fault campaign).
pub(crate) fn a_holder_frozen_past_its_lease_has_the_owners_group_killed_before_a_waiter_starts(
    b: &TestBackend,
) {
    let key = unique_key("wd-frozen");
    let dir = scratch("wd-frozen");
    let (o, child) = owner_with_stubborn_child(b, &key, &dir, Shape::OwnGroup);
    let seen = dir.join("seen");
    let script = format!(
        "s=$(cut -d' ' -f3 /proc/{child}/stat 2>/dev/null); echo \"${{s:-gone}}\" > {f}.tmp; \
         mv {f}.tmp {f}",
        f = seen.display()
    );
    let watchdog = watchdog_of(o.holder).expect("the holder has a watchdog");
    // SAFETY: kill takes two integers; `o.holder` is the live holder of this test's lock.
    unsafe { libc::kill(o.holder, libc::SIGSTOP) };
    let waiter = Proc::spawn(&mut b.run(&key, &["--wait", "60s"], &sh(&script)));
    let state = wait_for_file(&seen, b.ttl + Duration::from_secs(30));
    // SAFETY: as above; the holder is ours (stopped, not reaped: it cannot have been recycled).
    unsafe { libc::kill(o.holder, libc::SIGCONT) };
    assert!(
        state == "Z" || state == "X" || state == "gone",
        "the waiter's command started while the frozen holder's owner's child ({child}) ran \
         (state {state}; the watchdog {watchdog} is {})",
        if alive(watchdog) { "alive" } else { "gone" }
    );
    let (out, _) = waiter.wait(Duration::from_secs(10));
    assert!(out.status.success(), "{}", describe(&out));
    let (out, _) = o.p.wait(Duration::from_secs(10));
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        describe(&out)
    );
}

/// Expands to one `#[test]` per watchdog case for a backend.
macro_rules! watchdog {
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                crate::acquire_watchdog::$case(&backend);
            }
        )*
    };
}

mod file {
    use super::*;
    watchdog!(TestBackend::file();
        kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts,
        kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group,
        kill_9_of_the_holder_kills_a_child_in_a_session_of_its_own,
        kill_9_of_the_watchdog_gets_a_new_one_and_the_lock_is_kept,
    );
}

mod postgres {
    use super::*;
    watchdog!(
        match shared_postgres() {
            Some(p) => TestBackend::postgres(&p.url()),
            None => return,
        };
        kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts,
        kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group,
        kill_9_of_the_watchdog_gets_a_new_one_and_the_lock_is_kept,
    );
}

mod redis {
    use super::*;
    watchdog!(
        match shared_redis() {
            Some(url) => TestBackend::redis(&url),
            None => return,
        };
        kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts,
        kill_9_of_the_holder_kills_a_child_in_a_session_of_its_own,
        a_holder_frozen_past_its_lease_has_the_owners_group_killed_before_a_waiter_starts,
    );
}

/// MariaDB: a frozen holder's session outlives its lease until the server's `wait_timeout`
/// (set from `--ttl`) ends it.
mod mysql {
    use super::*;
    watchdog!(
        match crate::servers::shared_mariadb() {
            Some(m) => TestBackend::mysql(&m.url()),
            None => return,
        };
        a_holder_frozen_past_its_lease_has_the_owners_group_killed_before_a_waiter_starts,
    );
}

/// A library built here whose constructor exits 1 in a process named `d-lock-guard` — a
/// guardian or watchdog executing dlock anew — and does nothing anywhere else: what the long
/// fault campaign's libfaketime did there (its shared memory gone with the process that made
/// it, an `acquire` caller that had exited).
fn preload_that_fails_in_a_guardian(dir: &Path) -> std::path::PathBuf {
    compile_c(
        dir,
        "fail_in_guardian.so",
        "#define _GNU_SOURCE\n#include <errno.h>\n#include <string.h>\n#include <unistd.h>\n\
         __attribute__((constructor)) static void fail(void) {\n\
         if (strcmp(program_invocation_short_name, \"d-lock-guard\") == 0) _exit(1);\n}\n",
        &["-shared", "-fPIC"],
    )
}

/// `LD_PRELOAD` of a library that cannot start in a guardian executing dlock anew: the guardian
/// leaves it out of its environment and guards on. Before, every watchdog (and every one that
/// replaced it) died 20 ms after its start, and a `kill -9` of the holder in the gap before
/// the next let the lock go while the owner's child ran (the long campaign: file, MySQL,
/// PostgreSQL); a `dlock run` of more than 20 ms lost its guardian and ended in an error.
#[test]
fn a_preloaded_library_that_fails_in_a_guardian_is_left_out_of_it() {
    let dir = scratch("wd-preload");
    let lib = preload_that_fails_in_a_guardian(&dir);
    let mut b = TestBackend::file();
    b.env.push(("LD_PRELOAD".into(), lib.display().to_string()));
    let key = unique_key("wd-preload");
    let out = output(&mut b.run(&key, &[], &["sleep", "0.3"]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let (o, child) = owner_with_stubborn_child(&b, &key, &dir, Shape::OwnGroup);
    let first = watchdog_of(o.holder).expect("a watchdog");
    let resumed = |w: i32| {
        std::fs::read(format!("/proc/{w}/cmdline"))
            .is_ok_and(|c| c.starts_with(b"d-lock-guard\0--resume-guardian"))
    };
    wait_until(
        Duration::from_secs(5),
        "the watchdog to execute dlock anew",
        || resumed(first) || watchdog_of(o.holder) != Some(first),
    );
    assert_eq!(
        watchdog_of(o.holder),
        Some(first),
        "the watchdog died as it executed dlock anew, and was replaced"
    );
    let environ = std::fs::read(format!("/proc/{first}/environ")).unwrap();
    assert!(
        !environ
            .split(|&c| c == 0)
            .any(|e| e.starts_with(b"LD_PRELOAD=")),
        "the watchdog was executed with LD_PRELOAD"
    );
    kill_holder_and_check_the_owner(&b, &key, &dir, o, child);
}

/// The holder and its watchdog leave the caller's working directory (an unmount there is not
/// blocked by a held lock): both run in `/`.
#[test]
fn the_holder_and_its_watchdog_keep_no_working_directory() {
    let b = TestBackend::file();
    let key = unique_key("wd-cwd");
    let o = start_owner(&b, &["-k", &key], "sleep 60");
    let watchdog = watchdog_of(o.holder).expect("a watchdog");
    for pid in [o.holder, watchdog] {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
        assert_eq!(cwd, Path::new("/"), "pid {pid}");
    }
    run_ok(&mut crate::acquire::release(&o.handle));
    // SAFETY: kill takes two integers; the owner leads a group of its own.
    unsafe { libc::kill(-o.pid, libc::SIGKILL) };
    wait_until(Duration::from_secs(3), "the watchdog to exit", || {
        !alive(watchdog)
    });
}

/// Issue 40 item 8: a process-group id the owner never led is never signalled as "its group".
/// The owner (`--owner P`, a `sleep` inside its parent's group) exits while the holder is
/// stopped, and its pid P is handed (through `ns_last_pid`, as root) to a stranger that makes
/// a group P of its own; the holder, continued, sees its owner's exit and must leave group P
/// alone. Before, it took any running group P for the owner's and sent it SIGTERM.
#[test]
fn a_group_the_owner_never_led_is_not_signalled_when_its_number_is_reused() {
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("DLOCK_TEST_REQUIRE_BACKENDS").is_none(),
            "this test needs root, to choose the next pid"
        );
        eprintln!("skipped: needs root");
        return;
    }
    let b = TestBackend::file();
    let key = unique_key("wd-reused-group");
    let dir = scratch("wd-reused-group");
    let f = dir.join("owner");
    let script = format!("sleep 600 & echo $! > {}; wait", f.display());
    let mut parent = std::process::Command::new("sh");
    parent.args(["-c", &script]);
    std::os::unix::process::CommandExt::process_group(&mut parent, 0);
    let parent = Proc::spawn(&mut parent);
    let owner: i32 = wait_for_file(&f, Duration::from_secs(5)).parse().unwrap();
    let owner_start = start_ticks(owner).expect("the owner's start time");
    let out = run_ok(crate::acquire::cmd(&b, "acquire").args([
        "-k",
        &key,
        "--owner",
        &owner.to_string(),
        "--format",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let holder = v["holder_pid"].as_i64().unwrap() as i32;
    // SAFETY: kill takes two integers; `holder` is this test's holder.
    unsafe { libc::kill(holder, libc::SIGSTOP) };
    // SAFETY: as above; `owner` is this test's `sleep`, not yet reaped.
    unsafe { libc::kill(owner, libc::SIGKILL) };
    wait_until(Duration::from_secs(5), "the owner to be reaped", || {
        !Path::new(&format!("/proc/{owner}")).exists()
    });
    parent.wait(Duration::from_secs(5));
    let mut stranger = stranger_with_pid(owner, owner_start);
    // SAFETY: kill takes two integers; `holder` is this test's stopped holder.
    unsafe { libc::kill(holder, libc::SIGCONT) };
    wait_until(
        Duration::from_secs(5),
        "the holder to see its owner's exit",
        || !alive(holder),
    );
    let survived = stranger.try_wait().unwrap().is_none();
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        survived,
        "the holder signalled group {owner}, which was a stranger's"
    );
}

/// The holder works in `/`, yet a relative `sslrootcert=` given from the caller's directory
/// still works when it connects again after holding: a broken lock's end is recorded on a new
/// session, from a backend opened anew (PostgreSQL over TLS, verify-full). Before the URL's
/// path was made absolute (`config.rs`), that connection looked for the CA in `/` and the end
/// went unrecorded.
#[test]
fn a_relative_ca_file_still_works_once_the_holder_left_the_callers_directory() {
    let Some((pg, ca)) = crate::servers::Postgres::start_tls() else {
        return;
    };
    let dir = ca.parent().unwrap().to_path_buf();
    let name = ca.file_name().unwrap().to_str().unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={name}",
        pg.port
    );
    let b = TestBackend::postgres(&url);
    let key = unique_key("wd-relative-ca");
    let in_dir = |sub: &str| {
        let mut c = crate::acquire::cmd(&b, sub);
        c.current_dir(&dir);
        c
    };
    let out = run_ok(in_dir("acquire").args([
        "--ttl",
        "2s",
        "-k",
        &key,
        "--owner",
        "none",
        "--max-hold",
        "1m",
        "--format",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let holder = v["holder_pid"].as_i64().unwrap() as i32;
    let cwd = std::fs::read_link(format!("/proc/{holder}/cwd")).unwrap();
    assert_eq!(cwd, Path::new("/"));
    run_ok(in_dir("break").args(["-k", &key]));
    wait_until(Duration::from_secs(10), "the holder to notice", || {
        !alive(holder)
    });
    let out = run_ok(in_dir("log").args(["-k", &key, "--json", "-r", "1"]));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(runs[0]["ending"]["code"], 79, "{runs:#}");
    assert!(runs[0]["ending"]["lost"].is_string(), "{runs:#}");
}

/// The state letter of `pid` (`/proc/PID/stat`), if it exists.
fn state_of(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next().map(str::to_string)
}

/// A watchdog someone stopped protects nothing: its holder continues it when it next wakes
/// (a renewal); and one stopped at a clean end is ended (SIGKILL) rather than waited for —
/// before, a goodbye message left unread in a stopped watchdog's full pipe kept `release`
/// waiting for ever, and the lock's copies held.
#[test]
fn a_stopped_watchdog_is_continued_and_a_release_does_not_wait_for_it() {
    let Some(url) = shared_redis() else { return };
    let b = TestBackend::redis(&url);
    let key = unique_key("wd-stopped");
    let o = start_owner(&b, &["-k", &key], "sleep 60");
    let watchdog = watchdog_of(o.holder).expect("a watchdog");
    // The holder frozen first, so that it cannot continue the watchdog before it is seen
    // stopped. SAFETY: kill takes two integers; these are this test's holder and watchdog.
    unsafe { libc::kill(o.holder, libc::SIGSTOP) };
    // SAFETY: as above.
    unsafe { libc::kill(watchdog, libc::SIGSTOP) };
    wait_until(Duration::from_secs(5), "the watchdog to stop", || {
        state_of(watchdog).as_deref() == Some("T")
    });
    // SAFETY: as above.
    unsafe { libc::kill(o.holder, libc::SIGCONT) };
    wait_until(
        b.ttl + Duration::from_secs(3),
        "the holder to continue its watchdog",
        || state_of(watchdog).is_some_and(|s| s != "T"),
    );
    // SAFETY: as above.
    unsafe { libc::kill(watchdog, libc::SIGSTOP) };
    let started = std::time::Instant::now();
    run_ok(&mut crate::acquire::release(&o.handle));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        !alive(watchdog),
        "the watchdog is reaped before release returns"
    );
    // SAFETY: kill takes two integers; the owner leads a group of its own.
    unsafe { libc::kill(-o.pid, libc::SIGKILL) };
}

/// The pidfds in `pid`'s descriptor table.
fn pidfds_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().contains("[pidfd]"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Issue 40 (review of item 2): the watchdog watches the owner while the holder lives. The
/// owner (leading its group P) exits while the holder is frozen; the watchdog sees it, and its
/// group empty, and forgets both. P is then handed (through `ns_last_pid`, as root) to a
/// stranger leading a group P; a `kill -9` of the holder must leave it alone. Before, the
/// watchdog took any running group P for the owner's and SIGKILLed it.
#[test]
fn a_watchdog_forgets_the_group_of_an_owner_that_exited_while_the_holder_was_frozen() {
    owner_exits_while_the_holder_is_frozen_and_a_stranger_takes_its_group(true);
}

/// The same, the holder continued instead: it sees its owner's exit and must not take group P,
/// which a new process with the owner's pid leads, for the owner's. Before, it sent it SIGTERM.
#[test]
fn a_holder_continued_leaves_a_group_whose_number_came_round_to_a_stranger() {
    owner_exits_while_the_holder_is_frozen_and_a_stranger_takes_its_group(false);
}

fn owner_exits_while_the_holder_is_frozen_and_a_stranger_takes_its_group(kill_holder: bool) {
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("DLOCK_TEST_REQUIRE_BACKENDS").is_none(),
            "this test needs root, to choose the next pid"
        );
        eprintln!("skipped: needs root");
        return;
    }
    let b = TestBackend::file();
    let key = unique_key("wd-forget-group");
    let mut sleep = std::process::Command::new("sleep");
    sleep.arg("600");
    std::os::unix::process::CommandExt::process_group(&mut sleep, 0);
    let mut owner = sleep.spawn().unwrap();
    let pid = owner.id() as i32;
    let owner_start = start_ticks(pid).expect("the owner's start time");
    let out = run_ok(crate::acquire::cmd(&b, "acquire").args([
        "-k",
        &key,
        "--owner",
        &pid.to_string(),
        "--format",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let holder = v["holder_pid"].as_i64().unwrap() as i32;
    let watchdog = watchdog_of(holder).expect("a watchdog");
    let pidfds = pidfds_of(watchdog);
    // SAFETY: kill takes two integers; `holder` is this test's holder.
    unsafe { libc::kill(holder, libc::SIGSTOP) };
    let _ = owner.kill();
    let _ = owner.wait();
    // Without pidfds it would look every 100 ms; with them, its copy of the owner's pidfd is
    // closed as it forgets the owner, and the group in the same round.
    wait_until(
        Duration::from_secs(5),
        "the watchdog to forget the owner",
        || pidfds > 0 && pidfds_of(watchdog) == pidfds - 1,
    );
    let mut stranger = stranger_with_pid(pid, owner_start);
    let sig = if kill_holder {
        libc::SIGKILL
    } else {
        libc::SIGCONT
    };
    // SAFETY: kill takes two integers; `holder` is this test's stopped holder.
    unsafe { libc::kill(holder, sig) };
    wait_until(
        Duration::from_secs(5),
        "the holder and watchdog to exit",
        || !alive(watchdog) && !alive(holder),
    );
    let ended = stranger.try_wait().unwrap();
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        ended.is_none(),
        "group {pid}, a stranger's, was signalled: the stranger {ended:?}"
    );
}

/// A process's start time, in clock ticks since boot (`/proc/PID/stat`'s 22nd field).
fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat.rsplit_once(')')?;
    fields.split_whitespace().nth(19)?.parse().ok()
}

/// A process of another session (`setsid sleep 60`) given `pid` through `ns_last_pid` (root; a
/// few tries, since a parallel test may take the pid first), leading its own group `pid` —
/// and started in a later clock tick than the owner (`owner_start`). A process is known by its
/// pid and its start time, whose unit is a tick (10 ms): a pid handed out again within the same
/// tick, which only `ns_last_pid` can do, would be the same process to anyone (it was, once, in
/// CI: the stranger started in the owner's tick and was taken for it).
fn stranger_with_pid(pid: i32, owner_start: u64) -> std::process::Child {
    let mut stranger = None;
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "60"])
            .spawn()
            .unwrap();
        if child.id() as i32 == pid && start_ticks(pid).is_some_and(|t| t != owner_start) {
            stranger = Some(child);
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let stranger = stranger.expect("a process with the owner's old pid");
    wait_until(
        Duration::from_secs(5),
        "the stranger to lead group P",
        || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(&format!(" {pid} {pid} ")))
        },
    );
    stranger
}
