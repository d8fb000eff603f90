//! The child: starting it (through the guardian, `crate::guard`), reaping what comes back to
//! dlock, forwarding signals, and stopping the command's whole tree in time when the lease is
//! lost — and before the lock is released in every case: what the command leaves running when it
//! exits is stopped too (lifetime rule 4).
//!
//! dlock's only child is the guardian; the command is the guardian's, and every orphan below it
//! is re-parented to the guardian. dlock is a child subreaper as well, so if the guardian dies,
//! what it leaves comes to dlock, which kills it before releasing. Stopping signals every
//! descendant of dlock (found in /proc), so a lease loss kills the whole job, not just a shell
//! whose `sleep` would run on without the lock; the SIGKILL also comes from the guardian, which
//! kills its own children round after round — all of it on a kernel without pidfds
//! ([`kill_descendants`]). The command joins dlock's process group, so it
//! keeps the terminal (reads from it, gets Ctrl-C and Ctrl-Z like any foreground job).
//!
//! Everything here runs on the main thread.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::BootInstant;
use crate::events::Event;
use crate::exit;
use crate::guard::{Guardian, GuardianReport, StartError};
use crate::keeper::Keeper;
use crate::signals::{self, Woken};
use crate::stopper::{Step, Stopping, Tree};
use crate::sys::spawn::Plan;

/// Why the child was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It exited by itself.
    Exited(ExitStatus),
    /// dlock received this signal.
    Signalled(i32),
    /// The lease was lost (or could no longer be trusted) for this reason.
    Lost(String),
    /// The guardian died before the command did: killed by someone. Its command died with it
    /// (PDEATHSIG) and dlock killed the rest.
    GuardianDied {
        /// The guardian's pid.
        pid: u32,
        /// How it ended.
        status: ExitStatus,
        /// Whether it had said the command started.
        started: bool,
    },
}

impl Outcome {
    /// dlock's exit code for this ending (docs/design.md, "Exit codes").
    pub fn code(&self) -> u8 {
        match self {
            Outcome::Exited(status) => exit::child_code(*status),
            Outcome::Signalled(sig) => exit::signal_code(*sig),
            Outcome::Lost(_) => exit::LOST,
            // As if the command had been killed with the guardian's signal, which it was.
            Outcome::GuardianDied { status, .. } => exit::child_code(*status),
        }
    }
}

/// Makes this process the reaper of every orphan below it. Call once, before spawning. Without
/// child subreapers (Linux < 3.4, or a sandbox that denies them) the guardian could not keep
/// the command's tree below it: dlock refuses to run rather than run with a weaker guarantee.
pub(crate) fn become_subreaper() -> Result<(), String> {
    crate::sys::become_subreaper().map_err(|e| {
        let how = match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => "denied by a sandbox",
            _ => "unknown to this kernel",
        };
        format!(
            "child subreapers (PR_SET_CHILD_SUBREAPER, Linux 3.4 and later) are {how}, and \
             without them the command's whole process tree cannot be covered; dlock needs \
             Linux 3.10 or later"
        )
    })
}

/// Reaps this process's children on SIGCHLD — the guardian, and orphans re-parented here if it
/// died — and says when none is left.
#[derive(Default)]
pub struct Reaper {
    state: Mutex<ReapState>,
}

#[derive(Default)]
struct ReapState {
    /// The guardian's pid, once started.
    guardian: Option<libc::pid_t>,
    /// The command's pid: dlock reaps it itself if the guardian died first.
    command: Option<libc::pid_t>,
    /// The guardian has been reaped.
    reaped: bool,
    /// AllReaped was sent.
    all_sent: bool,
}

impl Reaper {
    /// A reaper with no child yet.
    pub fn new() -> Arc<Reaper> {
        Arc::new(Reaper::default())
    }

    /// Reaps every child that has exited, without blocking, and says what it found; call on
    /// SIGCHLD. Nothing before the guardian is started.
    fn reap(&self) -> Vec<Event> {
        let mut found = Vec::new();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(guardian) = st.guardian else {
            return found;
        };
        loop {
            let pid = match crate::sys::waitid_exited_nowait() {
                Ok(Some(pid)) => pid,
                Ok(None) => return found, // children remain, none has exited
                Err(_) => {
                    // ECHILD: nothing left at all.
                    if st.reaped && !st.all_sent {
                        st.all_sent = true;
                        found.push(Event::AllReaped);
                    }
                    return found;
                }
            };
            let status = crate::sys::wait_pid(pid);
            if pid == guardian {
                st.reaped = true;
                found.push(Event::GuardianExited(status));
            } else if Some(pid) == st.command {
                found.push(Event::ChildExited(status));
            }
        }
    }
}

