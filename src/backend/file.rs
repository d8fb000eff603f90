//! The file backend: `flock(2)` on `<dir>/<escaped key>.lock`, the zero-setup default.
//!
//! - The kernel is the lock server: it releases on process death, and a blocked `flock` is the
//!   waiting (no polling). A deadline or a signal interrupts the blocked call with a thread-directed
//!   `SIGALRM` whose handler has no `SA_RESTART`, as `flock -w` does.
//! - The lock file holds a small JSON document: the fencing counter and the holder's metadata,
//!   written while holding. The first token of a new file is the wall clock in microseconds, so
//!   tokens keep growing even after `break` (or a cleaner) removed the file.
//! - `status` reads `/proc/locks` for the truth (held, by which pid, how many wait) and never
//!   takes the lock itself, so it cannot make a concurrent `--no-wait` fail.
//! - `break` unlinks the file. The holder notices that its fd's inode is no longer the path's and
//!   treats the lock as lost; a waiter that gets the orphaned inode checks the same and retries.
//!
//! This module does not know about children or renewal schedules; see `keeper` and `supervise`.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Backend, Deadline, Holder, Lease, Mode, RenewError, Request, Status};
use crate::clock::BootInstant;
use crate::config::{BackendKind, Key};
use crate::exit::{Interrupted, Usage};

/// How often a holder checks that its lock file was not removed (`dlock break`).
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// Escaped names longer than this are shortened and made unique with a hash.
const MAX_PLAIN_NAME: usize = 180;

/// Locks as files in one directory.
pub struct FileBackend {
    dir: PathBuf,
}

impl FileBackend {
    /// `urls` empty: the per-user default directory; one `file:///dir` URL: that directory.
    /// Creates the directory if needed; refuses a default directory that another user could
    /// have planted (a symlink, someone else's, or writable by others).
    pub fn open(urls: &[String]) -> anyhow::Result<FileBackend> {
        let dir = match urls {
            [] => {
                let dir = default_dir();
                ensure_private_dir(&dir)?;
                dir
            }
            [url] => {
                let dir = parse_url(url)?;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .create(&dir)
                    .with_context(|| format!("cannot create lock directory {}", dir.display()))?;
                dir
            }
            _ => return Err(Usage("the file backend takes one --url".into()).into()),
        };
        Ok(FileBackend { dir })
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(file_name(key))
    }

    /// `LOCK_EX` on the lock file. Uncontended: one open and one flock. Contended: wait holding
    /// the gate, so that no new shared holder gets in meanwhile (writer preference).
    fn acquire_exclusive(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let path = self.path(req.key);
        loop {
            let file = open_lock_file(&path)?;
            let acquired_at = BootInstant::now();
            if !try_flock(&file, libc::LOCK_EX)? {
                about_to_wait(&file, req)?;
                wait_for(&file, LockOp::Gate, req)?;
                let got = wait_for(&file, LockOp::Flock(libc::LOCK_EX), req);
                unlock_gate(&file);
                got?;
            }
            // `break` may have unlinked the file while we waited for its inode: that lock is
            // orphaned, and someone may already hold the new file. Start over on the new one.
            if !still_linked(&file, &path)? {
                continue;
            }
            let mut data = read_data(&file).unwrap_or_default();
            let token = data.fence.map_or_else(clock_seed, |f| f + 1);
            data.fence = Some(token);
            data.holder = Some(Holder {
                fencing_token: Some(token),
                ..req.holder.clone()
            });
            data.sharers.clear();
            data.limit = None;
            write_data(&file, &data).with_context(|| format!("cannot write {}", path.display()))?;
            return Ok(Box::new(FileLease {
                file,
                path,
                data,
                acquired_at,
                slot: None,
            }));
        }
    }

