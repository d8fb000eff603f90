//! Fault injection on every backend, against real servers: while a [`Workload`] of looping
//! `dlock run`s contends for one key, something goes wrong — the holder's dlock is killed with
//! SIGKILL, an operator breaks the lock, waiters get Ctrl-C, the holder's whole process group is
//! paused for longer than the TTL, the server is paused or killed and restarted. Each case
//! asserts what must hold throughout: no two commands ever inside at once (each command checks
//! for another live one on entry), fencing tokens that grow in the order the commands entered,
//! and a workload that goes on once the fault is over.
//!
//! The cases that need only the shared server are instantiated per backend with [`faults!`];
//! the server faults are called from each server backend's file, on a server of the test's own.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::conformance::wait_until_waiting;
use crate::util::*;

/// Expands to one `#[test]` per fault that the shared server can take.
#[macro_export]
macro_rules! faults {
    ($make:expr) => {
        $crate::faults!(@cases $make;
            holder_killed_with_sigkill,
            operator_breaks_the_lock,
            ctrl_c_while_waiting,
            holder_process_group_paused_longer_than_the_ttl,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                $crate::faults::$case(&backend);
            }
        )*
    };
}

/// The command each workload run executes (`sh -c`, with `$1` = the workload's directory and
/// `$2` = how long to stay inside, in seconds): on entry it records itself in `in.PID` and
/// reports every *other* live command it finds there to `overlap`; then it logs "TOKEN PID" to
/// `log`, stays inside for a moment, and leaves. A command killed with SIGKILL leaves its
/// `in.PID` behind; a dead pid (or a zombie) is not inside. Nothing else is excused: a process
/// with a SIGKILL pending counts as inside (it once did not, to excuse the moment after a
/// `kill -9` of dlock when the kernel had freed the lock but not yet killed the command — the
/// guardian, `src/guard`, closed that window).
const INSIDE: &str = r#"
d=$1; m="$d/in.$$"
echo "$$" > "$m"
trap 'rm -f "$m"; exit 143' TERM INT HUP
for f in "$d"/in.*; do
  p=${f##*/in.}
  [ "$p" = "$$" ] && continue
  st=$(cat "/proc/$p/status" 2>/dev/null) || continue
  case $st in *"State:	Z"*) continue;; esac
  echo "$$ $p" >> "$d/overlap"
done
echo "${DLOCK_FENCING_TOKEN:-0} $$" >> "$d/log"
sleep "$2"
rm -f "$m"
"#;

/// Looping `dlock run --wait 60s` on one key, each in its own thread.
pub(crate) struct Workload {
    pub dir: PathBuf,
    pub key: String,
    fencing: bool,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Option<i32>>>>,
}

impl Workload {
    pub(crate) fn start(b: &TestBackend, name: &str, workers: usize, inside: &str) -> Workload {
        let dir = scratch(name);
        let key = unique_key(name);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..workers)
            .map(|_| {
                let (b, key, dir, stop) = (b.clone(), key.clone(), dir.clone(), stop.clone());
                let inside = inside.to_string();
                std::thread::spawn(move || {
                    let mut codes = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let mut cmd = b.run(&key, &["--wait", "60s"], &["sh", "-c", INSIDE, "sh"]);
                        let out = output(cmd.arg(&dir).arg(&inside));
                        codes.push(out.status.code());
                        if !out.status.success() {
                            // What each failed run said, for the assertions' messages.
                            use std::io::Write;
                            let mut f = std::fs::OpenOptions::new()
                                .create(true)
                                .append(true)
                                .open(dir.join("errors"))
                                .unwrap();
                            let _ = f.write_all(&out.stderr);
                        }
                        if out.status.code() == Some(69) {
                            // The server is down: do not spin while it is.
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                    codes
                })
            })
            .collect();
        let w = Workload {
            dir,
            key,
            fencing: b.fencing,
            stop,
            threads,
        };
        w.wait_entries(1, Duration::from_secs(20));
        w
    }

