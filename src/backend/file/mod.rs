//! The file backend: `flock(2)` on `<dir>/<escaped key>.lock`, the zero-setup default.
//!
//! - The kernel is the lock server: it releases on process death, and a blocked `flock` is the
//!   waiting (no polling). A deadline or a signal interrupts the blocked call with a thread-directed
//!   signal whose handler has no `SA_RESTART`, as `flock -w` does with SIGALRM.
//! - The lock file holds a small JSON document: the fencing counter and the holder's metadata,
//!   written while holding. The first token of a new file is the wall clock in microseconds, so
//!   tokens keep growing even after `break` (or a cleaner) removed the file.
//! - `status` reads `/proc/locks` for the truth (held, by which pid, how many wait) and never
//!   takes the lock itself, so it cannot make a concurrent `--no-wait` fail.
//! - `break` unlinks the file. The holder notices that its fd's inode is no longer the path's and
//!   treats the lock as lost; a waiter that gets the orphaned inode checks the same and retries.
//!
//! This module does not know about children or renewal schedules; see `keeper` and `supervise`.

mod broken;
mod ground;
mod history;
mod paths;
mod proc_locks;
mod retention;
mod slots;
mod wait;

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub(crate) use self::paths::{default_dir, file_name};
use self::paths::{
    ensure_private_dir, is_shared_dir, open_existing, open_lock_file, parse_url, still_linked,
};
use self::proc_locks::proc_locks;
use self::slots::take_slot;
use self::wait::{Blocked, LockOp, blocking_lock, try_flock, try_gate, unlock_gate};
use super::{Backend, BreakHow, Broken, Lease, RenewError, Request};
use crate::backend::Grant;
use crate::backend::ground::{Finding, Verdict, warn_once as ground_warn_once};
use crate::clock::BootInstant;
use crate::exit::{Interrupted, Unsound, Usage};
use crate::model::{BackendKind, Key};
use crate::model::{Deadline, Holder, Mode, Record, Status};

/// How often a holder checks that its lock file was not removed (`dlock break`).
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// The most of a lock file that is read: its JSON is a few hundred bytes (holder records are
/// capped), so anything longer was not written by dlock.
const MAX_DATA: usize = 1 << 20;

/// Locks as files in one directory.
pub(crate) struct FileBackend {
    dir: PathBuf,
    /// Other users may write to the directory: lock files are created for them too.
    shared: bool,
    /// What the directory's filesystem does to flock, once judged ([`ground::for_run`]).
    ground: std::cell::OnceCell<Option<Finding>>,
}

impl FileBackend {
    /// `urls` empty: the per-user default directory; one `file:///dir` URL: that directory.
    /// Creates the directory if needed when `create` (runs that take a lock); else a URL's
    /// directory that does not exist is [`Unavailable`](crate::exit::Unavailable), one line
    /// (`status`, `log`, `break` with a mistyped path used to create it, and said "free").
    /// Refuses a default directory that another user could have planted (a symlink, someone
    /// else's, or writable by others).
    pub(crate) fn open(urls: &[String], create: bool) -> anyhow::Result<FileBackend> {
        let dir = match urls {
            [] => {
                let dir = default_dir();
                ensure_private_dir(&dir)?;
                dir
            }
            [url] => {
                let dir = parse_url(url)?;
                if !create && !dir.is_dir() {
                    return Err(crate::exit::Unavailable(format!(
                        "no lock directory {} (nothing has run with this URL yet, or the path \
                         is mistyped: `dlock run` and `dlock acquire` create it)",
                        crate::report::clean(&dir.display().to_string(), 300)
                    ))
                    .into());
                }
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .create(&dir)
                    .with_context(|| format!("cannot create lock directory {}", dir.display()))?;
                dir
            }
            _ => return Err(Usage("the file backend takes one --url".into()).into()),
        };
        let shared = is_shared_dir(&dir);
        Ok(FileBackend {
            dir,
            shared,
            ground: std::cell::OnceCell::new(),
        })
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(file_name(key))
    }