    /// A shared lock or a semaphore slot: through the gate (which a waiting exclusive run
    /// holds), then `LOCK_SH` on the lock file (which keeps exclusive runs out), then for a
    /// semaphore `LOCK_EX` on one of N slot files. The gate is held until the holder is
    /// recorded, so the fencing counter and the holder list are updated by one process at a
    /// time. `Ok(None)`: the file was replaced (`break`) meanwhile; try again.
    fn acquire_shared(&self, req: &Request<'_>) -> anyhow::Result<Option<Box<dyn Lease>>> {
        let path = self.path(req.key);
        let file = open_lock_file(&path)?;
        let acquired_at = BootInstant::now();
        if !try_gate(&file)? {
            if req.deadline == Deadline::Now {
                let data = read_data(&file).unwrap_or_default();
                return Err(data
                    .mismatch(req)
                    .unwrap_or_else(|| req.busy(data.some_holder())));
            }
            wait_for(&file, LockOp::Gate, req)?;
        }
        // The gate is ours until unlocked below, or until `file` closes on an error path.
        if !try_flock(&file, libc::LOCK_SH)? {
            about_to_wait(&file, req)?;
            wait_for(&file, LockOp::Flock(libc::LOCK_SH), req)?;
        }
        if !still_linked(&file, &path)? {
            return Ok(None);
        }
        let mut data = read_data(&file).unwrap_or_default();
        let meta = file.metadata()?;
        let live = proc_locks(meta.dev(), meta.ino())?.holders;
        data.sharers
            .retain(|h| live.iter().any(|l| Some(l.pid) == h.pid && !l.write));
        // We hold LOCK_SH: a recorded exclusive holder is one that died without clearing it.
        data.holder = None;
        if let Some(e) = data.mismatch(req) {
            return Err(e);
        }
        let slot = match req.mode {
            Mode::Limit(n) => {
                let Some(slot) = take_slot(&path, n, req, &data)? else {
                    return Ok(None);
                };
                Some(slot)
            }
            _ => None,
        };
        let token = data.fence.map_or_else(clock_seed, |f| f + 1);
        data.fence = Some(token);
        data.limit = req.mode.limit();
        data.sharers.push(Holder {
            fencing_token: Some(token),
            ..req.holder.clone()
        });
        write_data(&file, &data).with_context(|| format!("cannot write {}", path.display()))?;
        unlock_gate(&file);
        Ok(Some(Box::new(FileLease {
            file,
            path,
            data,
            acquired_at,
            slot,
        })))
    }
}

impl Backend for FileBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::File
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn unsupported(&self, _mode: Mode) -> Option<String> {
        None
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        match req.mode {
            Mode::Exclusive => self.acquire_exclusive(req),
            Mode::Shared | Mode::Limit(_) => loop {
                if let Some(lease) = self.acquire_shared(req)? {
                    return Ok(lease);
                }
            },
        }
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let path = self.path(key);
        let location = path.display().to_string();
        let mut status = Status {
            waiters: Some(0),
            ..Status::new(key, self.kind(), location)
        };
        let file = match open_existing(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(status),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        let meta = file.metadata()?;
        let locks = proc_locks(meta.dev(), meta.ino())?;
        status.waiters = Some(locks.waiters);
        let data = read_data(&file).unwrap_or_default();
        for lock in &locks.holders {
            let recorded = if lock.write {
                data.holder.as_ref().filter(|h| h.pid == Some(lock.pid))
            } else {
                data.sharers.iter().find(|h| h.pid == Some(lock.pid))
            };
            let mut holder = match recorded {
                Some(h) => h.clone(),
                // Past the shared lock but not yet recorded: still entering (or waiting for a
                // semaphore slot).
                None if !lock.write => {
                    status.waiters = status.waiters.map(|w| w + 1);
                    continue;
                }
                None => Holder {
                    pid: Some(lock.pid),
                    fencing_token: data.fence,
                    ..Holder::default()
                },
            };
            holder.host.get_or_insert_with(super::hostname);
            status.holders.push(holder);
        }
        status.held = !status.holders.is_empty();
        if status
            .holders
            .iter()
            .any(|h| h.mode.is_some_and(|m| m.limit().is_some()))
        {
            status.limit = data.limit;
        }
        Ok(status)
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => Ok(()),
        }
    }

    fn break_lock(&self, key: &Key) -> anyhow::Result<Status> {
        let status = self.status(key)?;
        if status.held {
            let path = self.path(key);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {}", path.display()));
                }
                _ => {}
            }
        }
        Ok(status)
    }
}

/// A held flock (and for a semaphore, its slot). Dropping it closes the fds, which releases
/// the lock.
struct FileLease {
    file: File,
    path: PathBuf,
    data: LockData,
    acquired_at: BootInstant,
    /// A semaphore's slot file, held `LOCK_EX`.
    slot: Option<(File, PathBuf)>,
}

