//! The file backend's run history (docs/history.md): `NAME.history` beside `NAME.lock`, one
//! event per line as `MS BODY` (this host's clock — the file backend has one host), appended
//! under a `flock` of the history file itself. When it holds more than [`MAX_EVENTS`] plus a
//! slack, the start of a run rewrites it with the newest [`MAX_EVENTS`]. A reader reads at most
//! [`MAX_FILE`] bytes (the end of a longer file), so a forged file cannot blow it up.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::paths::{open_existing, open_lock_file};
use super::wait::try_flock;
use crate::history::{Begun, MAX_EVENT_BYTES, MAX_EVENTS, Stored, now_ms};

/// Events past [`MAX_EVENTS`] before the file is rewritten: pruning every few runs, not on
/// every one.
const SLACK: usize = 20;
/// The most a reader reads: enough for every kept event at its largest.
const MAX_FILE: u64 = ((MAX_EVENTS + SLACK) * (MAX_EVENT_BYTES + 24)) as u64;
/// How long to wait for another process's hold on the history file (an append or a read: a
/// few microseconds) before giving up on the history (a warning, never a hang).
const FLOCK_PATIENCE: Duration = Duration::from_secs(2);

/// The history file of the lock file `lock`.
pub(super) fn path_of(lock: &Path) -> PathBuf {
    lock.with_extension("history")
}

/// Opens the history file as the lock file is opened (no symlink, regular files only, shared
/// with the other users of a shared directory: [`open_lock_file`]; for a reader, only if it
/// exists: [`open_existing`]), and locks it (`op`) within [`FLOCK_PATIENCE`].
fn open_locked(path: &Path, op: libc::c_int, create: Option<bool>) -> anyhow::Result<Option<File>> {
    let file = match create {
        Some(shared) => open_lock_file(path, shared)?,
        None => match open_existing(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        },
    };
    let until = Instant::now() + FLOCK_PATIENCE;
    while !try_flock(&file, op)? {
        if Instant::now() >= until {
            bail!("{} stays locked by another process", path.display());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Some(file))
}

/// The end of an open history file: at most [`MAX_FILE`] bytes, and whether its start was cut
/// off (the first line is then a part of one). One `pread` of the size `fstat` gives (every
/// writer holds the flock this reader holds, so the file does not grow meanwhile; a file that
/// shrank, or grew by a writer that ignores the flock, is read as far as it goes, within the
/// bound).
fn read_tail(file: &File) -> anyhow::Result<(Vec<u8>, bool)> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let from = len.saturating_sub(MAX_FILE);
    // At most MAX_FILE (a few hundred KiB): the cast cannot truncate.
    let mut buf = vec![0u8; (len - from) as usize];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], from + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(got);
    Ok((buf, from > 0))
}

/// The events of a history file's tail ([`read_tail`]), oldest first, each line as it is.
fn lines_of(tail: &[u8], cut: bool) -> impl DoubleEndedIterator<Item = &[u8]> {
    let mut lines = tail.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    if cut {
        lines.next(); // cut in the middle
    }
    lines
}

/// How many events [`lines_of`] gives, counted as the bytes that begin a line: a loop without
/// an early exit, which the compiler turns into vector instructions (every start counts up to
/// 240 lines, ~50 KiB; splitting them one byte at a time took ~30 µs, and `memchr`'s first
/// call asks the CPU what it has, a dozen `cpuid`s — each a trap to the hypervisor on a VM).
fn count_lines(tail: &[u8], cut: bool) -> usize {
    let Some((&first, rest)) = tail.split_first() else {
        return 0;
    };
    let mut starts = usize::from(first != b'\n');
    // Pairs (a byte, the next one) in blocks of 240: a block's count fits a u8, the sum the
    // vector lanes add in.
    for (prev, next) in tail.chunks(240).zip(rest.chunks(240)) {
        let block = prev.iter().zip(next).fold(0u8, |n, (&a, &b)| {
            n.wrapping_add(u8::from(a == b'\n') & u8::from(b != b'\n'))
        });
        starts += usize::from(block);
    }
    starts.saturating_sub(usize::from(cut))
}

/// A line of the file: the event as `MS BODY` ([`Stored::line`]), and a newline.
fn line(at_ms: u64, body: &[u8]) -> Vec<u8> {
    let mut l = Stored::line(at_ms, body);
    l.push(b'\n');
    l
}

