//! Stopping a tree of processes before the lock it ran under goes — one rule for `dlock run`
//! (the command and everything below dlock, behind the guardian: `crate::supervise`) and for
//! `dlock acquire`'s holder (the pinned owner, its process group and what it started:
//! `crate::hold`). What the tree is, and how a signal reaches each of its processes, is the
//! caller's ([`Tree`]); when to send what, and what a process that does not die means for the
//! lock, is this module's ([`Stopping`]).
//!
//! 1. **SIGTERM**, with SIGCONT (a stopped process handles its SIGTERM only once continued), to
//!    every process of the tree at once — unless the caller already passed a signal on (a
//!    signal to dlock is forwarded to the command instead).
//! 2. **The grace**: SIGKILL at its end or by the lease's deadline (the caller's
//!    [`crate::supervise::LeaseClock::kill_by`], with room for a late wake-up), whichever first,
//!    however the stop began (the tree must be gone before the lease could run out; renewals
//!    go on during the grace and move the deadline). A loss never lengthens the grace, and one
//!    found when the lease is already over ends it at once ([`Stopping::lost`]).
//! 3. **SIGKILL**, again every [`KILL_ROUND`] until the tree is gone: a process forked during
//!    one scan is caught by the next.
//! 4. **Cannot be killed**: a process still there a second after the first SIGKILL outlives it —
//!    another user's (the command ran `sudo`: EPERM), or one in uninterruptible sleep. It is
//!    said once, naming the process and why, and killed again every second until it is gone.
//!
//! **The lock over a process that cannot be killed (the decision).** While any process of the
//! tree may still run, the lock is never released by dlock nor reported free: the stop is over
//! only when the tree is (the run's last child reaped; the holder's pinned processes and its
//! owner's group gone), and until then the lease is renewed and the descriptors and sessions
//! that hold the lock stay open. Only a lock that is already lost (its lease ran out, it was
//! broken) is beyond keeping: then the message says that another holder may start beside the
//! process, and the killing goes on all the same.

use std::time::Duration;

use crate::clock::BootInstant;

/// How often SIGKILL goes again while the tree is not gone.
pub(crate) const KILL_ROUND: Duration = Duration::from_millis(50);

/// How long after the first SIGKILL a process still there is taken for one that cannot be
/// killed (then SIGKILL goes once a second).
pub(crate) const UNKILLABLE_AFTER: Duration = Duration::from_secs(1);

/// A set of processes to stop, and how signals reach them: each process pinned (a pidfd, or its
/// start time checked), so that a signal reaches the process that was scanned or none.
pub(crate) trait Tree {
    /// SIGTERM and SIGCONT to every process of the tree.
    fn terminate(&mut self);
    /// SIGKILL to every process of the tree, after a rescan (what was forked meanwhile);
    /// `rounds_for` is how long the kill rounds have gone on.
    fn kill(&mut self, rounds_for: Duration);
    /// Whether no process of it is left; `false` where the caller learns that otherwise (the
    /// run: its last child reaped).
    fn is_over(&mut self) -> bool;
    /// Why what is left outlives SIGKILL, for the one message (`procs::why_alive`).
    fn why_alive(&self) -> String;
}

/// A stop under way, for `why` (the run's outcome, the holder's reply).
pub(crate) struct Stopping<W> {
    /// Why the tree is being stopped.
    pub(crate) why: W,
    /// SIGKILL then at the latest (the lease's deadline may come first).
    kill_at: BootInstant,
    killed: bool,
    /// The lock is lost: nothing left to keep over a process that cannot be killed.
    lost: bool,
    /// "Cannot be killed" was said.
    unkillable: bool,
}

/// What a [`Stopping::step`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The tree still runs (or only the caller can tell): go on.
    Running,
    /// Nothing of the tree is left: the lock may go.
    Over,
    /// Something outlived SIGKILL, said this once: why, and what that means for the lock.
    Unkillable(String),
}

impl<W> Stopping<W> {
    /// Begins a stop: SIGTERM and SIGCONT to `tree` now, SIGKILL at `kill_at`; or, when
    /// `kill_at` has come already (a lock already free on the server: `backend::Loss::Freed`),
    /// SIGKILL now and no SIGTERM — a TERM trap, or SIGCONT to a stopped process, would run
    /// code while the lock may be another's. `lost`: the lock is lost already.
    pub(crate) fn begin(tree: &mut dyn Tree, why: W, kill_at: BootInstant, lost: bool) -> Self {
        let mut s = Self::signalled(why, kill_at, lost);
        if BootInstant::now() >= kill_at {
            tree.kill(Duration::ZERO);
            s.killed = true;
        } else {
            tree.terminate();
        }
        s
    }

    /// Begins a stop whose first signal the caller sent (forwarded a signal to the command,
    /// or has none to send): SIGKILL at `kill_at`.
    pub(crate) fn signalled(why: W, kill_at: BootInstant, lost: bool) -> Self {
        Stopping {
            why,
            kill_at,
            killed: false,
            lost,
            unkillable: false,
        }
    }