impl FileLease {
    fn exclusive(&self) -> bool {
        self.data.holder.is_some()
    }
}

impl Lease for FileLease {
    fn fencing_token(&self) -> Option<u64> {
        self.data.fence
    }

    fn ttl(&self) -> Option<Duration> {
        None
    }

    fn acquired_at(&self) -> BootInstant {
        self.acquired_at
    }

    fn renew_every(&self) -> Duration {
        CHECK_EVERY
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let files = std::iter::once((&self.file, &self.path))
            .chain(self.slot.as_ref().map(|(f, p)| (f, p)));
        for (file, path) in files {
            match still_linked(file, path) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(RenewError::Lost(format!(
                        "lock file {} was removed or replaced (dlock break?)",
                        path.display()
                    )));
                }
                Err(e) => return Err(RenewError::Failed(e)),
            }
        }
        Ok(())
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        if !self.exclusive() {
            // A shared holder must not write: others share the file. Its entry in the holder
            // list is pruned by the next one to enter (its flock is gone from /proc/locks).
            return Ok(());
        }
        // Clear the holder so that stale metadata never outlives the lock; keep the counter.
        self.data.holder = None;
        let result = write_data(&self.file, &self.data);
        drop(self.file); // close: the kernel releases the flock and wakes the waiters
        result.with_context(|| format!("cannot update {}", self.path.display()))
    }
}

/// What the lock file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LockData {
    /// The last fencing token handed out.
    fence: Option<u64>,
    /// The exclusive holder, `None` when released or shared.
    holder: Option<Holder>,
    /// The shared holders or semaphore slot holders (may include ones that have gone: only
    /// those whose flock shows in /proc/locks count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sharers: Vec<Holder>,
    /// The semaphore's size while it has holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit: Option<u32>,
}

impl LockData {
    /// Someone who holds it, for messages.
    fn some_holder(&self) -> Option<&Holder> {
        self.holder.as_ref().or(self.sharers.first())
    }

    /// How the recorded holders hold the lock ("exclusive", "shared", "--limit 3").
    fn held_as(&self) -> Option<Mode> {
        if let Some(h) = &self.holder {
            return Some(h.mode.unwrap_or(Mode::Exclusive));
        }
        self.sharers.first().map(|h| h.mode.unwrap_or(Mode::Shared))
    }

    /// The error for a request that cannot share this key with its holders: a semaphore of
    /// another size, or a semaphore against an exclusive or shared lock.
    fn mismatch(&self, req: &Request<'_>) -> Option<anyhow::Error> {
        let theirs = self.held_as()?;
        let agree = match (req.mode, theirs) {
            (Mode::Limit(a), Mode::Limit(b)) => a == b,
            (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
            _ => true,
        };
        (!agree).then(|| super::mode_mismatch(req.key, req.mode, &theirs.describe()))
    }
}

fn read_data(file: &File) -> anyhow::Result<LockData> {
    let mut buf = Vec::new();
    (&*file).read_to_end(&mut buf)?;
    // The cursor is shared with later reads through the same fd: rewind for the next one.
    // SAFETY: plain lseek on a valid fd.
    unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_SET) };
    if buf.iter().all(u8::is_ascii_whitespace) {
        return Ok(LockData::default());
    }
    Ok(serde_json::from_slice(&buf)?)
}

fn write_data(file: &File, data: &LockData) -> io::Result<()> {
    let mut buf = serde_json::to_vec(data).map_err(io::Error::other)?;
    buf.push(b'\n');
    // One pwrite, then cut the tail: a reader sees the old or the new document (or, rarely, a
    // torn one, which it treats as unknown metadata; the lock state comes from /proc/locks).
    file.write_all_at(&buf, 0)?;
    file.set_len(buf.len() as u64)
}

/// The first token of a new lock file: microseconds since the Unix epoch, so that a recreated
/// file (after `break`) still hands out larger tokens than any earlier one.
fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}

/// `/var/tmp/dlock-<uid>`: per user, needs no setup, the same for cron and login shells (no
/// environment variable decides it), and survives reboots (as fencing counters should).
pub fn default_dir() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/var/tmp/dlock-{uid}"))
}

