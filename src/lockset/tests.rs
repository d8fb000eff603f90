//! Unit tests of `lockset` against the in-memory backend.

use std::thread;

use super::*;
use crate::backend::memory::Memory;
use crate::exit::Unavailable;

fn keys(names: &[&str]) -> Vec<Key> {
    names.iter().map(|n| Key::new(n).unwrap()).collect()
}

fn want<'a>(
    keys: &'a [Key],
    ttl: Duration,
    deadline: Deadline,
    holder: &'a Record,
    interrupt: &'a Interrupt,
) -> Want<'a> {
    Want {
        keys: canonical(keys),
        mode: Mode::Exclusive,
        ttl,
        deadline,
        holder,
        interrupt,
        look_up: None,
        start: None,
    }
}

fn me() -> Record {
    Record {
        pid: Some(std::process::id()),
        ..Record::default()
    }
}

#[test]
fn keys_are_taken_in_one_order() {
    let k = keys(&["b", "a", "c"]);
    let order: Vec<&str> = canonical(&k).iter().map(|k| k.as_str()).collect();
    assert_eq!(order, ["a", "b", "c"]);
}

#[test]
fn a_busy_later_key_releases_the_earlier_ones() {
    let mem = Memory::new();
    mem.take_as("b", 1, Duration::from_secs(30));
    let (k, holder, interrupt) = (keys(&["a", "b"]), me(), Interrupt::new());
    let w = want(
        &k,
        Duration::from_secs(30),
        Deadline::Now,
        &holder,
        &interrupt,
    );
    let err = acquire(&mem, &w).err().expect("b is busy");
    assert!(err.is::<Busy>(), "{err:#}");
    assert_eq!(mem.holder_pid("a"), None, "'a' was given back");
    assert_eq!(mem.holder_pid("b"), Some(Some(1)), "'b' is still theirs");
}

#[test]
fn an_unreachable_later_key_releases_the_earlier_ones() {
    let mem = Memory::new();
    mem.refuse("z");
    let (k, holder, interrupt) = (keys(&["a", "z"]), me(), Interrupt::new());
    let w = want(
        &k,
        Duration::from_secs(30),
        Deadline::Never,
        &holder,
        &interrupt,
    );
    let err = acquire(&mem, &w).err().expect("z is unreachable");
    assert!(err.root_cause().is::<Unavailable>(), "{err:#}");
    assert_eq!(mem.holder_pid("a"), None);
}

#[test]
fn earlier_keys_are_renewed_while_a_later_one_is_waited_for() {
    let mem = Memory::new();
    let ttl = Duration::from_millis(300);
    mem.take_as("b", 1, Duration::from_millis(700));
    let (k, holder, interrupt) = (keys(&["a", "b"]), me(), Interrupt::new());
    let w = want(&k, ttl, Deadline::Never, &holder, &interrupt);
    let started = Instant::now();
    let held = acquire(&mem, &w).expect("b expires after 700 ms");
    assert!(started.elapsed() >= Duration::from_millis(650));
    // 'a' (300 ms TTL) outlived a 700 ms wait only by being renewed.
    assert!(mem.renewals() >= 2, "renewals: {}", mem.renewals());
    assert_eq!(mem.holder_pid("a"), Some(holder.pid));
    assert_eq!(held.parts.len(), 2);
    release_all(held.parts);
    assert_eq!(mem.holder_pid("a"), None);
}

#[test]
fn a_held_back_lock_is_renewed_until_the_old_holder_must_be_gone() {
    let mem = Memory::new();
    let ttl = Duration::from_millis(300);
    mem.hold_back(Duration::from_millis(800));
    let (k, holder, interrupt) = (keys(&["a"]), me(), Interrupt::new());
    let w = want(&k, ttl, Deadline::Never, &holder, &interrupt);
    let started = Instant::now();
    let held = acquire(&mem, &w).expect("the lock is ours, held back");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(790),
        "returned after {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "returned after {took:?}"
    );
    assert!(mem.renewals() >= 2, "renewals: {}", mem.renewals());
    assert_eq!(mem.holder_pid("a"), Some(holder.pid), "still ours");
    // The lease the command starts under counts from the last renewal.
    let lease = LeaseSet::join(held.parts);
    assert!(
        lease
            .acquired_at()
            .saturating_duration_since(BootInstant::now() - took)
            > ttl
    );
    lease.release().unwrap();
}

