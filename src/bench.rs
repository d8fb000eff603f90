//! `dlock bench`: measures the configured backend from this host, in the spirit of
//! `etcdctl check perf`, through the same [`Backend`] code that `dlock run` uses.
//!
//! 1. Uncontended: one client takes and releases a key of its own, again and again; each sample
//!    is one acquire + release (connection set-up included, as for a `dlock run`).
//! 2. Hand-off: C clients (threads, each with its own backend instance and connections) contend
//!    for one key, holding it for no time; a sample is the time from a holder's release starting
//!    to the next holder's acquire returning, counted only when that next holder was already
//!    waiting. This is what a queue of cron jobs feels: how fast the server wakes a waiter.
//! 3. Throughput: acquisitions per second in each phase.
//!
//! Keys are `dlock-bench-HOST-PID-{solo,shared}` and are purged afterwards (lock files, fencing
//! counters, metadata). Ctrl-C stops the phases, cleans up, and exits 130.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::{self, Request, hostname};
use crate::config::{Amount, BenchConfig};
use crate::exit;
use crate::model::{Deadline, Holder, Key, Mode, Record};
use crate::report;
use crate::signals::{self, Interrupt, Woken};

/// Above these medians the verdict is "slow".
const SLOW_UNCONTENDED: Duration = Duration::from_millis(50);
const SLOW_HANDOFF: Duration = Duration::from_millis(20);

/// Latency percentiles of one phase.
#[derive(Debug, Serialize)]
pub(crate) struct Phase {
    /// Samples taken.
    pub n: usize,
    /// Percentiles and maximum, in milliseconds.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
    /// Acquisitions per second over the phase.
    pub acquisitions_per_s: f64,
}

impl Phase {
    fn new(mut samples: Vec<Duration>, acquisitions: u64, elapsed: Duration) -> Phase {
        samples.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let at = |q: f64| {
            if samples.is_empty() {
                return 0.0;
            }
            let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            ms(samples[i])
        };
        Phase {
            n: samples.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: samples.last().map_or(0.0, |d| ms(*d)),
            acquisitions_per_s: acquisitions as f64 / elapsed.as_secs_f64().max(1e-9),
        }
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what:<28} n={:<6} p50 {:>7.2} ms  p90 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  {:>7.0}/s\n",
            self.n, self.p50_ms, self.p90_ms, self.p99_ms, self.max_ms, self.acquisitions_per_s
        )
    }
}

/// The whole report (`--json` prints it as is).
#[derive(Debug, Serialize)]
pub(crate) struct BenchReport {
    /// Backend name.
    pub backend: &'static str,
    /// Where (no credentials).
    pub location: String,
    /// Clients in the hand-off phase.
    pub clients: u32,
    /// Phase 1.
    pub uncontended: Phase,
    /// Phase 2.
    pub handoff: Phase,
    /// "ok" or "slow".
    pub verdict: &'static str,
    /// Why.
    pub verdict_text: String,
}

