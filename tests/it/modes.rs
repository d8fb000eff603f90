//! Lock modes, written once and instantiated per backend with [`modes!`]: shared locks,
//! semaphores (`--limit`), several keys, and nested runs. A backend that cannot hold a mode
//! soundly must refuse it with exit 2 (its [`TestBackend`] says which it takes).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::conformance::wait_until_waiting;
use crate::util::*;

/// Expands to one `#[test]` per mode case for a backend.
#[macro_export]
macro_rules! modes {
    ($make:expr) => {
        $crate::modes!(@cases $make;
            shared_holders_run_together_and_the_exclusive_waits_for_all,
            writer_is_not_starved_by_overlapping_readers,
            limit_is_never_exceeded_and_is_reached,
            limit_holders_must_agree_on_n,
            limit_waiter_takes_a_freed_slot_at_once_and_leaves_nothing_when_interrupted,
            several_keys_in_any_order_never_deadlock,
            several_keys_are_held_together_or_not_at_all,
            losing_one_of_several_keys_is_losing_the_lock,
            nested_run_on_the_same_lock_does_not_wait,
            stale_inherited_claim_is_ignored,
            claim_forged_in_another_pid_namespace_is_not_honoured,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let backend = $make;
                $crate::modes::$case(&backend);
            }
        )*
    };
}

/// A backend without the mode refuses it: exit 2, one line naming the mode.
fn refuses(b: &TestBackend, flags: &[&str], mode: &str) {
    let key = unique_key("refused");
    let out = run_code(&mut b.run(&key, flags, &["true"]), 2);
    let line = one_error_line(&out);
    assert!(
        line.contains(mode) && line.contains("not supported"),
        "{line}"
    );
}

fn token_of(marker: &Path) -> u64 {
    let text = std::fs::read_to_string(marker).unwrap();
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

pub(crate) fn shared_holders_run_together_and_the_exclusive_waits_for_all(b: &TestBackend) {
    if !b.shared {
        return refuses(b, &["--shared"], "shared");
    }
    let key = unique_key("shared");
    let dir = scratch("shared");
    // All three commands run at once: each starts while the others still hold.
    let mut readers: Vec<Proc> = (0..3)
        .map(|i| b.holding(&key, &["--shared"], &dir.join(format!("reader-{i}"))))
        .collect();
    let st = b.status(&key);
    assert_eq!(st["held"], true, "{st}");
    assert_eq!(st["mode"], "shared", "{st}");
    assert_eq!(st["holders"].as_array().unwrap().len(), 3, "{st}");
    if b.fencing {
        let tokens: BTreeSet<u64> = (0..3)
            .map(|i| token_of(&dir.join(format!("reader-{i}"))))
            .collect();
        assert_eq!(tokens.len(), 3, "every acquisition gets its own token");
    }
    let ran = dir.join("writer-ran");
    let writer = Proc::spawn(&mut b.run(
        &key,
        &["--wait", "30s"],
        &sh(&format!(
            "echo \"$DLOCK_FENCING_TOKEN\" > {}",
            ran.display()
        )),
    ));
    wait_until_waiting(b, &key, 1);
    for r in readers.drain(..2) {
        let mut r = r;
        r.close_stdin();
        run_code_proc(r, 0);
    }
    assert!(!ran.exists(), "the writer ran while a reader still held");
    let mut last = readers.pop().unwrap();
    last.close_stdin();
    let released = Instant::now();
    run_code_proc(last, 0);
    run_code_proc(writer, 0);
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "the writer took {:?} after the last reader left",
        released.elapsed()
    );
    if b.fencing {
        let w: u64 = wait_for_file(&ran, Duration::from_secs(1)).parse().unwrap();
        for i in 0..3 {
            assert!(w > token_of(&dir.join(format!("reader-{i}"))));
        }
    }
    assert!(b.is_free(&key));
}

fn run_code_proc(p: Proc, code: i32) {
    let (out, _) = p.wait(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(code), "{}", describe(&out));
}

pub(crate) fn writer_is_not_starved_by_overlapping_readers(b: &TestBackend) {
    if !b.shared {
        return;
    }
    let key = unique_key("starve");
    let stop = AtomicBool::new(false);
    let writer_done = std::sync::Mutex::new(None::<Duration>);
    std::thread::scope(|s| {
        // Two reader loops, each run 400 ms long and started while the other holds: without
        // writer preference the lock is never free of readers.
        for i in 0..2 {
            let (stop, key) = (&stop, &key);
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(200 * i));
                let start = Instant::now();
                while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    run_ok(&mut b.run(key, &["--shared", "--wait", "30s"], &["sleep", "0.4"]));
                }
            });
        }
        // Let the readers overlap, then ask for the exclusive lock.
        wait_until(Duration::from_secs(10), "two readers at once", || {
            b.status(&key)["holders"]
                .as_array()
                .is_some_and(|h| h.len() == 2)
        });
        let asked = Instant::now();
        run_ok(&mut b.run(&key, &["--wait", "30s"], &["true"]));
        *writer_done.lock().unwrap() = Some(asked.elapsed());
        stop.store(true, Ordering::SeqCst);
    });
    let took = writer_done.lock().unwrap().unwrap();
    // The readers inside when it asked leave within 400 ms; new ones wait for it.
    assert!(
        took < Duration::from_secs(3),
        "the exclusive run waited {took:?} behind a stream of readers"
    );
}

