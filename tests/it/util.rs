//! Helpers for driving the real `dlock` binary: a configured command per backend, unique keys
//! and scratch directories, child processes that die with the test, waits on events with
//! deadlines, and assertions that print everything on failure.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub(crate) use crate::kernel::Kernel;

/// The binary under test.
pub(crate) const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A key no other test (or earlier run) uses: the test's name, this process and a counter.
pub(crate) fn unique_key(name: &str) -> String {
    default_signal_dispositions();
    format!(
        "{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// A fresh, empty scratch directory under cargo's per-target temp dir.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("scratch")
        .join(unique_key(name));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// How to reach one backend: the arguments that select it and the environment it needs.
#[derive(Clone, Debug)]
pub(crate) struct TestBackend {
    /// "file", "redis", ...
    pub name: &'static str,
    /// `--backend X --url Y ...`
    pub args: Vec<String>,
    /// Extra environment (e.g. DLOCK_URL with credentials).
    pub env: Vec<(String, String)>,
    /// The lease length tests use; a lock of a killed holder is free within this.
    pub ttl: Duration,
    /// How long a holder may take to notice a `break` (its check or renewal interval).
    pub notice: Duration,
    /// Whether the backend hands out fencing tokens (Redlock does not).
    pub fencing: bool,
    /// Whether it takes `--shared` (else it must refuse with exit 2).
    pub shared: bool,
    /// Whether it takes `--limit N` (else it must refuse with exit 2).
    pub limit: bool,
    /// The kernel dlock runs on (an older one simulated by a seccomp filter, `kernel.rs`).
    pub kernel: Kernel,
}

impl TestBackend {
    /// The file backend, in a directory private to this test binary.
    pub(crate) fn file() -> TestBackend {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("file-locks-{}", std::process::id()));
        // As an operator would: `status` and `log` do not create a URL's directory.
        std::fs::create_dir_all(&dir).unwrap();
        TestBackend {
            name: "file",
            args: vec![
                "--backend".into(),
                "file".into(),
                "--url".into(),
                format!("file://{}", dir.display()),
            ],
            env: Vec::new(),
            ttl: Duration::from_secs(2),
            notice: Duration::from_millis(500),
            fencing: true,
            shared: true,
            limit: true,
            kernel: Kernel::Today,
        }
    }

    /// A server backend at `url`, with a short TTL so that lost locks come back fast; a holder
    /// notices a lost lease at its next renewal (ttl/3).
    fn server(name: &'static str, url: &str) -> TestBackend {
        let ttl = Duration::from_secs(2);
        TestBackend {
            name,
            args: vec!["--backend".into(), name.into(), "--url".into(), url.into()],
            env: Vec::new(),
            ttl,
            notice: ttl / 3 + Duration::from_millis(300),
            fencing: true,
            shared: false,
            limit: false,
            kernel: Kernel::Today,
        }
    }

    /// The same backend with dlock on an older kernel (simulated).
    pub(crate) fn on(self, kernel: Kernel) -> TestBackend {
        TestBackend { kernel, ..self }
    }

    /// Redis at `url`.
    pub(crate) fn redis(url: &str) -> TestBackend {
        TestBackend {
            shared: true,
            limit: true,
            ..TestBackend::server("redis", url)
        }
    }

    /// etcd at `url`.
    pub(crate) fn etcd(url: &str) -> TestBackend {
        TestBackend {
            shared: true,
            limit: true,
            ..TestBackend::server("etcd", url)
        }
    }

    /// S3 (SeaweedFS) at `bucket_url`, with the AWS CLI's environment `env`: exclusive
    /// locks only. A waiter polls (up to 500 ms) and takes over only after watching a whole
    /// lease.
    pub(crate) fn s3(bucket_url: &str, env: Vec<(String, String)>) -> TestBackend {
        TestBackend {
            env,
            ..TestBackend::server("s3", bucket_url)
        }
    }

    /// MySQL/MariaDB at `url`.
    pub(crate) fn mysql(url: &str) -> TestBackend {
        TestBackend {
            shared: true,
            limit: true,
            ..TestBackend::server("mysql", url)
        }
    }

    /// PostgreSQL at `url`.
    pub(crate) fn postgres(url: &str) -> TestBackend {
        TestBackend {
            shared: true,
            limit: true,
            ..TestBackend::server("postgres", url)
        }
    }

    /// ZooKeeper at `url`. The lease is the session: the test servers allow 1 s and more.
    pub(crate) fn zookeeper(url: &str) -> TestBackend {
        TestBackend {
            // A deleted node is seen at once, by a watch.
            notice: Duration::from_millis(300),
            shared: true,
            limit: true,
            ..TestBackend::server("zookeeper", url)
        }
    }

    /// Redlock over several Redis masters.
    pub(crate) fn redlock(urls: &[String]) -> TestBackend {
        let mut args = vec!["--backend".to_string(), "redis".into()];
        for u in urls {
            args.push("--url".into());
            args.push(u.clone());
        }
        TestBackend {
            args,
            fencing: false,
            shared: false,
            limit: false,
            ..TestBackend::redis(&urls[0])
        }
    }

    /// `dlock SUB <backend args>`, with a clean environment.
    pub(crate) fn cmd(&self, sub: &str) -> Command {
        let mut c = dlock();
        self.kernel.apply(&mut c);
        c.arg(sub).args(&self.args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// The words of `dlock run <backend args> --ttl T` (for a command line run by a command).
    pub(crate) fn run_words(&self) -> Vec<String> {
        let mut w = vec![DLOCK.to_string(), "run".into()];
        w.extend(self.args.iter().cloned());
        w.push("--ttl".into());
        w.push(format!("{}ms", self.ttl.as_millis()));
        w
    }

    /// `dlock run <backend args> --ttl T -k KEY EXTRA... -- COMMAND...`
    pub(crate) fn run<S: AsRef<OsStr>>(&self, key: &str, extra: &[&str], command: &[S]) -> Command {
        let mut c = self.cmd("run");
        c.arg("--ttl").arg(format!("{}ms", self.ttl.as_millis()));
        c.arg("-k").arg(key).args(extra).arg("--");
        c.args(command);
        c
    }

    /// Starts a holder whose command writes "PID TOKEN" to `marker` and then waits for stdin to
    /// close ([`Proc::close_stdin`] releases the lock); returns once the command runs.
    pub(crate) fn holding(&self, key: &str, extra: &[&str], marker: &Path) -> Proc {
        let script = format!(
            "echo \"$$ $DLOCK_FENCING_TOKEN\" > {}; read _x || true",
            marker.display()
        );
        // A marker left by an earlier holder would make this return before this one holds
        // (etcd.rs reused one across modes, and etcdctl got the lock first now and then).
        let _ = std::fs::remove_file(marker);
        let p = Proc::spawn(&mut self.run(key, extra, &sh(&script)));
        // A young server holds the first lock of a key back (`backend::hold_back_until`).
        wait_for_file(marker, self.ttl + Duration::from_secs(10));
        p
    }

    /// Like [`TestBackend::holding`] (with `--wait 60s`), but returns at once: the holder may
    /// have to wait.
    pub(crate) fn holding_later(&self, key: &str, marker: &Path) -> Proc {
        let script = format!(
            "echo \"$$ ${{DLOCK_FENCING_TOKEN:-0}}\" > {}; read _x || true",
            marker.display()
        );
        Proc::spawn(&mut self.run(key, &["--wait", "60s"], &sh(&script)))
    }

    /// Starts a holder whose command writes its pid to a marker and sleeps; returns (dlock, the
    /// command's pid) once the command runs.
    pub(crate) fn hold(&self, key: &str, extra: &[&str]) -> (Proc, i32) {
        let dir = scratch("hold");
        let m = dir.join("pid");
        let script = format!("echo $$ > {}; exec sleep 60", m.display());
        let p = Proc::spawn(&mut self.run(key, extra, &sh(&script)));
        let pid = wait_for_file(&m, Duration::from_secs(10)).parse().unwrap();
        (p, pid)
    }

    /// `dlock status --json` parsed.
    pub(crate) fn status(&self, key: &str) -> serde_json::Value {
        let out = run_ok(self.cmd("status").args(["-k", key, "--json"]));
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    }

    /// `status --json` without a key: the keys it lists, and its output.
    pub(crate) fn listed(&self) -> (Vec<String>, Output) {
        let out = run_ok(self.cmd("status").arg("--json"));
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
        let keys = all
            .as_array()
            .expect("a JSON array")
            .iter()
            .filter_map(|s| s["key"].as_str().map(str::to_string))
            .collect();
        (keys, out)
    }

    /// Whether `--no-wait` gets the lock right now.
    pub(crate) fn is_free(&self, key: &str) -> bool {
        self.is_free_in(key, &[])
    }

    /// Whether `--no-wait` in the mode `mode` (`--shared`, `--limit N`) gets the lock right now:
    /// a probe in another mode than the holders' is refused (exit 2), not told it is busy.
    pub(crate) fn is_free_in(&self, key: &str, mode: &[&str]) -> bool {
        let probe = [mode, &["--no-wait"]].concat();
        let out = output(&mut self.run(key, &probe, &["true"]));
        match out.status.code() {
            Some(0) => true,
            Some(75) => false,
            _ => panic!(
                "unexpected result of a --no-wait probe:\n{}",
                describe(&out)
            ),
        }
    }
}

/// Puts this test binary in a process group of its own, unless it is a terminal's foreground
/// group (where Ctrl-C must reach it). Tests stop processes they start (SIGSTOP: a frozen
/// holder, a waiter held back, the watchdog stopping an owner's tree); a group with a stopped
/// member that is — or becomes — orphaned gets SIGHUP from the kernel, and under a CI runner
/// or `nohup` the group cargo runs in is orphaned from the start (every member's parent is in
/// it or outside the session), so any exit of a process that parented one of its members sent
/// SIGHUP to cargo and every test at once (CI saw the binary die of it). A group whose leader's
/// parent (cargo) is in another group of the same session is never orphaned while that parent
/// lives.
fn own_process_group() {
    // SAFETY: getpgrp takes nothing and cannot fail.
    let me = unsafe { libc::getpgrp() };
    let foreground = [0, 1, 2].into_iter().any(|fd| {
        // SAFETY: tcgetpgrp takes a descriptor number; a non-terminal gives -1.
        unsafe { libc::tcgetpgrp(fd) == me }
    });
    if !foreground {
        // SAFETY: setpgid with two integers; it fails harmlessly for a session leader.
        unsafe { libc::setpgid(0, 0) };
    }
}

/// Gives every process the tests start the signal dispositions a test means: default. A test
/// binary started under `nohup` (SIGHUP ignored, as some CI runners and job schedulers start
/// jobs) would pass that on to every dlock it starts, which would keep it (rightly: what a
/// program inherits ignored stays so), and a test's SIGHUP would never arrive. (The signal mask
/// std's `Command` empties in every child.) Tests about inherited dispositions set them on
/// their own command. Called by every helper that starts a process; once per test binary.
pub(crate) fn default_signal_dispositions() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        own_process_group();
        for sig in [
            libc::SIGHUP,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTERM,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGALRM,
            libc::SIGCHLD,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            // SAFETY: SIG_DFL is a valid disposition for each of these signals.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    });
}

/// `dlock` with every DLOCK_* variable of the test environment removed.
pub(crate) fn dlock() -> Command {
    default_signal_dispositions();
    let mut c = Command::new(DLOCK);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DLOCK_") {
            c.env_remove(k);
        }
    }
    c
}

/// A sh -c command line.
pub(crate) fn sh(script: &str) -> Vec<String> {
    default_signal_dispositions();
    vec!["sh".into(), "-c".into(), script.into()]
}

/// Runs to completion, capturing output.
pub(crate) fn output(cmd: &mut Command) -> Output {
    default_signal_dispositions();
    cmd.stdin(Stdio::null()).output().expect("spawn dlock")
}

/// Everything about a finished process, for failure messages.
pub(crate) fn describe(out: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs and asserts the exit code.
#[track_caller]
pub(crate) fn run_code(cmd: &mut Command, code: i32) -> Output {
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(code), "{cmd:?}\n{}", describe(&out));
    out
}

/// Runs and asserts success.
#[track_caller]
pub(crate) fn run_ok(cmd: &mut Command) -> Output {
    run_code(cmd, 0)
}

/// Builds the C program (or, with `-shared -fPIC` in `flags`, library) `source` as `dir/name`
/// with the machine's `cc`.
pub(crate) fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let src = out.with_extension("c");
    std::fs::write(&src, source).unwrap();
    run_ok(Command::new("cc").args(flags).arg("-o").arg(&out).arg(&src));
    out
}

