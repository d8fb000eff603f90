//! Lifetime rule 4 on every backend: the lock covers the command's whole process tree, whatever
//! ends dlock. A holder's command starts a tree of one of several shapes — a background job and
//! `wait`, a daemon that left the session (`setsid`), a grandchild that ignores SIGTERM, three
//! levels of shells — in which every process carries a mark in its environment and the deepest
//! writes a heartbeat; a waiter is queued behind it; then dlock is killed (`kill -9`, or the whole
//! process group as `timeout -s KILL` does, or only its guardian).
//!
//! The waiter's command, on entry, looks in /proc for any process carrying the old tree's mark
//! (the shells, and every `sleep` and `date` they started), and writes its start time. The test
//! fails if one was alive, if the last heartbeat is not older than the waiter's start, or if the
//! waiter took longer than the lease and a few seconds. It also measures, polling /proc from the
//! test, the time from the last old process's death to the waiter's start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::conformance::wait_until_waiting;
use crate::util::*;

/// Expands to one `#[test]` per case for a backend.
#[macro_export]
macro_rules! tree {
    ($make:expr) => {
        $crate::tree!(@cases $make;
            kill_9_of_dlock_ends_every_shape_of_tree_before_the_lock_passes,
            kill_9_of_the_guardian_alone_ends_the_tree_before_the_lock_passes,
            break_and_signals_end_descendants_that_left_the_session,
            leftovers_of_a_finished_command_are_stopped_before_the_release,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                $crate::tree::$case(&backend);
            }
        )*
    };
}

/// The heartbeat loop, run by the deepest process of each shape: its pid to `pids`, then the
/// time (ns) to `beat` every 20 ms.
const BEAT: &str = r#"echo $$ >> "$T/pids"; while :; do date +%s%N >> "$T/beat"; sleep 0.02; done"#;

/// The shapes of tree a command can leave, as `sh -c` scripts (`$T` is the test's directory;
/// `$BEAT` the heartbeat loop). Each shell records its pid first.
const SHAPES: [(&str, &str); 4] = [
    // `long_job & wait`: what most shell scripts look like.
    (
        "background",
        r#"echo $$ >> "$T/pids"; sh -c "$BEAT" & wait"#,
    ),
    // A daemon: double fork and a new session, re-parented away from its shell.
    (
        "setsid",
        r#"echo $$ >> "$T/pids"; sh -c 'setsid sh -c "$BEAT" & exit 0'; sleep 60"#,
    ),
    // A grandchild that ignores SIGTERM.
    (
        "sigterm-ignored",
        r#"echo $$ >> "$T/pids"; sh -c 'trap "" TERM; echo $$ >> "$T/pids"; sh -c "trap \"\" TERM; $BEAT" & wait' & wait"#,
    ),
    // Three levels of shells below the command.
    (
        "three-levels",
        r#"echo $$ >> "$T/pids"; sh -c 'echo $$ >> "$T/pids"; sh -c "echo \$\$ >> \"\$T/pids\"; sh -c \"\$BEAT\" & wait" & wait' & wait"#,
    ),
];

