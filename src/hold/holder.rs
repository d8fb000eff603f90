//! The holder process that `dlock acquire` leaves behind: takes the lock, tells its caller,
//! then keeps the lease (the same keeper as `dlock run`) until `dlock release` asks for it back
//! or the owner exits. When the lease is lost — or must be given up (`--max-hold`, a signal to
//! the holder) — the owner's process group is stopped first: SIGTERM now, SIGKILL at the end of
//! the grace or a quarter of the grace before the lease deadline, whichever is first (see
//! [`crate::supervise::LeaseClock::kill_by`]), so it is gone before anyone else can
//! hold the lock. Why it ended is kept for `release` (the end file, see [`super::handle`]).
//!
//! Everything here runs on the main thread but the watcher (`watcher.rs`), which only turns the
//! socket, the owner's pidfd and the caller's acknowledgement into events; the watchdog
//! (`watchdog.rs`) is a process of its own.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

use super::format::Granted;
use super::handle::{self, Reply};
use super::owner::{Owner, OwnerTree};
use super::watchdog::{Check, Watchdog};
use super::watcher::{OwnerWatch, Watched, watch};
use crate::clock::BootInstant;
use crate::config::AcquireConfig;
use crate::events::{Event, Events, HolderEvent};
use crate::exit;
use crate::history;
use crate::keeper::Keeper;
use crate::model::{Mode, OwnerRecord, Record};
use crate::report;
use crate::signals::{self, Woken};
use crate::stopper::{Step, Stopping, Tree};
use crate::supervise::LeaseClock;
use crate::sys;

/// The longest owner command line stored beside the lock.
const MAX_OWNER_COMMAND: usize = 1000;