    /// The lock is lost (now, or at `kill_by`): SIGKILL at `kill_by` at the latest.
    pub(crate) fn lost(&mut self, kill_by: BootInstant) {
        self.lost = true;
        self.kill_at = self.kill_at.min(kill_by);
    }

    /// Whether the lock is lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost
    }

    /// One step at `now`, the latest SIGKILL the lease allows being `deadline`: SIGKILL when due, and again
    /// every round; whether the tree is gone; "cannot be killed", once. Cuts `wake` to when the
    /// next step is due.
    pub(crate) fn step(
        &mut self,
        tree: &mut dyn Tree,
        now: BootInstant,
        deadline: Option<BootInstant>,
        wake: &mut Duration,
    ) -> Step {
        let kill_at = deadline.map_or(self.kill_at, |d| d.min(self.kill_at));
        if now >= kill_at {
            tree.kill(now.saturating_duration_since(kill_at));
            self.killed = true;
            *wake = (*wake).min(KILL_ROUND);
        } else {
            *wake = (*wake).min(kill_at.saturating_duration_since(now));
        }
        if tree.is_over() {
            return Step::Over;
        }
        if !(self.killed && now >= kill_at + UNKILLABLE_AFTER) {
            return Step::Running;
        }
        *wake = Duration::from_secs(1);
        if std::mem::replace(&mut self.unkillable, true) {
            return Step::Running;
        }
        let then = if self.lost {
            "it goes on being killed, but the lock is lost: another holder may start beside it"
        } else {
            "the lock is kept until it is gone"
        };
        Step::Unkillable(format!("{}: {then}", tree.why_alive()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree that dies after `dies_after` SIGKILLs (never: `usize::MAX`).
    #[derive(Default)]
    struct Fake {
        terms: usize,
        kills: usize,
        dies_after: usize,
    }

    impl Tree for Fake {
        fn terminate(&mut self) {
            self.terms += 1;
        }
        fn kill(&mut self, _: Duration) {
            self.kills += 1;
        }
        fn is_over(&mut self) -> bool {
            self.kills >= self.dies_after
        }
        fn why_alive(&self) -> String {
            "pid 7 is in uninterruptible sleep".into()
        }
    }

    #[test]
    fn sigkill_comes_at_the_graces_end_or_the_deadline_whichever_is_first() {
        let t0 = BootInstant::now();
        let mut tree = Fake {
            dies_after: 1,
            ..Fake::default()
        };
        let mut s = Stopping::begin(&mut tree, (), t0 + Duration::from_secs(10), false);
        assert_eq!(tree.terms, 1);
        let mut wake = Duration::from_secs(1);
        let deadline = Some(t0 + Duration::from_secs(2));
        assert_eq!(s.step(&mut tree, t0, deadline, &mut wake), Step::Running);
        assert_eq!(tree.kills, 0);
        let at = t0 + Duration::from_secs(2);
        assert_eq!(s.step(&mut tree, at, deadline, &mut wake), Step::Over);
        assert_eq!(tree.kills, 1);
    }

    #[test]
    fn a_loss_cuts_the_grace_and_what_cannot_be_killed_is_said_once() {
        let t0 = BootInstant::now();
        let mut tree = Fake {
            dies_after: usize::MAX,
            ..Fake::default()
        };
        let mut s = Stopping::signalled((), t0 + Duration::from_secs(60), false);
        assert_eq!(tree.terms, 0);
        s.lost(t0);
        assert!(s.is_lost());
        let mut wake = Duration::from_secs(1);
        assert_eq!(s.step(&mut tree, t0, None, &mut wake), Step::Running);
        assert_eq!((tree.kills, wake), (1, KILL_ROUND));
        let later = t0 + UNKILLABLE_AFTER;
        match s.step(&mut tree, later, None, &mut wake) {
            Step::Unkillable(m) => assert!(m.contains("the lock is lost"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.step(&mut tree, later, None, &mut wake), Step::Running);
        assert_eq!(tree.kills, 3);
    }

    #[test]
    fn a_lock_not_lost_is_kept_over_what_cannot_be_killed() {
        let t0 = BootInstant::now();
        let mut tree = Fake {
            dies_after: usize::MAX,
            ..Fake::default()
        };
        let mut s = Stopping::begin(&mut tree, (), t0, false);
        let mut wake = Duration::from_secs(1);
        let _ = s.step(&mut tree, t0, None, &mut wake);
        match s.step(&mut tree, t0 + UNKILLABLE_AFTER, None, &mut wake) {
            Step::Unkillable(m) => assert_eq!(
                m,
                "pid 7 is in uninterruptible sleep: the lock is kept until it is gone"
            ),
            other => panic!("{other:?}"),
        }
    }
}
