//! The child: spawning it, reaping it (and anything it leaves behind), forwarding signals, and
//! stopping it in time when the lease is lost.
//!
//! dlock makes itself a child subreaper, so every process the command starts stays in dlock's
//! subtree even when its parent exits; a lease loss can then kill the whole job, not just a shell
//! whose `sleep` would run on without the lock. The child stays in dlock's process group, so it
//! keeps the terminal (reads from it, gets Ctrl-C and Ctrl-Z like any foreground job).
//!
//! Everything here runs on the main thread except the reaper, which only waits and reports.

use std::ffi::OsString;
use std::io;
use std::process::ExitStatus;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::BootInstant;
use crate::exit;
use crate::keeper::Keeper;
use crate::signals::{self, Received, Woken};

/// Everything the main thread waits for while the child runs.
#[derive(Debug)]
pub enum Event {
    /// SIGINT, SIGTERM or SIGHUP arrived.
    Signal(Received),
    /// The child exited (reaped).
    ChildExited(ExitStatus),
    /// No child of dlock is left (the child and everything reparented to dlock are reaped).
    AllReaped,
    /// The lease was renewed; it now lasts until this instant.
    Renewed(BootInstant),
    /// A renewal failed; the lease may still be ours until its deadline.
    RenewFailed(String),
    /// The backend says the lease is gone.
    Lost(String),
}

/// The sending side of the main thread's event queue, for other threads: each send also wakes
/// the main thread from its signal wait.
#[derive(Clone)]
pub struct Events(pub Sender<Event>);

impl Events {
    /// Queues `event` for the main thread and wakes it.
    pub fn send(&self, event: Event) {
        let _ = self.0.send(event);
        signals::wake_main();
    }
}

/// Why the child was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It exited by itself.
    Exited(ExitStatus),
    /// dlock received this signal.
    Signalled(i32),
    /// The lease was lost (or could no longer be trusted) for this reason.
    Lost(String),
}

impl Ending {
    /// dlock's exit code for this ending (docs/design.md, "Exit codes").
    pub fn code(&self) -> u8 {
        match self {
            Ending::Exited(status) => exit::child_code(*status),
            Ending::Signalled(sig) => exit::signal_code(*sig),
            Ending::Lost(_) => exit::LOST,
        }
    }
}

/// Makes this process the reaper of every orphan below it. Call once, before spawning.
pub(crate) fn become_subreaper() {
    crate::sys::become_subreaper();
}

/// Reaps this process's children on SIGCHLD: reports the command's status, reaps orphans
/// reparented here, and says when none is left. The command is signalled only while unreaped,
/// so never a recycled pid.
#[derive(Default)]
pub struct Reaper {
    state: Mutex<ReapState>,
}

#[derive(Default)]
struct ReapState {
    /// The command's pid, once spawned.
    main: Option<libc::pid_t>,
    /// The command has been reaped.
    reaped: bool,
    /// AllReaped was sent.
    all_sent: bool,
}

impl Reaper {
    /// A reaper with no child yet.
    pub fn new() -> Arc<Reaper> {
        Arc::new(Reaper::default())
    }

    /// Reaps every child that has exited, without blocking; call on SIGCHLD. Does nothing before
    /// the command is spawned.
    pub fn reap(&self, events: &Sender<Event>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(main) = st.main else { return };
        loop {
            let pid = match crate::sys::waitid_exited_nowait() {
                Ok(Some(pid)) => pid,
                Ok(None) => return, // children remain, none has exited
                Err(_) => {
                    // ECHILD: nothing left at all.
                    if st.reaped && !st.all_sent {
                        st.all_sent = true;
                        let _ = events.send(Event::AllReaped);
                    }
                    return;
                }
            };
            let status = crate::sys::wait_pid(pid);
            if pid == main {
                st.reaped = true;
                let _ = events.send(Event::ChildExited(status));
            }
        }
    }
}

/// A running child.
pub struct Child {
    pid: libc::pid_t,
    reaper: Arc<Reaper>,
    events: Sender<Event>,
}

/// Why the command could not be started.
#[derive(Debug)]
pub struct SpawnError {
    /// 126 or 127.
    pub code: u8,
    /// What went wrong, naming the command.
    pub message: String,
}