/// `dlock bench`.
pub(crate) fn run(cfg: &BenchConfig) -> u8 {
    report::set_verbosity(cfg.verbosity);
    let name = cfg.target.kind.name();
    if let Err(e) = signals::block() {
        report::error(format_args!("{name}: cannot block signals: {e}"));
        return exit::UNAVAILABLE;
    }
    let backend = match backend::open(&cfg.target) {
        Ok(b) => b,
        Err(e) => return fail(name, &e),
    };
    // Short and lowercase, so that every backend stores it as it is (MySQL hashes long or
    // uppercase names), and an operator can find it.
    let host: String = hostname().to_lowercase().chars().take(24).collect();
    let base = format!("dlock-bench-{host}-{}", std::process::id());
    let keys = [format!("{base}-solo"), format!("{base}-shared")]
        .map(|k| Key::new(&k).unwrap_or_else(|_| Key::new("dlock-bench").expect("a valid key")));
    // Reach the server before anything else: an unreachable one is one line, exit 69.
    if let Err(e) = backend.status(&keys[0]) {
        return fail(name, &e);
    }
    let interrupt = Interrupt::new();
    // Acquisitions so far in the running phase, for the progress bar.
    let progress = AtomicU64::new(0);
    let mut phases = Vec::new();
    let mut failure = None;
    for (i, what) in ["uncontended", "hand-off"].into_iter().enumerate() {
        progress.store(0, Ordering::SeqCst);
        let result = std::thread::scope(|s| {
            let worker = s.spawn(|| match i {
                0 => uncontended(&keys[0], cfg, &interrupt, &progress),
                _ => handoff(&keys[1], cfg, &interrupt, &progress),
            });
            watch(&worker, &interrupt, &progress, cfg, what);
            worker
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the {what} phase panicked")))
        });
        match result {
            Ok(p) => phases.push(p),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        if interrupt.fired().is_some() {
            break;
        }
    }
    let left: Vec<String> = keys
        .iter()
        .filter_map(|key| backend.purge(key).err().map(|e| format!("'{key}' ({e:#})")))
        .collect();
    if let Some(sig) = interrupt.fired() {
        return exit::signal_code(sig);
    }
    if let Some(e) = failure {
        // One line: the cause, and what it left behind.
        return match left.is_empty() {
            true => fail(name, &e),
            false => fail(name, &e.context(format!("left behind {}", left.join(", ")))),
        };
    }
    if !left.is_empty() {
        report::warn(format_args!(
            "{name}: cannot remove benchmark keys: {}",
            left.join(", ")
        ));
    }

    let handoff = phases.pop().expect("two phases");
    let uncontended = phases.pop().expect("two phases");
    let (verdict, verdict_text) = verdict(&uncontended, &handoff);
    let report = BenchReport {
        backend: name,
        location: backend.location(),
        clients: cfg.clients,
        uncontended,
        handoff,
        verdict,
        verdict_text,
    };
    let text = if cfg.json {
        serde_json::to_string(&report).unwrap_or_default() + "\n"
    } else {
        format!(
            "dlock bench: {} ({}), {} clients in the hand-off phase\n{}{}verdict: {}: {}\n",
            report.backend,
            report.location,
            report.clients,
            report.uncontended.line("uncontended acquire+release"),
            report.handoff.line("hand-off"),
            report.verdict,
            report.verdict_text
        )
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    0
}

fn fail(name: &str, e: &anyhow::Error) -> u8 {
    report::error(format_args!("{name}: {e:#}"));
    exit::code_for(e, exit::UNAVAILABLE)
}

fn verdict(unc: &Phase, hand: &Phase) -> (&'static str, String) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    if unc.p50_ms > ms(SLOW_UNCONTENDED) {
        return (
            "slow",
            format!(
                "an uncontended lock takes {:.1} ms (median); over {} ms, the server or the network is slow",
                unc.p50_ms,
                SLOW_UNCONTENDED.as_millis()
            ),
        );
    }
    if hand.n > 0 && hand.p50_ms > ms(SLOW_HANDOFF) {
        return (
            "slow",
            format!(
                "a waiter gets a released lock after {:.1} ms (median); over {} ms, waiters are not woken promptly",
                hand.p50_ms,
                SLOW_HANDOFF.as_millis()
            ),
        );
    }
    (
        "ok",
        format!(
            "a lock costs {:.1} ms and passes to a waiter in {:.1} ms (medians)",
            unc.p50_ms, hand.p50_ms
        ),
    )
}

/// On the main thread while a phase runs: takes signals (Ctrl-C fires the interrupt) and draws
/// the progress bar on a terminal.
fn watch(
    worker: &std::thread::ScopedJoinHandle<'_, anyhow::Result<Phase>>,
    interrupt: &Interrupt,
    progress: &AtomicU64,
    cfg: &BenchConfig,
    what: &str,
) {
    let tty = !cfg.json
        && cfg.verbosity > crate::model::Verbosity::Quiet
        && std::io::stderr().is_terminal();
    let started = Instant::now();
    while !worker.is_finished() {
        if let Woken::Signal(r) = signals::wait(Duration::from_millis(100)) {
            interrupt.fire(r.signal);
        }
        if tty {
            let fraction = match cfg.amount {
                Amount::For(d) => started.elapsed().as_secs_f64() / d.as_secs_f64(),
                Amount::Ops(n) => progress.load(Ordering::Relaxed) as f64 / n as f64,
            }
            .clamp(0.0, 1.0);
            let filled = (fraction * 30.0) as usize;
            eprint!(
                "\r\x1b[Kdlock bench: {what:<11} [{}{}] {:>3.0}%",
                "#".repeat(filled),
                ".".repeat(30 - filled),
                fraction * 100.0
            );
            let _ = std::io::stderr().flush();
        }
    }
    if tty {
        eprint!("\r\x1b[K");
    }
}

/// Whether a phase is over: its duration ran out or its acquisitions are done.
fn over(amount: Amount, started: Instant, done: u64) -> bool {
    match amount {
        Amount::For(d) => started.elapsed() >= d,
        Amount::Ops(n) => done >= n,
    }
}

/// A request for one of the benchmark's keys. A lease's `held_back_until` (a young server) is
/// ignored here: these keys are this process's own, no holder from before a restart can exist.
fn request<'a>(
    key: &'a Key,
    cfg: &BenchConfig,
    deadline: Deadline,
    holder: &'a Record,
    interrupt: &'a Interrupt,
    on_holder: &'a dyn Fn(&Holder),
) -> Request<'a> {
    Request {
        key,
        mode: Mode::Exclusive,
        ttl: cfg.ttl,
        deadline,
        holder,
        interrupt,
        on_holder,
        start: None,
    }
}

