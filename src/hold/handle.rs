//! Handles: how `dlock release` (and nothing else) reaches the holder process that `dlock
//! acquire` left behind. A handle is the path of the holder's Unix socket,
//! `DIR/h-<16 hex digits>.sock`, in a directory private to the user (0700, owned by them):
//! `$XDG_RUNTIME_DIR/dlock` when that is set, else `/tmp/dlock-<uid>`. Both ends check the
//! other's credentials (`SO_PEERCRED`): the holder serves only its own user, and `release` talks
//! only to a holder of its own user, so a handle never lets another user release someone's lock
//! or pose as its holder.
//!
//! When a holder ends without being asked (the lock was lost, or given up after `--max-hold`),
//! it leaves `h-….end` beside the socket: the one line `release` reports, and its exit code.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exit::Usage;

/// The longest message either side reads.
const MAX_MESSAGE: u64 = 64 << 10;

/// The holder's directory for this user, created (0700) if missing: `$XDG_RUNTIME_DIR/dlock`
/// when that is private to the user, else `/tmp/dlock-<uid>`. One that another user could write
/// to or planted (a squatter who made `/tmp/dlock-<uid>` first) is passed over for
/// `/tmp/dlock-<uid>.1` … `.8`, then for a new one with a random name: a handle names its
/// directory, so `release` finds any of them.
pub(crate) fn runtime_dir() -> anyhow::Result<PathBuf> {
    let uid = crate::sys::euid();
    if let Some(base) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && base.is_absolute()
        && private_to_us(&base)
        && let Ok(dir) = ours(base.join("dlock"))
    {
        return Ok(dir);
    }
    let tmp = format!("/tmp/dlock-{uid}");
    let mut last = None;
    for n in 0..=8 {
        let dir = match n {
            0 => PathBuf::from(&tmp),
            n => PathBuf::from(format!("{tmp}.{n}")),
        };
        match ours(dir) {
            Ok(dir) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    for _ in 0..8 {
        let dir = PathBuf::from(format!("{tmp}-{}", random_hex()?));
        if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_ok() && private_to_us(&dir) {
            return Ok(dir);
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("cannot make a directory for the handle")))
}

/// `dir`, created (0700) if missing, if it is private to this user.
fn ours(dir: PathBuf) -> anyhow::Result<PathBuf> {
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("cannot create {}", dir.display())));
        }
    }
    if !private_to_us(&dir) {
        anyhow::bail!(
            "refusing {}: not a directory of uid {} closed to other users",
            dir.display(),
            crate::sys::euid()
        );
    }
    Ok(dir)
}

/// 16 random hex digits.
fn random_hex() -> anyhow::Result<String> {
    let mut id = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .map_err(|e| anyhow::Error::new(e).context("cannot read /dev/urandom"))?;
    Ok(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `dir` is a real directory (not a symlink) of this user that no other user can enter.
fn private_to_us(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.file_type().is_dir() && m.uid() == crate::sys::euid() && m.mode() & 0o077 == 0
    })
}

/// A new handle's socket, listening: bound in [`runtime_dir`] with mode 0600.
pub(crate) fn listen() -> anyhow::Result<(PathBuf, UnixListener)> {
    let dir = runtime_dir()?;
    prune_end_files(&dir);
    let path = dir.join(format!("h-{}.sock", random_hex()?));
    let listener = bind(&path)?;
    Ok((path, listener))
}

/// A socket listening at `path`, mode 0600. It is bound under a temporary name and renamed
/// into place, so the path appears only once the socket listens: a `release` that finds it
/// never meets the moment between `bind` and `listen`, when a connection is refused as if the
/// holder were gone (a holder putting back a socket a cleaner removed raced `release` so).
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    // Short: a socket's path must fit in 108 bytes, and the handle's own name is 21.
    let temporary = path.with_file_name(format!(".n-{}", &random_hex()?[..8]));
    let failed = |e: io::Error| {
        let _ = std::fs::remove_file(&temporary);
        anyhow::Error::new(e).context(format!("cannot listen on {}", path.display()))
    };
    let listener = UnixListener::bind(&temporary).map_err(failed)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(failed)?;
    Ok(listener)
}

/// How often a holder looks whether its socket is still there.
pub(crate) const SOCKET_CHECK: Duration = Duration::from_secs(1);

/// A new listener when the socket at `path` is gone (a cleaner such as systemd-tmpfiles or
/// logind removed it, or its whole directory), so that `release` still reaches the holder;
/// `None` while it is there, or when it cannot be put back (the directory is no longer private
/// to this user: then `release` says the holder is gone, and the lock ends with the owner).
pub(crate) fn rebind_if_gone(path: &Path) -> Option<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        _ => return None,
    }
    let dir = path.parent()?;
    let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    if !private_to_us(dir) {
        return None;
    }
    bind(path).ok()
}

/// The file a holder leaves for `release` when it ended by itself.
pub(crate) fn end_file(socket: &Path) -> PathBuf {
    socket.with_extension("end")
}

/// Why a holder ended by itself, for `release`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Reply {
    /// `release`'s exit code: 0 held throughout, 79 lost or given up.
    pub code: u8,
    /// The line to print (empty for none).
    pub message: String,
}