/// What the waiter runs on entry: its start time (ns) to `start`, then every live process that
/// still carries the old tree's mark to `survivors` (the mark is `DLOCK_TREE_MARK=$1`).
const WAITER: &str = r#"date +%s%N > "$1/start.tmp"; mv "$1/start.tmp" "$1/start"
for f in $(grep -lzx "DLOCK_TREE_MARK=$2" /proc/[0-9]*/environ 2>/dev/null); do
  p=${f#/proc/}; p=${p%/environ}
  st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
  case ${st##*) } in Z*) continue;; esac
  echo "$p $(cat /proc/$p/cmdline 2>/dev/null | tr '\0' ' ')" >> "$1/survivors"
done
echo done > "$1/checked""#;

/// `sh -c script` with the mark in its environment, and so in every process it starts — but not
/// in dlock's or its guardian's: the holder's dlock may still be exiting after its release when
/// the waiter looks (seen as a "survivor" with an empty command line), and it is not the tree.
fn marked(mark: &str, script: &str) -> Vec<String> {
    let mut cmd = vec!["env".into(), format!("DLOCK_TREE_MARK={mark}")];
    cmd.extend(sh(script));
    cmd
}

/// One holder with its tree and one waiter queued behind it.
struct Tree {
    name: &'static str,
    dir: PathBuf,
    key: String,
    mark: String,
    holder: Proc,
    waiter: Option<Proc>,
}

impl Tree {
    /// Starts the holder's command (shape `script`), waits for its heartbeat, queues a waiter.
    fn start(b: &TestBackend, name: &'static str, script: &str) -> Tree {
        let mut t = Tree::alone(b, name, script);
        let mut w = b.run(
            &t.key,
            &["--wait", "60s"],
            &[
                "sh",
                "-c",
                WAITER,
                "sh",
                &t.dir.display().to_string(),
                &t.mark,
            ],
        );
        t.waiter = Some(Proc::spawn(&mut w));
        t
    }

    /// The holder and its tree, without a waiter.
    fn alone(b: &TestBackend, name: &'static str, script: &str) -> Tree {
        let dir = scratch(&format!("tree-{name}"));
        let key = unique_key(&format!("tree-{name}"));
        let mark = unique_key("mark");
        let mut cmd = b.run(&key, &[], &marked(&mark, script));
        cmd.env("T", &dir).env("BEAT", BEAT);
        // In a process group of its own, as a job started from a shell is.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let holder = Proc::spawn(&mut cmd);
        wait_until(b.ttl + Duration::from_secs(10), "a heartbeat", || {
            lines(&dir.join("beat")).len() >= 2
        });
        Tree {
            name,
            dir,
            key,
            mark,
            holder,
            waiter: None,
        }
    }

    /// The pids the old tree's shells recorded.
    fn pids(&self) -> Vec<i32> {
        lines(&self.dir.join("pids"))
            .iter()
            .filter_map(|l| l.parse().ok())
            .collect()
    }

    /// The holder's guardian: the child of dlock named `d-lock-guard`.
    fn guardian(&self) -> i32 {
        let mut found = None;
        wait_until(Duration::from_secs(5), "the guardian", || {
            found = children(self.holder.pid())
                .into_iter()
                .find(|&p| comm(p).as_deref() == Some("d-lock-guard"));
            found.is_some()
        });
        found.unwrap()
    }

    /// Waits for the waiter's check and asserts rule 4; returns the time from the last old
    /// process's death (`died`, as seen by polling from here) to the waiter's start, from the
    /// last heartbeat to it, and the holder.
    #[track_caller]
    fn check(
        self,
        b: &TestBackend,
        died: Option<SystemTime>,
        limit: Duration,
    ) -> (Duration, Duration, Proc) {
        let pids = self.pids();
        wait_for_file(&self.dir.join("checked"), limit);
        let survivors = std::fs::read_to_string(self.dir.join("survivors")).unwrap_or_default();
        assert!(
            survivors.is_empty(),
            "{} on {}: the waiter's command started while processes of the old tree ran:\n{survivors}",
            self.name,
            b.name
        );
        let start = ns(std::fs::read_to_string(self.dir.join("start"))
            .unwrap()
            .trim());
        let beats = lines(&self.dir.join("beat"));
        let last_beat = beats.iter().filter_map(|l| l.parse::<u128>().ok()).max();
        let last_beat = last_beat.expect("heartbeats");
        assert!(
            last_beat < start,
            "{} on {}: a heartbeat at {last_beat} came after the waiter started at {start}",
            self.name,
            b.name
        );
        for p in &pids {
            assert!(
                !alive(*p),
                "{}: pid {p} of the old tree is alive",
                self.name
            );
        }
        let died = died.map_or(0, |t| t.duration_since(UNIX_EPOCH).unwrap().as_nanos());
        let gap = |from: u128| Duration::from_nanos(start.saturating_sub(from) as u64);
        let waiter = self.waiter.expect("a tree with a waiter");
        let (out, _) = waiter.wait(Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        (gap(died), gap(last_beat), self.holder)
    }
}

/// Polls every millisecond until each tree's waiter has started (at most `limit` after `from`,
/// else panics): when each old tree's last recorded process was last seen alive (its death,
/// to the millisecond).
#[track_caller]
fn watch(trees: &[&Tree], from: Instant, limit: Duration) -> Vec<Option<SystemTime>> {
    let pids: Vec<Vec<i32>> = trees.iter().map(|t| t.pids()).collect();
    let mut died = vec![None; trees.len()];
    loop {
        let mut started = 0;
        for (i, t) in trees.iter().enumerate() {
            if died[i].is_none() && pids[i].iter().all(|&p| !alive(p)) {
                died[i] = Some(SystemTime::now());
            }
            if t.dir.join("start").exists() {
                started += 1;
            }
        }
        if started == trees.len() {
            return died;
        }
        assert!(
            from.elapsed() < limit,
            "waiters did not start within {limit:?} of the kill"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `kill -9` of the holder's dlock, for every shape at once (one key each); and of the holder's
/// whole process group (dlock and the command die at once, as `timeout -s KILL` sends it) for
/// the daemon, which is not in that group. The guardian kills what is left within a second,
/// before the lock can pass: at once on a descriptor backend (flock, connection), by the lease
/// on the others.
pub(crate) fn kill_9_of_dlock_ends_every_shape_of_tree_before_the_lock_passes(b: &TestBackend) {
    let mut trees: Vec<(Tree, bool)> = SHAPES
        .iter()
        .map(|(name, script)| (Tree::start(b, name, script), false))
        .collect();
    trees.push((Tree::start(b, "setsid-group-killed", SHAPES[1].1), true));
    for (t, _) in &trees {
        wait_until_waiting(b, &t.key, 1);
    }
    let killed = Instant::now();
    let killed_at = SystemTime::now();
    for (t, group) in &trees {
        let target = if *group {
            -t.holder.pid()
        } else {
            t.holder.pid()
        };
        // SAFETY: plain kill of this test's own process (group).
        unsafe { libc::kill(target, libc::SIGKILL) };
    }
    let refs: Vec<&Tree> = trees.iter().map(|(t, _)| t).collect();
    let died = watch(&refs, killed, b.ttl + Duration::from_secs(5));
    let started_after = killed.elapsed();
    let mut report = Vec::new();
    for ((t, _), died) in trees.into_iter().zip(died) {
        let name = t.name;
        let gone = died
            .expect("the old tree died")
            .duration_since(killed_at)
            .unwrap_or_default();
        let (death, beat, _) = t.check(b, died, Duration::from_secs(10));
        // The tree is gone within a second of dlock's death, long before a lease runs out.
        assert!(
            gone < Duration::from_secs(1),
            "{name}: the old tree lived {gone:?} after the kill"
        );
        report.push(format!(
            "{name}: kill→death {gone:.1?}, death→start {death:.1?}, beat→start {beat:.1?}"
        ));
    }
    eprintln!(
        "{}: all waiters started {started_after:.1?} after the kill; {}",
        b.name,
        report.join("; ")
    );
}

/// `kill -9` of the guardian alone: its command dies with it (PDEATHSIG), what it started comes
/// to dlock (a subreaper), which kills it, then releases: exit 137 with one line, and the waiter
/// starts after the tree is gone — at once, whatever the backend, since dlock releases.
pub(crate) fn kill_9_of_the_guardian_alone_ends_the_tree_before_the_lock_passes(b: &TestBackend) {
    let t = Tree::start(b, "guardian-killed", SHAPES[1].1);
    wait_until_waiting(b, &t.key, 1);
    let g = t.guardian();
    let killed = Instant::now();
    // SAFETY: a process of this test's.
    unsafe { libc::kill(g, libc::SIGKILL) };
    let died = watch(&[&t], killed, Duration::from_secs(3));
    let (death, _, holder) = t.check(b, died[0], Duration::from_secs(5));
    let (out, _) = holder.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(137), "{}", describe(&out));
    assert!(
        one_error_line(&out).contains("guardian"),
        "{}",
        describe(&out)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(3),
        "the waiter started {:?} after the guardian was killed",
        killed.elapsed()
    );
    eprintln!("{}: guardian killed: death→start {death:.1?}", b.name);
}

/// The ordinary ends still stop descendants that left the session (a `setsid` daemon and a
/// SIGTERM-ignoring grandchild): `break` (79), SIGTERM to dlock (143), and SIGKILL escalation
/// after `--kill-grace`; each before the waiter starts.
pub(crate) fn break_and_signals_end_descendants_that_left_the_session(b: &TestBackend) {
    // No waiter behind the broken one: `break` lets the next holder in at once (the operator
    // says the holder is gone); what must hold is that the broken tree is gone within its
    // notice time.
    let broken = Tree::alone(b, "broken", SHAPES[1].1);
    let termed = Tree::start(b, "sigterm", SHAPES[2].1);
    wait_until_waiting(b, &termed.key, 1);
    let pids = broken.pids();
    run_ok(b.cmd("break").args(["-k", &broken.key]));
    let broke = Instant::now();
    wait_until(
        b.notice + Duration::from_secs(2),
        "the broken tree to die",
        || pids.iter().all(|&p| !alive(p)),
    );
    assert!(
        broke.elapsed() < b.notice + Duration::from_millis(500),
        "the broken tree ran on for {:?}",
        broke.elapsed()
    );
    let (out, _) = broken.holder.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));

    termed.holder.signal(libc::SIGTERM);
    let sent = Instant::now();
    let died = watch(&[&termed], sent, Duration::from_secs(10));
    let (_, _, holder) = termed.check(b, died[0], Duration::from_secs(10));
    let (out, _) = holder.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(143), "{}", describe(&out));
}

/// A command that exits and leaves processes running (a daemon in a new session, one that
/// ignores SIGTERM): they are stopped (SIGTERM, SIGKILL after `--kill-grace`) before the lock is
/// released, dlock exits with the command's code and says so once, and the next holder finds
/// none of them.
pub(crate) fn leftovers_of_a_finished_command_are_stopped_before_the_release(b: &TestBackend) {
    let dir = scratch("leftovers");
    let key = unique_key("leftovers");
    let mark = unique_key("mark");
    let script = r#"echo $$ >> "$T/pids"
sh -c 'setsid sh -c "$BEAT" & exit 0'
sh -c 'trap "" TERM; echo $$ >> "$T/pids"; exec sleep 60' &
while [ $(wc -l < "$T/pids") -lt 3 ] || ! [ -s "$T/beat" ]; do sleep 0.01; done
exit 3"#;
    let mut cmd = b.run(&key, &["--kill-grace", "300ms"], &marked(&mark, script));
    cmd.env("T", &dir).env("BEAT", BEAT);
    let started = Instant::now();
    let out = output(&mut cmd);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    // Two shells, and what the heartbeat loop runs at the moment (a `sleep` or a `date`).
    assert!(
        err.contains("the command exited but left") && err.contains("processes running"),
        "{}",
        describe(&out)
    );
    // The one ignoring SIGTERM needs the SIGKILL after the grace.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    let pids: Vec<i32> = lines(&dir.join("pids"))
        .iter()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert_eq!(pids.len(), 3, "{pids:?}");
    for p in pids {
        assert!(!alive(p), "pid {p} outlived `dlock run`");
    }
    // The lock is free at once, and nothing of the old tree runs.
    let w = scratch("leftovers-next");
    run_ok(&mut b.run(
        &key,
        &["--no-wait"],
        &["sh", "-c", WAITER, "sh", &w.display().to_string(), &mark],
    ));
    let survivors = std::fs::read_to_string(w.join("survivors")).unwrap_or_default();
    assert!(survivors.is_empty(), "{survivors}");
}

/// A file's lines (none if it does not exist).
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Nanoseconds from a `date +%s%N` line.
fn ns(s: &str) -> u128 {
    s.parse().unwrap_or_else(|_| panic!("a time in ns: {s:?}"))
}

/// The children of `pid`, from /proc.
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(") ")?
                        .1
                        .split(' ')
                        .nth(1)?
                        .parse::<i32>()
                        .ok()
                })
                == Some(pid)
        })
        .collect()
}

