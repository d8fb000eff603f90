//! The guardian process itself (see the module above): it starts the command, reaps everything
//! below it, reports to dlock, and kills the whole tree when dlock dies or its deadline (before
//! the lease's) passes.
//!
//! Until it has detached ([`super::DETACH_AFTER`]) this code runs in dlock's memory with the C
//! library's thread state of dlock's main thread, which keeps running. So, from the moment it
//! reports the command started: no allocation, no lock, no C library call (`errno`), no panic.
//! The module's lints (`guard/mod.rs`) make the compiler check the last; the rest is kept by calling only
//! [`crate::sys::raw`] and this module's own functions. After it detached (a process of its own)
//! the same code runs unchanged.

use std::ffi::CStr;
use std::time::Duration;

use super::buf::Buf;
use super::family::Family;
use super::{DETACH_AFTER, MESSAGE, Setup, decode, encode, from_guard, to_guard, tree};
use crate::sys::raw;

/// How often a guardian that is killing the tree looks again for processes that came to it
/// (orphans are re-parented without a signal to their new parent).
const KILL_ROUND: Duration = Duration::from_millis(10);

/// A watchdog's kill round once a second of rounds has not ended what it watches.
const SLOW_KILL_ROUND: Duration = Duration::from_millis(100);

/// How often a watchdog looks whether its owner (without a pidfd) or, once the owner exited,
/// its group still runs, while its holder lives.
const WATCH_ROUND: Duration = Duration::from_millis(100);

/// The guardian's name (`ps`, `/proc/PID/comm`), which is also the first argument of a guardian
/// executing itself anew. Not "dlock…": `pkill -9 dlock` would kill dlock and its guardian at
/// once, the one case a guardian cannot cover.
const NAME: &CStr = c"d-lock-guard";
/// The second argument of a guardian executing itself anew; anything else is not one.
const RESUME_MARK: &[u8] = b"--resume-guardian-v2";

/// What a guardian executing dlock's binary anew leaves out of its environment. A library
/// preloaded into dlock at its start need not load again, later, in another process: the long
/// fault campaign's libfaketime attaches in its constructor to shared memory that the first
/// process to preload it named in the environment — an `acquire` caller, gone by then with it —
/// and exits 1 without it. Each watchdog and each that replaced it died within 20 ms of its
/// start, and a `kill -9` of the holder in such a gap let the lock go while the owner ran. The
/// guardian's own code needs nothing preloaded (its clocks are system calls: `sys::raw`).
const NOT_PRELOADED: &[&[u8]] = &[b"LD_PRELOAD", b"LD_AUDIT"];

/// The guardian's whole state: on its own stack, or passed through `execve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Guard {
    /// dlock's pid, and a pidfd for it (-1 without).
    dlock: i32,
    dlock_fd: i32,
    /// Pipes: messages from dlock (-1 once it is gone) and to it.
    from_dlock: i32,
    to_dlock: i32,
    /// A signalfd for SIGCHLD.
    sigchld: i32,
    /// The command, and its wait status once reaped.
    child: i32,
    status: Option<i32>,
    /// When to kill the tree by itself, on CLOCK_BOOTTIME, in ns (0: never): before the lease's
    /// deadline (`LeaseClock::guard_deadline`).
    deadline_ns: u64,
    /// When to execute itself anew (0: done, or failed: do not try again).
    detach_at_ns: u64,
    /// dlock is gone: kill everything.
    dlock_gone: bool,
    /// Killing every process below, until none is left.
    killing: bool,
    told_exit: bool,
    told_leftovers: bool,
    told_deadline: bool,
    quiet: bool,
    /// Processes reaped while killing (for the line said when dlock died).
    killed: u32,
    /// The signals dlock forwards (bit N-1 for signal N): one sent to the guardian — a
    /// command's `kill $PPID` — is passed on to dlock, as it reached dlock before.
    forward: u64,
    /// A watchdog (`dlock acquire`'s holder is "dlock"): no command; it watches the owner
    /// below, and kills it and its group when killing.
    watching: bool,
    /// The owner's process group (0: none, or no longer to be signalled: seen empty).
    group: i32,
    /// The owner (0: none, or seen gone), its start time, and a pidfd of it (-1: none).
    owner: i32,
    owner_start: u64,
    owner_fd: i32,
}

