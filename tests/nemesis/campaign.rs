//! One campaign: start the backends, run their clients and fault schedules until the end, then
//! write history.jsonl, faults.jsonl and report.json and judge them.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Options;
use crate::check::{Section, report};
use crate::clients::{self, Attempt, Backend, Holding};
use crate::faults::{self, Fault};
use crate::section::read_record;
use crate::targets::{self, NAMES, Target};

/// Writes `lines` as JSON lines to `path`.
fn write_lines(path: &std::path::Path, lines: impl Iterator<Item = serde_json::Value>) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("an output file"));
    for l in lines {
        writeln!(f, "{l}").expect("write an output file");
    }
    f.flush().expect("write an output file");
}

pub(crate) fn run(o: &Options) -> i32 {
    crate::util::default_signal_dispositions();
    for sub in ["sections", "logs", "fences", "servers", "faketime"] {
        let _ = std::fs::remove_dir_all(o.out.join(sub));
        std::fs::create_dir_all(o.out.join(sub)).expect("the output directory");
    }
    // Absolute from here on: the file backend's URL is made from it (`file:///DIR`), and a
    // relative one (CI's `--out target/nemesis-smoke`) made every file client fail at once.
    let out = std::fs::canonicalize(&o.out).expect("the output directory");
    let o = &Options { out, ..o.clone() };
    let names: Vec<&'static str> = match &o.backends {
        Some(list) => NAMES
            .iter()
            .copied()
            .filter(|n| list.iter().any(|l| l == n))
            .collect(),
        None => NAMES.to_vec(),
    };
    eprintln!("nemesis: starting {}", names.join(", "));
    let started = Instant::now();
    let servers_dir = o.out.join("servers");
    // A server may lose its port to another starting at the same moment (a free port is
    // picked, then bound): a start that panics is tried again, up to three times in all.
    let start = |n: &'static str| {
        for attempt in 1.. {
            let once = || targets::start(n, &servers_dir, o.clients);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(once)) {
                Ok(t) => return t,
                Err(e) if attempt >= 3 => std::panic::resume_unwind(e),
                Err(_) => eprintln!("nemesis: {n}: its servers did not start; again"),
            }
        }
        None
    };
    let mut not_started = Vec::new();
    let mut targets: Vec<Target> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .map(|&n| (n, s.spawn(move || start(n))))
            .collect();
        handles
            .into_iter()
            .filter_map(|(n, h)| match h.join() {
                Ok(Some(t)) => Some(t),
                Ok(None) => {
                    eprintln!("nemesis: {n}: SKIPPED (its server is not installed)");
                    None
                }
                Err(_) => {
                    eprintln!("nemesis: {n}: its servers did not start, 3 times: FAILED");
                    not_started.push(n);
                    None
                }
            })
            .collect()
    });
    eprintln!(
        "nemesis: {} backends up in {:.1} s; seed {}, {} clients each, {:?}",
        targets.len(),
        started.elapsed().as_secs_f64(),
        o.seed,
        o.clients,
        o.duration
    );
    // A young Redis or MySQL holds every first lock back for a lease (dlock's hold-back).
    std::thread::sleep(Duration::from_secs(3));

    for t in &targets {
        std::fs::write(faults::faketime_file(&o.out, t.name), "+0").expect("a faketime file");
    }
    let plans: Vec<Vec<faults::Planned>> = targets
        .iter()
        .map(|t| faults::plan(t, o.seed, o.duration, &o.without))
        .collect();
    let slots: Vec<Vec<Mutex<Option<Holding>>>> = targets
        .iter()
        .map(|_| (0..o.clients).map(|_| Mutex::new(None)).collect())
        .collect();
    let backends: Vec<Backend> = targets
        .iter()
        .map(|t| Backend {
            name: t.name,
            args: t.args.clone(),
            shared: t.shared,
            limit: t.limit,
        })
        .collect();
    let t0 = Instant::now();
    let deadline = t0 + o.duration;
    let (mut attempts, mut all_faults): (Vec<Attempt>, Vec<Fault>) = (Vec::new(), Vec::new());
    std::thread::scope(|s| {
        let mut fault_threads = Vec::new();
        let mut client_threads = Vec::new();
        for (i, t) in targets.iter_mut().enumerate() {
            let (plan, slots, b) = (&plans[i], &slots[i], &backends[i]);
            fault_threads.push(s.spawn(move || faults::run(&o.out, t, plan, slots, t0, deadline)));
            for (c, slot) in slots.iter().enumerate() {
                let out = &o.out;
                client_threads
                    .push(s.spawn(move || clients::run(b, c, o.seed, deadline, out, slot)));
            }
        }
        for h in client_threads {
            attempts.extend(h.join().expect("a client thread"));
        }
        for h in fault_threads {
            all_faults.extend(h.join().expect("a fault thread"));
        }
    });

    let mut sections: Vec<Section> = attempts
        .iter()
        .filter_map(|a| {
            let r = read_record(&a.record)?;
            Some(Section {
                backend: a.backend,
                key: a.key.clone(),
                mode: a.mode.clone(),
                client: a.client,
                token: r.token,
                start_ns: r.start_ns,
                end_ns: r.end_ns,
                ended: a.ended.clone(),
                via: a.via,
                fence: r.fence,
            })
        })
        .collect();
    sections.sort_by_key(|s| (s.start_ns, s.end_ns));
    all_faults.sort_by_key(|f| f.start_ns);
    write_lines(
        &o.out.join("history.jsonl"),
        sections.iter().map(Section::json),
    );
    write_lines(
        &o.out.join("faults.jsonl"),
        all_faults.iter().map(|f| {
            serde_json::json!({
                "backend": f.backend,
                "kind": f.kind,
                "target": f.target,
                "start_ns": f.start_ns,
                "end_ns": f.end_ns,
            })
        }),
    );
    let list: Vec<(&'static str, Option<&'static str>)> = targets
        .iter()
        .map(|t| (t.name, t.unsafe_by_design))
        .collect();
    let (rep, pass) = report(&list, &sections, &all_faults);
    let text = serde_json::to_string_pretty(&rep).expect("the report") + "\n";
    std::fs::write(o.out.join("report.json"), &text).expect("report.json");
    println!("backend        safe  sections overlaps regress refused faults max_recovery_ms");
    for (name, v) in rep["backends"].as_object().into_iter().flatten() {
        let n_faults: u64 = v["faults"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        let f = |k: &str| v[k].to_string();
        println!(
            "{name:<14} {:<5} {:>8} {:>8} {:>7} {:>7} {:>6} {:>15}",
            f("safe"),
            f("sections"),
            f("overlaps"),
            f("token_regressions"),
            f("fence_refusals"),
            n_faults,
            f("max_recovery_ms")
        );
    }
    for (name, v) in rep["backends"].as_object().into_iter().flatten() {
        if let (Some(why), Some(n)) = (v["unsafe_by_design"].as_str(), v["overlaps"].as_u64()) {
            println!(
                "nemesis: {name}: {n} overlaps, counted and not failed: unsafe by design ({why})"
            );
        }
    }
    drop(targets);
    if !not_started.is_empty() {
        println!("nemesis: FAILED: not started: {}", not_started.join(", "));
        return 1;
    }
    if pass {
        println!(
            "nemesis: no overlap and no token regression where safe ({})",
            o.out.display()
        );
        0
    } else {
        println!(
            "nemesis: FAILED: an overlap or a token regression on a backend called safe, or a \
             backend without a single section"
        );
        1
    }
}
