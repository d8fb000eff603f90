//! A safe break where the mark is a lock of break's own server session, one per holder session
//! (MySQL/MariaDB, PostgreSQL): which holders to mark, and what `break` then shows.

use super::{BREAK_LOOK_EVERY, Broken, Frees};
use crate::model::{Deadline, Status};

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
    notice: std::time::Duration,
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
        .map(|ms| std::time::Duration::from_millis(ms / 3));
    Ok(Broken {
        frees: Frees::WhenStopped(renewal.unwrap_or(notice)),
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
            std::time::Duration::from_secs(1),
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
            std::time::Duration::from_secs(1),
            || Box::new(()),
        )
        .unwrap();
        assert!(b.keep.is_none() && !b.status.held);
    }
}