/// The guardian's first function, on its own stack (`clone` in [`super::Guardian::start`]).
/// `setup` is read only until the first report below: `start` keeps it alive until then (a
/// watchdog's is never freed).
pub(super) fn entry(setup: &mut Setup<'_>) -> i32 {
    // First, so that nothing the command starts can be re-parented past us (a watchdog starts
    // nothing); then out of dlock's process group before the command exists (a `kill -9` of
    // that group, as `timeout -s KILL` sends, must not reach the guardian), and every signal
    // blocked (taken from a descriptor below; the command unblocks its own).
    if setup.plan.is_some() {
        let _ = raw::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
    let _ = raw::setpgid(0, 0);
    raw::block_all_signals();
    for fd in setup.dlock_ends.into_iter().chain(setup.close) {
        if fd >= 0 {
            raw::close(fd);
        }
    }
    if setup.stderr_to >= 0 {
        let _ = raw::dup3(setup.stderr_to, 2);
        raw::close(setup.stderr_to);
    }
    let mut g = Guard {
        dlock: setup.dlock,
        dlock_fd: -1,
        from_dlock: setup.from_dlock,
        to_dlock: setup.to_dlock,
        sigchld: -1,
        child: 0,
        status: None,
        deadline_ns: setup.deadline_ns,
        detach_at_ns: if setup.detach {
            raw::boottime_ns().saturating_add(DETACH_AFTER.as_nanos() as u64)
        } else {
            0
        },
        quiet: setup.quiet,
        forward: setup.forward,
        watching: setup.plan.is_none(),
        group: setup.watch.group,
        owner: setup.watch.owner,
        owner_start: setup.watch.owner_start,
        owner_fd: setup.watch.owner_fd,
        ..Guard::default()
    };
    // dlock's main thread waits for a guardian's report, so the C library may still be used
    // here (the launch clones and, if the exec fails, waits). A watchdog's holder does not
    // wait: it uses raw system calls only, from its first instruction.
    match setup.plan.as_mut().map(|p| p.launch()) {
        Some(Ok(pid)) => {
            g.child = pid;
            g.tell(from_guard::STARTED, pid as u64);
        }
        Some(Err(errno)) => {
            g.tell(from_guard::FAILED, errno as u64);
            raw::exit(0);
        }
        None => g.tell(from_guard::STARTED, 0),
    }
    // From here on, dlock runs on and frees `setup`: only `g` and raw system calls.
    g.settle();
    g.run()
}

impl Guard {
    /// What a guardian does once the command runs: a name for `ps`, SIGCHLD and the forwarded
    /// signals as a descriptor, and a pidfd for dlock.
    fn settle(&mut self) {
        let _ = raw::prctl(libc::PR_SET_NAME, NAME.as_ptr() as usize);
        self.sigchld = raw::signalfd(self.signal_set()).unwrap_or(-1);
        self.dlock_fd = raw::pidfd_open(self.dlock).unwrap_or(-1);
        // dlock died before the pidfd was made (we were re-parented): the pidfd, if any, is
        // some other process's.
        if raw::getppid() != self.dlock {
            self.dlock_gone = true;
            self.killing = true;
        }
    }

    /// SIGCHLD and the signals passed on to dlock, as a kernel signal set.
    fn signal_set(&self) -> u64 {
        self.forward | 1u64 << (libc::SIGCHLD - 1)
    }

    fn run(mut self) -> ! {
        // A watchdog's killing: made when it begins (a command's guardian never touches it).
        let mut family: Option<Family> = None;
        loop {
            self.read_messages();
            if self.watching && !self.killing {
                self.forget_the_gone();
            }
            if self.watching && self.killing && family.is_none() {
                family = Some(Family::new());
            }
            let empty = if let Some(f) = family.as_mut() {
                self.watched_gone(f)
            } else if self.watching {
                false
            } else {
                self.reap()
            };
            if let (Some(status), false) = (self.status, self.told_exit) {
                self.told_exit = true;
                self.tell(from_guard::EXITED, status as u64);
            }
            if empty {
                if self.dlock_gone && self.killed > 0 {
                    self.say_killed();
                }
                raw::exit(0);
            }
            let now = raw::boottime_ns();
            if !self.killing && self.deadline_ns != 0 && now >= self.deadline_ns {
                self.killing = true;
                self.told_deadline = true;
                self.tell(from_guard::DEADLINE_PASSED, 0);
                self.kick();
            }
            if self.told_exit && !self.told_leftovers && !self.killing {
                // dlock stops them (SIGTERM, grace, SIGKILL) with the signalling it does for
                // every stop; the guardian goes on reaping.
                self.told_leftovers = true;
                self.tell(from_guard::LEFTOVERS, 0);
                self.kick();
            }
            if self.watching && self.killing {
                // Made here too, not only at the top: the deadline (above) starts a watchdog's
                // killing in this round. (A watchdog has no child: the command guardian's
                // branch below once sent its SIGKILL to pid 0 — the watchdog's own group —
                // and it died at the deadline, killing nobody.)
                let f = family.get_or_insert_with(Family::new);
                self.kill_watched(f);
            } else if self.killing {
                if self.status.is_none() && self.child > 0 {
                    // Our unreaped child: by pid, in case /proc cannot list our children.
                    let _ = raw::kill(self.child, libc::SIGKILL);
                }
                tree::signal_children(libc::SIGKILL);
            }
            // (Not while a watchdog kills: what it stopped is known to this process alone.)
            if self.detach_at_ns != 0 && now >= self.detach_at_ns && family.is_none() {
                self.detach();
            }
            self.wait(now);
        }
    }

    /// Takes dlock's messages; its end of the pipe closing means it died.
    fn read_messages(&mut self) {
        let mut buf = [0u8; MESSAGE * 16];
        while self.from_dlock >= 0 {
            match raw::read(self.from_dlock, &mut buf) {
                Ok(0) | Err(libc::EBADF) => {
                    raw::close(self.from_dlock);
                    self.from_dlock = -1;
                    self.dlock_gone = true;
                    self.killing = true;
                }
                Ok(n) => {
                    for m in buf.get(..n).unwrap_or_default().chunks_exact(MESSAGE) {
                        match decode(m) {
                            Some((to_guard::SIGNAL, sig))
                                if self.status.is_none() && self.child > 0 =>
                            {
                                // Our unreaped child: its pid cannot have been recycled.
                                let _ = raw::kill(self.child, sig as i32);
                            }
                            Some((to_guard::DEADLINE, ns)) => self.deadline_ns = ns,
                            Some((to_guard::KILL, _)) => self.killing = true,
                            _ => {}
                        }
                    }
                }
                Err(libc::EINTR) => {}
                Err(_) => return, // EAGAIN: nothing more
            }
        }
    }

    /// While its holder lives, a watchdog forgets an owner that exited and then, the first time
    /// it is seen empty, the owner's group: its id may be handed out again (`hold/owner.rs`,
    /// "Process groups"), and a frozen holder could die long after.
    fn forget_the_gone(&mut self) {
        if self.owner != 0 && !self.owner_runs() {
            self.owner = 0;
            if self.owner_fd >= 0 {
                raw::close(self.owner_fd);
                self.owner_fd = -1;
            }
        }
        if self.owner == 0 && self.group != 0 && self.group_gone() {
            self.group = 0;
        }
    }

    /// Whether the owner's group is to be forgotten: no process of it runs, or its number
    /// (the owner's pid: it led it) is now another process's pid (the owner's group emptied,
    /// and that one may lead a group of the same number).
    fn group_gone(&self) -> bool {
        !tree::group_runs(self.group)
            || tree::stat_of(self.group).is_some_and(|st| st.start != self.owner_start)
    }

    /// A watchdog's test of the end: neither the owner, nor any process of its group, nor any
    /// process of the family it stopped and killed ([`Family`]) runs any more. A group seen
    /// empty is forgotten for good (see [`Guard::forget_the_gone`]).
    fn watched_gone(&mut self, family: &mut Family) -> bool {
        if self.owner != 0 && !self.owner_runs() {
            self.owner = 0;
        }
        if self.group != 0 && self.group_gone() {
            self.group = 0;
        }
        let none = family.prune();
        self.owner == 0 && self.group == 0 && none
    }

    /// Whether the owner still runs: its pidfd is not readable, or (without pidfds) its pid
    /// still names a live process started when it was.
    fn owner_runs(&self) -> bool {
        if self.owner_fd >= 0 {
            let mut fds = [libc::pollfd {
                fd: self.owner_fd,
                events: libc::POLLIN,
                revents: 0,
            }];
            return raw::poll(&mut fds, Some(Duration::ZERO)) == 0;
        }
        tree::stat_of(self.owner).is_some_and(|st| st.start == self.owner_start && !st.exited)
    }

    /// A watchdog's kill round, just after [`Guard::watched_gone`] saw something run: the owner
    /// and every process below it (and in its group) stopped, then SIGKILL to them all, and
    /// SIGKILL and SIGCONT to the group. A family too large for [`Family`] is killed as far as
    /// it is known; the next round goes on.
    fn kill_watched(&mut self, family: &mut Family) {
        let owner = if self.owner != 0 {
            (self.owner, self.owner_start)
        } else {
            (0, 0)
        };
        let _complete = family.stop_all(owner, self.group, [raw::getpid(), self.dlock]);
        family.kill_all();
        if self.owner != 0 {
            if self.owner_fd >= 0 {
                let _ = raw::pidfd_send_signal(self.owner_fd, libc::SIGKILL);
            } else if self.owner_runs() {
                let _ = raw::kill(self.owner, libc::SIGKILL);
            }
        }
        if self.group > 1 {
            let _ = raw::kill_group(self.group, libc::SIGKILL);
            let _ = raw::kill_group(self.group, libc::SIGCONT);
        }
        self.killed = self.killed.saturating_add(1);
    }

    /// Reaps every child that has exited; true when none is left at all.
    fn reap(&mut self) -> bool {
        loop {
            match raw::reap_one() {
                Ok(Some((pid, status))) => {
                    if pid == self.child && self.status.is_none() {
                        self.status = Some(status);
                    }
                    if self.killing {
                        self.killed = self.killed.saturating_add(1);
                    }
                }
                Ok(None) => return false,
                Err(libc::ECHILD) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sleeps until dlock writes, a child changes state, or the next thing is due.
    fn wait(&self, now: u64) {
        let mut due: Option<u64> = None;
        let mut soonest = |t: u64| due = Some(due.map_or(t, |d| d.min(t)));
        if !self.killing && self.deadline_ns != 0 {
            soonest(self.deadline_ns);
        }
        if self.detach_at_ns != 0 {
            soonest(self.detach_at_ns);
        }
        if self.killing {
            // A watchdog scans /proc each round: after a second (a process that outlives
            // SIGKILL: another user's, or in uninterruptible sleep), ten rounds a second.
            let round = if self.watching && self.killed > 100 {
                SLOW_KILL_ROUND
            } else {
                KILL_ROUND
            };
            soonest(now.saturating_add(round.as_nanos() as u64));
        }
        // A watchdog whose holder lives watches the owner (its pidfd wakes it; without one it
        // looks every round), then the owner's group until it is seen empty.
        let watch = self.watching && !self.killing;
        let owner_fd = if watch && self.owner != 0 {
            self.owner_fd
        } else {
            -1
        };
        if watch && ((self.owner != 0 && owner_fd < 0) || (self.owner == 0 && self.group != 0)) {
            soonest(now.saturating_add(WATCH_ROUND.as_nanos() as u64));
        }
        let timeout = due.map(|t| Duration::from_nanos(t.saturating_sub(now)));
        let mut fds = [
            libc::pollfd {
                fd: self.from_dlock, // -1 once closed: poll skips it
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: owner_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.sigchld,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if self.sigchld < 0 {
            // No signalfd (out of descriptors): look again every round instead.
            let t = timeout.map_or(KILL_ROUND, |t| t.min(KILL_ROUND));
            raw::poll(&mut fds, Some(t));
            return;
        }
        raw::poll(&mut fds, timeout);
        // Drain the signals: SIGCHLDs need nothing (reaping looks at every child anyway); any
        // other goes on to dlock, as if sent to it (`signalfd_siginfo`: the number first).
        let mut info = [0u8; 128 * 4];
        while let Ok(n @ 1..) = raw::read(self.sigchld, &mut info) {
            for one in info.get(..n).unwrap_or_default().chunks_exact(128) {
                let signo = one
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u32::from_ne_bytes);
                if signo != libc::SIGCHLD as u32 && signo != 0 {
                    self.pass_on(signo as i32);
                }
            }
        }
    }

    /// Sends dlock a signal that reached the guardian.
    fn pass_on(&self, sig: i32) {
        if self.dlock_gone {
            return;
        }
        // Through the pidfd; else (no pidfds, or a sandbox that denies sending through one) by
        // pid while dlock is our parent, which it is as long as it lives.
        if (self.dlock_fd < 0 || raw::pidfd_send_signal(self.dlock_fd, sig).is_err())
            && raw::getppid() == self.dlock
        {
            let _ = raw::kill(self.dlock, sig);
        }
    }

    /// Best effort: dlock reads these when it reaps us, or when kicked.
    fn tell(&self, tag: u8, value: u64) {
        let _ = raw::write(self.to_dlock, &encode(tag, value));
    }

    /// Wakes dlock (its main thread waits for SIGCHLD, among other signals) to read a report
    /// that comes before our own exit. (Without pidfds, Linux < 5.3, by pid: our parent is
    /// dlock as long as it lives.)
    fn kick(&self) {
        self.pass_on(libc::SIGCHLD);
    }

    /// One line on stderr, after the tree is gone, unless `-q`.
    fn say_killed(&self) {
        if self.quiet {
            return;
        }
        let mut line = Buf::<512>::default();
        if self.watching {
            line.push(b"dlock: the holder process ");
            line.number(u64::from(self.dlock.unsigned_abs()));
            line.push(b" of dlock acquire died; its watchdog killed its owner's processes before letting the lock go\n");
            let _ = raw::write(2, line.bytes());
            return;
        }
        line.push(b"dlock: the dlock process ");
        line.number(u64::from(self.dlock.unsigned_abs()));
        line.push(b" died while its command ran; its guardian killed the command's ");
        line.number(u64::from(self.killed));
        line.push(b" process(es) before letting the lock go\n");
        let _ = raw::write(2, line.bytes());
    }

    /// Executes dlock's binary anew as this guardian (same pid, same children, same
    /// descriptors), so that it no longer shares dlock's memory; on failure, goes on as it is.
    fn detach(&mut self) {
        self.detach_at_ns = 0; // one try
        if !tree::keep_descriptors_on_exec() {
            return;
        }
        let mut args = Buf::<1024>::default();
        let mut starts = [0usize; 24];
        let mut count = 0usize;
        let mut arg = |args: &mut Buf<1024>, f: &dyn Fn(&mut Buf<1024>)| {
            if let Some(s) = starts.get_mut(count) {
                *s = args.len();
                count = count.saturating_add(1);
            }
            f(args);
            args.push(b"\0");
        };
        arg(&mut args, &|l| l.push(NAME.to_bytes()));
        arg(&mut args, &|l| l.push(RESUME_MARK));
        for v in self.fields() {
            arg(&mut args, &|l| l.signed(v));
        }
        if args.full() {
            return;
        }
        let mut argv = [c""; 24];
        for (a, &start) in argv.iter_mut().zip(starts.iter().take(count)) {
            match args.bytes().get(start..).map(CStr::from_bytes_until_nul) {
                Some(Ok(s)) => *a = s,
                _ => return,
            }
        }
        // With dlock's environment (LD_LIBRARY_PATH, say, may be what lets its binary start),
        // less what would load a library into it ([`NOT_PRELOADED`]).
        let _ = raw::execve_keeping_environment(
            c"/proc/self/exe",
            argv.get(..count).unwrap_or_default(),
            NOT_PRELOADED,
        );
    }

    /// The state passed through `execve`, in a fixed order ([`Guard::from_fields`]).
    fn fields(&self) -> [i64; 21] {
        let flag = |b: bool| i64::from(b);
        [
            i64::from(self.dlock),
            i64::from(self.dlock_fd),
            i64::from(self.from_dlock),
            i64::from(self.to_dlock),
            i64::from(self.sigchld),
            i64::from(self.child),
            self.status.map_or(-1, i64::from),
            self.deadline_ns as i64,
            flag(self.dlock_gone),
            flag(self.killing),
            flag(self.told_exit),
            flag(self.told_leftovers),
            flag(self.told_deadline),
            flag(self.quiet),
            i64::from(self.killed),
            self.forward as i64,
            flag(self.watching),
            i64::from(self.group),
            i64::from(self.owner),
            self.owner_start as i64,
            i64::from(self.owner_fd),
        ]
    }

    fn from_fields(f: &[i64]) -> Option<Guard> {
        let int = |i: usize| f.get(i).and_then(|&v| i32::try_from(v).ok());
        let flag = |i: usize| match f.get(i) {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        };
        if f.len() != 21 {
            return None;
        }
        Some(Guard {
            dlock: int(0)?,
            dlock_fd: int(1)?,
            from_dlock: int(2)?,
            to_dlock: int(3)?,
            sigchld: int(4)?,
            child: int(5)?,
            status: match int(6)? {
                -1 => None,
                s => Some(s),
            },
            deadline_ns: u64::try_from(*f.get(7)?).ok()?,
            detach_at_ns: 0,
            dlock_gone: flag(8)?,
            killing: flag(9)?,
            told_exit: flag(10)?,
            told_leftovers: flag(11)?,
            told_deadline: flag(12)?,
            quiet: flag(13)?,
            killed: u32::try_from(*f.get(14)?).ok()?,
            forward: *f.get(15)? as u64,
            watching: flag(16)?,
            group: int(17)?,
            owner: int(18)?,
            owner_start: u64::try_from(*f.get(19)?).ok()?,
            owner_fd: int(20)?,
        })
    }
}

/// Set by [`resume_if_asked`]: this binary resumes guardians, so a guardian may execute it anew.
/// (A binary that never asks — a test harness — would run its own `main` again instead.)
static RESUMABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a guardian started by this process may detach by executing this binary anew.
pub(super) fn can_detach() -> bool {
    RESUMABLE.load(std::sync::atomic::Ordering::Relaxed)
}

/// In a process started by a guardian that executed itself anew ([`Guard::detach`]): goes on
/// guarding and never returns. Anything else returns at once. Call first thing in `main`: a
/// program that does not never gets detached guardians (see [`super::DETACH_AFTER`]).
pub fn resume_if_asked() {
    RESUMABLE.store(exe_is_this_program(), std::sync::atomic::Ordering::Relaxed);
    let mut args = std::env::args_os();
    if args
        .next()
        .is_none_or(|a| a.as_encoded_bytes() != NAME.to_bytes())
        || args
            .next()
            .is_none_or(|a| a.as_encoded_bytes() != RESUME_MARK)
    {
        return;
    }
    let fields: Option<Vec<i64>> = args
        .map(|a| a.to_str().and_then(|s| s.parse().ok()))
        .collect();
    let Some(g) = fields.as_deref().and_then(Guard::from_fields) else {
        let _ = raw::write(2, b"dlock: not a guardian's state\n");
        raw::exit(2);
    };
    let _ = raw::prctl(libc::PR_SET_NAME, NAME.as_ptr() as usize);
    raw::block_all_signals();
    g.run()
}

/// Whether `/proc/self/exe` is this program, which a guardian can execute anew. It is not when
/// the program was started as `ld.so PROGRAM` (then it is the dynamic loader, which would take
/// a guardian's arguments for a program to run, and fail: the guardian gone, the command killed
/// by its PDEATHSIG). The kernel says so: it loaded no interpreter (`AT_BASE` is 0), and glibc
/// rewrites the other entries (`AT_EXECFN`, `AT_ENTRY`) to the program's. A static build reads 0
/// too, and keeps its guardians in its memory: safe, with the OOM caveat for the whole run.
fn exe_is_this_program() -> bool {
    crate::sys::has_interpreter()
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::arithmetic_side_effects
)]
mod tests {
    use super::*;

    #[test]
    fn the_state_survives_the_trip_through_execve() {
        let g = Guard {
            dlock: 4242,
            dlock_fd: 7,
            from_dlock: -1,
            to_dlock: 9,
            sigchld: 10,
            child: 4243,
            status: Some(3 << 8),
            deadline_ns: 123_456_789_000,
            detach_at_ns: 0,
            dlock_gone: true,
            killing: true,
            told_exit: true,
            told_leftovers: false,
            told_deadline: false,
            quiet: true,
            killed: 5,
            forward: 1 << 14,
            watching: true,
            group: 4240,
            owner: 4240,
            owner_start: 987_654,
            owner_fd: 11,
        };
        assert_eq!(Guard::from_fields(&g.fields()), Some(g));
        let mut f = g.fields();
        f[8] = 2;
        assert_eq!(Guard::from_fields(&f), None, "a flag is 0 or 1");
        assert_eq!(Guard::from_fields(&f[..20]), None);
    }
}