/// Spawns `command` directly (no shell) from the calling thread, which must be the main thread
/// and must outlive the child: `PR_SET_PDEATHSIG` fires when the *thread* that forked exits.
/// Its exit is reported on `events` when [`supervise`] sees SIGCHLD.
pub fn spawn(
    command: &[OsString],
    env: &[(&str, String)],
    reaper: &Arc<Reaper>,
    events: &Sender<Event>,
) -> Result<Child, SpawnError> {
    // An inherited token (dlock inside dlock) must not pass for ours when we have none.
    let pid = crate::sys::spawn::spawn(command, &["DLOCK_FENCING_TOKEN"], env).map_err(|e| {
        let name = command[0].to_string_lossy();
        let code = match e.kind() {
            io::ErrorKind::NotFound => exit::NOT_FOUND,
            _ => exit::NOT_EXECUTABLE,
        };
        SpawnError {
            code,
            message: format!("cannot run '{name}': {e}"),
        }
    })?;
    *reaper.state.lock().unwrap_or_else(|e| e.into_inner()) = ReapState {
        main: Some(pid),
        reaped: false,
        all_sent: false,
    };
    // Its SIGCHLD, however early, stays pending (blocked) until supervise() takes it.
    Ok(Child {
        pid,
        reaper: reaper.clone(),
        events: events.clone(),
    })
}

impl Child {
    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Sends `sig` to the child if it has not been reaped yet.
    fn signal(&self, sig: i32) {
        let st = self.reaper.state.lock().unwrap_or_else(|e| e.into_inner());
        if !st.reaped {
            // Our unreaped child (the lock above keeps it so), so the pid is not reused.
            crate::sys::kill(self.pid, sig);
        }
    }
}

/// Sends `sig` to every descendant of this process (the child, its children, and orphans
/// reparented here). Descendants are found in /proc; a process forked during the scan is caught
/// by the next call.
///
/// Never by bare pid: a descendant that dies between the scan and the kill can have its pid
/// handed to an unrelated process at once (pids wrap after 32768 by default, and a long-lived
/// descendant's pid is a full cycle old). Each process is pinned with a pidfd, checked to be the
/// one scanned (same start time), and signalled through the pidfd. This once killed another
/// test's dlock with SIGKILL.
fn signal_descendants(sig: i32) {
    let me = std::process::id() as libc::pid_t;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut procs = Vec::new(); // (pid, ppid, start time)
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if let Some((ppid, start)) = read_stat(pid) {
            procs.push((pid, ppid, start));
        }
    }
    let mut tree = vec![(me, 0)];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i].0;
        tree.extend(
            procs
                .iter()
                .filter(|(_, pp, _)| *pp == p)
                .map(|(c, _, st)| (*c, *st)),
        );
        i += 1;
    }
    for (pid, start) in tree.into_iter().skip(1) {
        signal_pinned(pid, start, sig);
    }
}

/// Signals `pid` only if it is still the process that started at `start`.
fn signal_pinned(pid: libc::pid_t, start: u64, sig: i32) {
    // Gone already (or a kernel before 5.3: do not risk a recycled pid).
    let Some(fd) = crate::sys::PidFd::open(pid) else {
        return;
    };
    if read_stat(pid).map(|(_, st)| st) == Some(start) {
        fd.signal(sig);
    }
}

