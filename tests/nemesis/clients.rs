//! The clients: each takes one key in a loop through the real `dlock`, with a mix of modes —
//! clients 0 and 1 (mod 4) the exclusive key `x` with `--no-wait`, `--wait` or
//! `acquire`/`release`; client 2 the key `s` as a `--shared` reader, now and then as its
//! exclusive writer; client 3 the key `l` with `--limit 2`. A backend without `--shared` or
//! `--limit` (Redlock) takes those keys exclusively.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::faults::Rng;
use crate::procs::Proc;
use crate::targets::TTL;

/// What a client needs of its backend.
#[derive(Clone, Debug)]
pub(crate) struct Backend {
    pub name: &'static str,
    /// Each client's `--backend … --url …` (one for all where there is a single set).
    pub args: Vec<Vec<String>>,
    pub shared: bool,
    pub limit: bool,
}

/// The section a client is in now, for the process faults.
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    /// `dlock run`, or the `acquire-section` that owns an `acquire` holder.
    pub top: Proc,
    pub record: PathBuf,
    pub acquire: bool,
}

/// One attempt to enter a section (whether it entered is known from its record).
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub backend: &'static str,
    pub key: String,
    pub mode: String,
    pub client: usize,
    pub record: PathBuf,
    pub ended: String,
    /// `run --no-wait`, `run --wait` or `acquire`.
    pub via: &'static str,
}

/// How the limit key is shared.
pub(crate) const LIMIT: u32 = 2;

/// The key of `role` (`x`, `s` or `l`) for this campaign.
pub(crate) fn key(seed: u64, role: &str) -> String {
    format!("nemesis-{seed}-{}-{role}", std::process::id())
}

/// Runs client `c` of `b` until `deadline`; `slot` tells the faults what it holds.
pub(crate) fn run(
    b: &Backend,
    c: usize,
    seed: u64,
    deadline: Instant,
    dir: &Path,
    slot: &Mutex<Option<Holding>>,
) -> Vec<Attempt> {
    let me = std::env::current_exe().expect("the campaign's own path");
    let dlock = crate::util::DLOCK;
    let mut rng =
        Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15 ^ (c as u64) << 32 ^ crate::faults::hash(b.name));
    let records = dir.join("sections").join(b.name);
    std::fs::create_dir_all(&records).expect("the records' directory");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("logs").join(format!("{}-c{c}.log", b.name)))
        .expect("a client log");
    let mut attempts = Vec::new();
    for n in 0.. {
        if Instant::now() >= deadline {
            break;
        }
        let (role, mode, flags, acquire): (&str, String, Vec<&str>, bool) = match c % 4 {
            0 | 1 => match rng.below(3) {
                0 => ("x", "exclusive".into(), vec!["--no-wait"], false),
                1 => ("x", "exclusive".into(), vec!["--wait", "3s"], false),
                _ => ("x", "exclusive".into(), vec!["--wait", "3s"], true),
            },
            2 if b.shared && rng.below(4) != 0 => (
                "s",
                "shared".into(),
                vec!["--shared", "--wait", "3s"],
                false,
            ),
            2 => ("s", "exclusive".into(), vec!["--wait", "3s"], false),
            _ if b.limit => (
                "l",
                format!("limit:{LIMIT}"),
                vec!["--limit", "2", "--wait", "3s"],
                false,
            ),
            _ => ("l", "exclusive".into(), vec!["--wait", "3s"], false),
        };
        let key = key(seed, role);
        let record = records.join(format!("c{c}-{n}"));
        let fence = if mode == "exclusive" {
            dir.join("fences")
                .join(format!("{}-{role}", b.name))
                .display()
                .to_string()
        } else {
            "-".to_string()
        };
        // Most sections are short (30-250 ms); one in eight outlasts the lease's renewal
        // interval or the lease itself (0.8-2.5 s), so that a fault lands inside it.
        let dur = match rng.below(8) {
            0 => 800 + rng.below(1700),
            _ => 30 + rng.below(220),
        }
        .to_string();
        let rec = record.display().to_string();
        let mut common: Vec<String> = b.args.get(c).or(b.args.last()).cloned().unwrap_or_default();
        common.extend([
            "--ttl".into(),
            format!("{}ms", TTL.as_millis()),
            "-k".into(),
            key.clone(),
        ]);
        common.extend(flags.iter().map(|s| s.to_string()));
        let mut cmd = if acquire {
            let mut cmd = Command::new(&me);
            cmd.args(["acquire-section", &rec, &dur, &fence, dlock])
                .args(&common);
            cmd
        } else {
            let mut cmd = Command::new(dlock);
            cmd.arg("run").args(&common).arg("--").arg(&me);
            cmd.args(["section", &rec, &dur, &fence]);
            cmd
        };
        if let Some(lib) = crate::faults::faketime() {
            // The wall clock dlock sees is shifted by the backend's `clock_jump` faults; the
            // monotonic clocks (CLOCK_MONOTONIC, CLOCK_BOOTTIME) are left alone.
            cmd.env("LD_PRELOAD", lib)
                .env(
                    "FAKETIME_TIMESTAMP_FILE",
                    crate::faults::faketime_file(dir, b.name),
                )
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_CACHE_DURATION", "1");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.try_clone().map_or(Stdio::null(), Stdio::from))
            .process_group(0);
        let Ok(mut child) = cmd.spawn() else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let top = Proc::of(child.id() as i32);
        if let Some(top) = top {
            *slot.lock().unwrap() = Some(Holding {
                top,
                record: record.clone(),
                acquire,
            });
        }
        // A client stuck past the campaign's end (30 s of grace) is killed, and says so.
        let hard_stop = deadline + Duration::from_secs(30);
        let mut hung_state = '?';
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() > hard_stop => {
                    // Its state says why: `T` stopped, `S` waiting, `D` in the kernel.
                    hung_state = std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
                        .ok()
                        .and_then(|s| s.rfind(')').and_then(|i| s[i + 1..].trim().chars().next()))
                        .unwrap_or('?');
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break None,
            }
        };
        *slot.lock().unwrap() = None;
        use std::os::unix::process::ExitStatusExt;
        let ended = match status {
            None => format!("hung:{hung_state}"),
            Some(s) => match (s.code(), s.signal()) {
                (Some(0), _) => "ok".into(),
                (Some(79), _) => "lost".into(),
                (Some(code), _) => format!("exit:{code}"),
                (None, Some(sig)) => format!("signal:{sig}"),
                _ => "unknown".into(),
            },
        };
        if ended == "exit:75" {
            // Busy or waited out: no section. A short pause keeps --no-wait from spinning.
            std::thread::sleep(Duration::from_millis(20));
        }
        attempts.push(Attempt {
            backend: b.name,
            key,
            mode,
            client: c,
            record,
            ended,
            via: match (acquire, flags.first()) {
                (true, _) => "acquire",
                (false, Some(&"--no-wait")) => "run --no-wait",
                _ => "run --wait",
            },
        });
    }
    attempts
}