    /// `LOCK_EX` on the lock file. Uncontended: one open and one flock. Contended: wait holding
    /// the gate, so that no new shared holder gets in meanwhile (writer preference).
    fn acquire_exclusive(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let path = self.path(req.key);
        loop {
            let file = open_lock_file(&path, self.shared)?;
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
            let token = next_token(data.fence, &path)?;
            data.fence = Some(token);
            data.holder = Some(Entry {
                record: req.holder.clone(),
                fencing_token: Some(token),
            });
            data.sharers.clear();
            data.limit = None;
            // Everyone a break marked has let go of the flock we now hold. Cleared before our
            // record is written: a break that sees our token writes its mark after this.
            broken::clear(&path);
            write_data(&file, &data).with_context(|| format!("cannot write {}", path.display()))?;
            return Ok(Box::new(FileLease {
                grant: Grant {
                    fence: data.fence,
                    acquired_at,
                    held_back_until: None,
                },
                file,
                path,
                data,
                slot: None,
                shared_dir: self.shared,
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
        let file = open_lock_file(&path, self.shared)?;
        let acquired_at = BootInstant::now();
        if !try_gate(&file)? {
            if req.deadline == Deadline::Now {
                let data = read_data(&file).unwrap_or_default();
                return Err(data
                    .mismatch(req)
                    .unwrap_or_else(|| req.busy(data.some_holder().as_ref())));
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
            .retain(|h| live.iter().any(|l| Some(l.pid) == h.record.pid && !l.write));
        // We hold LOCK_SH: a recorded exclusive holder is one that died without clearing it.
        data.holder = None;
        if let Some(e) = data.mismatch(req) {
            return Err(e);
        }
        let slot = match req.mode {
            Mode::Limit(n) => {
                let Some(slot) = take_slot(&path, n, req, &data, self.shared)? else {
                    return Ok(None);
                };
                Some(slot)
            }
            _ => None,
        };
        let token = next_token(data.fence, &path)?;
        data.fence = Some(token);
        data.limit = req.mode.limit();
        data.sharers.push(Entry {
            record: req.holder.clone(),
            fencing_token: Some(token),
        });
        write_data(&file, &data).with_context(|| format!("cannot write {}", path.display()))?;
        unlock_gate(&file);
        Ok(Some(Box::new(FileLease {
            grant: Grant {
                fence: data.fence,
                acquired_at,
                held_back_until: None,
            },
            file,
            path,
            data,
            slot,
            shared_dir: self.shared,
        })))
    }
}

impl Backend for FileBackend {
    /// The lock files in the directory: an escaped name is its key; a hashed one (a long key)
    /// names its key in the record inside.
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        // Lock files stay after use (see docs/backends.md): only those someone holds or waits
        // for now, as /proc/locks says, are candidates.
        let locked = proc_locks::locked_inodes()?;
        let mut keys = Vec::new();
        let entries = std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot list {}", self.dir.display()))?;
        for entry in entries.flatten() {
            if keys.len() >= super::MAX_LISTED {
                break;
            }
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
                continue;
            };
            let busy = entry
                .metadata()
                .is_ok_and(|m| locked.contains(&proc_locks::inode_id(m.dev(), m.ino())));
            if !busy {
                continue;
            }
            let key = match super::unescape_key(stem) {
                Some(k) if !stem.contains('~') => Some(k),
                _ => open_existing(&entry.path())
                    .ok()
                    .and_then(|f| read_data(&f).ok())
                    .and_then(|d| d.some_holder().and_then(|h| h.key.clone()))
                    .and_then(|k| Key::new(&k).ok()),
            };
            keys.extend(key);
        }
        Ok(keys)
    }

    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        history::keys(&self.dir)
    }

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
        // One statfs per process; a filesystem whose flock is local or lost silently warns
        // once, one where it does not even exclude here refuses (78).
        if let Some(f) = self.ground.get_or_init(|| ground::for_run(&self.dir)) {
            match f.verdict {
                Verdict::Unsafe => return Err(Unsound(f.sentence()).into()),
                Verdict::Warn => ground_warn_once(f),
                _ => {}
            }
        }
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
            server_name: Some(location.clone()),
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
                data.holder
                    .as_ref()
                    .filter(|h| h.record.pid == Some(lock.pid))
            } else {
                data.sharers.iter().find(|h| h.record.pid == Some(lock.pid))
            };
            let mut holder = match recorded {
                Some(h) => h.holder(),
                // Past the shared lock but not yet recorded: still entering (or waiting for a
                // semaphore slot).
                None if !lock.write => {
                    status.waiters = status.waiters.map(|w| w + 1);
                    continue;
                }
                // An exclusive flock with no record: `flock(1)` or an application's own lock
                // (or, for an instant, a dlock between its flock and its record).
                None => Holder {
                    record: Record {
                        pid: Some(lock.pid),
                        ..Record::default()
                    },
                    foreign: Some("a flock with no dlock record".into()),
                    ..Holder::default()
                },
            };
            holder.host.get_or_insert_with(super::hostname);
            status.holders.push(holder);
        }
        if let Some(upto) = broken::read(&path) {
            for h in &mut status.holders {
                h.broken = h.fencing_token.is_some_and(|t| t <= upto);
            }
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
        let _ = std::fs::remove_file(history::path_of(&path));
        broken::clear(&path);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => Ok(()),
        }
    }