    /// (token, pid) of every command that entered, in the order they entered.
    pub(crate) fn entries(&self) -> Vec<(u64, i32)> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let (t, p) = l.split_once(' ').expect("TOKEN PID");
                (t.parse().unwrap(), p.parse().unwrap())
            })
            .collect()
    }

    /// Waits until `n` commands have entered in all.
    #[track_caller]
    pub(crate) fn wait_entries(&self, n: usize, limit: Duration) {
        wait_until(limit, &format!("{n} entries of the workload"), || {
            self.entries().len() >= n
        });
    }

    /// Waits until `more` commands have entered after now: the workload goes on.
    #[track_caller]
    pub(crate) fn goes_on(&self, more: usize, limit: Duration) {
        self.wait_entries(self.entries().len() + more, limit);
    }

    /// The command inside right now and its dlock (the parent of its guardian), once there is
    /// one.
    pub(crate) fn holder(&self) -> (i32, i32) {
        let mut found = None;
        wait_until(Duration::from_secs(20), "a command inside", || {
            found = std::fs::read_dir(&self.dir).unwrap().find_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let pid: i32 = name.strip_prefix("in.")?.parse().ok()?;
                Some((pid, parent(parent(pid)?)?)).filter(|_| alive(pid))
            });
            found.is_some()
        });
        found.unwrap()
    }

    /// Stops the loops, and checks the whole run: no overlap (but between the pairs that
    /// `allowed` accepts), tokens growing in the order of entry. Returns every run's exit code.
    #[track_caller]
    pub(crate) fn finish(self, allowed: impl Fn(i32, i32) -> bool) -> Vec<Option<i32>> {
        self.stop.store(true, Ordering::SeqCst);
        let codes: Vec<Option<i32>> = self
            .threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let overlaps: Vec<String> = std::fs::read_to_string(self.dir.join("overlap"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let (a, b) = l.split_once(' ').unwrap();
                !allowed(a.parse().unwrap(), b.parse().unwrap())
            })
            .map(String::from)
            .collect();
        assert!(
            overlaps.is_empty(),
            "two commands were inside at once (entering pid, pid found inside): {overlaps:?}"
        );
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let tokens: Vec<u64> = log
            .lines()
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        if self.fencing {
            assert!(
                tokens.windows(2).all(|w| w[0] < w[1]),
                "fencing tokens must grow in the order the commands entered:\n{log}"
            );
        }
        codes
    }
}

impl Workload {
    /// [`Workload::finish`] with no overlap allowed, then checks that every run exited with one
    /// of `ok` (what the others said in the message), and says how many exited 0 and 79.
    #[track_caller]
    pub(crate) fn finish_expecting(self, ok: &[Option<i32>], label: &str) {
        let errors = self.dir.join("errors");
        let codes = self.finish(|_, _| false);
        let count = |c| codes.iter().filter(|&&x| x == Some(c)).count();
        eprintln!(
            "{label}: {} runs exited 0, {} lost their lock (79)",
            count(0),
            count(79)
        );
        let bad: Vec<_> = codes.iter().filter(|c| !ok.contains(c)).collect();
        assert!(
            bad.is_empty(),
            "unexpected exit codes {bad:?} among {codes:?}; what they said:\n{}",
            std::fs::read_to_string(errors).unwrap_or_default()
        );
    }
}

/// The parent of a process.
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

/// Every exit code is one of `ok` (a run that was never interfered with exits 0).
#[track_caller]
fn codes_are(codes: &[Option<i32>], ok: &[Option<i32>]) {
    let bad: Vec<_> = codes.iter().filter(|c| !ok.contains(c)).collect();
    assert!(
        bad.is_empty(),
        "unexpected exit codes {bad:?} among {codes:?}"
    );
}

/// `kill -9` of the holder's dlock, three times in a row: its guardian kills the command, then
/// lets the lock free itself (fd, TTL, session, connection) and pass on; nobody enters while
/// the command lives, not even for the moment it has a SIGKILL pending.
pub(crate) fn holder_killed_with_sigkill(b: &TestBackend) {
    let w = Workload::start(b, "fault-kill9", 3, "1");
    for _ in 0..3 {
        let (child, dlock) = w.holder();
        // SAFETY: plain kill of a process of this test.
        unsafe { libc::kill(dlock, libc::SIGKILL) };
        wait_until(
            Duration::from_secs(5),
            "the command to die with dlock",
            || !alive(child),
        );
        w.goes_on(3, b.ttl * 3 + Duration::from_secs(10));
    }
    let codes = w.finish(|_, _| false);
    codes_are(&codes, &[Some(0), None]);
    assert_eq!(codes.iter().filter(|c| c.is_none()).count(), 3, "{codes:?}");
}

