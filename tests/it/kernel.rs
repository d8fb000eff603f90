//! An older kernel, simulated: a seccomp filter, installed in the child between `fork` and
//! `exec`, that answers the system calls a kernel of that age lacks as that kernel does
//! (`ENOSYS`), and `waitid(P_PIDFD, …)` with `EINVAL`. It is inherited by everything the process
//! starts, so dlock, its guardian, its holder and the command all run "on" that kernel.
//!
//! The filter is a dozen BPF instructions written here rather than built with a crate
//! (`seccompiler`, `libseccomp`): what it denies are two ranges of system-call numbers —
//! every call added after a release has a number above the last one that release knew, on
//! x86-64 and AArch64 alike (since 5.1 the numbers are shared by every architecture) — and one
//! argument test, which a rule language would not make shorter, and a crate would be one more
//! dependency of the test build for it.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Which kernel dlock runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// This machine's, unfiltered.
    #[default]
    Today,
    /// Linux 5.0: no pidfds (`pidfd_open`, `pidfd_send_signal`, `waitid(P_PIDFD)`), no
    /// `clone3`, no `close_range`, `openat2`, `io_uring`, nothing newer.
    Linux5_0,
    /// Linux 3.10 (CentOS 7): also no `statx`, `getrandom`, `memfd_create`,
    /// `copy_file_range`, `execveat`, `membarrier`, `preadv2`, `pkey_*`, `rseq`, `bpf`,
    /// `renameat2`, `seccomp`, `sched_setattr`, `userfaultfd`, `mlock2`, `io_pgetevents`.
    Linux3_10,
    /// Linux 3.3, older than dlock supports: also no child subreapers (`prctl`'s
    /// `PR_SET_CHILD_SUBREAPER` is `EINVAL`).
    Linux3_3,
    /// Today's kernel in a sandbox that lets a process open pidfds but denies signalling
    /// through one (`pidfd_send_signal` is `EPERM`).
    PidfdSignalDenied,
}

/// `struct seccomp_data`: the call's number, then its architecture, then the arguments.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0: u32 = 16;

/// The first number a kernel of each level does not know.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "x86_64")]
const FIRST_AFTER_3_10: u32 = 314; // sched_setattr (3.14)
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;
#[cfg(target_arch = "aarch64")]
const FIRST_AFTER_3_10: u32 = 274; // sched_setattr (3.14)
/// pidfd_send_signal (5.1), the first of the numbers shared by every architecture.
const FIRST_AFTER_5_0: u32 = 424;
/// `P_PIDFD` (5.4) for `waitid`.
const P_PIDFD: u32 = 3;

const LD_ABS_W: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | e as u32
}

impl Kernel {
    /// The filter's program; `None` for today's kernel.
    fn program(self) -> Option<Vec<libc::sock_filter>> {
        let first_unknown = match self {
            Kernel::Today => return None,
            Kernel::PidfdSignalDenied => u32::MAX,
            Kernel::Linux5_0 => FIRST_AFTER_5_0,
            Kernel::Linux3_10 | Kernel::Linux3_3 => FIRST_AFTER_3_10,
        };
        let mut p = vec![
            op(LD_ABS_W, 0, 0, ARCH),
            op(JEQ, 1, 0, AUDIT_ARCH),
            op(RET, 0, 0, ALLOW), // another architecture's calls (none here)
            op(LD_ABS_W, 0, 0, NR),
            op(JGE, 0, 1, first_unknown),
            op(RET, 0, 0, errno(libc::ENOSYS)),
        ];
        if self == Kernel::PidfdSignalDenied {
            p.extend([
                op(JEQ, 0, 1, libc::SYS_pidfd_send_signal as u32),
                op(RET, 0, 0, errno(libc::EPERM)),
            ]);
        }
        // Call `nr` with a first argument `arg0`: fails with `e`. (The accumulator holds the
        // call's number when a rule does not match it.)
        let mut refuse = |nr: i64, arg0: u32, e: i32| {
            p.extend([
                op(JEQ, 0, 4, nr as u32),
                op(LD_ABS_W, 0, 0, ARG0),
                op(JEQ, 0, 1, arg0),
                op(RET, 0, 0, errno(e)),
                op(RET, 0, 0, ALLOW),
            ]);
        };
        refuse(libc::SYS_waitid, P_PIDFD, libc::EINVAL);
        if self == Kernel::Linux3_3 {
            refuse(
                libc::SYS_prctl,
                libc::PR_SET_CHILD_SUBREAPER as u32,
                libc::EINVAL,
            );
        }
        p.push(op(RET, 0, 0, ALLOW));
        Some(p)
    }

    /// Makes `cmd` run on this kernel.
    pub(crate) fn apply(self, cmd: &mut Command) {
        let Some(program) = self.program() else {
            return;
        };
        // SAFETY: the closure runs between fork and exec and calls only prctl, which is
        // async-signal-safe; `program` was built before the fork and is only read.
        unsafe {
            cmd.pre_exec(move || {
                let prog = libc::sock_fprog {
                    len: program.len() as u16,
                    filter: program.as_ptr().cast_mut(),
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &raw const prog,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Its name in test output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::Today => "today's kernel",
            Kernel::Linux5_0 => "Linux 5.0",
            Kernel::Linux3_10 => "Linux 3.10",
            Kernel::Linux3_3 => "Linux 3.3",
            Kernel::PidfdSignalDenied => "a sandbox denying pidfd_send_signal",
        }
    }
}
