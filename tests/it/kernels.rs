//! Every lifetime rule on the oldest kernels the release supports, simulated (`kernel.rs`):
//! Linux 5.0 (no pidfds, no clone3, no close_range) and 3.10 (CentOS 7: also no statx,
//! getrandom, memfd_create, copy_file_range, rseq, …), on the file backend, Redis and
//! PostgreSQL. The lifetime, tree and acquire cases of the other modules run here unchanged
//! under each filter, and the cases below check the bounds of "where it runs" (docs/failures.md,
//! "Old kernels"): a `break` or a SIGTERM ends a command that ignores SIGTERM, a `break` ends
//! an acquire owner's child that does, and so does a `kill -9` of the acquire holder (its
//! watchdog).

use std::time::{Duration, Instant};

use crate::acquire::{cmd, release, start_owner};
use crate::servers::{shared_postgres, shared_redis};
use crate::util::*;

/// One module per kernel and backend, each with the cases of every suite that stop processes.
macro_rules! on_kernel {
    ($kernel:expr, $make:expr) => {
        crate::conformance!(@cases $make.on($kernel);
            exit_code_is_the_commands,
            each_signal_reaches_the_command_and_frees_the_lock,
            kill_grace_escalates_to_sigkill,
            kill_9_of_dlock_kills_the_command_and_frees_the_lock,
            break_stops_the_holder_with_79,
            break_never_lets_a_waiter_start_beside_the_holder,
            interrupt_while_waiting_leaves_nothing_behind,
        );
        crate::tree!($make.on($kernel));
        crate::acquire!(@cases $make.on($kernel);
            acquire_holds_across_commands_until_release,
            owner_exit_frees_the_lock_within_a_second,
            break_stops_the_owner_group_and_release_says_79,
            kill_9_of_the_holder_frees_the_lock_and_release_says_79,
        );

        #[test]
        fn break_and_sigterm_end_a_command_that_ignores_sigterm() {
            crate::kernels::break_and_sigterm_end_a_command_that_ignores_sigterm(&$make.on($kernel));
        }

        #[test]
        fn break_ends_an_acquire_owners_child_that_ignores_sigterm() {
            crate::kernels::break_ends_an_acquire_owners_child_that_ignores_sigterm(&$make.on($kernel));
        }

        #[test]
        fn kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts() {
            crate::acquire_watchdog::kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts(
                &$make.on($kernel),
            );
        }
    };
}

macro_rules! backends {
    ($kernel:expr) => {
        mod file {
            use super::*;
            on_kernel!($kernel, TestBackend::file());
        }
        mod redis {
            use super::*;
            on_kernel!(
                $kernel,
                match shared_redis() {
                    Some(url) => TestBackend::redis(&url),
                    None => return,
                }
            );
        }
        mod postgres {
            use super::*;
            on_kernel!(
                $kernel,
                match shared_postgres() {
                    Some(p) => TestBackend::postgres(&p.url()),
                    None => return,
                }
            );
        }
    };
}

mod linux_5_0 {
    use super::*;

    backends!(Kernel::Linux5_0);
}

mod linux_3_10 {
    use super::*;

    backends!(Kernel::Linux3_10);

    /// Without pidfds the watchdog names each process it stops by its start time alone.
    #[test]
    fn kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group() {
        let b = TestBackend::file().on(Kernel::Linux3_10);
        crate::acquire_watchdog::kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group(
            &b,
        );
    }
}

/// A sandbox that allows `pidfd_open` but not `pidfd_send_signal` counts as one without pidfds.
mod pidfd_signal_denied {
    use super::*;

    #[test]
    fn break_and_sigterm_end_a_command_that_ignores_sigterm() {
        let b = TestBackend::file().on(Kernel::PidfdSignalDenied);
        crate::kernels::break_and_sigterm_end_a_command_that_ignores_sigterm(&b);
    }

    #[test]
    fn break_ends_an_acquire_owners_child_that_ignores_sigterm() {
        let b = TestBackend::file().on(Kernel::PidfdSignalDenied);
        crate::kernels::break_ends_an_acquire_owners_child_that_ignores_sigterm(&b);
    }

    #[test]
    fn kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts() {
        let b = TestBackend::file().on(Kernel::PidfdSignalDenied);
        crate::acquire_watchdog::kill_9_of_the_holder_kills_the_owners_group_before_a_waiter_starts(
            &b,
        );
    }

    #[test]
    fn kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group() {
        let b = TestBackend::file().on(Kernel::PidfdSignalDenied);
        crate::acquire_watchdog::kill_9_of_the_holder_kills_the_child_of_an_owner_leading_no_group(
            &b,
        );
    }
}