/// The holder's life, from just after the fork; returns its exit code (nobody waits for it once
/// the caller has the handle).
pub(super) fn hold(
    cfg: &AcquireConfig,
    owner: Option<Owner>,
    to_caller: UnixStream,
    caller: libc::pid_t,
) -> u8 {
    // Out of the caller's session (the terminal's Ctrl-C reaches the caller, which passes it on)
    // and off its stdout; stderr stays the caller's until it has the handle.
    let _ = sys::setsid();
    let _ = sys::set_parent_death_signal(libc::SIGTERM);
    if sys::parent_pid() != caller {
        return exit::UNAVAILABLE; // the caller died before the death signal was armed
    }
    let _ = sys::to_dev_null(0);
    let _ = sys::to_dev_null(1);
    // Nothing the caller left open for dlock but stderr (until it has the handle).
    let _ = sys::close_inherited();
    if let Err(e) = signals::block() {
        report::error(format_args!("cannot block signals: {e}"));
        return exit::UNAVAILABLE;
    }
    let lock = &cfg.lock;
    let name = lock.target.kind.name();
    let interrupt = signals::Interrupt::new();
    let record = Record {
        mode: (lock.mode != Mode::Exclusive).then_some(lock.mode),
        reason: lock.reason.clone(),
        command: None,
        owner: Some(OwnerRecord {
            pid: owner.as_ref().map(Owner::pid),
            command: owner
                .as_ref()
                .and_then(|o| o.command_line(MAX_OWNER_COMMAND)),
            max_hold_ms: cfg.max_hold.map(|d| d.as_millis() as u64),
        }),
        ..Record::this_process(&[])
    };
    let (backend, held) = match crate::session::take_locks(lock, &record, &interrupt) {
        Ok(taken) => taken,
        Err(code) => return code,
    };
    // Out of the caller's directory (an unmount there must not wait for `release`), now that
    // the lock is held: what the backend read relative to it (a CA file, a password file) was
    // read while connecting, and paths it reads again are absolute (`crate::config`).
    let _ = std::env::set_current_dir("/");
    let tokens = held.tokens_of(&lock.keys);
    let claims = serde_json::to_string(&held.claims).unwrap_or_default();
    let lease = crate::lockset::LeaseSet::join(held.parts);
    let keys_text = lock.keys_text();
    if let Some(r) = signals::pending() {
        interrupt.fire(r.signal);
    }
    if let Some(sig) = interrupt.fired() {
        give_back(name, &keys_text, Keeper::new(lease, events_nowhere()));
        return exit::signal_code(sig);
    }
    let (socket, listener) = match handle::listen() {
        Ok(l) => l,
        Err(e) => {
            report::error(format_args!("{name}: {e:#}"));
            give_back(name, &keys_text, Keeper::new(lease, events_nowhere()));
            return exit::UNAVAILABLE;
        }
    };
    let me = std::process::id();
    let mut vars: Vec<(String, String)> = vec![
        ("DLOCK_HANDLE".into(), socket.display().to_string()),
        ("DLOCK_HOLDER_PID".into(), me.to_string()),
    ];
    vars.extend(
        crate::session::command_env(lock, &tokens, claims)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v)),
    );
    let granted = Granted {
        handle: socket.display().to_string(),
        holder_pid: me,
        backend: name.to_string(),
        keys: lock.keys.iter().map(|k| k.to_string()).collect(),
        tokens,
        vars,
    };
    let mut clock = Clock {
        lease: LeaseClock::of(lease.as_ref(), lock.kill_grace),
        give_up_at: cfg.max_hold.map(|d| BootInstant::now() + d),
    };
    // The history's start goes in before the caller gets the handle: a skip (`--once-per`)
    // must reach it as acquire's failure. The run's command is the owner's.
    let mut lease = lease;
    let run_record = Record {
        command: record.owner.as_ref().and_then(|o| o.command.clone()),
        ..record.clone()
    };
    let run_log =
        match crate::session::begin_history(lock, lease.as_mut(), &run_record, granted.tokens[0]) {
            Ok(log) => log,
            Err(code) => {
                give_back(name, &keys_text, Keeper::new(lease, events_nowhere()));
                let _ = std::fs::remove_file(&socket);
                return code;
            }
        };
    // A start that took the lease's time is renewed for before the caller hears of the lock.
    let late = clock.lease.renew_if_late(lease.as_mut()).err();
    let (tx, rx) = mpsc::channel();
    let events = Events(tx);
    let keeper = Keeper::new(lease, events.clone());
    let closing = Closing {
        backend: backend.as_ref(),
        run_log: run_log.as_ref(),
        target: &lock.target,
    };
    if let Some(why) = late {
        report::error(format_args!(
            "{name}: lost the lock '{keys_text}' before it was handed over: the run's start took \
             the lease's time, and renewing it failed ({why})"
        ));
        closing.give_back(name, &keys_text, keeper, not_started("the lease ran out"));
        let _ = std::fs::remove_file(&socket);
        return exit::LOST;
    }
    if let Some(o) = owner.as_ref().filter(|o| o.has_exited()) {
        report::error(format_args!(
            "{name}: the owner (pid {}) exited while dlock acquire waited; the lock is given back",
            o.pid()
        ));
        closing.give_back(
            name,
            &keys_text,
            keeper,
            not_started("the owner exited first"),
        );
        let _ = std::fs::remove_file(&socket);
        return exit::UNAVAILABLE;
    }
    // The watchdog, before anyone hears of the lock: from here a kill -9 of the holder stops
    // the owner before the lock can go (see `watchdog.rs`).
    let mut watchdog = match owner
        .as_ref()
        .map(|o| {
            let close = [to_caller.as_raw_fd(), listener.as_raw_fd(), -1, -1];
            Watchdog::start(o, close, clock.lease.guard_deadline(false))
        })
        .transpose()
    {
        Ok(w) => w,
        Err(e) => {
            report::error(format_args!(
                "{name}: cannot start the holder's watchdog: {e}"
            ));
            closing.give_back(name, &keys_text, keeper, not_started("no watchdog"));
            let _ = std::fs::remove_file(&socket);
            return exit::UNAVAILABLE;
        }
    };
    // From here the caller's exit (once it printed the handle) must not end the holder. A
    // caller that died before it printed is seen as a failed write; one that dies after this
    // write may have printed already, so the lock stays held (for the owner, or --max-hold).
    let _ = sys::set_parent_death_signal(0);
    let line = serde_json::to_string(&granted).unwrap_or_default() + "\n";
    if sys::parent_pid() != caller || (&to_caller).write_all_ok(line.as_bytes()).is_err() {
        watchdog.as_mut().map(Watchdog::reap);
        closing.give_back(
            name,
            &keys_text,
            keeper,
            not_started("dlock acquire exited first"),
        );
        let _ = std::fs::remove_file(&socket);
        return exit::UNAVAILABLE;
    }
    let watched = Watched {
        caller: Some(to_caller),
        listener,
        socket: socket.clone(),
        asked: false,
        owner: owner.as_ref().and_then(|o| match o.fd() {
            Some(fd) => fd.as_fd().try_clone_to_owned().ok().map(OwnerWatch::Fd),
            None => Some(OwnerWatch::Scan(o.proc())),
        }),
    };
    if let Err(e) = watch(watched, events) {
        report::error(format_args!(
            "{name}: cannot start the holder's watcher thread: {e}"
        ));
        watchdog.as_mut().map(Watchdog::reap);
        closing.give_back(name, &keys_text, keeper, not_started("no watcher thread"));
        let _ = std::fs::remove_file(&socket);
        return exit::UNAVAILABLE;
    }
    let mut holding = Holding {
        name,
        keys_text,
        socket,
        owner,
        kill_grace: lock.kill_grace,
        max_hold: cfg.max_hold,
        stop: None,
        answered: false,
        closing,
        watchdog,
    };
    holding.run(keeper, clock, &rx)
}

