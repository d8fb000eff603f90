//! The critical section the clients run under the lock. It writes one record, rewritten in
//! place at every heartbeat (every 5 ms): `START LAST TOKEN FENCE HOLDER`, where START and LAST
//! are CLOCK_MONOTONIC nanoseconds, TOKEN the fencing token it saw (`-`: none), FENCE what the
//! fenced resource said (`A` accepted, `R` refused, `N` not asked) and HOLDER the pid of an
//! `acquire` holder (0 under `dlock run`). A section killed at any point leaves its last
//! heartbeat: its end is its last sign of life.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use crate::procs::now_ns;

/// How often the section shows it is alive.
const HEARTBEAT: Duration = Duration::from_millis(5);

/// One parsed record.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub start_ns: u64,
    pub end_ns: u64,
    pub token: Option<u64>,
    pub fence: char,
    pub holder: i32,
}

/// Reads a record back (None if the section never started, or the record is torn).
pub(crate) fn read_record(path: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(path).ok()?;
    let f: Vec<&str> = text.split_whitespace().collect();
    if f.len() != 5 {
        return None;
    }
    Some(Record {
        start_ns: f[0].parse().ok()?,
        end_ns: f[1].parse().ok()?,
        token: f[2].parse().ok(),
        fence: f[3].chars().next()?,
        holder: f[4].parse().ok()?,
    })
}

/// The fenced resource: a file holding the highest token it accepted. A write with a lower
/// token is refused (and counted by the checker); the file is locked while it is read and
/// written. Returns `A` or `R`.
fn fence(path: &Path, token: u64) -> char {
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    else {
        return 'N';
    };
    // SAFETY: flock on an fd we own.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    let mut text = String::new();
    let _ = f.read_to_string(&mut text);
    let seen: u64 = text.trim().parse().unwrap_or(0);
    if token < seen {
        return 'R';
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = write!(f, "{token}");
    'A'
}

/// Records the start, asks the fenced resource, then beats until `dur` has passed.
fn beat(record: &Path, dur: Duration, fence_path: &str, token: Option<u64>, holder: u32) {
    let start = now_ns();
    let Ok(file) = File::create(record) else {
        return;
    };
    let tok = token.map_or("-".to_string(), |t| t.to_string());
    let line = |last: u64, fence: char| format!("{start} {last:020} {tok} {fence} {holder}\n");
    let _ = file.write_all_at(line(start, 'N').as_bytes(), 0);
    let verdict = match token {
        Some(t) if fence_path != "-" => fence(Path::new(fence_path), t),
        _ => 'N',
    };
    loop {
        let now = now_ns();
        let _ = file.write_all_at(line(now, verdict).as_bytes(), 0);
        if Duration::from_nanos(now.saturating_sub(start)) >= dur {
            return;
        }
        std::thread::sleep(HEARTBEAT);
    }
}

/// `section RECORD DUR_MS FENCE`: the command of a `dlock run`.
pub(crate) fn run_section(args: &[String]) -> i32 {
    let [record, dur, fence_path] = args else {
        eprintln!("nemesis: section RECORD DUR_MS FENCE");
        return 2;
    };
    let dur = Duration::from_millis(dur.parse().unwrap_or(50));
    let token = std::env::var("DLOCK_FENCING_TOKEN")
        .ok()
        .and_then(|t| t.parse().ok());
    beat(Path::new(record), dur, fence_path, token, 0);
    0
}

/// `acquire-section RECORD DUR_MS FENCE DLOCK ARGS...`: runs `DLOCK acquire ARGS --format
/// json` (this process is the owner), the section, then `DLOCK release`; exits with release's
/// status (75 if the lock was not acquired).
pub(crate) fn acquire_section(args: &[String]) -> i32 {
    let [record, dur, fence_path, dlock, rest @ ..] = args else {
        eprintln!("nemesis: acquire-section RECORD DUR_MS FENCE DLOCK ARGS...");
        return 2;
    };
    let dur = Duration::from_millis(dur.parse().unwrap_or(50));
    let out = std::process::Command::new(dlock)
        .arg("acquire")
        .args(rest)
        .args(["--format", "json"])
        .stderr(std::process::Stdio::inherit())
        .output();
    let Ok(out) = out else { return 70 };
    if !out.status.success() {
        return out.status.code().unwrap_or(70);
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return 70;
    };
    let token = v["fencing_tokens"][0].as_u64();
    let holder = v["holder_pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or(0);
    let Some(handle) = v["handle"].as_str() else {
        return 70;
    };
    beat(Path::new(record), dur, fence_path, token, holder);
    std::process::Command::new(dlock)
        .args(["release", "--handle", handle])
        .status()
        .ok()
        .and_then(|s| s.code())
        .unwrap_or(70)
}
