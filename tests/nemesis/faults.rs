//! The seeded fault schedule of each backend and the faults aimed at holders: `kill -9` of a
//! holder's dlock, of its guardian, of both; SIGSTOP of a holder's dlock past its lease; CPU
//! starvation of a holder (stopped 40 ms of every 50). The server faults are in targets.rs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clients::Holding;
use crate::procs::{Proc, now_ns};
use crate::section::read_record;
use crate::targets::{RESET_KINDS, Servers, TTL, Target, server_fault, server_kinds};

/// splitmix64: the campaign's only source of chance, so that a seed replays its schedule.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 if n is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next().checked_rem(n).unwrap_or(0)
    }
}

/// FNV-1a of a name: each backend's schedule has a seed of its own.
pub(crate) fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The faults aimed at a holder, which every backend takes. `stop_acquire_holder` is
/// `stop_holder` aimed only at the background holder of a `dlock acquire` (its owner, the
/// section, keeps running: the holder must have it stopped before its lease ends).
/// `kill_both` is aimed only at `dlock run`: `dlock acquire` survives the kill -9 of its holder
/// or of its watchdog, not of both, since nothing of dlock is left then to stop an owner it did
/// not start (docs/acquire.md); `dlock run`'s command is its descendant.
pub(crate) const PROCESS_KINDS: &[&str] = &[
    "kill_dlock",
    "kill_guardian",
    "kill_both",
    "stop_holder",
    "stop_acquire_holder",
    "cpu_starve",
];

/// Debian's libfaketime (multi-threaded flavour: dlock has threads), if installed: the
/// `clock_jump` fault needs it.
pub(crate) fn faketime() -> Option<&'static str> {
    const LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    Path::new(LIB).exists().then_some(LIB)
}

/// The file that holds the wall-clock offset of `backend`'s dlocks (`+0` when no jump is on).
pub(crate) fn faketime_file(dir: &Path, backend: &str) -> PathBuf {
    dir.join("faketime").join(backend)
}

/// One planned fault.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    /// When, from the campaign's start.
    pub at: Duration,
    pub kind: &'static str,
    pub dur: Duration,
    /// Which member, proxy or client it is aimed at (modulo their number).
    pub pick: usize,
}

/// One fault as it happened.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub backend: &'static str,
    pub kind: &'static str,
    pub target: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The schedule of `t` for a campaign of `length`: one fault every 1–3 s after the previous
/// one healed (planned as if each lasted its planned time), the kinds in a seeded order that
/// goes through every kind before repeating one, none in the last 8 s (left for recovery).
pub(crate) fn plan(t: &Target, seed: u64, length: Duration, without: &[String]) -> Vec<Planned> {
    let mut rng = Rng::new(seed ^ hash(t.name));
    let mut kinds: Vec<&'static str> = server_kinds(t);
    kinds.extend(PROCESS_KINDS);
    if faketime().is_some() {
        kinds.push("clock_jump");
    }
    // A session lock's reset is its `-reset` backend's only fault, and no other's there.
    let session = matches!(t.servers, Servers::Mysql(_) | Servers::Postgres(_));
    if t.reset_only {
        kinds.retain(|k| RESET_KINDS.contains(k));
    } else if session {
        kinds.retain(|k| !RESET_KINDS.contains(k));
    }
    kinds.retain(|k| !without.iter().any(|w| w == k));
    if kinds.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = Duration::from_secs(3);
    let mut order: Vec<&'static str> = Vec::new();
    while at + Duration::from_secs(8) < length {
        if order.is_empty() {
            order = kinds.clone();
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let kind = order.remove(0);
        let dur = match kind {
            "stop_holder" | "stop_acquire_holder" => {
                TTL + Duration::from_millis(1000 + rng.below(1000))
            }
            // A reset: every connection closed, new ones refused for at most 300 ms.
            "conn_blip" | "client_blip" => Duration::from_millis(rng.below(300)),
            "kill_dlock" | "kill_guardian" | "kill_both" | "failover" => Duration::ZERO,
            _ => Duration::from_millis(1000 + rng.below(3000)),
        };
        let pick = rng.below(1 << 16) as usize;
        out.push(Planned {
            at,
            kind,
            dur,
            pick,
        });
        at += dur + Duration::from_millis(1000 + rng.below(2000));
    }
    out
}

/// Applies `t`'s schedule from `t0` on; returns the faults that happened.
pub(crate) fn run(
    dir: &Path,
    t: &mut Target,
    plan: &[Planned],
    slots: &[Mutex<Option<Holding>>],
    t0: Instant,
    deadline: Instant,
) -> Vec<Fault> {
    let mut out = Vec::new();
    for p in plan {
        if let Some(wait) = (t0 + p.at).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // Faults run late (a holder looked for, a server slow to come back): none begins in
        // the last 8 s, left for recovery.
        if Instant::now() + Duration::from_secs(8) > deadline {
            break;
        }
        let mut start_ns = now_ns();
        let target = if p.kind == "clock_jump" {
            // A jump of the wall clock, forwards or back, for the fault's time.
            let offset = ["+3600", "-3600", "+86400", "-86400", "-600"][p.pick % 5];
            let file = faketime_file(dir, t.name);
            let _ = std::fs::write(&file, offset);
            std::thread::sleep(p.dur);
            let _ = std::fs::write(&file, "+0");
            format!("wall clock {offset} s")
        } else if p.kind == "client_partition" || p.kind == "client_blip" {
            // Aimed at a client in a section, so that a waiter may take what it loses.
            match find_holder(p.pick, slots, Aim::Any) {
                Some((c, ..)) => {
                    start_ns = now_ns();
                    crate::targets::client_fault(t, p.kind, c, p.dur)
                }
                None => {
                    eprintln!("nemesis: {}: {} skipped: no holder found", t.name, p.kind);
                    continue;
                }
            }
        } else if PROCESS_KINDS.contains(&p.kind) {
            match holder_fault(p, slots) {
                Some((target, began)) => {
                    start_ns = began;
                    target
                }
                None => {
                    eprintln!(
                        "nemesis: {}: {} skipped: no holder in a section, or none of its \
                         processes left to signal",
                        t.name, p.kind
                    );
                    continue;
                }
            }
        } else {
            let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                server_fault(t, p.kind, p.dur, p.pick)
            }));
            match applied {
                Ok(target) => target,
                Err(_) => {
                    // The panic said why (a server that did not come back); no more faults here.
                    eprintln!("nemesis: {}: {} failed; its schedule stops", t.name, p.kind);
                    out.push(Fault {
                        backend: t.name,
                        kind: p.kind,
                        target: "failed".into(),
                        start_ns,
                        end_ns: now_ns(),
                    });
                    return out;
                }
            }
        };
        out.push(Fault {
            backend: t.name,
            kind: p.kind,
            target,
            start_ns,
            end_ns: now_ns(),
        });
    }
    out
}