    fn prune(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        retention::prune(&self.dir, self.shared, older_than, most)
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        history::read(&self.path(key))
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        history::end(&self.path(key), end, self.shared)
    }

    /// The directory (its owner and mode, which decide whether lock files are shared), its
    /// filesystem and what flock is there ([`ground`]).
    fn doctor(&self, _ttl: Duration) -> anyhow::Result<Vec<Finding>> {
        let mut findings = vec![paths::describe_dir(&self.dir, self.shared)?];
        findings.extend(ground::doctor(&self.dir));
        Ok(findings)
    }

    /// A safe break's wait, confirmed by the kernel: a status (one scan of `/proc/locks`) that
    /// no longer shows a broken holder is believed only if the lock can be taken shared at once
    /// (and is let go at once), or its record names a holder that is none of the broken ones.
    /// `/proc/locks` is read in pieces, and entries that change between two pieces can be
    /// skipped: in a busy test run one scan missed the broken holder while it still held the
    /// lock, and `break --wait` said the lock was free while the command ran.
    fn await_broken(&self, key: &Key, broken: &Broken, deadline: Deadline) -> anyhow::Result<bool> {
        loop {
            if !broken.still_held(&self.status(key)?) && broken::let_go(&self.path(key), broken)? {
                return Ok(true);
            }
            match deadline.remaining() {
                Some(left) if left.is_zero() => return Ok(false),
                Some(left) => std::thread::sleep(left.min(super::BREAK_LOOK_EVERY)),
                None => std::thread::sleep(super::BREAK_LOOK_EVERY),
            }
        }
    }

    /// Safe: a mark beside the lock file ([`broken`]) that its holders see at their next
    /// check; they let go of the flock once their commands have stopped. Forced: the lock file
    /// is unlinked, and a new one can be locked at once.
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        let mut status = self.status(key)?;
        if !status.held {
            return Ok(Broken::now(status));
        }
        let path = self.path(key);
        if how == BreakHow::Force {
            // A mark of an earlier break goes too: the new lock file's counter starts afresh.
            broken::clear(&path);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {}", path.display()));
                }
                _ => {}
            }
            return Ok(Broken::now(status));
        }
        let upto = status
            .holders
            .iter()
            .filter_map(|h| h.fencing_token)
            .max()
            .context("the holders have no fencing token to mark as broken")?;
        broken::write(&path, upto)?;
        for h in &mut status.holders {
            h.broken = true;
        }
        Ok(Broken {
            status,
            frees: super::Frees::WhenStopped(CHECK_EVERY),
            keep: None,
        })
    }
}

/// A held flock (and for a semaphore, its slot). Dropping it closes the fds, which releases
/// the lock.
struct FileLease {
    file: File,
    path: PathBuf,
    data: LockData,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    grant: Grant,
    /// A semaphore's slot file, held `LOCK_EX`.
    slot: Option<(File, PathBuf)>,
    /// Whether the lock directory is shared with other users (see [`open_lock_file`]).
    shared_dir: bool,
}

impl FileLease {
    fn exclusive(&self) -> bool {
        self.data.holder.is_some()
    }
}