pub(crate) fn limit_is_never_exceeded_and_is_reached(b: &TestBackend) {
    if !b.limit {
        return refuses(b, &["--limit", "3"], "limit");
    }
    let key = unique_key("limit");
    let dir = scratch("limit");
    let inside = dir.join("inside");
    std::fs::create_dir(&inside).unwrap();
    let counts = dir.join("counts");
    // Each run marks itself inside, counts the marks, stays a while, leaves.
    let script = format!(
        "touch {i}/$$; ls {i} | wc -l >> {c}; sleep 0.5; rm {i}/$$",
        i = inside.display(),
        c = counts.display()
    );
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                for _ in 0..2 {
                    run_ok(&mut b.run(&key, &["--limit", "3", "--wait", "60s"], &sh(&script)));
                }
            });
        }
    });
    let seen: Vec<u32> = std::fs::read_to_string(&counts)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 12);
    let max = *seen.iter().max().unwrap();
    assert!(max <= 3, "more than 3 holders at once: {seen:?}");
    assert_eq!(max, 3, "never 3 holders at once: {seen:?}");
    assert!(b.is_free(&key));
}

pub(crate) fn limit_holders_must_agree_on_n(b: &TestBackend) {
    if !b.limit {
        return;
    }
    let key = unique_key("limit-n");
    let dir = scratch("limit-n");
    let mut h = b.holding(&key, &["--limit", "3"], &dir.join("held"));
    let st = b.status(&key);
    assert_eq!(st["mode"], "limit", "{st}");
    assert_eq!(st["limit"], 3, "{st}");
    for flags in [
        &["--limit", "2"][..],
        &[],
        &["--limit", "4", "--wait", "5s"],
    ] {
        let mut all = flags.to_vec();
        all.push("--no-wait");
        if flags.contains(&"--wait") {
            all.pop();
        }
        let out = run_code(&mut b.run(&key, &all, &["true"]), 2);
        let line = one_error_line(&out);
        assert!(line.contains("--limit 3"), "{line}");
    }
    // The same N is welcome.
    run_ok(&mut b.run(&key, &["--limit", "3", "--no-wait"], &["true"]));
    h.close_stdin();
    run_code_proc(h, 0);
}

pub(crate) fn limit_waiter_takes_a_freed_slot_at_once_and_leaves_nothing_when_interrupted(
    b: &TestBackend,
) {
    if !b.limit {
        return;
    }
    let key = unique_key("limit-wait");
    let dir = scratch("limit-wait");
    let flags = ["--limit", "2"];
    let mut first = b.holding(&key, &flags, &dir.join("h1"));
    let second = b.holding(&key, &flags, &dir.join("h2"));
    // A waiter that gives up on Ctrl-C holds nothing afterwards.
    let quitter = Proc::spawn(&mut b.run(&key, &flags, &["true"]));
    wait_until_waiting(b, &key, 1);
    quitter.signal(libc::SIGINT);
    let (out, _) = quitter.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(130), "{}", describe(&out));
    // Nothing of it is left: no waiter entry (an etcd waiter's key kept until its lease ran
    // out held the next waiter back for a TTL).
    let st = b.status(&key);
    assert!(
        st["waiters"].as_u64().is_none_or(|w| w == 0),
        "the interrupted waiter left an entry: {st}"
    );
    // A waiter gets the slot a holder frees, at once.
    let ran = dir.join("ran");
    let waiter = Proc::spawn(&mut b.run(
        &key,
        &["--limit", "2", "--wait", "30s"],
        &sh(&format!("echo ok > {}", ran.display())),
    ));
    wait_until_waiting(b, &key, 1);
    assert!(!ran.exists(), "a third holder ran beside two");
    first.close_stdin();
    let freed = Instant::now();
    run_code_proc(first, 0);
    run_code_proc(waiter, 0);
    assert!(
        freed.elapsed() < Duration::from_secs(2),
        "the waiter took {:?} to get the freed slot",
        freed.elapsed()
    );
    // One slot is still held by the second holder: exactly one more fits.
    let third = b.holding(&key, &flags, &dir.join("h3"));
    run_code(
        &mut b.run(&key, &["--limit", "2", "--no-wait"], &["true"]),
        75,
    );
    drop((second, third));
}