/// `--no-wait` is busy at once; a `--wait` that ends before the hold-back is waited out (the
/// operator asked to wait that long; it used to give up at once), then busy; both give back.
#[test]
fn a_held_back_lock_is_busy_for_a_run_that_cannot_wait_that_long() {
    let mem = Memory::new();
    let ttl = Duration::from_secs(3);
    mem.hold_back(Duration::from_secs(3));
    let (k, holder, interrupt) = (keys(&["a", "b"]), me(), Interrupt::new());
    for (wait, took) in [(None, 0), (Some(500), 500)] {
        let deadline = wait.map_or(Deadline::Now, |ms| {
            Deadline::At(Instant::now() + Duration::from_millis(ms))
        });
        let started = Instant::now();
        let w = want(&k, ttl, deadline, &holder, &interrupt);
        let err = acquire(&mem, &w).err().expect("busy");
        let busy = err.downcast_ref::<Busy>().expect("a Busy error");
        let why = busy.why.as_deref().unwrap_or_default();
        assert!(
            why.contains("restarted") && why.contains("held back"),
            "{err:#}"
        );
        let took = Duration::from_millis(took);
        let elapsed = started.elapsed();
        assert!(
            elapsed >= took && elapsed < took + Duration::from_millis(500),
            "{wait:?}: {elapsed:?}"
        );
        assert_eq!((mem.holder_pid("a"), mem.holder_pid("b")), (None, None));
    }
}

/// Runs `acquire` for keys a and b while `sig` arrives after 200 ms: it must end with
/// `Interrupted(sig)` within 2 s, and leave neither key held.
fn interrupted_after_200ms(mem: &Memory, ttl: Duration, sig: i32) {
    let (k, holder) = (keys(&["a", "b"]), me());
    let interrupt = Interrupt::new();
    let fire = interrupt.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        fire.fire(sig);
    });
    let w = want(&k, ttl, Deadline::Never, &holder, &interrupt);
    let started = Instant::now();
    let err = acquire(mem, &w).err().expect("interrupted");
    t.join().unwrap();
    let took = started.elapsed();
    assert!(matches!(err.downcast_ref::<Interrupted>(), Some(Interrupted(s)) if *s == sig));
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(mem.holder_pid("a"), None, "'a' was given back");
    assert_ne!(
        mem.holder_pid("b"),
        Some(Some(std::process::id())),
        "'b' is not ours"
    );
}

#[test]
fn a_signal_while_holding_back_gives_everything_back() {
    let mem = Memory::new();
    mem.hold_back(Duration::from_secs(30));
    interrupted_after_200ms(&mem, Duration::from_secs(3), libc::SIGTERM);
}

#[test]
fn a_signal_while_waiting_gives_everything_back() {
    let mem = Memory::new();
    mem.take_as("b", 1, Duration::from_secs(30));
    interrupted_after_200ms(&mem, Duration::from_secs(30), libc::SIGINT);
}

#[test]
fn a_wait_that_runs_out_is_busy_and_leaves_nothing() {
    let mem = Memory::new();
    mem.take_as("b", 1, Duration::from_secs(30));
    let (k, holder, interrupt) = (keys(&["a", "b"]), me(), Interrupt::new());
    let deadline = Deadline::At(Instant::now() + Duration::from_millis(300));
    let w = want(&k, Duration::from_secs(30), deadline, &holder, &interrupt);
    let started = Instant::now();
    let err = acquire(&mem, &w).err().expect("busy");
    let took = started.elapsed();
    assert!(err.is::<Busy>() || err.root_cause().is::<Busy>(), "{err:#}");
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(mem.holder_pid("a"), None);
}