/// The running command, behind its guardian.
pub struct Child {
    guardian: Guardian,
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

/// Why the command could not be executed, in words: "not found" or the error's own words
/// (without "(os error N)"), and, for a lone word with a space in it that was not found, that
/// the command is not run through a shell.
fn exec_failure(name: &str, words: usize, e: &io::Error) -> String {
    let what = match e.kind() {
        io::ErrorKind::NotFound => "not found".to_string(),
        io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => crate::report::io_words(e),
    };
    let mut line = format!("cannot run '{name}': {what}");
    if e.kind() == io::ErrorKind::NotFound && words == 1 && name.contains(' ') {
        line.push_str(&format!(
            "; dlock runs the command directly, not through a shell: write sh -c '{name}'"
        ));
    }
    line
}

/// Starts `command` directly (no shell) under a new guardian, from the main thread (whose
/// signals are blocked, see `signals`). `deadline` is the lease's, for the guardian to enforce
/// if dlock cannot; `quiet` silences the guardian's one line. Returns once the command has been
/// executed; its exit is reported on `events` when [`supervise`] sees SIGCHLD.
pub fn spawn(
    command: &[OsString],
    env: &[(&str, String)],
    deadline: Option<BootInstant>,
    quiet: bool,
    reaper: &Arc<Reaper>,
    events: &Sender<Event>,
) -> Result<Child, SpawnError> {
    let name = command[0].to_string_lossy();
    let fail = |code: u8, e: io::Error| SpawnError {
        code,
        message: exec_failure(&name, command.len(), &e),
    };
    // An inherited token (dlock inside dlock) must not pass for ours when we have none.
    let pgid = crate::sys::own_process_group();
    let plan = Plan::new(command, &["DLOCK_FENCING_TOKEN"], env, pgid)
        .map_err(|e| fail(exit::NOT_EXECUTABLE, e))?;
    let guardian = Guardian::start(Box::new(plan), deadline, quiet).map_err(|e| match e {
        StartError::Exec(e) if e.kind() == io::ErrorKind::NotFound => fail(exit::NOT_FOUND, e),
        StartError::Exec(e) => fail(exit::NOT_EXECUTABLE, e),
        StartError::Guardian(e) => fail(
            exit::NOT_EXECUTABLE,
            io::Error::other(format!("cannot start its guardian process: {e}")),
        ),
    })?;
    *reaper.state.lock().unwrap_or_else(|e| e.into_inner()) = ReapState {
        guardian: Some(guardian.pid()),
        command: guardian.command(),
        reaped: false,
        all_sent: false,
    };
    // The guardian's SIGCHLD, however early, stays pending (blocked) until supervise() takes it.
    Ok(Child {
        guardian,
        reaper: reaper.clone(),
        events: events.clone(),
    })
}

impl Child {
    /// The command's pid, if known (it is unless the guardian was killed as it started).
    pub fn pid(&self) -> Option<u32> {
        self.guardian.command().map(|p| p as u32)
    }

    /// Asks the guardian to send `sig` to the command if it still runs.
    fn signal(&self, sig: i32) {
        self.guardian.signal_command(sig);
    }

    /// The ending of a run whose guardian died (ended with `status`) before the command.
    fn guardian_died(&self, status: ExitStatus) -> Outcome {
        Outcome::GuardianDied {
            pid: self.guardian.pid() as u32,
            status,
            started: self.guardian.command().is_some(),
        }
    }