pub(crate) fn several_keys_in_any_order_never_deadlock(b: &TestBackend) {
    let a = unique_key("multi-a");
    let z = unique_key("multi-z");
    let dir = scratch("multi");
    let counter = dir.join("counter");
    std::fs::write(&counter, "0\n").unwrap();
    let script = format!("n=$(cat {c}); echo $((n + 1)) > {c}", c = counter.display());
    std::thread::scope(|s| {
        for order in [[&a, &z], [&z, &a]] {
            let script = &script;
            s.spawn(move || {
                for _ in 0..15 {
                    let p = Proc::spawn(&mut b.run(
                        order[0],
                        &["-k", order[1], "--wait", "30s"],
                        &sh(script),
                    ));
                    let (out, _) = p.wait(Duration::from_secs(30));
                    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
                }
            });
        }
    });
    let n: u32 = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(n, 30, "lost updates: two holders of both keys at once");
    assert!(b.is_free(&a) && b.is_free(&z));
}

pub(crate) fn several_keys_are_held_together_or_not_at_all(b: &TestBackend) {
    let a = unique_key("all-a");
    let z = unique_key("all-z");
    let dir = scratch("all");
    // Both held, both named to the command in the order given.
    let out = run_ok(&mut b.run(
        &z,
        &["-k", &a],
        &sh("printf '%s|%s|%s' \"$DLOCK_KEY\" \"$DLOCK_KEYS\" \"$DLOCK_FENCING_TOKENS\""),
    ));
    let text = String::from_utf8(out.stdout).unwrap();
    let parts: Vec<&str> = text.split('|').collect();
    assert_eq!(parts[0], z);
    assert_eq!(parts[1], format!("{z}\n{a}"));
    if b.fencing {
        assert_eq!(parts[2].lines().count(), 2, "{text}");
    }
    // One of them busy: the other is not left held, whether we try once or wait a while.
    let mut h = b.holding(&z, &[], &dir.join("held"));
    for wait in [&["--no-wait"][..], &["--wait", "500ms"]] {
        let mut flags = vec!["-k", &z];
        flags.extend_from_slice(wait);
        let out = run_code(&mut b.run(&a, &flags, &["true"]), 75);
        one_error_line(&out);
        assert!(b.is_free(&a), "a partial acquisition was left behind");
    }
    h.close_stdin();
    run_code_proc(h, 0);
}

