//! Semaphore slots: `KEY~1.lock … KEY~N.lock`, one `LOCK_EX` each, and waiting for any of them
//! to be closed (inotify) with a deadline and signals.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use super::paths::{open_existing, open_lock_file};
use super::wait::{Blocked, try_flock};
use super::{LockData, read_data};
use crate::backend::Request;
use crate::exit::Interrupted;
use crate::model::Deadline;
use crate::signals::Interrupt;
use crate::sys::{self, Inotify};

/// A semaphore slot: `LOCK_EX` on the first free of `<lock file>~1 .. ~N` (with the gate held,
/// so one waiter at a time). When all are taken, waits for any slot file to be closed (inotify:
/// a holder's exit closes its fd) and tries again. `Ok(None)`: the lock file was replaced.
pub(super) fn take_slot(
    path: &Path,
    n: u32,
    req: &Request<'_>,
    data: &LockData,
    shared: bool,
) -> anyhow::Result<Option<(File, PathBuf)>> {
    let base = path.to_string_lossy();
    let base = base.strip_suffix(".lock").unwrap_or(&base);
    let slots: Vec<PathBuf> = (1..=n)
        .map(|i| PathBuf::from(format!("{base}~{i}.lock")))
        .collect();
    // Watch before trying (a close between a try and the watch would be missed).
    let watch = match req.deadline {
        Deadline::Now => None,
        _ => Some(Closes::watch(&slots, shared)?),
    };
    // Opened once: our own closes would wake the watch.
    let mut files = slots
        .iter()
        .map(|p| open_lock_file(p, shared))
        .collect::<anyhow::Result<Vec<_>>>()?;
    loop {
        for i in 0..files.len() {
            if try_flock(&files[i], libc::LOCK_EX)? {
                return Ok(Some((files.swap_remove(i), slots[i].clone())));
            }
        }
        let Some(watch) = &watch else {
            return Err(req.busy(data.some_holder().as_ref()));
        };
        if let Some(h) = data.some_holder() {
            (req.on_holder)(&h);
        }
        match watch.wait(req.deadline, req.interrupt)? {
            Blocked::Acquired => {}
            Blocked::TimedOut => return Err(req.busy(data.some_holder().as_ref())),
            Blocked::Interrupted(sig) => return Err(Interrupted(sig).into()),
        }
        if !still_linked_path(path, data)? {
            return Ok(None);
        }
    }
}

/// The lock file may be replaced by `break` while a semaphore waiter waits for a slot; it then
/// starts over. (The holder list in `data` was read from the file that is now the path's if it
/// was not replaced: compare the counter.)
fn still_linked_path(path: &Path, data: &LockData) -> anyhow::Result<bool> {
    match open_existing(path) {
        Ok(f) => Ok(read_data(&f).map(|d| d.fence == data.fence).unwrap_or(true)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot open {}", path.display())),
    }
}

/// An inotify watch for `IN_CLOSE` on some files, and a pipe that an interrupt writes to.
struct Closes {
    inotify: Inotify,
    pipe: (io::PipeReader, Arc<io::PipeWriter>),
}

impl Closes {
    fn watch(paths: &[PathBuf], shared: bool) -> anyhow::Result<Closes> {
        let inotify = Inotify::new().context("inotify_init1 failed")?;
        for p in paths {
            // Create it first, so the watch has something to watch.
            drop(open_lock_file(p, shared)?);
            inotify
                .add_watch(p, libc::IN_CLOSE)
                .with_context(|| format!("cannot watch {}", p.display()))?;
        }
        let (reader, writer) = io::pipe().context("pipe failed")?;
        Ok(Closes {
            inotify,
            pipe: (reader, Arc::new(writer)),
        })
    }

    /// Waits until a watched file is closed (`Acquired`: time to try again), the deadline, or
    /// the interrupt.
    fn wait(&self, deadline: Deadline, interrupt: &Interrupt) -> anyhow::Result<Blocked> {
        let writer = self.pipe.1.clone();
        let _guard = interrupt.on_fire(move || {
            let _ = (&*writer).write_all(b"!");
        })?;
        loop {
            if let Some(sig) = interrupt.fired() {
                return Ok(Blocked::Interrupted(sig));
            }
            let timeout = match deadline.remaining() {
                None => -1,
                Some(d) if d.is_zero() => return Ok(Blocked::TimedOut),
                Some(d) => d.as_millis().clamp(1, i32::MAX as u128) as i32,
            };
            let ready = sys::poll_readable(&[self.inotify.as_fd(), self.pipe.0.as_fd()], timeout)
                .context("poll failed")?;
            if ready.first() == Some(&true) {
                self.inotify.drain();
                return Ok(Blocked::Acquired);
            }
        }
    }
}