    /// On SIGCHLD: reaping, then the guardian's reports, then what reaping found. Reports are
    /// read after reaping because the guardian writes them before it exits: read first, a
    /// report written just before an exit reaped next would come after it (and a command's
    /// exit code would be taken for a guardian's death).
    fn poll(&self) {
        let reaped = self.reaper.reap();
        for report in self.guardian.reports() {
            let event = match report {
                GuardianReport::Exited(status) => Event::ChildExited(status),
                GuardianReport::Leftovers => Event::Leftovers,
                GuardianReport::DeadlinePassed => Event::Lost(
                    "dlock neither renewed the lease nor stopped the command in time (stopped or starved?); its guardian killed the command's processes before the lease could run out".into(),
                ),
            };
            let _ = self.events.send(event);
        }
        for event in reaped {
            let _ = self.events.send(event);
        }
    }
}

/// Sends each of `sigs` to every descendant of this process but `spare` (the guardian, the
/// command, its children, orphans re-parented here) and says how many it signalled.
fn signal_descendants(sigs: &[i32], spare: Option<libc::pid_t>) -> usize {
    let me = std::process::id() as libc::pid_t;
    crate::procs::descendants(me)
        .into_iter()
        .filter(|p| Some(p.pid) != spare && p.signal(sigs))
        .count()
}

/// SIGTERM to every descendant but the guardian, then SIGCONT: a stopped process handles its
/// SIGTERM only once continued. Returns how many were signalled.
fn terminate_descendants(child: &Child) -> usize {
    signal_descendants(&[libc::SIGTERM, libc::SIGCONT], Some(child.guardian.pid()))
}

/// SIGKILL to every descendant but the guardian, which must outlive them (its copies of
/// dlock's descriptors hold the lock if dlock dies now); it gets SIGCONT, in case someone
/// stopped it (it blocks every other signal).
///
/// The guardian is told to kill its tree: it kills its own children round after round (each
/// killed process's children become its own), by pid, which is safe for a parent and needs
/// nothing new from the kernel. Where pidfds exist, dlock also kills every descendant at once
/// (each pinned); where they do not, only its own children (orphans of a dead guardian), which
/// it alone reaps — and, once `stragglers` is set (the rounds have had [`STRAGGLERS_AFTER`]),
/// every descendant still there by checked pid (`procs::Proc::signal`): what runs below a
/// process that cannot die (uninterruptible sleep) never comes to the guardian.
fn kill_descendants(child: &Child, stragglers: bool) {
    child.guardian.kill_tree();
    let guardian = child.guardian.pid();
    if crate::sys::has_pidfds() || stragglers {
        signal_descendants(&[libc::SIGKILL], Some(guardian));
    } else {
        let me = std::process::id() as libc::pid_t;
        for p in crate::procs::children(me) {
            if p.pid != guardian {
                p.signal_child(&[libc::SIGKILL]);
            }
        }
    }
    if let Some(g) = crate::procs::Proc::of(guardian) {
        g.signal_child(&[libc::SIGCONT]);
    }
}

/// Without pidfds, how long the guardian's kill rounds have before dlock also kills what is left
/// of the tree by checked pid (see [`kill_descendants`]).
const STRAGGLERS_AFTER: Duration = Duration::from_millis(200);

/// The supervisor's knowledge of the lease.
pub struct LeaseClock {
    /// When the lease runs out unless renewed; `None` if it never runs out by itself.
    pub deadline: Option<BootInstant>,
    /// How long before the deadline to start terminating: the child gets SIGTERM then and
    /// SIGKILL by [`LeaseClock::kill_by`], so it is gone before anyone else can hold the lock.
    pub loss_grace: Duration,
}

impl LeaseClock {
    /// The clock of a lease just granted: its deadline, and a grace on loss of at most ttl/3
    /// (SIGKILL must land before the deadline, and the renewal at ttl/3 must not be mistaken
    /// for a failure).
    pub(crate) fn of(lease: &dyn crate::backend::Lease, kill_grace: Duration) -> LeaseClock {
        LeaseClock {
            deadline: lease
                .ttl()
                .map(|ttl| crate::keeper::deadline_after(lease.acquired_at(), ttl)),
            loss_grace: lease
                .ttl()
                .map_or(kill_grace, |ttl| kill_grace.min(ttl / 3)),
        }
    }