/// Asserts that stderr's first line is dlock's error saying `text` (warnings may follow it).
pub(crate) fn first_error_says(out: &Output, text: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .next()
            .is_some_and(|l| l.starts_with("dlock: ") && l.contains(text)),
        "{}",
        describe(out)
    );
}

/// Asserts that stderr is exactly one `dlock: ` line without a panic, and returns it.
#[track_caller]
pub(crate) fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr:\n{}",
        describe(out)
    );
    assert!(lines[0].starts_with("dlock: "), "{}", describe(out));
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{}",
        describe(out)
    );
    lines[0].to_string()
}

/// A spawned process that is killed when the test ends, however it ends.
pub(crate) struct Proc {
    pub child: Child,
    pub started: Instant,
    what: String,
}

impl Proc {
    /// Spawns with stdin piped (write to it, or drop it to send EOF) and output captured.
    pub(crate) fn spawn(cmd: &mut Command) -> Proc {
        default_signal_dispositions();
        let what = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        Proc {
            child,
            started: Instant::now(),
            what,
        }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal.
    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: plain kill of our own unreaped child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Closes stdin (the child sees EOF).
    pub(crate) fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Waits at most `limit` for exit; panics (with the output) if it does not come.
    #[track_caller]
    pub(crate) fn wait(mut self, limit: Duration) -> (Output, Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(_status) = self.child.try_wait().unwrap() {
                break;
            }
            if Instant::now() > deadline {
                let mut tree = process_tree(self.pid());
                if std::env::var_os("DLOCK_TEST_GDB").is_some() {
                    let bt = Command::new("gdb")
                        .args([
                            "-batch",
                            "-p",
                            &self.pid().to_string(),
                            "-ex",
                            "thread apply all bt",
                        ])
                        .output();
                    if let Ok(bt) = bt {
                        tree.push_str(&String::from_utf8_lossy(&bt.stdout));
                    }
                }
                self.child.kill().ok();
                let out = self.take_output();
                panic!(
                    "{} did not exit within {limit:?}\n{}\n--- its processes ---\n{tree}",
                    self.what,
                    describe(&out)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let elapsed = self.started.elapsed();
        (self.take_output(), elapsed)
    }

    fn take_output(&mut self) -> Output {
        use std::io::Read;
        let status = self.child.wait().unwrap_or_else(|_| ExitStatus::default());
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        if let Some(mut s) = self.child.stdout.take() {
            s.read_to_end(&mut stdout).ok();
        }
        if let Some(mut s) = self.child.stderr.take() {
            s.read_to_end(&mut stderr).ok();
        }
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `pid` and every process below it, one line each (pid, parent, state, where it waits, pending
/// and blocked signals, command line), for the message of a test that hung.
pub(crate) fn process_tree(pid: i32) -> String {
    let field = |p: i32, name: &str| {
        std::fs::read_to_string(format!("/proc/{p}/{name}"))
            .unwrap_or_default()
            .replace('\0', " ")
            .trim()
            .to_string()
    };
    let status = |p: i32, key: &str| {
        field(p, "status")
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    };
    let procs: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter_map(|p| Some((p, status(p, "PPid:").parse().ok()?)))
                .collect()
        })
        .unwrap_or_default();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            procs
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree.iter()
        .map(|&p| {
            format!(
                "{p} ppid {} {} wchan {} pnd {}/{} blk {}: {}",
                status(p, "PPid:"),
                status(p, "State:"),
                field(p, "wchan"),
                status(p, "SigPnd:"),
                status(p, "ShdPnd:"),
                status(p, "SigBlk:"),
                field(p, "cmdline")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until `cond` holds, checking every 5 ms, at most `limit`; returns how long it took.
#[track_caller]
pub(crate) fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// Waits for a marker file to exist and returns its trimmed contents.
#[track_caller]
pub(crate) fn wait_for_file(path: &Path, limit: Duration) -> String {
    wait_until(limit, &format!("{}", path.display()), || {
        std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n'))
    });
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// Whether a process exists (and is not a zombie).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Ctrl-C (SIGINT) to a waiting `dlock run`: it exits 130 within a second.
#[track_caller]
pub(crate) fn ctrl_c_ends_it_at_once(p: Proc) {
    signal_ends_it_at_once(p, libc::SIGINT);
}

/// A forwarded signal `sig` to a waiting `dlock run`: it exits 128+`sig` within a second.
#[track_caller]
pub(crate) fn signal_ends_it_at_once(p: Proc, sig: i32) {
    let sent = Instant::now();
    p.signal(sig);
    let (out, _) = p.wait(Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(128 + sig), "{}", describe(&out));
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "interrupt took {:?}\n{}",
        sent.elapsed(),
        describe(&out)
    );
}

/// Holds `key`, ends the holder's session on the server with `end`, and checks that the holder
/// notices within a third of the TTL (exit 79) and that its command is gone.
#[track_caller]
pub(crate) fn ended_session_is_noticed(b: &TestBackend, key: &str, end: impl FnOnce()) {
    let (p, child) = b.hold(key, &[]);
    end();
    let ended = Instant::now();
    let (out, _) = p.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        ended.elapsed() < b.ttl / 3 + Duration::from_millis(400),
        "noticed after {:?}",
        ended.elapsed()
    );
    assert!(!alive(child));
}

/// Whether this test may act as a second user (`nobody`): it runs as root. Without root it is
/// skipped — except where every backend is required (CI), where that is a failure.
pub(crate) fn as_root_for_nobody() -> bool {
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("DLOCK_TEST_REQUIRE_BACKENDS").is_none(),
        "this test needs root, to run a command as nobody"
    );
    eprintln!("skipped: needs root");
    false
}
