//! System calls that never touch `errno`, for code that runs where the C library's thread state
//! is not its own: the guardian (`crate::guard`) shares dlock's memory and, with it, the main
//! thread's `errno` slot; a libc wrapper that failed there would overwrite the `errno` the main
//! thread is about to read (a `waitid` that failed with EINTR read as ECHILD: "every child is
//! gone"). Each call here issues the system call instruction itself and returns the kernel's
//! answer: a value, or the error number.
//!
//! Nothing here allocates, locks or panics. Only what the guardian needs is offered.

#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use std::ffi::CStr;

/// An error number from the kernel (`libc::EINTR`, ...).
pub(crate) type Errno = i32;

#[cfg(target_arch = "x86_64")]
unsafe fn syscall6(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller passes a system call number and arguments that are valid for it; the
    // `syscall` instruction clobbers rcx and r11 and nothing else but rax.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(target_arch = "aarch64")]
unsafe fn syscall6(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller passes a system call number and arguments that are valid for it; `svc 0`
    // returns in x0 and clobbers nothing else.
    unsafe {
        std::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a[0] as isize => ret,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x4") a[4],
            in("x5") a[5],
            options(nostack),
        );
    }
    ret
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("dlock's guardian issues system calls itself: add this architecture to sys/raw.rs");

/// The kernel returns -4095..-1 for errors.
fn result(ret: isize) -> Result<usize, Errno> {
    if (-4095..0).contains(&ret) {
        Err(ret.wrapping_neg() as Errno)
    } else {
        Ok(ret as usize)
    }
}

/// # Safety
/// `n` and `args` must form a valid system call: pointers valid for what the call does with
/// them, for as long as it runs.
unsafe fn call(n: libc::c_long, args: [usize; 6]) -> Result<usize, Errno> {
    // SAFETY: forwarded from the caller.
    result(unsafe { syscall6(n, args) })
}

/// `read(fd, buf)`.
pub(crate) fn read(fd: i32, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for writes of its length for the duration of the call.
    unsafe {
        call(
            libc::SYS_read,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// `write(fd, buf)`.
pub(crate) fn write(fd: i32, buf: &[u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for reads of its length for the duration of the call.
    unsafe {
        call(
            libc::SYS_write,
            [fd as usize, buf.as_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// `close(fd)`.
pub(crate) fn close(fd: i32) {
    // SAFETY: close takes an integer; closing a descriptor the caller owns.
    let _ = unsafe { call(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]) };
}

/// `openat(AT_FDCWD, path, flags | O_CLOEXEC)`.
pub(crate) fn open(path: &CStr, flags: i32) -> Result<i32, Errno> {
    let flags = flags | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated and outlives the call.
    unsafe {
        call(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                flags as usize,
                0,
                0,
                0,
            ],
        )
    }
    .map(|fd| fd as i32)
}

/// `readlinkat(AT_FDCWD, path, buf)`: the link's target, as bytes in `buf`.
pub(crate) fn readlink<'a>(path: &CStr, buf: &'a mut [u8]) -> Result<&'a [u8], Errno> {
    // SAFETY: `path` is NUL-terminated and `buf` writable for its length, both for the call.
    let n = unsafe {
        call(
            libc::SYS_readlinkat,
            [
                libc::AT_FDCWD as usize,
                path.as_ptr() as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                0,
                0,
            ],
        )
    }?;
    Ok(buf.get(..n).unwrap_or_default())
}

/// `getdents64(fd, buf)`: directory entries (`struct linux_dirent64`) into `buf`.
pub(crate) fn getdents64(fd: i32, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for writes of its length for the duration of the call.
    unsafe {
        call(
            libc::SYS_getdents64,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// `fcntl(fd, cmd, arg)` with an integer argument.
pub(crate) fn fcntl(fd: i32, cmd: i32, arg: usize) -> Result<usize, Errno> {
    // SAFETY: the commands used here take an integer argument.
    unsafe { call(libc::SYS_fcntl, [fd as usize, cmd as usize, arg, 0, 0, 0]) }
}

/// `ppoll(fds, timeout, NULL)`: `None` waits without a time limit. Returns how many are ready.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<std::time::Duration>) -> usize {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` and `ts` outlive the call; no signal mask is given.
    unsafe {
        call(
            libc::SYS_ppoll,
            [fds.as_mut_ptr() as usize, fds.len(), tsp as usize, 0, 0, 0],
        )
    }
    .unwrap_or(0)
}

/// One child that has exited, reaped: `Ok(Some((pid, wait status)))`; `Ok(None)` when children
/// remain but none has exited; `Err(ECHILD)` when none remains.
pub(crate) fn reap_one() -> Result<Option<(i32, i32)>, Errno> {
    // SAFETY: all-zero bytes are a valid siginfo_t, used as an out-parameter only.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG;
    loop {
        // SAFETY: a valid siginfo_t out-pointer; no rusage.
        let r = unsafe {
            call(
                libc::SYS_waitid,
                [
                    libc::P_ALL as usize,
                    0,
                    &mut info as *mut libc::siginfo_t as usize,
                    flags as usize,
                    0,
                    0,
                ],
            )
        };
        match r {
            Err(libc::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => break,
        }
    }
    // SAFETY: waitid filled in a CLD_* siginfo, or left it zeroed (pid 0: none has exited).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    // As waitpid would report it: exit code in bits 8-15, or the signal in bits 0-6.
    let raw = match info.si_code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => status & 0x7f,
    };
    Ok(Some((pid, raw)))
}

/// `kill(pid, sig)` to the one process `pid`. A `pid` of 0 or less is refused (`EINVAL`):
/// to `kill(2)` it means the caller's own process group (0), every process it may signal
/// (−1) or a group (−N) — a watchdog once SIGKILLed its own group through an unset pid of 0.
/// Groups go through [`kill_group`].
pub(crate) fn kill(pid: i32, sig: i32) -> Result<(), Errno> {
    if pid <= 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: kill takes two integers.
    unsafe { call(libc::SYS_kill, [pid as usize, sig as usize, 0, 0, 0, 0]) }.map(|_| ())
}

/// `kill(-group, sig)`: every process of process group `group`. Groups 0 (the caller's own)
/// and 1 (init's) are refused (`EINVAL`), as is a negative number.
pub(crate) fn kill_group(group: i32, sig: i32) -> Result<(), Errno> {
    if group <= 1 {
        return Err(libc::EINVAL);
    }
    // SAFETY: kill takes two integers; -group is a group, never 0 or -1 here.
    unsafe {
        call(
            libc::SYS_kill,
            [group.wrapping_neg() as usize, sig as usize, 0, 0, 0, 0],
        )
    }
    .map(|_| ())
}

/// `pidfd_open(pid, 0)` (Linux ≥ 5.3).
pub(crate) fn pidfd_open(pid: i32) -> Result<i32, Errno> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor.
    unsafe { call(libc::SYS_pidfd_open, [pid as usize, 0, 0, 0, 0, 0]) }.map(|fd| fd as i32)
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`.
pub(crate) fn pidfd_send_signal(pidfd: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: integers and a null siginfo pointer.
    unsafe {
        call(
            libc::SYS_pidfd_send_signal,
            [pidfd as usize, sig as usize, 0, 0, 0, 0],
        )
    }
    .map(|_| ())
}

/// This process's id.
pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid takes nothing and cannot fail.
    unsafe { syscall6(libc::SYS_getpid, [0; 6]) as i32 }
}

/// This process's parent's id.
pub(crate) fn getppid() -> i32 {
    // SAFETY: getppid takes nothing and cannot fail.
    unsafe { syscall6(libc::SYS_getppid, [0; 6]) as i32 }
}

/// `setpgid(pid, pgid)`.
pub(crate) fn setpgid(pid: i32, pgid: i32) -> Result<(), Errno> {
    // SAFETY: setpgid takes two integers.
    unsafe { call(libc::SYS_setpgid, [pid as usize, pgid as usize, 0, 0, 0, 0]) }.map(|_| ())
}

/// `dup3(old, new, 0)`: `new` now refers to what `old` does (without close-on-exec).
pub(crate) fn dup3(old: i32, new: i32) -> Result<(), Errno> {
    // SAFETY: dup3 takes three integers.
    unsafe { call(libc::SYS_dup3, [old as usize, new as usize, 0, 0, 0, 0]) }.map(|_| ())
}

/// `prctl(option, arg)` with integer arguments.
pub(crate) fn prctl(option: i32, arg: usize) -> Result<(), Errno> {
    // SAFETY: the options used here take an integer (or, PR_SET_NAME, a NUL-terminated name of
    // at most 16 bytes, which the caller passes as `arg`).
    unsafe { call(libc::SYS_prctl, [option as usize, arg, 0, 0, 0, 0]) }.map(|_| ())
}

/// Blocks every signal that can be blocked, in the calling thread.
pub(crate) fn block_all_signals() {
    let all: u64 = !0;
    // SAFETY: a valid 8-byte kernel sigset, no old set asked for.
    let _ = unsafe {
        call(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_BLOCK as usize,
                &all as *const u64 as usize,
                0,
                size_of::<u64>(),
                0,
                0,
            ],
        )
    };
}

/// A non-blocking, close-on-exec signalfd for the signals in `set` (bit N-1 for signal N;
/// blocked by the caller).
pub(crate) fn signalfd(set: u64) -> Result<i32, Errno> {
    let flags = libc::SFD_NONBLOCK | libc::SFD_CLOEXEC;
    // SAFETY: a valid 8-byte kernel sigset that outlives the call; -1 asks for a new descriptor.
    unsafe {
        call(
            libc::SYS_signalfd4,
            [
                usize::MAX, // -1
                &set as *const u64 as usize,
                size_of::<u64>(),
                flags as usize,
                0,
                0,
            ],
        )
    }
    .map(|fd| fd as i32)
}

/// `CLOCK_BOOTTIME` now, in nanoseconds.
pub(crate) fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    let _ = unsafe {
        call(
            libc::SYS_clock_gettime,
            [
                libc::CLOCK_BOOTTIME as usize,
                &mut ts as *mut libc::timespec as usize,
                0,
                0,
                0,
                0,
            ],
        )
    };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

unsafe extern "C" {
    /// The C library's environment: read (never written) by [`execve_keeping_environment`].
    static environ: *const *const libc::c_char;
}

/// The most arguments [`execve_keeping_environment`] passes.
pub(crate) const MAX_EXEC_ARGS: usize = 31;

/// The most environment entries [`execve_keeping_environment`] filters; a larger environment is
/// passed whole (32 KiB of the caller's stack, a guardian's 256 KiB).
const MAX_EXEC_ENV: usize = 4096;

/// `execve(path, args, env)`: executes `path` with the arguments `args` (at most
/// [`MAX_EXEC_ARGS`], else `E2BIG`) and this process's environment less the variables named in
/// `leave_out` (an environment of more than [`MAX_EXEC_ENV`] entries whole). Returns only on
/// failure.
pub(crate) fn execve_keeping_environment(
    path: &CStr,
    args: &[&CStr],
    leave_out: &[&[u8]],
) -> Errno {
    let mut argv = [std::ptr::null::<libc::c_char>(); MAX_EXEC_ARGS + 1];
    if args.len() > MAX_EXEC_ARGS {
        return libc::E2BIG;
    }
    for (p, a) in argv.iter_mut().zip(args) {
        *p = a.as_ptr();
    }
    // SAFETY: `environ` is the C library's NULL-terminated array; dlock never changes its
    // environment (no `setenv`), so it is not being rewritten while it is read.
    let whole = unsafe { environ };
    let mut kept = [std::ptr::null::<libc::c_char>(); MAX_EXEC_ENV + 1];
    let mut count = 0usize;
    let mut envp = kept.as_ptr();
    let mut i = 0usize;
    // An environment cleared (`clearenv`) is NULL: passed so, an empty one.
    while !whole.is_null() {
        // SAFETY: as above: every entry up to and including the NULL may be read.
        let entry = unsafe { *whole.wrapping_add(i) };
        i = i.wrapping_add(1);
        if entry.is_null() {
            break;
        }
        if leave_out.iter().any(|name| names(entry, name)) {
            continue;
        }
        match kept.get_mut(count).filter(|_| count < MAX_EXEC_ENV) {
            Some(slot) => *slot = entry,
            None => {
                envp = whole;
                break;
            }
        }
        count = count.wrapping_add(1);
    }
    // SAFETY: `argv` holds pointers to NUL-terminated strings borrowed for the call, then at
    // least one NULL; `envp` is `environ` or `kept`, pointers into it then at least one NULL;
    // all outlive the call (which returns only on failure).
    match unsafe {
        call(
            libc::SYS_execve,
            [
                path.as_ptr() as usize,
                argv.as_ptr() as usize,
                envp as usize,
                0,
                0,
                0,
            ],
        )
    } {
        Err(e) => e,
        Ok(_) => 0,
    }
}

/// Whether the environment entry `entry` (`NAME=value`, NUL-terminated) is of the variable
/// `name` (which has no NUL); reads no further than its NUL (no C library: see
/// [`execve_keeping_environment`]'s callers).
fn names(entry: *const libc::c_char, name: &[u8]) -> bool {
    for (i, &want) in name.iter().chain(b"=").enumerate() {
        // SAFETY: the bytes before this one matched `name` or `=`, none of which is NUL (a
        // `name` has none), so the string's NUL has not been passed.
        if unsafe { *entry.wrapping_add(i) } as u8 != want {
            return false;
        }
    }
    true
}

/// Ends the calling process at once with `code`: no destructors, no `atexit` handlers, no
/// flushing of buffers that may belong to another process sharing this memory.
pub(crate) fn exit(code: i32) -> ! {
    loop {
        // SAFETY: exit_group takes an integer and does not return.
        unsafe { syscall6(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0, 0]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_signals_one_process_and_kill_group_a_group_never_our_own_or_everyone() {
        // Signal 0 only checks: what matters is that these never reach kill(2).
        for pid in [0, -1, -2, i32::MIN] {
            assert_eq!(kill(pid, 0), Err(libc::EINVAL), "kill({pid})");
        }
        for group in [1, 0, -1, i32::MIN] {
            assert_eq!(
                kill_group(group, 0),
                Err(libc::EINVAL),
                "kill_group({group})"
            );
        }
        assert_eq!(kill(getpid(), 0), Ok(()));
    }

    #[test]
    fn errors_come_back_as_numbers_and_errno_is_untouched() {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = 1234 };
        assert_eq!(read(-1, &mut [0u8; 4]), Err(libc::EBADF));
        assert_eq!(kill(i32::MAX, 0), Err(libc::ESRCH));
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, 1234);
        assert_eq!(getpid() as u32, std::process::id());
        assert!(boottime_ns() > 0);
    }

    #[test]
    fn an_environment_entry_is_matched_by_its_whole_name() {
        let is = |entry: &CStr, name: &[u8]| names(entry.as_ptr(), name);
        assert!(is(c"LD_PRELOAD=/x.so", b"LD_PRELOAD"));
        assert!(is(c"LD_PRELOAD=", b"LD_PRELOAD"));
        assert!(!is(c"LD_PRELOADS=/x.so", b"LD_PRELOAD"));
        assert!(!is(c"LD_PRE", b"LD_PRELOAD"));
        assert!(!is(c"LD_LIBRARY_PATH=/lib", b"LD_PRELOAD"));
        assert!(!is(c"", b"LD_AUDIT"));
    }
}