/// Which holders a fault may be aimed at.
#[derive(Clone, Copy, PartialEq)]
enum Aim {
    Any,
    /// The background holder of a `dlock acquire`.
    Acquire,
    /// A `dlock run`.
    Run,
}

/// A client in a section now: its dlock (or `acquire` holder) and that one's guardians.
fn find_holder(
    pick: usize,
    slots: &[Mutex<Option<Holding>>],
    aim: Aim,
) -> Option<(usize, Proc, Vec<Proc>, bool)> {
    let dlock_exe = std::fs::canonicalize(crate::util::DLOCK).ok()?;
    // An `acquire` holder is rarer (a third of two clients' sections): it gets longer.
    let wait = if aim == Aim::Acquire { 10 } else { 3 };
    let deadline = Instant::now() + Duration::from_secs(wait);
    while Instant::now() < deadline {
        for k in 0..slots.len() {
            let c = (pick + k) % slots.len();
            let Some(h) = slots[c].lock().unwrap().clone() else {
                continue;
            };
            if (aim == Aim::Acquire && !h.acquire) || (aim == Aim::Run && h.acquire) {
                continue;
            }
            let Some(rec) = read_record(&h.record) else {
                continue;
            };
            let dlock = if h.acquire {
                match Proc::of(rec.holder) {
                    Some(p) if rec.holder > 0 => p,
                    _ => continue,
                }
            } else {
                h.top
            };
            if !h.top.alive() || !dlock.alive() {
                continue;
            }
            let guardians = dlock.children_running(&dlock_exe);
            return Some((c, dlock, guardians, h.acquire));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// A process fault; what it was aimed at and when it began, or None if no client held a
/// section.
fn holder_fault(p: &Planned, slots: &[Mutex<Option<Holding>>]) -> Option<(String, u64)> {
    let aim = match p.kind {
        "stop_acquire_holder" => Aim::Acquire,
        "kill_both" => Aim::Run,
        _ => Aim::Any,
    };
    let (c, dlock, guardians, acquire) = find_holder(p.pick, slots, aim)?;
    let began = now_ns();
    let g: Vec<i32> = guardians.iter().map(|g| g.pid).collect();
    let kill = |x: &Proc| x.signal(libc::SIGKILL);
    let done = match p.kind {
        "kill_dlock" => kill(&dlock),
        "kill_guardian" => guardians.iter().map(kill).fold(false, |a, b| a | b),
        "kill_both" => {
            let a = kill(&dlock);
            guardians.iter().map(kill).fold(a, |a, b| a | b)
        }
        "stop_holder" | "stop_acquire_holder" => {
            let stopped = dlock.signal(libc::SIGSTOP);
            std::thread::sleep(p.dur);
            dlock.signal(libc::SIGCONT);
            stopped
        }
        _ => {
            // cpu_starve: the holder and its guardians get 10 ms of every 50.
            let all: Vec<Proc> = std::iter::once(dlock)
                .chain(guardians.iter().copied())
                .collect();
            let end = Instant::now() + p.dur;
            let mut any = false;
            while Instant::now() < end {
                for x in &all {
                    any |= x.signal(libc::SIGSTOP);
                }
                std::thread::sleep(Duration::from_millis(40));
                for x in &all {
                    x.signal(libc::SIGCONT);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            any
        }
    };
    let what = if acquire {
        "acquire holder"
    } else {
        "dlock run"
    };
    done.then(|| {
        (
            format!("client {c} {what} {} guardians {g:?}", dlock.pid),
            began,
        )
    })
}
