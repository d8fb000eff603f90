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
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Backend, Deadline, Holder, Lease, RenewError, Request, Status};
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
}

impl Backend for FileBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::File
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let path = self.path(req.key);
        loop {
            let file = open_lock_file(&path)?;
            let acquired_at = BootInstant::now();
            if !try_flock(&file, libc::LOCK_EX)? {
                if req.deadline == Deadline::Now {
                    return Err(req.busy(holder_of(&file).as_ref()));
                }
                if let Some(holder) = read_data(&file).ok().and_then(|d| d.holder) {
                    (req.on_holder)(&holder);
                }
                match blocking_flock(&file, req.deadline, req.interrupt)? {
                    Blocked::Acquired => {}
                    Blocked::TimedOut => return Err(req.busy(holder_of(&file).as_ref())),
                    Blocked::Interrupted(sig) => return Err(Interrupted(sig).into()),
                }
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
            write_data(&file, &data).with_context(|| format!("cannot write {}", path.display()))?;
            return Ok(Box::new(FileLease {
                file,
                path,
                data,
                acquired_at,
            }));
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
        if let Some(pid) = locks.holder_pid {
            status.held = true;
            let data = read_data(&file).unwrap_or_default();
            let mut holder = data
                .holder
                .filter(|h| h.pid == Some(pid))
                .unwrap_or(Holder {
                    pid: Some(pid),
                    fencing_token: data.fence,
                    ..Holder::default()
                });
            holder.host.get_or_insert_with(super::hostname);
            status.holders.push(holder);
        }
        Ok(status)
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

/// A held flock. Dropping it closes the fd, which releases the lock.
struct FileLease {
    file: File,
    path: PathBuf,
    data: LockData,
    acquired_at: BootInstant,
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
        match still_linked(&self.file, &self.path) {
            Ok(true) => Ok(()),
            Ok(false) => Err(RenewError::Lost(format!(
                "lock file {} was removed or replaced (dlock break?)",
                self.path.display()
            ))),
            Err(e) => Err(RenewError::Failed(e)),
        }
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
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
    /// The current holder, `None` when released.
    holder: Option<Holder>,
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

/// The holder recorded in the lock file, if readable.
fn holder_of(file: &File) -> Option<Holder> {
    read_data(file).ok().and_then(|d| d.holder)
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

/// Blocks in `flock(LOCK_EX)` until acquired, `deadline`, or the interrupt. A helper thread
/// sleeps until the deadline (or is woken by the interrupt) and then signals this thread,
/// repeating every 10 ms until this thread is out of the call, which closes the race where the
/// signal lands just before `flock` starts.
fn blocking_flock(
    file: &File,
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
        // SAFETY: valid fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            break Ok(Blocked::Acquired);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            break Err(anyhow::Error::new(e).context("flock failed"));
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

/// What `/proc/locks` says about one inode's flock.
struct ProcLocks {
    holder_pid: Option<u32>,
    waiters: u64,
}

/// Reads `/proc/locks` for the flock on (dev, ino). Lines look like
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF`, with `->` after the id for a blocked waiter.
fn proc_locks(dev: u64, ino: u64) -> anyhow::Result<ProcLocks> {
    let text = std::fs::read_to_string("/proc/locks").context("cannot read /proc/locks")?;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let mut out = ProcLocks {
        holder_pid: None,
        waiters: 0,
    };
    for line in text.lines() {
        let mut fields = line.split_whitespace().skip(1).peekable();
        let waiting = fields.peek() == Some(&"->");
        if waiting {
            fields.next();
        }
        let f: Vec<&str> = fields.collect();
        if f.len() < 5 || f[0] != "FLOCK" || f[4] != want {
            continue;
        }
        if waiting {
            out.waiters += 1;
        } else {
            out.holder_pid = f[3].parse().ok();
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