/// What records the end of an acquire-held run.
struct Closing<'a> {
    backend: &'a dyn crate::backend::Backend,
    run_log: Option<&'a crate::session::RunLog>,
    target: &'a crate::config::Target,
}

impl Closing<'_> {
    fn app(&self) -> crate::session::Recorder<'_> {
        crate::session::Recorder {
            backend: self.backend,
            run_log: self.run_log,
        }
    }

    /// Gives the lock back, recording `ending`.
    fn give_back(&self, name: &str, keys: &str, keeper: Keeper, ending: history::Ending) {
        if let Err(e) = self.app().release(keeper, ending) {
            report::warn(format_args!(
                "{name}: release of '{keys}' failed (it expires by itself): {e:#}"
            ));
        }
    }
}

/// The ending of a hold that never reached its caller.
fn not_started(why: &str) -> history::Ending {
    history::Ending {
        code: Some(exit::UNAVAILABLE.into()),
        note: Some(why.into()),
        ..history::Ending::default()
    }
}

/// Now, as a date for messages.
fn now_text() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| report::since_text(d.as_millis() as u64))
        .unwrap_or_default()
}

/// A sink for a keeper that only gives back.
fn events_nowhere() -> Events {
    Events(mpsc::channel().0)
}

fn give_back(name: &str, keys: &str, keeper: Keeper) {
    if let Err(e) = keeper.release() {
        report::warn(format_args!(
            "{name}: release of '{keys}' failed (it expires by itself): {e:#}"
        ));
    }
}

/// `write_all` that says only whether it worked (the caller may be gone: EPIPE).
trait WriteAllOk {
    fn write_all_ok(self, buf: &[u8]) -> std::io::Result<()>;
}

impl WriteAllOk for &UnixStream {
    fn write_all_ok(mut self, buf: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.write_all(buf)
    }
}

/// What the holder knows of its lease, and when it must give it up.
struct Clock {
    /// The lease's deadline and how long before it the owner is stopped when renewals fail.
    lease: LeaseClock,
    /// `--max-hold`'s end.
    give_up_at: Option<BootInstant>,
}

/// Stopping the owner (and what it started) before the lock goes ([`crate::stopper`]: when to
/// send what, and the lock kept over a process that cannot be killed).
struct Stop {
    /// What `release` will report.
    reply: Reply,
    /// The grace, SIGKILL, "cannot be killed"; lost: the lease is gone (abandon it), else it
    /// is still ours (give it back after the owner).
    stopping: Stopping<()>,
    /// What is being stopped; `None` for no owner.
    tree: Option<OwnerTree>,
    /// How the run ended, for the history.
    ending: history::Ending,
}