/// Adds the start event `body` for the lock file `lock` (see [`crate::backend::Lease::begin_run`]).
pub(super) fn begin(
    lock: &Path,
    body: &[u8],
    once_per: Option<Duration>,
    shared: bool,
) -> anyhow::Result<Begun> {
    let path = path_of(lock);
    let Some(file) = open_locked(&path, libc::LOCK_EX, Some(shared))? else {
        bail!("cannot open {}", path.display());
    };
    let (tail, cut) = read_tail(&file)?;
    let now = now_ms();
    if let Some(d) = once_per {
        // The newest start with a time that counts: one without a time (a forged or torn line)
        // does not, nor one dated more than DUR ahead ([`crate::history::age`]).
        // By time, not by place in the file (a prune cut short leaves older events last).
        let last = lines_of(&tail, cut)
            .rev()
            .map(Stored::from_line)
            .filter(|s| crate::history::RunEvent::read(s).is_some_and(|e| e.ev == "start"))
            .filter_map(|s| {
                let ago = crate::history::age(now, s.at_ms?, d)?;
                Some((s, ago))
            })
            .min_by_key(|(_, ago)| *ago);
        if let Some((last, ago)) = last.filter(|(_, ago)| *ago < d) {
            return Ok(Begun::Skip { last, ago });
        }
    }
    let new = line(now, body);
    // Counted without a copy of each line: most starts only append.
    let count = count_lines(&tail, cut);
    if count >= MAX_EVENTS + SLACK {
        let mut kept: Vec<u8> = Vec::new();
        for l in lines_of(&tail, cut).skip(count + 1 - MAX_EVENTS) {
            kept.extend_from_slice(l);
            kept.push(b'\n');
        }
        kept.extend_from_slice(&new);
        // The kept events are written over the start of the file first, and only then is the
        // rest cut off: a crash in between leaves older events after them (read by time, see
        // `read`), never an empty history that would reopen every `--once-per` window.
        use std::os::unix::fs::FileExt;
        file.write_all_at(&kept, 0)?;
        file.set_len(kept.len() as u64)?;
    } else {
        append(&file, &new)?;
    }
    Ok(Begun::Started)
}

/// Appends `line`, after a newline if the file does not end with one (a torn write, a full
/// disk, a forged file): glued to that garbage, the event would be lost.
/// (Under the history file's flock, which every writer takes: the end is the end.)
fn append(mut file: &File, line: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.seek(SeekFrom::End(0))?;
    let mut last = [0u8; 1];
    if len > 0 && file.read_at(&mut last, len - 1)? == 1 && last[0] != b'\n' {
        file.write_all(b"\n")?;
    }
    file.write_all(line)
}

/// Appends the end event `body` to the history of the lock file `lock`.
pub(super) fn end(lock: &Path, body: &[u8], shared: bool) -> anyhow::Result<()> {
    let path = path_of(lock);
    let Some(file) = open_locked(&path, libc::LOCK_EX, Some(shared))? else {
        bail!("cannot open {}", path.display());
    };
    append(&file, &line(now_ms(), body)).with_context(|| format!("cannot write {}", path.display()))
}

/// The events of the lock file `lock`'s history, newest first (none without a history file).
pub(super) fn read(lock: &Path) -> anyhow::Result<Vec<Stored>> {
    let path = path_of(lock);
    let Some(file) = open_locked(&path, libc::LOCK_SH, None)? else {
        return Ok(Vec::new());
    };
    let (tail, cut) = read_tail(&file)?;
    let mut events: Vec<Stored> = lines_of(&tail, cut).rev().map(Stored::from_line).collect();
    // Newest first by time (stable: the file's order among equal times), so that events a
    // prune cut short left after newer ones still read in order.
    events.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
    events.truncate(MAX_EVENTS);
    Ok(events)
}

/// The keys with a history file in `dir` (`dlock metrics` without `--key`), at most
/// [`MAX_LISTED`](crate::backend::MAX_LISTED).
pub(super) fn keys(dir: &Path) -> anyhow::Result<Vec<crate::model::Key>> {
    let mut keys = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries.flatten() {
        if keys.len() >= crate::backend::MAX_LISTED {
            break;
        }
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".history")) else {
            continue;
        };
        // A hashed name (a long key) names its key only in its lock file's record.
        let key = match crate::backend::unescape_key(stem) {
            Some(k) if !stem.contains('~') => Some(k),
            _ => open_existing(&dir.join(format!("{stem}.lock")))
                .ok()
                .and_then(|f| super::read_data(&f).ok())
                .and_then(|d| d.some_holder().and_then(|h| h.key.clone()))
                .and_then(|k| crate::model::Key::new(&k).ok()),
        };
        keys.extend(key);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(run: &str) -> String {
        format!(r#"{{"run":"{run}","ev":"start","host":"h","pid":1}}"#)
    }

    proptest::proptest! {
        /// The events counted without splitting are the events split out — across the
        /// count's blocks of 240 bytes too.
        #[test]
        fn counting_the_lines_is_splitting_them(
            bytes in proptest::collection::vec(proptest::sample::select(b"ab\n".to_vec()), 0..1000),
            cut: bool,
        ) {
            proptest::prop_assert_eq!(count_lines(&bytes, cut), lines_of(&bytes, cut).count());
        }
    }

    /// A prune cut short by a crash leaves the kept (newer) events first and older ones after
    /// them: `log` still reads newest first, and `--once-per` still sees the newest start.
    #[test]
    fn a_prune_cut_short_loses_neither_order_nor_the_once_per_window() {
        let dir = std::env::temp_dir().join(format!("dlock-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("k.lock");
        let now = now_ms();
        let text = format!(
            "{} {}\n{} {}\n",
            now - 1_000,
            start("new"),
            now - 3_600_000,
            start("old")
        );
        std::fs::write(path_of(&lock), text).unwrap();
        let events = read(&lock).unwrap();
        assert_eq!(events[0].at_ms, Some(now - 1_000), "newest first");
        let once = begin(&lock, b"{}", Some(Duration::from_secs(60)), false).unwrap();
        assert!(
            matches!(once, Begun::Skip { ago, .. } if ago < Duration::from_secs(60)),
            "the newest start (1 s ago) counts, not the last line (an hour ago)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