    /// When a guardian (or an acquire holder's watchdog) is to kill the tree by itself, its
    /// dlock (holder) having done nothing: while nothing is being stopped, a quarter of the loss
    /// grace after stopping was due (`deadline − ¾·loss_grace`): a dlock alive begins stopping
    /// at `deadline − loss_grace` and says so; one that has not by then is frozen or starved.
    /// The three quarters left are the guardian's room for a late wake-up on a busy machine:
    /// at the deadline itself it had only the drift margin, and the long fault campaign saw a
    /// frozen holder's watchdog woken 150–470 ms late at a load of 50 on 2 cores, its owner
    /// killed after the next holder had started. While stopping: [`LeaseClock::kill_by`], the
    /// SIGKILL dlock sends itself, so the command keeps its grace.
    pub fn guard_deadline(&self, stopping: bool) -> Option<BootInstant> {
        if stopping {
            return self.kill_by();
        }
        self.deadline.map(|d| d - self.loss_grace * 3 / 4)
    }

    /// The latest a stop's SIGKILL may come: a quarter of the loss grace before the deadline,
    /// room for a late wake-up of the killer (not the deadline itself, which a SIGTERM-ignoring
    /// command on a busy machine outlived). `None` for a lease that never runs out.
    pub fn kill_by(&self) -> Option<BootInstant> {
        self.deadline.map(|d| d - self.loss_grace / 4)
    }

    /// A start that took long (a history write retried, a slow server) may have used the time
    /// the keeper had to renew in: from `deadline − loss_grace` on, the lease is renewed once
    /// now, before the command starts, and the deadline counted from that renewal's send
    /// time. `Err` (why) if it cannot be: the command must not start.
    pub(crate) fn renew_if_late(
        &mut self,
        lease: &mut dyn crate::backend::Lease,
    ) -> Result<(), String> {
        let (Some(deadline), Some(ttl)) = (self.deadline, lease.ttl()) else {
            return Ok(());
        };
        if BootInstant::now() + self.loss_grace < deadline {
            return Ok(());
        }
        let sent = BootInstant::now();
        match lease.renew() {
            Ok(()) => {
                self.deadline = Some(crate::keeper::deadline_after(sent, ttl));
                Ok(())
            }
            Err(crate::backend::RenewError::Lost(why)) => Err(why),
            Err(crate::backend::RenewError::Failed(e)) => Err(format!("{e:#}")),
        }
    }

    /// Whether stopping must begin now, renewals not having succeeded by `deadline −
    /// loss_grace`: then the reason (naming the last renewal error, taken) and the SIGKILL's time
    /// ([`LeaseClock::kill_by`]); else `wake` is cut to when it will be due.
    pub(crate) fn overdue(
        &self,
        now: BootInstant,
        last_error: &mut Option<String>,
        wake: &mut Duration,
    ) -> Option<(String, BootInstant)> {
        let deadline = self.deadline?;
        let start = deadline - self.loss_grace;
        if now < start {
            *wake = (*wake).min(start.saturating_duration_since(now));
            return None;
        }
        let why = last_error
            .take()
            .unwrap_or_else(|| "no reply to the last renewal yet".into());
        Some((
            format!("the lease could not be renewed before it ran out ({why})"),
            self.kill_by().unwrap_or(deadline),
        ))
    }
}

/// The command's tree, to stop ([`crate::stopper`]): every descendant of dlock but the guardian
/// (the command, its children, orphans re-parented to the guardian or, if it died, to dlock).
struct CommandTree<'a>(&'a Child);

impl Tree for CommandTree<'_> {
    fn terminate(&mut self) {
        self.0.signal(libc::SIGTERM);
        terminate_descendants(self.0);
    }

    fn kill(&mut self, rounds_for: Duration) {
        kill_descendants(self.0, rounds_for >= STRAGGLERS_AFTER);
    }

    /// Only the reaper can tell (`Event::AllReaped` ends the loop).
    fn is_over(&mut self) -> bool {
        false
    }

    fn why_alive(&self) -> String {
        let guardian = self.0.guardian.pid();
        let me = std::process::id() as libc::pid_t;
        let left: Vec<crate::procs::Proc> = crate::procs::descendants(me)
            .into_iter()
            .filter(|p| p.pid != guardian)
            .collect();
        crate::procs::why_alive(&left)
            .unwrap_or_else(|| "processes of the command do not die".into())
    }
}

