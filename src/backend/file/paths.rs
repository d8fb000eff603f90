//! Where lock files live and how they are opened: the default directory (and the checks that
//! refuse one another user planted), `file://` URLs, key → file name, and opening without
//! following symlinks.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::backend::ground::Finding;
use crate::exit::Usage;
use crate::model::Key;
use crate::sys;

/// Escaped names longer than this are shortened and made unique with a hash.
const MAX_PLAIN_NAME: usize = 180;

/// `/var/tmp/dlock-<uid>`: per user, needs no setup, the same for cron and login shells (no
/// environment variable decides it), and survives reboots (as fencing counters should).
pub(crate) fn default_dir() -> PathBuf {
    let uid = sys::euid();
    PathBuf::from(format!("/var/tmp/dlock-{uid}"))
}

pub(super) fn ensure_private_dir(dir: &Path) -> anyhow::Result<()> {
    let hint = "set DLOCK_URL=file:///some/dir to use another directory";
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| format!("cannot create {}; {hint}", dir.display()));
        }
    }
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot inspect {}", dir.display()))?;
    let uid = sys::euid();
    if !meta.file_type().is_dir() {
        bail!(
            "refusing {}: not a directory (a symlink?); {hint}",
            dir.display()
        );
    }
    if meta.uid() != uid {
        bail!(
            "refusing {}: owned by uid {}, not {uid}; {hint}",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        bail!(
            "refusing {}: writable by other users; {hint}",
            dir.display()
        );
    }
    Ok(())
}

/// `file:///abs/dir` or `file://localhost/abs/dir`, percent-escapes decoded.
pub(super) fn parse_url(url: &str) -> Result<PathBuf, Usage> {
    let bad = |why: &str| {
        Usage(format!(
            "bad file URL '{url}': {why} (expected file:///absolute/dir)"
        ))
    };
    let rest = url
        .strip_prefix("file://")
        .ok_or_else(|| bad("it must start with file://"))?;
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return Err(bad("the directory must be an absolute path"));
    }
    if path.contains(['?', '#']) {
        return Err(bad("query strings and fragments are not allowed"));
    }
    let decoded = crate::backend::percent_decode(path).ok_or_else(|| bad("invalid %-escape"))?;
    if decoded.contains(&0) {
        return Err(bad("the path must not contain NUL"));
    }
    Ok(PathBuf::from(OsStr::from_bytes(&decoded)))
}

/// The lock file's name for a key: [`escape_key`](crate::backend::escape_key); names that would grow too
/// long keep a readable prefix and end in a SHA-256 of the key. Distinct keys always get distinct
/// names.
pub(crate) fn file_name(key: &Key) -> String {
    let mut name = crate::backend::escape_key(key);
    if name.len() > MAX_PLAIN_NAME {
        let mut cut = 100;
        while name.as_bytes()[cut - 1] == b'%' || name.as_bytes()[cut - 2] == b'%' {
            cut -= 1;
        }
        let digest = Sha256::digest(key.as_str().as_bytes());
        let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        // '~' never appears in an escaped name, so a hashed name cannot equal a plain one.
        name = format!("{}~{hex}", &name[..cut]);
    }
    name + ".lock"
}