struct Holding<'a> {
    name: &'static str,
    keys_text: String,
    socket: PathBuf,
    owner: Option<Owner>,
    kill_grace: Duration,
    max_hold: Option<Duration>,
    stop: Option<Stop>,
    /// A `release` already got the stop's reply: no end file.
    answered: bool,
    closing: Closing<'a>,
    /// Kills the owner's processes if the holder dies ([`Watchdog`]); `None` without an owner.
    watchdog: Option<Watchdog>,
}

impl Holding<'_> {
    fn run(&mut self, mut keeper: Keeper, mut clock: Clock, rx: &Receiver<Event>) -> u8 {
        let mut last_renew_error: Option<String> = None;
        loop {
            // While nothing is stopped, the watchdog kills before the lease's deadline with
            // room for its own late wake-up; while stopping, at the stop's latest SIGKILL.
            let guard = clock.lease.guard_deadline(self.stop.is_some());
            self.check_watchdog(guard);
            if let Some(w) = &self.watchdog {
                w.set_deadline(guard);
            }
            let now = BootInstant::now();
            let mut wake = Duration::from_secs(1);
            if let Some(started) = keeper.start_if_due(now, &mut wake) {
                if let Err(e) = started {
                    let why = format!("cannot start the keeper thread: {e}");
                    self.begin_stop(why, false, now + self.kill_grace);
                }
                continue;
            }
            match &mut self.stop {
                None => {
                    if let Some((why, deadline)) =
                        clock.lease.overdue(now, &mut last_renew_error, &mut wake)
                    {
                        self.begin_stop(why, true, deadline);
                        continue;
                    }
                    if let Some(at) = clock.give_up_at {
                        if now >= at {
                            let held = self.max_hold.map(report::short_duration);
                            let why =
                                format!("given up after --max-hold {}", held.unwrap_or_default());
                            self.begin_stop(why, false, now + self.kill_grace);
                            continue;
                        }
                        wake = wake.min(at.saturating_duration_since(now));
                    }
                }
                // The stopper's rule: SIGKILL at the grace's end or by the lease's deadline, again
                // every round; never let the lock go over what is left (the holder's descriptors
                // and sessions hold it, and a lease is renewed while it is ours), said once.
                Some(s) => {
                    let step = match &mut s.tree {
                        Some(tree) => s.stopping.step(tree, now, clock.lease.kill_by(), &mut wake),
                        None => Step::Over,
                    };
                    match step {
                        Step::Over => return self.finish(keeper),
                        Step::Unkillable(message) => {
                            s.reply.message.push_str(&format!("; {message}"));
                            report::error(format_args!("{}", s.reply.message));
                        }
                        Step::Running => {}
                    }
                }
            }
            let event = match rx.try_recv() {
                Ok(e) => e,
                Err(TryRecvError::Empty) => match signals::wait(wake) {
                    Woken::Signal(r) => Event::Signal(r),
                    Woken::Child | Woken::Wake => continue,
                },
                Err(TryRecvError::Disconnected) => continue,
            };
            // A lock already free on the server may be another's now: no grace.
            let loss_grace = if matches!(event, Event::Freed(_)) {
                Duration::ZERO
            } else {
                self.kill_grace
            };
            match event {
                Event::Renewed(deadline) => {
                    clock.lease.deadline = Some(deadline);
                    last_renew_error = None;
                }
                Event::RenewFailed(e) => last_renew_error = Some(e),
                Event::Lost(reason) | Event::Freed(reason) => match &mut self.stop {
                    None => self.begin_stop(reason, true, BootInstant::now() + loss_grace),
                    Some(s) => s.stopping.lost(BootInstant::now() + loss_grace),
                },
                Event::Signal(r) => {
                    if self.stop.is_some() {
                        continue;
                    }
                    let signal = exit::signal_name(r.signal);
                    if self.owner.is_none() {
                        // Held for nobody: a signal to the holder is a request to end it, as a
                        // service manager stopping a unit or a runner ending a job sends.
                        let ending = history::Ending {
                            code: Some(0),
                            note: Some(format!(
                                "given back when its holder was stopped by {signal}"
                            )),
                            ..history::Ending::default()
                        };
                        self.dismiss_watchdog();
                        self.closing
                            .give_back(self.name, &self.keys_text, keeper, ending);
                        self.reap_watchdog();
                        let reply = Reply {
                            code: 0,
                            message: format!(
                                "{}: '{}' was given back at {} when its holder was stopped by {signal}",
                                self.name,
                                self.keys_text,
                                now_text()
                            ),
                        };
                        handle::write_end(&self.socket, &reply);
                        let _ = std::fs::remove_file(&self.socket);
                        return 0;
                    }
                    let why = format!("the holder process was stopped by {signal}");
                    self.begin_stop(why, false, BootInstant::now() + self.kill_grace);
                }
                // The caller has the handle (or died, perhaps after it printed it: keep holding,
                // for the owner or until --max-hold). Either way, let go of its stderr unless it
                // is a terminal (where a later loss is worth a line): a `$(… 2>&1)` must end.
                Event::Holder(HolderEvent::CallerAcked | HolderEvent::CallerGone) => {
                    use std::io::IsTerminal;
                    if !std::io::stderr().is_terminal() {
                        let _ = sys::to_dev_null(2);
                        report::set_verbosity(crate::model::Verbosity::Quiet);
                    }
                }
                Event::Holder(HolderEvent::OwnerExited) => {
                    if self.stop.is_none() {
                        self.owner_exited(now_text());
                    }
                }
                Event::Holder(HolderEvent::Request(stream, request)) => {
                    if request != handle::RELEASE {
                        continue;
                    }
                    match &self.stop {
                        None => {
                            let ending = history::Ending {
                                code: Some(0),
                                note: Some("released".into()),
                                ..history::Ending::default()
                            };
                            self.dismiss_watchdog();
                            let message = match self.closing.app().release(keeper, ending) {
                                Ok(()) => String::new(),
                                Err(e) => format!(
                                    "{}: release of '{}' failed (it expires by itself): {e:#}",
                                    self.name, self.keys_text
                                ),
                            };
                            self.reap_watchdog();
                            let _ = std::fs::remove_file(&self.socket);
                            handle::answer(&stream, &Reply { code: 0, message });
                            return 0;
                        }
                        Some(s) => {
                            handle::answer(&stream, &s.reply);
                            self.answered = true;
                        }
                    }
                }
                Event::ChildExited(_)
                | Event::Leftovers
                | Event::GuardianExited(_)
                | Event::AllReaped => {}
            }
        }
    }

    /// Looks whether the watchdog still runs: one that died is replaced (the lock is not lost,
    /// and the owner is protected again at once); one that ended because its deadline passed
    /// (the holder frozen past it) killed the owner: the lease is given up as lost.
    fn check_watchdog(&mut self, deadline: Option<BootInstant>) {
        let Some(w) = &mut self.watchdog else { return };
        match w.check(deadline) {
            Check::Fine => {}
            Check::Replaced(old, status, new) => report::warn(format_args!(
                "{}: the holder's watchdog (pid {old}) died ({}); a new one (pid {new}) watches the owner",
                self.name,
                exit::describe_status(status)
            )),
            Check::DeadlinePassed => {
                let why = "the holder neither renewed the lease nor stopped the owner in time \
                           (stopped or starved?); its watchdog killed the owner and its process \
                           group before the lease could run out"
                    .to_string();
                self.lost_now(why);
            }
            Check::Gone(e) => {
                self.watchdog = None;
                if self.stop.is_none() {
                    let why = format!(
                        "the holder's watchdog died and no new one could be started ({e}); \
                         the lock is given back rather than held unguarded"
                    );
                    self.begin_stop(why, false, BootInstant::now() + self.kill_grace);
                }
            }
        }
    }

    /// The lease is lost now: stop the owner (what is left of it) at once.
    fn lost_now(&mut self, why: String) {
        let now = BootInstant::now();
        match &mut self.stop {
            None => self.begin_stop(why, true, now),
            Some(s) => s.stopping.lost(now),
        }
    }

    /// Dismisses the watchdog (a clean end) before the lock is given back.
    fn dismiss_watchdog(&mut self) {
        if let Some(w) = &mut self.watchdog {
            w.dismiss();
        }
    }

    /// Waits until the dismissed watchdog is gone, once the lock is given back: `release`
    /// hears of the end only after its copies of the lock's descriptors are closed.
    fn reap_watchdog(&mut self) {
        if let Some(w) = &mut self.watchdog {
            w.reap();
        }
        self.watchdog = None;
    }

    /// Starts stopping the owner and what it started (SIGTERM now, SIGKILL at `kill_at`)
    /// because of `why`; `lost` when the lease is gone already.
    fn begin_stop(&mut self, why: String, lost: bool, kill_at: BootInstant) {
        let verb = if lost { "lost" } else { "gave up" };
        let mut message = format!(
            "{}: {verb} the lock '{}' at {}: {why}",
            self.name,
            self.keys_text,
            now_text()
        );
        let mut tree = self.owner.as_ref().map(OwnerTree::of);
        let stopping = match &mut tree {
            Some(t) => Stopping::begin(t, (), kill_at, lost),
            None => Stopping::signalled((), kill_at, lost),
        };
        if let (Some(o), Some(t)) = (&self.owner, &tree)
            && t.found_any()
        {
            message.push_str(&format!(
                "; its owner (pid {}) and what it started were sent SIGTERM",
                o.pid()
            ));
        }
        report::error(format_args!("{message}"));
        let ending = history::Ending {
            code: Some(exit::LOST.into()),
            lost: lost.then(|| why.clone()),
            note: (!lost).then_some(why),
            ..history::Ending::default()
        };
        self.stop = Some(Stop {
            reply: Reply {
                code: exit::LOST,
                message,
            },
            stopping,
            tree,
            ending,
        });
    }

    /// The owner exited: what is left of its process group is stopped (it ran under the lock),
    /// then the lock is given back; `release` will say so.
    fn owner_exited(&mut self, when: String) {
        let pid = self.owner.as_ref().map_or(0, Owner::pid);
        let mut message = format!(
            "{}: '{}' was given back at {when} when its owner (pid {pid}) exited",
            self.name, self.keys_text
        );
        let mut tree = self.owner.as_ref().map(OwnerTree::of);
        let kill_at = BootInstant::now() + self.kill_grace;
        let stopping = match &mut tree {
            Some(t) => Stopping::begin(t, (), kill_at, false),
            None => Stopping::signalled((), kill_at, false),
        };
        if tree.as_mut().is_some_and(|t| !t.is_over()) {
            message
                .push_str("; the processes left in its process group were stopped first (SIGTERM)");
        }
        report::verbose(format_args!("{message}"));
        self.stop = Some(Stop {
            reply: Reply {
                code: exit::LOST,
                message,
            },
            stopping,
            tree,
            ending: history::Ending {
                code: Some(exit::LOST.into()),
                note: Some(format!("given back when its owner (pid {pid}) exited")),
                ..history::Ending::default()
            },
        });
    }

    /// The owner and what it started are gone: give the lock back (or abandon a lost lease),
    /// leave the end file for `release`, and exit.
    fn finish(&mut self, keeper: Keeper) -> u8 {
        let Some(stop) = self.stop.take() else {
            return 0;
        };
        self.dismiss_watchdog();
        if stop.stopping.is_lost() {
            // Given back meanwhile: a broken lock passes on only once its holder lets go.
            let started = std::time::Instant::now();
            let released = keeper.release_in_background();
            self.closing
                .app()
                .record_lost(self.closing.target, stop.ending);
            let bound = crate::session::LOST_END_BOUND.saturating_sub(started.elapsed());
            let _ = released.recv_timeout(bound);
        } else {
            self.closing
                .give_back(self.name, &self.keys_text, keeper, stop.ending);
        }
        self.reap_watchdog();
        if !self.answered {
            handle::write_end(&self.socket, &stop.reply);
        }
        let _ = std::fs::remove_file(Path::new(&self.socket));
        exit::LOST
    }
}
