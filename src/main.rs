//! The `dlock` binary: see [`dlock_cli::start`].
//!
//! `no_main`: the C library calls `main` below directly. Rust's runtime start-up, skipped that
//! way, cost 0.076 ms of every run here (it reads /proc/self/maps, maps and later unmaps a
//! signal stack for a stack-overflow message, asks for the CPU affinity: some fifteen system
//! calls) — 5% of a whole `flock(1)` run, measured with `bench/alternate.py` against a program
//! that skips it. `dlock_cli::start` does the part dlock needs.
#![no_main]

/// The process's entry point, called by the C library (std's own `args` still work: glibc hands
/// them to std's initializer as well).
// SAFETY: no other symbol of the program is named `main` (`no_main`: std defines none here, and
// the library defines none, or every test binary linking it would have two): the C library's
// call reaches this function, whose signature is C's `main`. The one `unsafe` outside src/sys/
// (an attribute, not unsafe code; see docs/design.md, "Shape of the code").
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    dlock_cli::start()
}