fn uncontended(
    key: &Key,
    cfg: &BenchConfig,
    interrupt: &Interrupt,
    progress: &AtomicU64,
) -> anyhow::Result<Phase> {
    let backend = backend::open(&cfg.target)?;
    let holder = Record::this_process(&["dlock-bench".into()]);
    let mut samples = Vec::new();
    let started = Instant::now();
    while !over(cfg.amount, started, samples.len() as u64) && interrupt.fired().is_none() {
        let t = Instant::now();
        let lease = backend.acquire(&request(
            key,
            cfg,
            Deadline::Now,
            &holder,
            interrupt,
            &|_| {},
        ))?;
        lease.release()?;
        samples.push(t.elapsed());
        progress.fetch_add(1, Ordering::Relaxed);
    }
    let n = samples.len() as u64;
    Ok(Phase::new(samples, n, started.elapsed()))
}

/// What the hand-off clients share.
#[derive(Default)]
struct Queue {
    /// Clients between asking for the lock and getting it (or giving up).
    waiting: u32,
    /// When the last holder started its release.
    released: Option<Instant>,
}

fn handoff(
    key: &Key,
    cfg: &BenchConfig,
    interrupt: &Interrupt,
    progress: &AtomicU64,
) -> anyhow::Result<Phase> {
    let queue = Mutex::new(Queue::default());
    let changed = Condvar::new();
    let samples = Mutex::new(Vec::new());
    let acquisitions = AtomicU64::new(0);
    let others = cfg.clients - 1;
    let started = Instant::now();
    let client = || -> anyhow::Result<()> {
        let backend = backend::open(&cfg.target)?;
        let holder = Record::this_process(&["dlock-bench".into()]);
        // A waiter still waiting when the phase is long over gives up.
        let give_up = Instant::now() + phase_bound(cfg.amount);
        let over_now = || {
            over(cfg.amount, started, acquisitions.load(Ordering::SeqCst))
                || interrupt.fired().is_some()
        };
        loop {
            if over_now() {
                return Ok(());
            }
            let asked = Instant::now();
            lock(&queue).waiting += 1;
            changed.notify_all();
            let req = request(key, cfg, Deadline::At(give_up), &holder, interrupt, &|_| {});
            let acquired = backend.acquire(&req);
            let got = Instant::now();
            let mut q = lock(&queue);
            q.waiting -= 1;
            let lease = match acquired {
                Ok(l) => l,
                Err(e) if e.is::<exit::Interrupted>() || e.is::<exit::Busy>() => return Ok(()),
                Err(e) => return Err(e),
            };
            let mine = acquisitions.fetch_add(1, Ordering::SeqCst) + 1;
            if matches!(cfg.amount, Amount::Ops(n) if mine > n) {
                // A waiter that was queued when the last counted acquisition happened.
                acquisitions.fetch_sub(1, Ordering::SeqCst);
                changed.notify_all();
                drop(q);
                lease.release()?;
                return Ok(());
            }
            progress.fetch_add(1, Ordering::Relaxed);
            changed.notify_all();
            if let Some(released) = q.released.filter(|r| *r >= asked) {
                lock(&samples).push(got - released);
            }
            // Hold until every other client is waiting, so that the release is a hand-off to
            // a queue of waiters (as cron jobs piling up on one key), not a race to the server.
            let bound = got + Duration::from_secs(1);
            while q.waiting < others && !over_now() && Instant::now() < bound {
                q = changed
                    .wait_timeout(q, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            q.released = Some(Instant::now());
            drop(q);
            lease.release()?;
            // Let a waiter have it: a lock that is not fair (flock) would go straight back to
            // this client, and that is no hand-off.
            let mut q = lock(&queue);
            let bound = Instant::now() + Duration::from_secs(1);
            while acquisitions.load(Ordering::SeqCst) == mine
                && q.waiting > 0
                && !over_now()
                && Instant::now() < bound
            {
                q = changed
                    .wait_timeout(q, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    };
    let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cfg.clients).map(|_| s.spawn(client)).collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    results.into_iter().collect::<anyhow::Result<()>>()?;
    let samples = samples.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(Phase::new(
        samples,
        acquisitions.load(Ordering::SeqCst),
        elapsed,
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a hand-off client may wait at most: the phase, and then some.
fn phase_bound(amount: Amount) -> Duration {
    match amount {
        Amount::For(d) => d + Duration::from_secs(30),
        Amount::Ops(_) => Duration::from_secs(600),
    }
}