/// Writes `reply` as the end file of `socket` (0600, atomically: a reader sees all or nothing).
pub(crate) fn write_end(socket: &Path, reply: &Reply) {
    use std::os::unix::fs::OpenOptionsExt;
    let end = end_file(socket);
    let tmp = end.with_extension("end.tmp");
    let _ = std::fs::remove_file(&tmp);
    let text = serde_json::to_string(reply).unwrap_or_default();
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if written.is_ok() {
        let _ = std::fs::rename(&tmp, &end);
    }
}

/// The end file at `end`, if it is a regular file (never followed through a symlink, never a
/// FIFO that would block) of at most [`MAX_MESSAGE`] bytes holding a reply; a code other than
/// 0 or 79 reads as 79 (it was not held throughout, as far as anyone can tell).
pub(crate) fn read_end(end: &Path) -> Option<Reply> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(end)
        .ok()?;
    if !file.metadata().ok()?.file_type().is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_MESSAGE).read_to_end(&mut bytes).ok()?;
    let mut reply: Reply = serde_json::from_slice(&bytes).ok()?;
    if reply.code != 0 {
        reply.code = crate::exit::LOST;
    }
    Some(reply)
}

/// End files older than this are removed when a holder starts: their lock ended long ago and
/// nobody asked.
const END_FILES_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Removes the end files in `dir` older than [`END_FILES_KEPT`].
fn prune_end_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > END_FILES_KEPT);
        let name = e.file_name();
        let name = name.to_string_lossy();
        // And a socket's temporary name, left by a holder killed between bind and rename.
        if old && (name.starts_with("h-") && name.ends_with(".end") || name.starts_with(".n-")) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Checks a handle's form and its directory; the socket's path.
pub(crate) fn parse(handle: &str) -> Result<PathBuf, Usage> {
    let bad = |why: &str| {
        Usage(format!(
            "bad handle '{}': {why}",
            crate::report::clean(handle, 200)
        ))
    };
    let path = Path::new(handle);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| bad("not a path that dlock acquire prints"))?;
    let well_formed = path.is_absolute()
        && name.len() == "h-.sock".len() + 16
        && name.starts_with("h-")
        && name.ends_with(".sock")
        && name[2..18]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    if !well_formed {
        return Err(bad("not a path that dlock acquire prints"));
    }
    let dir = path.parent().ok_or_else(|| bad("no directory"))?;
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(bad(
            "it belongs to another user (its directory cannot be entered)",
        )),
        Err(_) => Err(bad(
            "its directory is gone (a handle from before a reboot?)",
        )),
        Ok(m) if m.uid() != crate::sys::euid() => Err(bad("it belongs to another user")),
        Ok(_) if !private_to_us(dir) => Err(bad("its directory is open to other users")),
        Ok(_) => Ok(path.to_path_buf()),
    }
}

/// What `release` asks.
pub(crate) const RELEASE: &str = "release";

/// Sends `request` to the holder at `socket` and reads its reply. `Ok(None)` when no holder
/// answers there (none listens, or it closed without a reply).
pub(crate) fn ask(socket: &Path, request: &str, wait: Duration) -> anyhow::Result<Option<Reply>> {
    let mut stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
            ) =>
        {
            return Ok(None);
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("cannot reach {}", socket.display())));
        }
    };
    let (_, uid) = crate::sys::peer_credentials(stream.as_fd())?;
    if uid != crate::sys::euid() {
        anyhow::bail!(Usage(format!(
            "the holder at {} is another user's (uid {uid})",
            socket.display()
        )));
    }
    stream.set_read_timeout(Some(wait))?;
    stream.write_all(format!("{request}\n").as_bytes())?;
    let mut line = String::new();
    match BufReader::new(stream.take(MAX_MESSAGE)).read_line(&mut line) {
        Ok(0) => Ok(None),
        Ok(_) => Ok(serde_json::from_str(&line).ok()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context("no reply from the holder process")),
    }
}

/// The holder's side of a connection: the request, if the peer is this user; `None` for another
/// user (closed at once) or a peer that says nothing within a second.
pub(crate) fn read_request(stream: &UnixStream) -> Option<String> {
    let (_, uid) = crate::sys::peer_credentials(stream.as_fd()).ok()?;
    if uid != crate::sys::euid() {
        return None;
    }
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_MESSAGE))
        .read_line(&mut line)
        .ok()?;
    Some(line.trim_end().to_string())
}

/// Sends `reply` on a request's connection.
pub(crate) fn answer(mut stream: &UnixStream, reply: &Reply) {
    let text = serde_json::to_string(reply).unwrap_or_default() + "\n";
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_of_another_form_are_refused() {
        for h in [
            "",
            "h-0123456789abcdef.sock",
            "/tmp/x.sock",
            "/tmp/h-0123456789ABCDEF.sock",
            "/tmp/h-0123456789abcde.sock",
            "/tmp/h-0123456789abcdefg.sock",
            "/tmp/h-0123456789abcdef.end",
        ] {
            assert!(parse(h).is_err(), "{h}");
        }
        // The right form in a directory other users can write to.
        assert!(parse("/tmp/h-0123456789abcdef.sock").is_err());
    }
}
