//! Lifetime rule 2 (docs/design.md) at the supervisor: when renewals keep failing, the command gets SIGTERM at
//! `deadline - grace` and is SIGKILLed a quarter of the grace before the deadline (room for a
//! late wake-up), measured from the acquisition's send time.
//! The file backend's lease never expires and server backends test this against real servers;
//! here a lease whose every renewal fails drives the real supervisor and a real child.
//!
//! `harness = false`: like `dlock`, this process must block its signals before any thread
//! exists, which libtest's threads would prevent.

use std::ffi::OsString;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock_cli::internals::{
    BootInstant, Events, Grant, Keeper, Lease, LeaseClock, Outcome, Reaper, RenewError,
    deadline_after, spawn, supervise,
};

/// A lease whose server never answers.
struct Unreachable {
    acquired_at: BootInstant,
    ttl: Duration,
}

impl Lease for Unreachable {
    fn grant(&self) -> Grant {
        Grant {
            fence: None,
            acquired_at: self.acquired_at,
            held_back_until: None,
        }
    }
    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }
    fn renew(&mut self) -> Result<(), RenewError> {
        Err(RenewError::Failed(anyhow::anyhow!("connection timed out")))
    }
    fn release(self: Box<Self>) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Runs `script` under a 1500 ms lease that cannot be renewed, with a 600 ms loss grace.
fn run_unrenewable(reaper: &std::sync::Arc<Reaper>, script: &str) -> (Outcome, Duration) {
    let (tx, rx) = mpsc::channel();
    let ttl = Duration::from_millis(1500);
    let acquired_at = BootInstant::now();
    let started = Instant::now();
    let mut keeper = Keeper::new(
        Box::new(Unreachable { acquired_at, ttl }),
        Events(tx.clone()),
    );
    let cmd: Vec<OsString> = ["sh", "-c", script].map(OsString::from).to_vec();
    let clock = LeaseClock {
        deadline: Some(deadline_after(acquired_at, ttl)),
        loss_grace: Duration::from_millis(600),
    };
    let guard = clock.guard_deadline(false);
    let child = spawn(&cmd, &[], guard, false, reaper, &tx).expect("spawn sh");
    let ending = supervise(&child, &rx, &mut keeper, clock, Duration::from_secs(5));
    let took = started.elapsed();
    keeper.release().unwrap();
    (ending, took)
}

fn check(name: &str, ok: bool, detail: String, failed: &mut u32) {
    println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
    if !ok {
        println!("    {detail}");
        *failed += 1;
    }
}

fn main() {
    // A guardian that outlives `DETACH_AFTER` executes this binary anew: it must go on guarding
    // rather than run the tests again.
    dlock_cli::internals::resume_guardian_if_asked();
    dlock_cli::internals::block_signals().unwrap();
    let reaper = Reaper::new();
    let mut failed = 0;

    // Ignores SIGTERM: only the SIGKILL ends it, a quarter of the grace before the deadline
    // (1500 ms - 17 ms margin - 150 ms = 1333 ms). At the deadline itself (1483 ms) it fails.
    let (ending, took) = run_unrenewable(&reaper, "trap '' TERM; sleep 30");
    let lost = matches!(&ending, Outcome::Lost(why) if why.contains("connection timed out"));
    check(
        "lost_lease_reports_the_renewal_error",
        lost && ending.code() == 79,
        format!("{ending:?}"),
        &mut failed,
    );
    check(
        "sigkill_lands_a_quarter_grace_before_the_deadline",
        took >= Duration::from_millis(1300) && took < Duration::from_millis(1450),
        format!("the child ended after {took:?}; the SIGKILL was due at 1333 ms"),
        &mut failed,
    );

    // Dies on SIGTERM, which comes at deadline - grace (1483 - 600 ms), to the whole job.
    let (ending, took) = run_unrenewable(&reaper, "sleep 30; echo never");
    check(
        "sigterm_comes_a_grace_before_the_deadline",
        ending.code() == 79
            && took >= Duration::from_millis(850)
            && took < Duration::from_millis(1050),
        format!("{ending:?} after {took:?}; SIGTERM was due at 883 ms"),
        &mut failed,
    );

    println!("\n{} passed, {failed} failed", 3 - failed);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
