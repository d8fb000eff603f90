//! The fault campaign (`scripts/nemesis`): every backend in its production topology, clients
//! taking three keys in a loop through the real `dlock`, faults from a seeded schedule, and a
//! checker over the sections' history (docs/failures.md, "The fault campaign").
//!
//! The same binary is the critical section the clients run (`nemesis section …`, and
//! `nemesis acquire-section …` for `dlock acquire`/`release`): it records its start and then a
//! heartbeat every few milliseconds on CLOCK_MONOTONIC, so the section's end is its last sign of
//! life even when it is killed. Without `--campaign` (as `cargo test` runs it) it only tests its
//! checker on a history whose answer is known.

#[allow(dead_code, unreachable_pub)]
#[path = "../it/kernel.rs"]
mod kernel;
#[allow(dead_code, unreachable_pub, unused_imports)]
#[path = "../it/servers/mod.rs"]
mod servers;
#[allow(dead_code, unreachable_pub)]
#[path = "../it/util.rs"]
mod util;

mod campaign;
mod check;
mod clients;
mod faults;
mod procs;
mod section;
mod targets;

use std::time::Duration;

/// The campaign's options (`scripts/nemesis --help`).
#[derive(Debug, Clone)]
struct Options {
    backends: Option<Vec<String>>,
    /// Fault kinds left out of the schedule (`--without`).
    without: Vec<String>,
    duration: Duration,
    clients: usize,
    seed: u64,
    out: std::path::PathBuf,
}

const USAGE: &str = "usage: nemesis --campaign [--backends LIST] [--duration D] [--clients N] \
                     [--seed S] [--out DIR] [--without KINDS]";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        backends: None,
        without: Vec::new(),
        duration: Duration::from_secs(60),
        clients: 4,
        seed: 1,
        out: std::path::PathBuf::from("nemesis-out"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--campaign" => {}
            "--backends" => {
                let list = value()?;
                let names: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                for n in &names {
                    if !targets::NAMES.contains(&n.as_str()) {
                        return Err(format!(
                            "unknown backend {n:?} (known: {})",
                            targets::NAMES.join(", ")
                        ));
                    }
                }
                o.backends = Some(names);
            }
            "--without" => {
                let list = value()?;
                o.without = list.split(',').map(|s| s.trim().to_string()).collect();
            }
            "--duration" => {
                let v = value()?;
                o.duration =
                    humantime::parse_duration(&v).map_err(|e| format!("--duration {v:?}: {e}"))?;
            }
            "--clients" => {
                let v = value()?;
                o.clients = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or(format!("--clients {v:?}: a number from 1 to 64"))?;
            }
            "--seed" => {
                let v = value()?;
                o.seed = v.parse().map_err(|_| format!("--seed {v:?}: a number"))?;
            }
            "--out" => o.out = value()?.into(),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("section") => section::run_section(&args[1..]),
        Some("acquire-section") => section::acquire_section(&args[1..]),
        _ if args.iter().any(|a| a == "--campaign") => match parse(&args) {
            Ok(o) => campaign::run(&o),
            Err(e) => {
                eprintln!("nemesis: {e}");
                2
            }
        },
        _ => {
            check::self_test();
            eprintln!(
                "nemesis: the checker's self-test passed; the campaign runs from scripts/nemesis"
            );
            0
        }
    };
    std::process::exit(code);
}