/// `dlock break` of a live holder: the broken holder's command is stopped within the notice
/// time and exits 79, and the next waiter enters only after it has stopped — no overlap at all
/// (a break used to let the next one in at once, the one overlap this test allowed) — with a
/// higher token.
pub(crate) fn operator_breaks_the_lock(b: &TestBackend) {
    let w = Workload::start(b, "fault-break", 3, "2");
    let mut broken = Vec::new();
    for _ in 0..2 {
        let (child, _) = w.holder();
        run_ok(b.cmd("break").args(["-k", &w.key]));
        let broke = Instant::now();
        wait_until(
            b.notice + Duration::from_secs(2),
            "the broken command to stop",
            || !alive(child),
        );
        assert!(
            broke.elapsed() < b.notice + Duration::from_millis(500),
            "the broken holder ran on for {:?}",
            broke.elapsed()
        );
        broken.push(child);
        w.goes_on(3, Duration::from_secs(20));
    }
    let entries = w.entries();
    let codes = w.finish(|_, _| false);
    // Only a command that was still inside can have been stopped (it may have left by itself
    // just before the break).
    codes_are(&codes, &[Some(0), Some(79)]);
    if b.fencing {
        for child in &broken {
            let i = entries.iter().position(|(_, p)| p == child).unwrap();
            assert!(entries[i + 1..].iter().all(|(t, _)| *t > entries[i].0));
        }
    }
}

/// Ctrl-C to waiters queued behind the workload: they stop waiting (130) at once, never run,
/// and leave nothing behind; the workload goes on.
pub(crate) fn ctrl_c_while_waiting(b: &TestBackend) {
    let dir = scratch("fault-ctrl-c");
    let w = Workload::start(b, "fault-ctrl-c", 2, "0.05");
    // A holder of our own, so that the waiters are surely waiting when the signal comes.
    let mut h = b.holding(&w.key, &["--wait", "60s"], &dir.join("held"));
    let ran = dir.join("ran");
    let waiters: Vec<Proc> = (0..3)
        .map(|_| {
            Proc::spawn(&mut b.run(
                &w.key,
                &["--wait", "60s"],
                &sh(&format!("echo > {}", ran.display())),
            ))
        })
        .collect();
    // Two workload runs and three waiters.
    wait_until_waiting(b, &w.key, 5);
    for p in waiters {
        ctrl_c_ends_it_at_once(p);
    }
    h.close_stdin();
    h.wait(Duration::from_secs(10));
    w.goes_on(3, Duration::from_secs(20));
    let key = w.key.clone();
    codes_are(&w.finish(|_, _| false), &[Some(0)]);
    assert!(!ran.exists(), "an interrupted waiter ran its command");
    let st = b.status(&key);
    assert_eq!(st["held"], false, "{st}");
    if let Some(n) = st["waiters"].as_u64() {
        assert_eq!(n, 0, "a waiter was left behind: {st}");
    }
}

