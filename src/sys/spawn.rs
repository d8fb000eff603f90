//! Starting the command the way `posix_spawn` does — `clone(CLONE_VM | CLONE_VFORK)`, the child
//! borrowing its parent's memory until it execs — plus what `posix_spawn` cannot do:
//! `PR_SET_PDEATHSIG`, so that the command dies with the process that started it (the guardian,
//! `crate::guard`), and joining a given process group (dlock's, where the terminal's signals
//! go).
//!
//! std's `Command` with a `pre_exec` hook (how this was done before) has to `fork()`, which
//! copies the page tables: measured 0.26 ms of a 3.3 ms `dlock run -- true` on the file
//! backend (`flock(1)` itself takes 2.4 ms), the difference between 1.33× and 1.22× flock.
//!
//! A [`Plan`] is built (and everything it needs allocated) in dlock; [`Plan::launch`] then
//! allocates nothing, so the guardian can call it. The child only calls async-signal-safe
//! functions on memory it does not allocate, and reports a failed exec by writing its errno into
//! the plan (its parent sleeps until the child has exec'd or exited).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;

/// glibc's execvp search path when PATH is unset.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// What the child reads; built by dlock, launched by the guardian.
pub(crate) struct Plan {
    /// The files to try, in order: the command itself if it names a path, else each PATH entry.
    paths: Vec<CString>,
    /// The arguments, NULL-terminated (pointers into `_args`).
    argv: Vec<*const libc::c_char>,
    /// `/bin/sh FILE ARGS...` for a file without a `#!` line (ENOEXEC), as execvp does; the
    /// child sets slot 1 to the file it tried.
    sh_argv: Vec<*const libc::c_char>,
    /// The environment, NULL-terminated (pointers into `_env`).
    envp: Vec<*const libc::c_char>,
    /// The launching process's pid: a child whose parent already changed missed the death
    /// signal. Set by [`Plan::launch`].
    parent: libc::pid_t,
    /// The process group the child joins (0: its parent's).
    pgid: libc::pid_t,
    /// Written by the child when no exec succeeded.
    errno: libc::c_int,
    /// The child's stack until it execs.
    stack: Vec<u8>,
    _args: Vec<CString>,
    _env: Vec<CString>,
    _sh: CString,
}

impl Plan {
    /// Plans to run `command` (searched in PATH like execvp) with dlock's environment minus
    /// `remove`, plus `set`, in process group `pgid` (0: the launcher's).
    pub(crate) fn new(
        command: &[OsString],
        remove: &[&str],
        set: &[(&str, String)],
        pgid: libc::pid_t,
    ) -> io::Result<Plan> {
        plan(command, remove, set, pgid)
    }

