//! Starting a process in this one's memory (`clone(CLONE_VM)`), for the guardian
//! (`crate::guard`): no page-table copy, so it starts in a few microseconds whatever dlock's size.
//!
//! What the compiler cannot check here is the new process's side, and the caller keeps it: the
//! function it runs shares this process's memory and the C library's thread state of the thread
//! that cloned it, so until it executes a program it must not allocate, take a lock, panic or
//! call the C library (which writes `errno`) — it calls only [`super::raw`]; `guard/`'s lints
//! deny the panics. And it reads its argument only until it has told the caller so (or the
//! caller never frees it).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// What the new process's first function is given: placed at the top of its own stack, which is
/// never unmapped, so it stays valid however long the process takes to read it.
struct Start<T> {
    entry: fn(&mut T) -> i32,
    arg: *mut T,
}

/// The new process's first instruction: calls `entry(arg)` and exits with what it returns.
extern "C" fn trampoline<T>(start: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `start` points to the `Start<T>` that `clone_vm` wrote at the top of this process's
    // stack before cloning: mapped, never unmapped, initialized, and read by nothing else.
    let start = unsafe { &*start.cast::<Start<T>>() };
    // SAFETY: `arg` came from a `&mut T` handed to `clone_vm`, whose caller keeps it alive and
    // untouched until this process has said it is done with it (the contract above).
    let arg = unsafe { &mut *start.arg };
    (start.entry)(arg)
}

/// Starts `entry(arg)` as a new process sharing this one's memory, on a stack of its own of
/// `stack` bytes (with a guard page below it, never unmapped: the process may outlive every use
/// this one makes of it). It is this process's child (SIGCHLD when it ends), with its own copy
/// of the descriptor table, its own signal dispositions, its own pid. Returns its pid.
///
/// The caller keeps `arg` alive and does not touch it until the new process has said it is
/// done with it, and `entry` keeps the rules of the module documentation.
pub(crate) fn clone_vm<T>(stack: usize, entry: fn(&mut T) -> i32, arg: &mut T) -> io::Result<i32> {
    let top = map_stack(stack)?;
    // The `Start` at the top of the new stack, aligned down; the stack grows down from below it
    // (16-byte aligned, as both architectures want).
    let at = (top as usize - size_of::<Start<T>>()) & !15;
    let start = at as *mut Start<T>;
    // SAFETY: `at` is inside the mapping just made (it is far larger than a `Start`), aligned
    // for it, and nothing else refers to that memory.
    unsafe {
        start.write(Start {
            entry,
            arg: std::ptr::from_mut(arg),
        });
    }
    // SAFETY: `trampoline::<T>` runs on the new stack (below `start`, which it only reads) in
    // this process's memory, and reads `start` and `arg` as argued there. No CLONE_FILES: the
    // new process gets its own copy of the descriptor table. No CLONE_SIGHAND or CLONE_THREAD:
    // its own dispositions, its own pid.
    let pid = unsafe {
        libc::clone(
            trampoline::<T>,
            start.cast(),
            libc::CLONE_VM | libc::SIGCHLD,
            start.cast(),
        )
    };
    if pid < 0 {
        // No new process exists: errno is ours alone.
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// Maps a stack of `size` bytes with a guard page below it, and returns its top.
fn map_stack(size: usize) -> io::Result<*mut u8> {
    let page = 4096;
    // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size + page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the lowest page of the mapping just made.
    unsafe { libc::mprotect(base, page, libc::PROT_NONE) };
    Ok(base.cast::<u8>().wrapping_add(size + page))
}

/// A non-blocking, close-on-exec pipe: (read end, write end).
pub(crate) fn pipe_nonblocking() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether the kernel loaded a program interpreter for this process (`AT_BASE` is not 0): it
/// did for a dynamically linked program started directly, not for `ld.so PROGRAM` (then
/// `/proc/self/exe` is the loader) nor for a static build.
pub(crate) fn has_interpreter() -> bool {
    // SAFETY: getauxval reads the auxiliary vector, nothing else (AT_BASE always exists).
    unsafe { libc::getauxval(libc::AT_BASE) != 0 }
}