fn ensure_private_dir(dir: &Path) -> anyhow::Result<()> {
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
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
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
fn parse_url(url: &str) -> Result<PathBuf, Usage> {
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
    let decoded = super::percent_decode(path).ok_or_else(|| bad("invalid %-escape"))?;
    if decoded.contains(&0) {
        return Err(bad("the path must not contain NUL"));
    }
    Ok(PathBuf::from(OsStr::from_bytes(&decoded)))
}

/// The lock file's name for a key: [`escape_key`](super::escape_key); names that would grow too
/// long keep a readable prefix and end in a SHA-256 of the key. Distinct keys always get distinct
/// names.
pub fn file_name(key: &Key) -> String {
    let mut name = super::escape_key(key);
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

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// Opens (creating) the lock file without following a symlink someone planted at its path.
fn open_lock_file(path: &Path) -> anyhow::Result<File> {
    let c = cstring(path)?;
    // SAFETY: valid NUL-terminated path; the returned fd is owned by the File below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o666 as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) {
            bail!("refusing {}: it is a symbolic link", path.display());
        }
        return Err(e).with_context(|| format!("cannot open {}", path.display()));
    }
    // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    if !file.metadata()?.file_type().is_file() {
        bail!("refusing {}: not a regular file", path.display());
    }
    Ok(file)
}

fn open_existing(path: &Path) -> io::Result<File> {
    let c = cstring(path)?;
    // SAFETY: as in open_lock_file.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Whether `path` still names the inode `file` has open.
fn still_linked(file: &File, path: &Path) -> anyhow::Result<bool> {
    let mine = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok(now.dev() == mine.dev() && now.ino() == mine.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot stat {}", path.display())),
    }
}

/// `flock(fd, op | LOCK_NB)`: Ok(false) when someone else holds it.
fn try_flock(file: &File, op: libc::c_int) -> anyhow::Result<bool> {
    // SAFETY: valid fd.
    if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e).context("flock failed")
}

enum Blocked {
    Acquired,
    TimedOut,
    Interrupted(i32),
}

/// A blocking lock operation on the lock file.
#[derive(Clone, Copy)]
enum LockOp {
    /// `flock(op)`: the lock itself.
    Flock(libc::c_int),
    /// An open-file-description write lock on byte 0: the gate that a waiting exclusive run
    /// holds to keep new shared holders out, and that shared holders pass through. Independent
    /// of the flock on the same file.
    Gate,
}

impl LockOp {
    /// One attempt: 0 on success, else -1 with errno set.
    fn call(self, file: &File, wait: bool) -> libc::c_int {
        match self {
            LockOp::Flock(op) => {
                let op = if wait { op } else { op | libc::LOCK_NB };
                // SAFETY: valid fd.
                unsafe { libc::flock(file.as_raw_fd(), op) }
            }
            LockOp::Gate => {
                let cmd = if wait {
                    libc::F_OFD_SETLKW
                } else {
                    libc::F_OFD_SETLK
                };
                gate_fcntl(file, cmd, libc::F_WRLCK)
            }
        }
    }
}

fn gate_fcntl(file: &File, cmd: libc::c_int, kind: libc::c_int) -> libc::c_int {
    // SAFETY: a zeroed flock is valid; OFD locks need l_pid 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: valid fd and a valid flock structure.
    unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) }
}

/// Takes the gate if it is free.
fn try_gate(file: &File) -> anyhow::Result<bool> {
    if LockOp::Gate.call(file, false) == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e).context("fcntl(F_OFD_SETLK) failed"),
    }
}

fn unlock_gate(file: &File) {
    gate_fcntl(file, libc::F_OFD_SETLK, libc::F_UNLCK);
}

/// The lock is busy: an error if its holders use another mode or the request does not wait;
/// else tells the waiting line who holds it.
fn about_to_wait(file: &File, req: &Request<'_>) -> anyhow::Result<()> {
    let data = read_data(file).unwrap_or_default();
    if let Some(e) = data.mismatch(req) {
        return Err(e);
    }
    if req.deadline == Deadline::Now {
        return Err(req.busy(data.some_holder()));
    }
    if let Some(holder) = data.some_holder() {
        (req.on_holder)(holder);
    }
    Ok(())
}

