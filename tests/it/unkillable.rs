//! Processes a holder cannot kill: the owner ran `sudo` (its child changed user, and the
//! holder's SIGKILL gets EPERM). The lock must never be let go over them.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// A setuid-root program that makes itself root for good (real, effective and saved uid, as
/// `sudo` does), writes its pid to the file named by its argument and sleeps: once started by
/// another user, that user can no longer signal it. Built with the system's C compiler.
fn become_root_program(dir: &Path) -> PathBuf {
    let bin = compile_c(
        dir,
        "become-root",
        r#"#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (setgid(0) || setuid(0)) return 1;
    FILE *f = fopen(argv[1], "w");
    if (!f) return 2;
    fprintf(f, "%d\n", getpid());
    fclose(f);
    for (;;) pause();
}
"#,
        &[],
    );
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    bin
}

/// Kills the root process on drop: a failing test must not leave it (and its holder) behind.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill takes a pid and a signal.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// The acquire holder (run as `nobody`) gives up after `--max-hold`; its owner's child became
/// root and outlives SIGKILL. The lock stays held until that process is gone, and `release`
/// says why. Regression: the holder gave the lock back one second after SIGKILL, with the root
/// process still running. Needs root (to act as `nobody`, and a setuid-root program).
#[test]
fn the_holder_keeps_the_lock_while_a_process_it_cannot_kill_lives() {
    if !as_root_for_nobody() {
        return;
    }
    let dir = PathBuf::from(format!("/tmp/dlock-unkillable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let program = become_root_program(&dir);
    let runtime = dir.join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let chown = Command::new("chown")
        .args(["65534:65534"])
        .arg(&runtime)
        .status()
        .unwrap();
    assert!(chown.success());
    let url = format!("file://{}", dir.display());
    let pid_file = dir.join("root-pid");
    let key = unique_key("unkillable");
    // The owner: a shell of nobody's that holds the lock and starts the root process.
    let script = format!(
        "eval \"$(\"$D\" acquire -u {url} -k {key} --max-hold 1s --kill-grace 300ms)\" || exit 9; \
         {prog} {pid} & wait",
        prog = program.display(),
        pid = pid_file.display(),
    );
    let mut owner = Proc::spawn(
        Command::new("sh")
            .args(["-c", &script])
            .env("D", DLOCK)
            .env("XDG_RUNTIME_DIR", &runtime)
            .current_dir("/")
            .uid(65534)
            .gid(65534),
    );
    let root: i32 = wait_for_file(&pid_file, Duration::from_secs(10))
        .parse()
        .unwrap();
    let _root = KillOnDrop(root);
    let b = TestBackend {
        args: vec!["--url".into(), url.clone()],
        ..TestBackend::file()
    };
    // --max-hold ends, SIGTERM and SIGKILL get EPERM: the owner shell dies, the root process
    // lives on. Well past the point where the holder gave the lock back, it is still held.
    wait_until(
        Duration::from_secs(10),
        "the owner shell to be stopped",
        || !alive(owner.pid()),
    );
    // The old holder gave the lock back at --max-hold + grace + 1 s (2.3 s after the acquire);
    // the owner shell died at ~1.3 s. Three seconds more is well past that.
    std::thread::sleep(Duration::from_secs(3));
    assert!(alive(root), "the root process was killed");
    let out = output(&mut b.run(&key, &["--no-wait"], &["true"]));
    assert_eq!(
        out.status.code(),
        Some(75),
        "the lock was let go while a process of its owner ran: {}",
        describe(&out)
    );
    // Gone: the holder lets go.
    // SAFETY: kill takes a pid and a signal.
    unsafe { libc::kill(root, libc::SIGKILL) };
    wait_until(Duration::from_secs(10), "the lock to be free", || {
        b.is_free(&key)
    });
    owner.close_stdin();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dlock run` (as `nobody`) whose command leaves a process that became root: SIGKILL gets
/// EPERM. dlock says so, keeps the lock — renewed, on a backend with a lease — until the
/// process is gone, and only then exits and lets go. Regression: it blamed "uninterruptible
/// sleep?" and abandoned the lock, so a lease ran out while the root process ran.
#[test]
fn run_keeps_the_lock_while_a_process_it_cannot_kill_lives() {
    if !as_root_for_nobody() {
        return;
    }
    let Some(url) = crate::servers::shared_redis() else {
        return;
    };
    let dir = PathBuf::from(format!("/tmp/dlock-unkillable-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let program = become_root_program(&dir);
    let pid_file = dir.join("root-pid");
    let key = unique_key("unkillable-run");
    let b = TestBackend::redis(&url);
    let mut run = Command::new(DLOCK);
    run.args([
        "run",
        "-u",
        &url,
        "-k",
        &key,
        "--ttl",
        "1500ms",
        "--kill-grace",
        "300ms",
    ])
    .args(["--", "sh", "-c"])
    // The command exits once the program has become root (its pid file written): a SIGTERM
    // to the leftovers before that (between the fork and the program's setuid) killed it while
    // it could still be killed, and the test waited for a file that never came (CI, once).
    .arg(format!(
        "{p} {f} & i=0; while [ ! -s {f} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; exit 0",
        p = program.display(),
        f = pid_file.display()
    ))
    .current_dir("/")
    .uid(65534)
    .gid(65534);
    let p = Proc::spawn(&mut run);
    let root: i32 = wait_for_file(&pid_file, Duration::from_secs(30))
        .parse()
        .unwrap();
    let _root = KillOnDrop(root);
    // Several TTLs: a lease left to run out would be gone.
    std::thread::sleep(Duration::from_secs(5));
    assert!(alive(root) && alive(p.pid()));
    let out = output(&mut b.run(&key, &["--no-wait"], &["true"]));
    assert_eq!(
        out.status.code(),
        Some(75),
        "the lock was let go while a process of the command ran: {}",
        describe(&out)
    );
    // SAFETY: kill takes a pid and a signal.
    unsafe { libc::kill(root, libc::SIGKILL) };
    let (out, _) = p.wait(Duration::from_secs(10));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("runs as uid 0"), "{}", describe(&out));
    assert!(b.is_free(&key));
    let _ = std::fs::remove_dir_all(&dir);
}