/// A process's name (`/proc/PID/comm`).
fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// A command's `kill $PPID` reaches dlock, as it did before the guardian stood between them:
/// the guardian passes on every signal dlock forwards (and dlock forwards it to the command).
#[test]
fn a_signal_the_command_sends_its_parent_reaches_dlock() {
    let b = TestBackend::file();
    let key = unique_key("kill-ppid");
    for (sig, name) in [(libc::SIGTERM, "TERM"), (libc::SIGUSR1, "USR1")] {
        let out = output(&mut b.run(
            &key,
            &[],
            &sh(&format!(
                "trap 'exit 0' {name}; kill -{name} $PPID; sleep 10 & wait"
            )),
        ));
        assert_eq!(out.status.code(), Some(128 + sig), "{}", describe(&out));
    }
}

/// Started through the dynamic loader (`ld.so dlock …`), `/proc/self/exe` is the loader: a
/// guardian that executed it anew would be gone (and the command killed 20 ms into the run).
/// It must stay as it is instead.
#[test]
fn started_through_the_dynamic_loader_the_guardian_stays() {
    let Some(loader) = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"]
        .into_iter()
        .find(|l| Path::new(l).exists())
    else {
        panic!("no dynamic loader where glibc keeps it");
    };
    let b = TestBackend::file();
    let mut cmd = std::process::Command::new(loader);
    cmd.arg(DLOCK).arg("run").args(&b.args).args([
        "-k",
        &unique_key("ld-so"),
        "--",
        "sh",
        "-c",
        "sleep 0.2; cat /proc/$PPID/comm",
    ]);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "d-lock-guard");
}