    /// Starts the child from the calling process, which becomes its parent: its pid, or why it
    /// could not be executed (an errno). Allocates nothing, calls no function that takes a lock
    /// and writes to no memory but the plan's, so the guardian may call it. The calling thread
    /// sleeps until the child has exec'd or exited.
    pub(crate) fn launch(&mut self) -> Result<libc::pid_t, libc::c_int> {
        self.parent = super::raw::getpid();
        self.errno = 0;
        // The stack grows down from its 16-byte aligned end.
        let top = (self.stack.as_mut_ptr() as usize).wrapping_add(self.stack.capacity()) & !15;
        // SAFETY: `child` runs on `stack` in this process's memory while this thread is suspended
        // (CLONE_VFORK) until it execs or exits; the plan and its stack outlive that. Without
        // CLONE_SIGHAND the child has its own signal dispositions; the launcher's signals are
        // blocked (see `signals`), so no handler can run on the child's side meanwhile.
        let pid = unsafe {
            libc::clone(
                child,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                self as *mut Plan as *mut libc::c_void,
            )
        };
        if pid < 0 {
            // SAFETY: errno is the calling thread's (or, in the guardian, that of dlock's main
            // thread, which is waiting for this launch and reads no errno meanwhile).
            return Err(unsafe { *libc::__errno_location() });
        }
        if self.errno != 0 {
            // The child exited without exec'ing: reap it here, so that nobody takes it for the
            // command.
            let mut status = 0;
            // SAFETY: a valid pointer to an int; our own child.
            while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
                // SAFETY: as for clone's errno above.
                && unsafe { *libc::__errno_location() } == libc::EINTR
            {}
            return Err(self.errno);
        }
        Ok(pid)
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn plan(
    command: &[OsString],
    remove: &[&str],
    set: &[(&str, String)],
    pgid: libc::pid_t,
) -> io::Result<Plan> {
    let name = command
        .first()
        .map(|c| c.as_bytes())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    let paths = if name.is_empty() {
        Vec::new() // ENOENT, as execvp
    } else if name.contains(&b'/') {
        vec![cstring(name)?]
    } else {
        let path = std::env::var_os("PATH");
        let path = path.as_deref().map_or(DEFAULT_PATH, OsStr::as_bytes);
        path.split(|&b| b == b':')
            .map(|dir| {
                let dir = if dir.is_empty() { &b"."[..] } else { dir };
                let mut file = dir.to_vec();
                file.push(b'/');
                file.extend_from_slice(name);
                cstring(&file)
            })
            .collect::<io::Result<_>>()?
    };
    let args: Vec<CString> = command
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<io::Result<_>>()?;
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.as_bytes();
            !remove.iter().any(|r| r.as_bytes() == k) && !set.iter().any(|(s, _)| s.as_bytes() == k)
        })
        .map(|(k, v)| cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
        .collect::<io::Result<_>>()?;
    for (k, v) in set {
        env.push(cstring(format!("{k}={v}").as_bytes())?);
    }
    let sh = cstring(b"/bin/sh")?;
    let null = std::ptr::null();
    let argv: Vec<_> = args.iter().map(|a| a.as_ptr()).chain([null]).collect();
    let sh_argv: Vec<_> = [sh.as_ptr(), null]
        .into_iter()
        .chain(args.iter().skip(1).map(|a| a.as_ptr()))
        .chain([null])
        .collect();
    let envp: Vec<_> = env.iter().map(|e| e.as_ptr()).chain([null]).collect();
    Ok(Plan {
        paths,
        argv,
        sh_argv,
        envp,
        parent: 0,
        pgid,
        errno: 0,
        // Enough for `child` (a few frames of libc calls); not zeroed: only what the child
        // touches is ever mapped in.
        stack: Vec::with_capacity(32 * 1024),
        _args: args,
        _env: env,
        _sh: sh,
    })
}

/// The child, between clone and exec: async-signal-safe calls only, no allocation.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive and untouched while the parent is suspended.
    unsafe {
        let plan = &mut *(arg as *mut Plan);
        // dlock blocks the signals it waits for (see `signals`); the command must start with
        // an empty mask, or `kill -TERM` would never reach it. SIGPIPE as a shell would.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // Into dlock's process group, where the terminal's signals and job control go (the
        // guardian keeps a group of its own). Failure leaves it in the guardian's group: then
        // dlock is gone and the guardian kills it anyway.
        if plan.pgid != 0 {
            libc::setpgid(0, plan.pgid);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            plan.errno = *libc::__errno_location();
            libc::_exit(127);
        }
        // The launcher died between clone and prctl: the death signal was missed, so die now.
        // (Directly: `raise` finds "this thread" through thread-local state that, in a child of
        // the guardian, describes a thread of dlock.)
        if super::raw::getppid() != plan.parent {
            let _ = super::raw::kill(super::raw::getpid(), libc::SIGKILL);
        }
        // As execvp: remember EACCES but go on searching; other errors end the search.
        let mut failed = libc::ENOENT;
        for file in &plan.paths {
            libc::execve(file.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
            match *libc::__errno_location() {
                libc::ENOEXEC => {
                    plan.sh_argv[1] = file.as_ptr();
                    libc::execve(plan.sh_argv[0], plan.sh_argv.as_ptr(), plan.envp.as_ptr());
                    failed = *libc::__errno_location();
                    break;
                }
                libc::EACCES => failed = libc::EACCES,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                e => {
                    failed = e;
                    break;
                }
            }
        }
        plan.errno = failed;
        libc::_exit(127)
    }
}