impl Lease for FileLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        None
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
        if let (Some(upto), Some(mine)) = (broken::read(&self.path), self.grant.fence)
            && mine <= upto
        {
            return Err(RenewError::Lost(format!(
                "dlock break told it to stop ({} is there)",
                broken::path_of(&self.path).display()
            )));
        }
        Ok(())
    }

    fn begin_run(
        &mut self,
        start: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<crate::history::Begun> {
        if !self.exclusive() {
            return Ok(crate::history::Begun::NotKept);
        }
        history::begin(&self.path, start, once_per, self.shared_dir)
    }

    /// The end is appended before the flock is let go: the next holder's start comes after it.
    fn release_with_end(self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        let wrote = self.exclusive() && history::end(&self.path, end, self.shared_dir).is_ok();
        self.release().map(|()| wrote)
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

/// A holder as the lock file keeps it: its record, and the token it got (each shared holder
/// has its own).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Entry {
    #[serde(flatten)]
    record: Record,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fencing_token: Option<u64>,
}

impl Entry {
    /// The holder `status` shows.
    fn holder(&self) -> Holder {
        Holder {
            record: self.record.clone(),
            fencing_token: self.fencing_token,
            ..Holder::default()
        }
    }
}

/// What the lock file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct LockData {
    /// The last fencing token handed out.
    fence: Option<u64>,
    /// The exclusive holder, `None` when released or shared.
    holder: Option<Entry>,
    /// The shared holders or semaphore slot holders (may include ones that have gone: only
    /// those whose flock shows in /proc/locks count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sharers: Vec<Entry>,
    /// The semaphore's size while it has holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit: Option<u32>,
}

impl LockData {
    /// Someone who holds it, for messages.
    pub(super) fn some_holder(&self) -> Option<Holder> {
        self.holder
            .as_ref()
            .or(self.sharers.first())
            .map(Entry::holder)
    }

    /// How the recorded holders hold the lock ("exclusive", "shared", "--limit 3").
    fn held_as(&self) -> Option<Mode> {
        if let Some(h) = &self.holder {
            return Some(h.record.mode.unwrap_or(Mode::Exclusive));
        }
        self.sharers
            .first()
            .map(|h| h.record.mode.unwrap_or(Mode::Shared))
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

/// Reads the lock file's document (at most [`MAX_DATA`] bytes, from offset 0, without moving
/// the fd's cursor). An empty file is a default document; anything unparsable is an error,
/// which callers treat as unknown metadata.
fn read_data(file: &File) -> anyhow::Result<LockData> {
    let mut buf = vec![0u8; MAX_DATA];
    let mut len = 0;
    while len < buf.len() {
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let buf = &buf[..len];
    if buf.iter().all(u8::is_ascii_whitespace) {
        return Ok(LockData::default());
    }
    Ok(serde_json::from_slice(buf)?)
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

/// How far ahead of the clock a fencing counter may be before it is taken for one written by
/// hand: a year of microseconds.
const AHEAD_LIMIT_US: u64 = 365 * 24 * 3600 * 1_000_000;

/// The next fencing token from the lock file's counter `stored`: one more than it, and never
/// less than the clock in microseconds. In a shared directory every user must be able to write
/// the lock file (to record itself), so any user can also write its counter: one rewound by
/// hand (`{"fence":5}`) is overtaken by the clock, which every earlier token followed, so tokens
/// still grow (unless the clock itself stepped back by more than the time since the last one).
/// A counter far ahead of the clock is refused rather than followed: tokens drawn from a forged
/// `u64::MAX` would stop growing (or wrap to 0).
fn next_token(stored: Option<u64>, path: &Path) -> anyhow::Result<u64> {
    let now = clock_seed();
    match stored {
        None => Ok(retention::above_floor(path, now, AHEAD_LIMIT_US)),
        Some(f) if f > now.saturating_add(AHEAD_LIMIT_US) => Err(anyhow::anyhow!(
            "the fencing counter in {} ({f}) is more than a year ahead of the clock ({now} µs): written by hand? Tokens from it would stop growing; removing the file while the lock is free starts the counter again from the clock",
            path.display()
        )),
        Some(f) => Ok(f.saturating_add(1).max(now)),
    }
}

/// The lock is busy: an error if its holders use another mode or the request does not wait;
/// else tells the waiting line who holds it.
fn about_to_wait(file: &File, req: &Request<'_>) -> anyhow::Result<()> {
    let data = read_data(file).unwrap_or_default();
    if let Some(e) = data.mismatch(req) {
        return Err(e);
    }
    if req.deadline == Deadline::Now {
        return Err(req.busy(data.some_holder().as_ref()));
    }
    if let Some(holder) = data.some_holder() {
        (req.on_holder)(&holder);
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
            Err(req.busy(data.some_holder().as_ref()))
        }
        Blocked::Interrupted(sig) => Err(Interrupted(sig).into()),
    }
}
