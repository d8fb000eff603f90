//! Retention on the file backend ([`crate::history::retention`]): a key whose lock file and
//! history were last written more than the retention ago loses `NAME.lock`, `NAME.history` and
//! a break's mark.
//!
//! - **Held or waited for**: the pruner takes `LOCK_EX` on the lock file without waiting; a
//!   holder (exclusive or shared) makes that fail, and the key is left alone. A waiter blocked
//!   in `flock` on the old inode gets it once the pruner closes, finds the path no longer names
//!   it ([`still_linked`]) and starts over on a new file, as after a `break`.
//! - **Fencing**: a new lock file's first token is the clock in microseconds, and never more
//!   than one past the directory's floor `dlock.floor` ([`above_floor`]), which the pruner
//!   raises to the removed file's counter *before* it unlinks the file: a key used again gets a
//!   larger token than it ever had, even if the clock stepped back. The floor's name ends in
//!   neither `.lock` nor `.history`, so no key's files are named so.
//! - **Bounded**: one pass lists the directory's names (no stat), then looks at the candidates
//!   from a random place, statting at most 16 per key it may remove.
//! - **Not pruned**: a semaphore's slot files (`NAME~N.lock`), files of other users in a sticky
//!   shared directory (the kernel refuses; they are skipped).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::paths::{open_existing, open_lock_file, still_linked};
use super::wait::try_flock;
use super::{broken, history, read_data};
use crate::history::retention::parse_floor;

/// The directory's fencing floor: the largest token of a pruned lock file.
const FLOOR_FILE: &str = "dlock.floor";
/// The most directory entries one pass reads.
const MAX_ENTRIES: usize = 1 << 20;

/// The first token of a new lock file at `lock`: `now` (the clock in µs), or one past the
/// directory's floor if that is larger. A floor more than `ahead_limit` past `now` is taken
/// for a forged one and ignored (the clock still orders tokens).
pub(super) fn above_floor(lock: &Path, now: u64, ahead_limit: u64) -> u64 {
    match lock.parent().and_then(read_floor) {
        Some(f) if f < now.saturating_add(ahead_limit) => now.max(f.saturating_add(1)),
        _ => now,
    }
}

fn read_floor(dir: &Path) -> Option<u64> {
    let mut f = open_existing(&dir.join(FLOOR_FILE)).ok()?;
    let mut buf = Vec::with_capacity(24);
    (&mut f).take(24).read_to_end(&mut buf).ok()?;
    parse_floor(&buf)
}

/// Raises the directory's floor to `fence` (under its own flock: prunes may run side by side).
fn raise_floor(dir: &Path, shared: bool, fence: u64) -> anyhow::Result<()> {
    let path = dir.join(FLOOR_FILE);
    let file = open_lock_file(&path, shared)?;
    // Another prune's write takes microseconds; one held for longer (by anyone who can open
    // the file in a shared directory) must not hold this run up: no prune this time.
    if !try_flock(&file, libc::LOCK_EX)? {
        anyhow::bail!("{} is locked", path.display());
    }
    let mut buf = Vec::with_capacity(24);
    (&file).take(24).read_to_end(&mut buf)?;
    if parse_floor(&buf).is_some_and(|f| f >= fence) {
        return Ok(());
    }
    let text = format!("{fence}\n");
    file.write_all_at(text.as_bytes(), 0)?;
    file.set_len(text.len() as u64)?;
    (&file).flush()?;
    Ok(())
}

