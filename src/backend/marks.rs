//! A safe break where the mark is a lock of break's own server session, one per holder session
//! (MySQL/MariaDB, PostgreSQL): which holders to mark, and what `break` then shows.

use std::time::Duration;

use super::{BREAK_LOOK_EVERY, BreakHow, Broken, Frees};
use crate::model::{Deadline, Key, Status};

/// How soon a holder sees its mark when its record does not say its `--ttl` (records of older
/// dlocks): the default TTL's renewal interval (30 s / 3).
pub(crate) const NOTICE: Duration = Duration::from_secs(10);

/// A backend whose safe break marks holders with locks of break's own server session: the
/// [`super::Backend`] methods `break_lock` and `await_broken` are these provided ones.
pub(super) trait SessionMarks {
    /// Break's session, kept in [`Broken::keep`] while the holders stop.
    type Kept: 'static;

    /// Marks every dlock holder of `key`, through [`mark_holders`].
    fn break_safe(&self, key: &Key) -> anyhow::Result<Broken>;

    /// Ends the holders' sessions, which frees their locks at once.
    fn break_forced(&self, key: &Key) -> anyhow::Result<Broken>;

    /// The status of `key`, read on break's kept session.
    fn status_on_kept(&self, kept: &Self::Kept, key: &Key) -> anyhow::Result<Status>;

    /// The status of `key`, read on a new session.
    fn status_fresh(&self, key: &Key) -> anyhow::Result<Status>;

    /// [`super::Backend::break_lock`].
    fn break_by_marks(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        match how {
            BreakHow::Safe => self.break_safe(key),
            BreakHow::Force => self.break_forced(key),
        }
    }

    /// [`super::Backend::await_broken`]: reads the status on break's own session (the marks'),
    /// else on a new one, until the broken holders are gone.
    fn await_marked(&self, key: &Key, broken: &Broken, deadline: Deadline) -> anyhow::Result<bool> {
        let kept = broken
            .keep
            .as_ref()
            .and_then(|k| k.downcast_ref::<Self::Kept>());
        await_gone(broken, deadline, || match kept {
            Some(k) => self.status_on_kept(k, key),
            None => self.status_fresh(key),
        })
    }
}

/// How many times break looks again for holders it has not marked yet (one that got the lock
/// while break marked the others, a semaphore slot filled again).
const ROUNDS: usize = 3;

/// Marks every dlock holder that `read` shows (a status, and the server session of each of its
/// holders, in order), with `mark` (taking the marks of those sessions). The status returned is
/// the first read, with each holder marked since shown `broken`, and any holder found by a later
/// read added: a holder that noticed its mark and let go between two reads is still shown as
/// the one broken. Some `keep` (break's session, which `keep_of` gives) when a holder is marked.
pub(crate) fn mark_holders<S: PartialEq + Copy>(
    mut read: impl FnMut() -> anyhow::Result<(Status, Vec<S>)>,
    mut mark: impl FnMut(&[S]) -> anyhow::Result<()>,
    keep_of: impl FnOnce() -> Box<dyn std::any::Any>,
) -> anyhow::Result<Broken> {
    let (mut status, mut seen) = read()?;
    let mut todo = unmarked(&status, &seen, |_| true);
    for round in 0..ROUNDS {
        if todo.is_empty() {
            break;
        }
        mark(&todo)?;
        for (h, s) in status.holders.iter_mut().zip(&seen) {
            h.broken |= todo.contains(s);
        }
        if round + 1 == ROUNDS {
            break;
        }
        let (now, sessions) = read()?;
        todo = unmarked(&now, &sessions, |s| !seen.contains(s));
        for (h, s) in now.holders.into_iter().zip(sessions) {
            if !seen.contains(&s) {
                status.holders.push(h);
                seen.push(s);
            }
        }
    }
    status.held = !status.holders.is_empty();
    if !status.holders.iter().any(|h| h.broken) {
        return Ok(Broken::now(status));
    }
    // A holder renews every third of its --ttl, which its record carries (dlock since the
    // hold-back's status); `notice` (the default TTL's) for older records.
    let renewal = status
        .holders
        .iter()
        .filter(|h| h.broken)
        .filter_map(|h| h.ttl_ms)
        .max()
        .map(|ms| Duration::from_millis(ms / 3));
    Ok(Broken {
        frees: Frees::WhenStopped(renewal.unwrap_or(NOTICE)),
        status,
        keep: Some(keep_of()),
    })
}

/// [`super::Backend::await_broken`] with `read` (a status read on break's own session, which
/// also keeps that session from looking idle to the server): every [`BREAK_LOOK_EVERY`] until
/// none of `broken`'s holders holds the lock, or until `deadline` (`Ok(false)`).
pub(crate) fn await_gone(
    broken: &Broken,
    deadline: Deadline,
    mut read: impl FnMut() -> anyhow::Result<Status>,
) -> anyhow::Result<bool> {
    loop {
        if !broken.still_held(&read()?) {
            return Ok(true);
        }
        match deadline.remaining() {
            Some(left) if left.is_zero() => return Ok(false),
            Some(left) => std::thread::sleep(left.min(BREAK_LOOK_EVERY)),
            None => std::thread::sleep(BREAK_LOOK_EVERY),
        }
    }
}

/// The sessions of `status`'s dlock holders that carry no mark yet and pass `new`.
fn unmarked<S: PartialEq + Copy>(
    status: &Status,
    sessions: &[S],
    new: impl Fn(&S) -> bool,
) -> Vec<S> {
    status
        .holders
        .iter()
        .zip(sessions)
        .filter(|(h, s)| !h.broken && h.foreign.is_none() && new(s))
        .map(|(_, s)| *s)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BackendKind, Holder, Key};

    fn status(holders: &[(u32, bool)]) -> (Status, Vec<u32>) {
        let key = Key::new("k").unwrap();
        let mut s = Status::new(&key, BackendKind::Mysql, "here".into());
        for &(id, broken) in holders {
            s.holders.push(Holder {
                broken,
                ..Holder::default()
            });
            let _ = id;
        }
        s.held = !s.holders.is_empty();
        (s, holders.iter().map(|h| h.0).collect())
    }

    #[test]
    fn marks_each_holder_once_and_keeps_the_ones_that_left() {
        // Holder 1, then holder 2 came in (a semaphore slot) while 1 was marked and let go.
        let mut reads = vec![status(&[(2, false)]), status(&[(1, false)])];
        let mut marked = Vec::new();
        let b = mark_holders(
            || Ok(reads.pop().unwrap_or_else(|| status(&[(2, true)]))),
            |ids| {
                marked.extend_from_slice(ids);
                Ok(())
            },
            || Box::new(()),
        )
        .unwrap();
        assert_eq!(marked, [1, 2]);
        assert_eq!(b.status.holders.len(), 2);
        assert!(b.status.holders.iter().all(|h| h.broken));
        assert!(b.keep.is_some());
    }

    #[test]
    fn nothing_held_keeps_nothing() {
        let b = mark_holders(
            || Ok(status(&[])),
            |_: &[u32]| panic!("nothing to mark"),
            || Box::new(()),
        )
        .unwrap();
        assert!(b.keep.is_none() && !b.status.held);
    }
}