/// The holder's whole process group is stopped (SIGSTOP, as Ctrl-Z does) for longer than the
/// TTL. A lease backend hands the lock to a waiter meanwhile — but the guardian, in a group of
/// its own, is not stopped: it kills the stopped command at the lease deadline, before the lease
/// can run out on the server, so the command never runs again; on resume, dlock exits 79 at
/// once. (A pause of the whole machine or container stops the guardian too; then what protects
/// the resource is the fencing token, checked here as well: the stale command's is lower than
/// the new holder's.) The file backend has no lease: a paused process still holds its flock, so
/// the waiter waits for it, and nothing is lost.
pub(crate) fn holder_process_group_paused_longer_than_the_ttl(b: &TestBackend) {
    let key = unique_key("fault-pause");
    let dir = scratch("fault-pause");
    let writes = dir.join("writes");
    // The stale holder: writes its token to the "resource" every 20 ms, in its own process
    // group so that the whole job (dlock, sh, sleep) can be stopped at once.
    let script = format!(
        "echo \"$$ ${{DLOCK_FENCING_TOKEN:-0}}\" > {m}; \
         while :; do echo \"${{DLOCK_FENCING_TOKEN:-0}}\" >> {w}; sleep 0.02; done",
        m = dir.join("stale").display(),
        w = writes.display()
    );
    let mut cmd = b.run(&key, &[], &sh(&script));
    cmd.process_group(0);
    let stale = Proc::spawn(&mut cmd);
    let stale_token = token(&wait_for_file(&dir.join("stale"), Duration::from_secs(10)));
    let mut next = b.holding_later(&key, &dir.join("next"));
    wait_until_waiting(b, &key, 1);
    // SAFETY: the group of a child of ours.
    unsafe { libc::kill(-stale.pid(), libc::SIGSTOP) };
    let paused = Instant::now();
    if b.name == "file" {
        // No lease: the lock stays with the paused process, whose flock the kernel keeps.
        std::thread::sleep(b.ttl * 2);
        assert!(
            !dir.join("next").exists(),
            "the waiter got a flock that is held"
        );
        // SAFETY: as above.
        unsafe { libc::kill(-stale.pid(), libc::SIGCONT) };
        stale.signal(libc::SIGTERM);
        let (out, _) = stale.wait(Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(143), "{}", describe(&out));
        wait_for_file(&dir.join("next"), Duration::from_secs(10));
        return finish_next(next);
    }
    // The lease runs out on the server (TTL, session timeout, wait_timeout) and the waiter
    // gets the lock while the holder is still paused.
    let limit = b.ttl * 5 + Duration::from_secs(10);
    let next_token = loop {
        if let Ok(m) = std::fs::read_to_string(dir.join("next"))
            && m.ends_with('\n')
        {
            break token(m.trim());
        }
        if paused.elapsed() > limit || next.child.try_wait().unwrap().is_some() {
            // SAFETY: as above.
            unsafe { libc::kill(-stale.pid(), libc::SIGCONT) };
            let (out, _) = next.wait(Duration::from_secs(10));
            panic!(
                "the waiter did not get the lock from the paused holder:\n{}",
                describe(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        paused.elapsed() >= b.ttl / 2,
        "passed on after {:?}",
        paused.elapsed()
    );
    let before_resume = lines(&writes);
    // SAFETY: as above.
    unsafe { libc::kill(-stale.pid(), libc::SIGCONT) };
    let resumed = Instant::now();
    let (out, _) = stale.wait(Duration::from_secs(10));
    let took = resumed.elapsed();
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        took < Duration::from_secs(1),
        "dlock took {took:?} to stop the resumed command"
    );
    if b.fencing {
        assert!(
            stale_token < next_token,
            "the stale command's token {stale_token} must be lower than the new holder's {next_token}"
        );
    }
    assert_eq!(
        lines(&writes)[before_resume.len()..],
        [] as [String; 0],
        "the stale command wrote after the lease ran out: the guardian did not kill it in time"
    );
    finish_next(next)
}

fn finish_next(mut next: Proc) {
    next.close_stdin();
    let (out, _) = next.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// The token of a "PID TOKEN" marker (0 without fencing).
fn token(marker: &str) -> u64 {
    marker.split(' ').nth(1).unwrap().parse().unwrap()
}

/// The server stops answering (SIGSTOP) for twice the TTL while the workload runs: holders that
/// cannot renew stop their commands in time (79), waiters may give up (69); nobody overlaps,
/// and the workload goes on once the server is back.
pub(crate) fn server_paused(b: &TestBackend, pause: &dyn Fn(bool)) {
    let w = Workload::start(b, "fault-server-pause", 3, "1");
    w.wait_entries(3, Duration::from_secs(20));
    pause(true);
    std::thread::sleep(b.ttl * 2);
    pause(false);
    w.goes_on(5, Duration::from_secs(30));
    let codes = w.finish(|_, _| false);
    codes_are(&codes, &[Some(0), Some(79), Some(69)]);
}

/// The server is killed (SIGKILL) and started again while the workload runs: holders lose the
/// lock (79) or keep it (a ZooKeeper session survives a restart), waiters may fail (69); nobody
/// overlaps, tokens keep growing across the restart, and the workload goes on.
///
/// The restart comes just after a command entered, with a TTL long against a restart: the
/// holder from before it stays inside until its first renewal fails (ttl/3 = 1.3 s), while the
/// waiters are back within a few hundred milliseconds. A server that forgot the lock would let
/// one in at once; it must hold the lock back until the old holder must be gone.
pub(crate) fn server_killed_and_restarted(b: &TestBackend, restart: &mut dyn FnMut()) {
    let b = TestBackend {
        ttl: Duration::from_secs(4),
        ..b.clone()
    };
    let w = Workload::start(&b, "fault-server-restart", 3, "2");
    w.goes_on(1, Duration::from_secs(20));
    restart();
    w.goes_on(3, Duration::from_secs(60));
    let codes = w.finish(|_, _| false);
    codes_are(&codes, &[Some(0), Some(79), Some(69)]);
}