/// Runs the event loop until the command and every process below it are gone: forwards
/// signals, enforces the lease deadline, escalates to SIGKILL, and stops what the command leaves
/// running when it exits (SIGTERM, SIGKILL after `kill_grace`), so that nothing of it outlives
/// the lock.
pub fn supervise(
    child: &Child,
    events: &Receiver<Event>,
    keeper: &mut Keeper,
    mut lease: LeaseClock,
    kill_grace: Duration,
) -> Outcome {
    let mut stopping: Option<Stopping<Outcome>> = None;
    let mut status: Option<ExitStatus> = None;
    let mut last_renew_error: Option<String> = None;
    let mut tree = CommandTree(child);
    loop {
        // When the guardian kills by itself (`LeaseClock::guard_deadline`); sent when it moved.
        child
            .guardian
            .set_deadline(lease.guard_deadline(stopping.is_some()));
        let now = BootInstant::now();
        let mut wake = Duration::from_secs(1);
        // The keeper starts when the first renewal is due, also while stopping: the lock is held
        // until the command is gone.
        if let Some(started) = keeper.start_if_due(now, &mut wake) {
            if let Err(e) = started {
                // Nobody can renew: the lease runs out at its deadline (enforced below, also
                // while stopping); stop the command now with the reason.
                let why = format!("cannot start the keeper thread: {e}");
                match &mut stopping {
                    None => stopping = Some(lose(&mut tree, why, now + kill_grace)),
                    Some(_) => crate::report::warn(format_args!("{why}")),
                }
            }
            continue;
        }
        match &mut stopping {
            None => {
                if let Some((reason, deadline)) =
                    lease.overdue(now, &mut last_renew_error, &mut wake)
                {
                    stopping = Some(lose(&mut tree, reason, deadline));
                    continue;
                }
            }
            // The rule is the stopper's: SIGKILL at the grace's end or the lease deadline,
            // again every round; the lock is never let go over a process that cannot be
            // killed (it stays held, renewed; the guardian keeps the descriptors), which is
            // said once. The loop ends when the last child is reaped (`Event::AllReaped`).
            Some(s) => {
                if let Step::Unkillable(message) =
                    s.step(&mut tree, now, lease.kill_by(), &mut wake)
                {
                    crate::report::warn(format_args!("{message}"));
                }
            }
        }
        let event = match events.try_recv() {
            Ok(e) => e,
            Err(TryRecvError::Empty) => match signals::wait(wake) {
                Woken::Signal(r) => Event::Signal(r),
                Woken::Child => {
                    child.poll();
                    continue;
                }
                Woken::Wake => continue,
            },
            Err(TryRecvError::Disconnected) => {
                return Outcome::Lost("internal: event channel closed".into());
            }
        };
        // A lock already free on the server may be another's now: no grace.
        let loss_grace = if matches!(event, Event::Freed(_)) {
            Duration::ZERO
        } else {
            kill_grace
        };
        match event {
            Event::Signal(r) => {
                if !r.from_terminal {
                    match status {
                        None => child.signal(r.signal),
                        // The command is gone: what it left gets the signal.
                        Some(_) => {
                            signal_descendants(&[r.signal], Some(child.guardian.pid()));
                        }
                    }
                }
                match &mut stopping {
                    // Passed on to the command above: that is its first signal.
                    None => {
                        stopping = Some(Stopping::signalled(
                            Outcome::Signalled(r.signal),
                            BootInstant::now() + kill_grace,
                            false,
                        ));
                    }
                    // Stopping what the command left: a signal to dlock now decides the code.
                    Some(s) if matches!(s.why, Outcome::Exited(_)) => {
                        s.why = Outcome::Signalled(r.signal);
                    }
                    Some(_) => {}
                }
            }
            Event::Renewed(deadline) => {
                lease.deadline = Some(deadline);
                last_renew_error = None;
            }
            Event::RenewFailed(e) => last_renew_error = Some(e),
            Event::Lost(reason) | Event::Freed(reason) => match &mut stopping {
                None => {
                    let kill_at = BootInstant::now() + loss_grace;
                    stopping = Some(lose(&mut tree, reason, kill_at));
                }
                // Already stopping: the lock is gone, so the grace ends sooner; if what was
                // being stopped is the command's leftovers, they ran without the lock: lost.
                Some(s) => {
                    s.lost(BootInstant::now() + loss_grace);
                    if matches!(s.why, Outcome::Exited(_)) {
                        s.why = Outcome::Lost(reason);
                    }
                }
            },
            Event::ChildExited(st) => {
                if status.is_none() {
                    status = Some(st);
                    if stopping
                        .as_ref()
                        .is_some_and(|s| !matches!(s.why, Outcome::Exited(_)))
                    {
                        // What the child left behind gets the same treatment it got.
                        terminate_descendants(child);
                    }
                }
            }
            Event::Leftovers => {
                if let (None, Some(st)) = (&stopping, status) {
                    let n = terminate_descendants(child);
                    if n > 0 {
                        crate::report::notice(format_args!(
                            "the command exited but left {n} process{} running; stopping {} before the lock is released",
                            if n == 1 { "" } else { "es" },
                            if n == 1 { "it" } else { "them" },
                        ));
                    }
                    stopping = Some(Stopping::signalled(
                        Outcome::Exited(st),
                        BootInstant::now() + kill_grace,
                        false,
                    ));
                }
            }
            Event::GuardianExited(st) => match (&stopping, status) {
                // Killed by someone: its command died with it (PDEATHSIG); what is left came to
                // dlock. Kill it all now, then release.
                (None, None) => {
                    stopping = Some(Stopping::signalled(
                        child.guardian_died(st),
                        BootInstant::now(),
                        false,
                    ));
                }
                // Killed after the command exited, before it said what the command left
                // running: that came to dlock, and is stopped like any leftovers. (A guardian
                // that exits by itself does so once nothing is left below it: nothing to do,
                // and no /proc scan on the way out of every run.)
                (None, Some(cmd)) if st.signal().is_some() => {
                    terminate_descendants(child);
                    stopping = Some(Stopping::signalled(
                        Outcome::Exited(cmd),
                        BootInstant::now() + kill_grace,
                        false,
                    ));
                }
                _ => {}
            },
            Event::Holder(_) => {}
            Event::AllReaped => match (&stopping, status) {
                (Some(s), _) => return s.why.clone(),
                (None, Some(st)) => return Outcome::Exited(st),
                // Unreachable in practice (the guardian's exit comes first); never release
                // with nothing known: treat as a guardian gone.
                (None, None) => return child.guardian_died(ExitStatus::from_raw(libc::SIGKILL)),
            },
        }
    }
}

