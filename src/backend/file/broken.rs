//! The mark a safe `dlock break` leaves beside a lock file: `<lock file>.broken`, holding the
//! largest fencing token it broke. Every holder with a token up to it sees the mark at its next
//! check ([`super::CHECK_EVERY`]) and stops as on any loss, then lets go of its flock; the
//! waiters, blocked in `flock`, get the lock only then. Tokens only grow, so a mark left behind
//! never touches a later holder; the next exclusive holder removes it.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The mark's path beside the lock file at `lock`.
pub(super) fn path_of(lock: &Path) -> PathBuf {
    let mut p = lock.as_os_str().to_owned();
    p.push(".broken");
    PathBuf::from(p)
}

/// The largest token broken at `lock`, if a mark is there. Anything that is not a small
/// decimal number counts as no mark, and so does a mark of a user other than this one, root or
/// the lock file's owner: in a shared (1777) directory another user could otherwise plant a
/// mark with the largest token, which no later holder could remove (the sticky bit), and so
/// break every run of the key for good.
pub(super) fn read(lock: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path_of(lock))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    let lock_owner = std::fs::symlink_metadata(lock).ok().map(|m| m.uid());
    if meta.uid() != crate::sys::euid() && meta.uid() != 0 && Some(meta.uid()) != lock_owner {
        return None;
    }
    let mut text = String::new();
    Read::take(&mut file, 32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Marks every holder of `lock` with a token up to `upto` as broken (keeping a larger mark).
/// Written to a new file and renamed into place: a hard link another user planted at the
/// mark's path is replaced, never written through.
pub(super) fn write(lock: &Path, upto: u64) -> anyhow::Result<()> {
    let upto = read(lock).map_or(upto, |had| had.max(upto));
    let mark = path_of(lock);
    let mut tmp = mark.as_os_str().to_owned();
    tmp.push(format!(".{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(format!("{upto}\n").as_bytes())?;
        std::fs::rename(&tmp, &mark)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write {}", mark.display()))
}

/// Removes the mark: called by an exclusive holder, which holds the flock, so every holder the
/// mark was for has let go.
pub(super) fn clear(lock: &Path) {
    let _ = std::fs::remove_file(path_of(lock));
}

/// Whether the kernel agrees that `broken`'s holders have let go of the lock file `lock`: it is
/// gone, it can be locked shared without waiting (then unlocked at once), or its record names
/// an exclusive holder whose pid is none of theirs.
pub(super) fn let_go(lock: &Path, broken: &crate::backend::Broken) -> anyhow::Result<bool> {
    let file = match super::paths::open_existing(lock) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", lock.display())),
    };
    if super::wait::try_flock(&file, libc::LOCK_SH)? {
        return Ok(true); // closing `file` lets go at once
    }
    let data = super::read_data(&file).unwrap_or_default();
    let theirs = |pid| {
        broken
            .status
            .holders
            .iter()
            .any(|b| b.record.pid == Some(pid))
    };
    Ok(data
        .holder
        .as_ref()
        .and_then(|h| h.record.pid)
        .is_some_and(|pid| !theirs(pid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_keep_the_largest_token_and_ignore_garbage() {
        let dir = std::env::temp_dir().join(format!("dlock-broken-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = dir.join("k.lock");
        assert_eq!(read(&lock), None);
        write(&lock, 7).unwrap();
        write(&lock, 5).unwrap();
        assert_eq!(read(&lock), Some(7));
        std::fs::write(path_of(&lock), "x".repeat(100)).unwrap();
        assert_eq!(read(&lock), None);
        clear(&lock);
        assert_eq!(read(&lock), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