pub(crate) fn losing_one_of_several_keys_is_losing_the_lock(b: &TestBackend) {
    let a = unique_key("lose-a");
    let z = unique_key("lose-z");
    let (p, child) = b.hold(&a, &["-k", &z]);
    run_ok(b.cmd("break").args(["-k", &z]));
    let (out, _) = p.wait(b.notice + Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(!alive(child));
    assert!(b.is_free(&a), "the other key was not released");
}

pub(crate) fn nested_run_on_the_same_lock_does_not_wait(b: &TestBackend) {
    let key = unique_key("nested");
    // Without nesting, the inner run would wait for its own parent and give up after 5 s.
    let mut inner = b.run_words();
    inner.extend(
        ["-k", &key, "--wait", "5s", "--", "sh", "-c"]
            .iter()
            .map(|s| s.to_string()),
    );
    inner.push("echo \"inner $DLOCK_FENCING_TOKEN\"".into());
    let script = format!("echo \"outer $DLOCK_FENCING_TOKEN\"; {}", quote(&inner));
    let started = Instant::now();
    let out = run_ok(&mut b.run(&key, &[], &sh(&script)));
    let took = started.elapsed();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    if b.fencing {
        let outer = lines[0].strip_prefix("outer ").unwrap();
        let inner = lines[1].strip_prefix("inner ").unwrap();
        assert_eq!(outer, inner, "the nested run has the same token");
    }
    assert!(took < Duration::from_secs(4), "nested run took {took:?}");
    assert!(b.is_free(&key));

    // The nested run leaves the release to the outer one: the lock is still the outer's after.
    let dir = scratch("nested");
    let marker = dir.join("inner-done");
    let script = format!(
        "{} -k '{key}' -- true && echo done > {}; read _x || true",
        quote(&b.run_words()),
        marker.display()
    );
    let mut outer = Proc::spawn(&mut b.run(&key, &[], &sh(&script)));
    wait_for_file(&marker, Duration::from_secs(10));
    let st = b.status(&key);
    assert_eq!(st["held"], true, "{st}");
    assert_eq!(st["holders"][0]["pid"], outer.pid(), "{st}");
    outer.close_stdin();
    run_code_proc(outer, 0);
}

fn quote(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a holder whose command writes its `DLOCK_HELD` to `marker` and waits for stdin to close.
fn holding_with_claims(b: &TestBackend, key: &str, marker: &Path) -> (Proc, String) {
    let script = format!(
        "printf '%s\\n' \"$DLOCK_HELD\" > {m}.tmp && mv {m}.tmp {m}; read _x || true",
        m = marker.display()
    );
    let p = Proc::spawn(&mut b.run(key, &[], &sh(&script)));
    let claims = wait_for_file(marker, Duration::from_secs(10));
    (p, claims)
}

pub(crate) fn stale_inherited_claim_is_ignored(b: &TestBackend) {
    let key = unique_key("stale-claim");
    let dir = scratch("stale-claim");
    // A real claim, by a run that has ended: the lock is free, and acquired anew.
    let (mut h, claims) = holding_with_claims(b, &key, &dir.join("claims-1"));
    h.close_stdin();
    run_code_proc(h, 0);
    let out = run_ok(
        b.run(&key, &["--no-wait"], &sh("echo $DLOCK_FENCING_TOKEN"))
            .env("DLOCK_HELD", &claims),
    );
    let parsed: serde_json::Value = serde_json::from_str(&claims).unwrap();
    if b.fencing {
        let old = parsed[0]["token"].as_u64().unwrap();
        let new: u64 = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(new > old, "a stale claim's token was reused");
    }
    // A live holder's claim, copied into a process that is not its descendant: not honoured.
    let (mut h, claims) = holding_with_claims(b, &key, &dir.join("claims-2"));
    let out = run_code(
        b.run(&key, &["--no-wait"], &["true"])
            .env("DLOCK_HELD", &claims),
        75,
    );
    one_error_line(&out);
    h.close_stdin();
    run_code_proc(h, 0);
}

/// A `DLOCK_HELD` claim is honoured only within the holder's PID namespace. Regression: with
/// the holder running as pid 1 of a namespace of its own (a container's init), a claim naming
/// pid 1 — with the token and time copied from `status` — made in *another* namespace on a
/// host of the same name passed: the forger's pid 1 is its ancestor too, and the nested run
/// ran beside the holder. Needs root (to make PID namespaces).
pub(crate) fn claim_forged_in_another_pid_namespace_is_not_honoured(b: &TestBackend) {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !crate::servers::required(),
            "making PID namespaces needs root, and DLOCK_TEST_REQUIRE_BACKENDS=1"
        );
        eprintln!("SKIPPED: making PID namespaces needs root");
        return;
    }
    if !crate::servers::available("unshare") {
        return;
    }
    let key = unique_key("forged-claim");
    let dir = scratch("forged-claim");
    let held = dir.join("held");
    // The holder: dlock as pid 1 of its own PID namespace.
    let mut words = b.run_words();
    words.extend(["-k".into(), key.clone(), "--".into()]);
    words.extend(sh(&format!(
        "echo \"$DLOCK_HELD\" > {}; read _x || true",
        held.display()
    )));
    let mut holder = in_own_pid_namespace(b, &words);
    let mut holder = Proc::spawn(&mut holder);
    let claim = wait_for_file(&held, b.ttl + Duration::from_secs(10));
    let claims: serde_json::Value = serde_json::from_str(&claim).unwrap();
    assert_eq!(
        claims[0]["pid"], 1,
        "the holder is pid 1 of its namespace: {claim}"
    );
    // The forger, in a namespace of its own, where pid 1 (its shell) is an ancestor of its
    // dlock: the claim copied as it is, and again naming the forger's own namespace.
    for variant in ["as copied", "own namespace"] {
        let script = format!(
            "if [ \"$VARIANT\" = 'own namespace' ]; then \
               ns=$(readlink /proc/self/ns/pid | tr -dc 0-9); \
               CLAIM=$(printf '%s' \"$CLAIM\" | sed \"s/\\\"pidns\\\":[0-9]*/\\\"pidns\\\":$ns/\"); \
             fi; \
             DLOCK_HELD=\"$CLAIM\" {} -k '{key}' --no-wait -- echo ran; exit $?",
            quote(&b.run_words())
        );
        let out = output(
            in_own_pid_namespace(b, &sh(&script))
                .env("CLAIM", &claim)
                .env("VARIANT", variant),
        );
        assert_eq!(
            out.status.code(),
            Some(75),
            "the forged claim ({variant}) was honoured: {}",
            describe(&out)
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    }
    holder.close_stdin();
    run_code_proc(holder, 0);
}

/// `unshare --pid --fork --mount-proc -- WORDS…`, with the backend's environment: WORDS run as
/// pid 1 of a PID namespace of their own.
fn in_own_pid_namespace(b: &TestBackend, words: &[String]) -> std::process::Command {
    let mut c = std::process::Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--"])
        .args(words);
    for (k, v) in &b.env {
        c.env(k, v);
    }
    c
}