/// Starts stopping the whole job because the lease is lost (or cannot be kept) for `why`:
/// SIGTERM to every descendant now, SIGKILL at `kill_at`.
fn lose(tree: &mut CommandTree<'_>, why: String, kill_at: BootInstant) -> Stopping<Outcome> {
    Stopping::begin(tree, Outcome::Lost(why), kill_at, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--ttl 3s` (a loss grace of 1 s): stopping is due 1 s before the deadline, the guardian
    /// fires 750 ms before it, and a stop's SIGKILL comes 250 ms before it.
    #[test]
    fn the_guardian_fires_after_the_stop_was_due_and_before_the_kill() {
        let deadline = BootInstant::now() + Duration::from_secs(10);
        let lease = LeaseClock {
            deadline: Some(deadline),
            loss_grace: Duration::from_secs(1),
        };
        let ms =
            |at: Option<BootInstant>| deadline.saturating_duration_since(at.unwrap()).as_millis();
        assert_eq!(ms(lease.guard_deadline(false)), 750);
        assert_eq!(ms(lease.guard_deadline(true)), 250);
        assert_eq!(ms(lease.kill_by()), 250);
        let (mut last, mut wake) = (None, Duration::from_secs(60));
        assert!(
            lease
                .overdue(deadline - Duration::from_millis(1001), &mut last, &mut wake)
                .is_none()
        );
        assert_eq!(wake, Duration::from_millis(1));
        let (_, kill_at) = lease
            .overdue(deadline - Duration::from_secs(1), &mut last, &mut wake)
            .unwrap();
        assert_eq!(ms(Some(kill_at)), 250);
    }

    /// No TTL (the file backend): nothing fires by itself; `--kill-grace 0`: all at the deadline.
    #[test]
    fn without_a_ttl_or_a_grace() {
        let none = LeaseClock {
            deadline: None,
            loss_grace: Duration::from_secs(5),
        };
        assert_eq!(none.guard_deadline(false), None);
        assert_eq!(none.kill_by(), None);
        let deadline = BootInstant::now() + Duration::from_secs(10);
        let zero = LeaseClock {
            deadline: Some(deadline),
            loss_grace: Duration::ZERO,
        };
        assert_eq!(zero.guard_deadline(false), Some(deadline));
        assert_eq!(zero.kill_by(), Some(deadline));
    }
}