/// Opens (creating) the lock file without following a symlink someone planted at its path, and
/// refuses anything but a regular file (a FIFO or device planted there) and a file with more
/// than one link. `O_NONBLOCK` so that opening a FIFO cannot block; it changes nothing for a
/// regular file or its locks.
///
/// In a `shared` directory (one that other users may write to, such as a sticky `1777` one), a
/// lock file this call creates (`O_EXCL`) is made readable and writable by everyone who can use
/// the directory, whatever the umask, so that the next user's dlock can open it to lock and to
/// update the counter (with the umask's 0644, a second user got "Permission denied" instead of
/// waiting). `flock(1)` users expect the same of a shared lock directory. A file that was there
/// already keeps its mode, and one with several links is refused: in a shared directory another
/// user can hard-link a file of yours at a lock file's or history file's path (where
/// `fs.protected_hardlinks` is 0, or the file is writable by them), and dlock would then change
/// its mode and rewrite it.
pub(super) fn open_lock_file(path: &Path, shared: bool) -> anyhow::Result<File> {
    let open = |create: bool| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
    };
    // The common case first: the file is there (one open). A file removed or created between
    // the two opens (a `break --force`, another run), or removed right after the open (a
    // prune: no links left), is simply looked at again.
    let mut tries = 0;
    let (file, created) = loop {
        tries += 1;
        let (opened, created) = match open(false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => (open(true), true),
            other => (other, false),
        };
        match opened {
            Ok(f) if tries < 5 && f.metadata().is_ok_and(|m| m.nlink() == 0) => {}
            Ok(f) => break (f, created),
            Err(e)
                if tries < 5
                    && matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::AlreadyExists
                    ) => {}
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                bail!("refusing {}: it is a symbolic link", path.display())
            }
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        }
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        bail!("refusing {}: not a regular file", path.display());
    }
    if meta.nlink() != 1 {
        bail!(
            "refusing {}: it has {} hard links, so it may be a file of someone's linked there; \
             remove it",
            path.display(),
            meta.nlink()
        );
    }
    if shared && created && meta.mode() & 0o666 != 0o666 {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("cannot share {}", path.display()))?;
    }
    Ok(file)
}

/// Whether other users may create files in `dir` (group- or world-writable): then lock files
/// are shared with them (see [`open_lock_file`]).
pub(super) fn is_shared_dir(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| m.mode() & 0o022 != 0)
}

/// `dlock doctor`'s line on the lock directory: whose it is, its mode, and so whether lock files
/// are private or shared with other users ([`open_lock_file`]).
pub(super) fn describe_dir(dir: &Path, shared: bool) -> anyhow::Result<Finding> {
    let meta =
        std::fs::metadata(dir).with_context(|| format!("cannot inspect {}", dir.display()))?;
    let owner = if meta.uid() == sys::euid() {
        "yours".to_string()
    } else {
        format!("owned by uid {}", meta.uid())
    };
    let mode = meta.mode() & 0o7777;
    let how = if shared {
        "shared: other users may lock here, and lock files are made readable and writable by all of them"
    } else {
        "private: only its owner can create lock files here"
    };
    Ok(Finding::ok(
        "directory",
        format!("{}: {owner}, mode {mode:04o}, {how}", dir.display()),
    ))
}

/// Opens an existing lock file for reading, as [`open_lock_file`] does (no symlink, no FIFO);
/// anything but a regular file is an `InvalidData` error that names it.
pub(super) fn open_existing(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("refusing {}: not a regular file", path.display()),
        ));
    }
    Ok(file)
}

/// Whether `path` still names the inode `file` has open.
pub(super) fn still_linked(file: &File, path: &Path) -> anyhow::Result<bool> {
    let mine = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok(now.dev() == mine.dev() && now.ino() == mine.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot stat {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(k: &str) -> String {
        file_name(&Key::new(k).unwrap())
    }

    #[test]
    fn names_are_safe_and_distinct() {
        assert_eq!(name("nightly-report"), "nightly-report.lock");
        assert_eq!(name(".."), "%2E..lock");
        assert_eq!(name("a/b c"), "a%2Fb%20c.lock");
        assert_eq!(name("Job"), "Job.lock");
        assert_ne!(name("a/b"), name("a%2Fb"));
        let long_a = format!("{}a", "ü".repeat(127));
        let long_b = format!("{}b", "ü".repeat(127));
        assert!(name(&long_a).len() < 255);
        assert_ne!(name(&long_a), name(&long_b));
        for k in [".", "..", "/", "a/../b", &"x".repeat(256), &"é".repeat(128)] {
            let n = name(k);
            assert!(
                !n.contains('/') && n.len() < 255 && !n.starts_with('.'),
                "{k:?} -> {n}"
            );
        }
    }

    #[test]
    fn file_urls() {
        assert_eq!(
            parse_url("file:///tmp/x%20y").unwrap(),
            PathBuf::from("/tmp/x y")
        );
        assert_eq!(
            parse_url("file://localhost/tmp").unwrap(),
            PathBuf::from("/tmp")
        );
        assert!(parse_url("file://host/tmp").is_err());
        assert!(parse_url("file://relative").is_err());
        assert!(parse_url("file:///a%zz").is_err());
        assert!(parse_url("file:///a%00b").is_err());
    }
}