/// Blocks on `op` until acquired; the deadline and the interrupt end the wait with the
/// request's errors.
fn wait_for(file: &File, op: LockOp, req: &Request<'_>) -> anyhow::Result<()> {
    match blocking_lock(file, op, req.deadline, req.interrupt)? {
        Blocked::Acquired => Ok(()),
        Blocked::TimedOut => {
            let data = read_data(file).unwrap_or_default();
            Err(req.busy(data.some_holder()))
        }
        Blocked::Interrupted(sig) => Err(Interrupted(sig).into()),
    }
}

/// A semaphore slot: `LOCK_EX` on the first free of `<lock file>~1 .. ~N` (with the gate held,
/// so one waiter at a time). When all are taken, waits for any slot file to be closed (inotify:
/// a holder's exit closes its fd) and tries again. `Ok(None)`: the lock file was replaced.
fn take_slot(
    path: &Path,
    n: u32,
    req: &Request<'_>,
    data: &LockData,
) -> anyhow::Result<Option<(File, PathBuf)>> {
    let base = path.to_string_lossy();
    let base = base.strip_suffix(".lock").unwrap_or(&base);
    let slots: Vec<PathBuf> = (1..=n)
        .map(|i| PathBuf::from(format!("{base}~{i}.lock")))
        .collect();
    // Watch before trying (a close between a try and the watch would be missed).
    let watch = match req.deadline {
        Deadline::Now => None,
        _ => Some(Closes::watch(&slots)?),
    };
    // Opened once: our own closes would wake the watch.
    let mut files = slots
        .iter()
        .map(|p| open_lock_file(p).map(Some))
        .collect::<anyhow::Result<Vec<_>>>()?;
    loop {
        for (file, slot) in files.iter_mut().zip(&slots) {
            if try_flock(file.as_ref().expect("taken only on return"), libc::LOCK_EX)? {
                return Ok(Some((file.take().expect("present"), slot.clone())));
            }
        }
        let Some(watch) = &watch else {
            return Err(req.busy(data.some_holder()));
        };
        if let Some(h) = data.some_holder() {
            (req.on_holder)(h);
        }
        match watch.wait(req.deadline, req.interrupt)? {
            Blocked::Acquired => {}
            Blocked::TimedOut => return Err(req.busy(data.some_holder())),
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
    inotify: File,
    pipe: (File, Arc<File>),
}

impl Closes {
    fn watch(paths: &[PathBuf]) -> anyhow::Result<Closes> {
        // SAFETY: plain syscalls; the fds are owned by Files right away.
        let inotify = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if inotify < 0 {
            return Err(io::Error::last_os_error()).context("inotify_init1 failed");
        }
        // SAFETY: fresh descriptor.
        let inotify = unsafe { File::from_raw_fd(inotify) };
        for p in paths {
            // Create it first, so the watch has something to watch.
            drop(open_lock_file(p)?);
            let c = cstring(p)?;
            // SAFETY: valid fd and path.
            let rc =
                unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), c.as_ptr(), libc::IN_CLOSE) };
            if rc < 0 {
                return Err(io::Error::last_os_error())
                    .with_context(|| format!("cannot watch {}", p.display()));
            }
        }
        let mut fds = [0; 2];
        // SAFETY: valid array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error()).context("pipe2 failed");
        }
        // SAFETY: fresh descriptors.
        let pipe = unsafe {
            (
                File::from_raw_fd(fds[0]),
                Arc::new(File::from_raw_fd(fds[1])),
            )
        };
        Ok(Closes { inotify, pipe })
    }

    /// Waits until a watched file is closed (`Acquired`: time to try again), the deadline, or
    /// the interrupt.
    fn wait(
        &self,
        deadline: Deadline,
        interrupt: &crate::signals::Interrupt,
    ) -> anyhow::Result<Blocked> {
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
            let mut fds = [
                libc::pollfd {
                    fd: self.inotify.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.pipe.0.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: valid array of pollfds.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e).context("poll failed");
            }
            if fds[0].revents != 0 {
                let mut buf = [0u8; 4096];
                while (&self.inotify).read(&mut buf).is_ok_and(|n| n > 0) {}
                return Ok(Blocked::Acquired);
            }
        }
    }
}

extern "C" fn wake_handler(_: libc::c_int) {}