/// (ppid, start time in clock ticks) from /proc/PID/stat.
fn read_stat(pid: libc::pid_t) -> Option<(libc::pid_t, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ... starttime ...": comm may contain spaces and parentheses; the
    // fields after the last ')' start with state (field 3), so ppid is 1 and starttime (22) is 19.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// The supervisor's knowledge of the lease.
pub struct LeaseClock {
    /// When the lease runs out unless renewed; `None` if it never runs out by itself.
    pub deadline: Option<BootInstant>,
    /// How long before the deadline to start terminating: the child gets SIGTERM then and
    /// SIGKILL at the deadline, so it is gone before anyone else can hold the lock.
    pub loss_grace: Duration,
}

struct Stopping {
    why: Ending,
    kill_at: BootInstant,
    killed: bool,
    child_status: Option<ExitStatus>,
}

/// Runs the event loop until the child has exited (and, when dlock stopped it, everything it
/// left behind is gone). Forwards signals, enforces the lease deadline, escalates to SIGKILL.
pub fn supervise(
    child: &Child,
    events: &Receiver<Event>,
    keeper: &mut Keeper,
    mut lease: LeaseClock,
    kill_grace: Duration,
) -> Ending {
    let mut stopping: Option<Stopping> = None;
    let mut last_renew_error: Option<String> = None;
    loop {
        let now = BootInstant::now();
        let mut wake = Duration::from_secs(1);
        // The keeper starts when the first renewal is due, also while stopping: the lock is held
        // until the command is gone.
        if let Some(due) = keeper.due() {
            if now >= due {
                if let Err(e) = keeper.start() {
                    // Nobody can renew: the lease runs out at its deadline (enforced below, also
                    // while stopping); stop the command now with the reason.
                    let why = format!("cannot start the keeper thread: {e}");
                    match &mut stopping {
                        None => stopping = Some(stop(child, Ending::Lost(why), now + kill_grace)),
                        Some(_) => crate::report::warn(format_args!("{why}")),
                    }
                }
                continue;
            }
            wake = wake.min(due.saturating_duration_since(now));
        }
        match &mut stopping {
            None => {
                if let Some(deadline) = lease.deadline {
                    let start = deadline - lease.loss_grace;
                    if now >= start {
                        let why = last_renew_error
                            .take()
                            .unwrap_or_else(|| "no reply to the last renewal yet".into());
                        let reason =
                            format!("the lease could not be renewed before it ran out ({why})");
                        stopping = Some(stop(child, Ending::Lost(reason), deadline));
                        continue;
                    }
                    wake = wake.min(start.saturating_duration_since(now));
                }
            }
            Some(s) => {
                // However the stop began, the job must be gone before the lease could run out:
                // SIGKILL at the grace's end or the lease deadline, whichever is first (renewals
                // go on during the grace and keep moving the deadline).
                let kill_at = lease.deadline.map_or(s.kill_at, |d| d.min(s.kill_at));
                if now >= kill_at {
                    // Keep killing: a process forked during the last scan is caught by this one.
                    child.signal(libc::SIGKILL);
                    signal_descendants(libc::SIGKILL);
                    s.killed = true;
                    wake = Duration::from_millis(50);
                } else {
                    wake = wake.min(kill_at.saturating_duration_since(now));
                }
                if s.child_status.is_some() && s.killed && now >= kill_at + Duration::from_secs(1) {
                    // Something below the child cannot be killed (uninterruptible sleep): give up
                    // on it rather than hang; the child itself is gone.
                    return s.why.clone();
                }
            }
        }
        let event = match events.try_recv() {
            Ok(e) => e,
            Err(TryRecvError::Empty) => match signals::wait(wake) {
                Woken::Signal(r) => Event::Signal(r),
                Woken::Child => {
                    child.reaper.reap(&child.events);
                    continue;
                }
                Woken::Wake => continue,
            },
            Err(TryRecvError::Disconnected) => {
                return Ending::Lost("internal: event channel closed".into());
            }
        };
        match event {
            Event::Signal(r) => {
                if !r.from_terminal {
                    child.signal(r.signal);
                }
                if stopping.is_none() {
                    let kill_at = BootInstant::now() + kill_grace;
                    stopping = Some(Stopping {
                        why: Ending::Signalled(r.signal),
                        kill_at,
                        killed: false,
                        child_status: None,
                    });
                }
            }
            Event::Renewed(deadline) => {
                lease.deadline = Some(deadline);
                last_renew_error = None;
            }
            Event::RenewFailed(e) => last_renew_error = Some(e),
            Event::Lost(reason) => match &mut stopping {
                None => {
                    let kill_at = BootInstant::now() + kill_grace;
                    stopping = Some(stop(child, Ending::Lost(reason), kill_at));
                }
                // Already stopping (a signal): the lock is gone, so the grace ends sooner.
                Some(s) => s.kill_at = s.kill_at.min(BootInstant::now() + kill_grace),
            },
            Event::ChildExited(status) => match &mut stopping {
                None => return Ending::Exited(status),
                Some(s) => {
                    s.child_status = Some(status);
                    // What the child left behind gets the same treatment it got.
                    signal_descendants(libc::SIGTERM);
                }
            },
            Event::AllReaped => {
                if let Some(s) = &stopping {
                    return s.why.clone();
                }
            }
        }
    }
}

/// Starts terminating the whole job: SIGTERM to every descendant now, SIGKILL at `kill_at`.
fn stop(child: &Child, why: Ending, kill_at: BootInstant) -> Stopping {
    child.signal(libc::SIGTERM);
    signal_descendants(libc::SIGTERM);
    Stopping {
        why,
        kill_at,
        killed: false,
        child_status: None,
    }
}