/// The filter is in force: what each level lacks fails as that kernel fails (a test of the
/// test helper, without which every case above could pass on today's kernel by mistake).
#[test]
fn the_simulated_kernels_lack_what_they_should() {
    let probe = |kernel: Kernel, code: &str| {
        let mut c = std::process::Command::new("python3");
        kernel.apply(&mut c);
        let out = output(c.args(["-c", code]));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let pidfd = "import os\ntry:\n  os.pidfd_open(os.getpid()); print('ok')\nexcept OSError as e: print(e.errno)";
    let random =
        "import os\ntry:\n  os.getrandom(1); print('ok')\nexcept OSError as e: print(e.errno)";
    let waitid = "import os\ntry:\n  os.waitid(3, 0, os.WEXITED); print('ok')\nexcept OSError as e: print(e.errno)";
    assert_eq!(probe(Kernel::Today, pidfd), "ok");
    assert_eq!(probe(Kernel::Today, random), "ok");
    for kernel in [Kernel::Linux5_0, Kernel::Linux3_10] {
        let name = kernel.name();
        assert_eq!(probe(kernel, pidfd), libc::ENOSYS.to_string(), "{name}");
        assert_eq!(probe(kernel, waitid), libc::EINVAL.to_string(), "{name}");
    }
    assert_eq!(probe(Kernel::Linux5_0, random), "ok");
    assert_eq!(probe(Kernel::Linux3_10, random), libc::ENOSYS.to_string());
}

/// Older than the oldest kernel dlock supports (no child subreapers, Linux < 3.4): `run`
/// refuses with 69 and one line naming the feature, and the command never runs.
#[test]
fn a_kernel_without_child_subreapers_is_refused() {
    let b = TestBackend::file().on(Kernel::Linux3_3);
    let key = unique_key("no-subreaper");
    let out = run_code(&mut b.run(&key, &[], &sh("echo ran")), 69);
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    let line = one_error_line(&out);
    assert!(
        line.contains("PR_SET_CHILD_SUBREAPER") && line.contains("Linux 3.10"),
        "{line}"
    );
    assert!(TestBackend::file().is_free(&key));
}

/// A command whose shell and child both ignore SIGTERM: `break` ends it within the holder's
/// notice time + `--kill-grace` + 2 s (79), SIGTERM to dlock within `--kill-grace` + 2 s (143),
/// and neither lets the child print.
pub(crate) fn break_and_sigterm_end_a_command_that_ignores_sigterm(b: &TestBackend) {
    let grace = Duration::from_secs(1);
    for how in ["break", "SIGTERM"] {
        let key = unique_key("ignores-term");
        let dir = scratch("ignores-term");
        let pid = dir.join("pid");
        let script = format!(
            "trap '' TERM; sleep 30 & echo $! > {}; wait; echo survived",
            pid.display()
        );
        let p = Proc::spawn(&mut b.run(&key, &["--kill-grace", "1s"], &sh(&script)));
        let child: i32 = wait_for_file(&pid, b.ttl + Duration::from_secs(10))
            .parse()
            .unwrap();
        let sent = Instant::now();
        let (code, limit) = if how == "break" {
            run_ok(b.cmd("break").args(["-k", &key]));
            (79, b.notice + grace + Duration::from_secs(2))
        } else {
            p.signal(libc::SIGTERM);
            (128 + libc::SIGTERM, grace + Duration::from_secs(2))
        };
        let (out, _) = p.wait(limit + Duration::from_secs(5));
        let took = sent.elapsed();
        assert_eq!(out.status.code(), Some(code), "{how}: {}", describe(&out));
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("survived"),
            "{how}: the command outlived dlock"
        );
        assert!(!alive(child), "{how}: its child outlived dlock");
        assert!(
            took < limit,
            "{how} on {}: dlock ended {took:?} after it (limit {limit:?})",
            b.kernel.name()
        );
    }
}

/// An acquire owner's child that ignores SIGTERM is killed (after `--kill-grace`) when the lock
/// is broken; `release` says 79.
pub(crate) fn break_ends_an_acquire_owners_child_that_ignores_sigterm(b: &TestBackend) {
    let key = unique_key("acq-ignores-term");
    let dir = scratch("acq-ignores-term");
    let child = dir.join("child");
    let tail = format!(
        "sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 0.1; done' & wait",
        child.display()
    );
    let o = start_owner(b, &["-k", &key, "--kill-grace", "1s"], &tail);
    let child: i32 = wait_for_file(&child, Duration::from_secs(5))
        .parse()
        .unwrap();
    run_ok(cmd(b, "break").args(["-k", &key]));
    let broke = Instant::now();
    let limit = b.notice + Duration::from_secs(1) + Duration::from_secs(2);
    wait_until(
        limit + Duration::from_secs(3),
        "the owner's child to die",
        || !alive(child),
    );
    let took = broke.elapsed();
    assert!(
        took < limit,
        "on {}: the owner's child lived {took:?} after the break",
        b.kernel.name()
    );
    let (out, _) = o.p.wait(Duration::from_secs(5));
    assert!(!out.status.success(), "{}", describe(&out));
    wait_until(Duration::from_secs(3), "the holder to exit", || {
        !alive(o.holder)
    });
    run_code(&mut release(&o.handle), 79);
}