/// Removes the files of at most `most` keys of `dir` untouched for `older_than`.
pub(super) fn prune(
    dir: &Path,
    shared: bool,
    older_than: Duration,
    most: usize,
) -> anyhow::Result<usize> {
    let Some(cutoff) = SystemTime::now().checked_sub(older_than) else {
        return Ok(0);
    };
    let mut names: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(dir)?.take(MAX_ENTRIES) {
        let Ok(entry) = entry else { continue };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if let Some(base) = name.strip_suffix(".lock") {
            if !is_slot(base) {
                names.push(name);
            }
        } else if let Some(base) = name.strip_suffix(".history") {
            // A history without its lock file (removed by `break --force`, or by hand).
            names.push(format!("{base}.history"));
        }
    }
    if names.is_empty() {
        return Ok(0);
    }
    let start = usize::try_from(crate::history::now_ms()).unwrap_or(0) % names.len();
    let budget = most.saturating_mul(16);
    let mut removed = 0;
    for name in names
        .iter()
        .cycle()
        .skip(start)
        .take(names.len().min(budget))
    {
        if removed >= most {
            break;
        }
        let path = dir.join(name);
        let done = if name.ends_with(".lock") {
            prune_lock(dir, &path, shared, cutoff)
        } else {
            prune_orphan_history(dir, &path, cutoff)
        };
        if done {
            removed += 1;
        }
    }
    Ok(removed)
}

/// `NAME.N.lock` slot files end in `~` and a small number; a hashed long name ends in `~` and
/// 32 hex digits.
fn is_slot(base: &str) -> bool {
    base.rsplit_once('~')
        .is_some_and(|(_, n)| (1..=4).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

fn older(path: &Path, cutoff: SystemTime) -> Option<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m.modified().is_ok_and(|t| t < cutoff)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(true),
        Err(_) => None,
    }
}

/// One key's lock file (and its history and mark): removed when free and aged out.
fn prune_lock(dir: &Path, lock: &Path, shared: bool, cutoff: SystemTime) -> bool {
    let history = history::path_of(lock);
    if older(lock, cutoff) != Some(true) || older(&history, cutoff) != Some(true) {
        return false;
    }
    let Ok(file) = open_existing(lock) else {
        return false;
    };
    // Held (exclusive or shared): left alone. Held by us from here on, so no one takes it.
    if !try_flock(&file, libc::LOCK_EX).unwrap_or(false) {
        return false;
    }
    // Replaced meanwhile, or used between the look and the lock: not aged out after all.
    let fresh = file
        .metadata()
        .ok()
        .and_then(|m| m.modified().ok())
        .is_none_or(|t| t >= cutoff);
    if fresh
        || !still_linked(&file, lock).unwrap_or(false)
        || file.metadata().map_or(true, |m| m.nlink() != 1)
    {
        return false;
    }
    if older(&history, cutoff) != Some(true) {
        return false;
    }
    // The floor first: once the file is gone a new one may be created at once.
    if let Some(fence) = read_data(&file).ok().and_then(|d| d.fence)
        && raise_floor(dir, shared, fence).is_err()
    {
        return false;
    }
    let _ = std::fs::remove_file(&history);
    broken::clear(lock);
    let gone = std::fs::remove_file(lock).is_ok();
    drop::<File>(file);
    gone
}

/// A history whose lock file is gone: removed when aged out (no lock, so nothing holds it).
fn prune_orphan_history(dir: &Path, history: &Path, cutoff: SystemTime) -> bool {
    let mut lock: PathBuf = history.to_path_buf();
    lock.set_extension("lock");
    if lock.exists() || !history.starts_with(dir) || older(history, cutoff) != Some(true) {
        return false;
    }
    std::fs::remove_file(history).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_files_are_told_from_hashed_names() {
        assert!(is_slot("job~1"));
        assert!(is_slot("job~32"));
        assert!(!is_slot("job"));
        assert!(!is_slot("long~0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn the_floor_lifts_a_new_counter_and_a_forged_one_is_ignored() {
        let dir = std::env::temp_dir().join(format!("dlock-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("k.lock");
        assert_eq!(above_floor(&lock, 100, 1000), 100);
        raise_floor(&dir, false, 500).unwrap();
        assert_eq!(above_floor(&lock, 100, 1000), 501);
        raise_floor(&dir, false, 300).unwrap(); // never lowered
        assert_eq!(above_floor(&lock, 100, 1000), 501);
        assert_eq!(above_floor(&lock, 600, 1000), 600);
        raise_floor(&dir, false, 5000).unwrap();
        assert_eq!(above_floor(&lock, 100, 1000), 100);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