/// A SIGALRM handler installed without SA_RESTART, so that a thread-directed SIGALRM makes a
/// blocked flock return EINTR instead of being restarted.
fn install_wake_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction with a valid handler and an empty mask is well-formed; the
        // handler does nothing, so it is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = wake_handler as *const () as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        }
    });
}

/// Blocks in `op` until acquired, `deadline`, or the interrupt. A helper thread
/// sleeps until the deadline (or is woken by the interrupt) and then signals this thread,
/// repeating every 10 ms until this thread is out of the call, which closes the race where the
/// signal lands just before `flock` starts.
fn blocking_lock(
    file: &File,
    op: LockOp,
    deadline: Deadline,
    interrupt: &crate::signals::Interrupt,
) -> anyhow::Result<Blocked> {
    install_wake_handler();
    // SAFETY: pthread_self cannot fail; the id stays valid until this function joins the helper.
    let me = unsafe { libc::pthread_self() };
    let state = Arc::new((Mutex::new(Alarm::default()), Condvar::new()));
    let waker_state = state.clone();
    let _guard = interrupt.on_fire(move || {
        waker_state
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .interrupted = true;
        waker_state.1.notify_all();
    });
    let helper_state = state.clone();
    let until = match deadline {
        Deadline::At(t) => Some(t),
        Deadline::Now => Some(Instant::now()),
        Deadline::Never => None,
    };
    let helper = std::thread::Builder::new()
        .name("dlock-flock-alarm".into())
        .spawn(move || alarm_thread(&helper_state, me, until))?;

    let result = loop {
        if let Some(sig) = interrupt.fired() {
            break Ok(Blocked::Interrupted(sig));
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            break Ok(Blocked::TimedOut);
        }
        if op.call(file, true) == 0 {
            break Ok(Blocked::Acquired);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            break Err(anyhow::Error::new(e).context("lock failed"));
        }
    };
    state.0.lock().unwrap_or_else(|e| e.into_inner()).done = true;
    state.1.notify_all();
    let _ = helper.join();
    result
}

#[derive(Default)]
struct Alarm {
    done: bool,
    interrupted: bool,
}

fn alarm_thread(state: &(Mutex<Alarm>, Condvar), target: libc::pthread_t, until: Option<Instant>) {
    let (lock, cvar) = state;
    let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if s.done {
            return;
        }
        let due = s.interrupted || until.is_some_and(|t| Instant::now() >= t);
        let wait = if due {
            // SAFETY: `target` is alive until it sets `done` and joins us.
            unsafe { libc::pthread_kill(target, libc::SIGALRM) };
            Some(Duration::from_millis(10))
        } else {
            until.map(|t| t.saturating_duration_since(Instant::now()))
        };
        s = match wait {
            Some(d) => cvar.wait_timeout(s, d).unwrap_or_else(|e| e.into_inner()).0,
            None => cvar.wait(s).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// What `/proc/locks` says about one inode's flocks.
struct ProcLocks {
    /// Every process holding a flock on it.
    holders: Vec<ProcLock>,
    /// Processes blocked on its flock or its gate.
    waiters: u64,
}

struct ProcLock {
    pid: u32,
    /// `LOCK_EX` (else `LOCK_SH`).
    write: bool,
}

/// Reads `/proc/locks` for the locks on (dev, ino). Lines look like
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`, with `->` after the id for a blocked
/// waiter; the gate shows as `OFDLCK` (pid -1).
fn proc_locks(dev: u64, ino: u64) -> anyhow::Result<ProcLocks> {
    let text = std::fs::read_to_string("/proc/locks").context("cannot read /proc/locks")?;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let mut out = ProcLocks {
        holders: Vec::new(),
        waiters: 0,
    };
    for line in text.lines() {
        let mut fields = line.split_whitespace().skip(1).peekable();
        let waiting = fields.peek() == Some(&"->");
        if waiting {
            fields.next();
        }
        let f: Vec<&str> = fields.collect();
        if f.len() < 5 || f[4] != want {
            continue;
        }
        match (f[0], waiting) {
            ("FLOCK", false) => out.holders.extend(f[3].parse().ok().map(|pid| ProcLock {
                pid,
                write: f[2] == "WRITE",
            })),
            // A gate holder is also blocked on (or past) the flock, and counted there.
            ("FLOCK", true) | ("OFDLCK", true) => out.waiters += 1,
            _ => {}
        }
    }
    Ok(out)
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
