//! What a lock stands on (issue 38): `dlock doctor` for the file backend on real filesystems
//! mounted here (tmpfs, overlayfs, a FUSE bindfs), for ZooKeeper and for etcd, and the one
//! warning a run prints where the ground weakens the lock.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::servers::{Zookeeper, available, required, shared_etcd, shared_zookeeper};
use crate::util::*;

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts that `out` has a line starting with `start` and containing each of `words`.
#[track_caller]
fn has_line(out: &Output, start: &str, words: &[&str]) -> String {
    let found = stdout_lines(out)
        .into_iter()
        .find(|l| l.starts_with(start) && words.iter().all(|w| l.contains(w)));
    found.unwrap_or_else(|| panic!("no line '{start}' with {words:?}:\n{}", describe(out)))
}

/// `doctor --json`'s object: its exit field and (check, verdict) pairs.
#[track_caller]
fn json_checks(out: &Output) -> (i64, Vec<(String, String)>) {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}\n{}", describe(out)));
    let checks = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            assert!(c["found"].is_string(), "{c}");
            (
                c["check"].as_str().unwrap().to_string(),
                c["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (v["exit"].as_i64().expect("exit"), checks)
}

/// The `dlock: warning:` lines of a run.
fn warnings(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("dlock: warning:"))
        .map(str::to_string)
        .collect()
}

/// A filesystem mounted for a test, unmounted on drop.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Mounts with `cmd` (whose last argument is the mount point `at`); `None` (skipped loudly) when
/// not root, and a failure under DLOCK_TEST_REQUIRE_BACKENDS=1 if the mount cannot be made.
fn mount(cmd: &mut Command, at: &Path) -> Option<Mounted> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !required(),
            "mounting a test filesystem needs root, and DLOCK_TEST_REQUIRE_BACKENDS=1"
        );
        eprintln!("SKIPPED: mounting a test filesystem needs root");
        return None;
    }
    let out = cmd.output().expect("spawn mount");
    if !out.status.success() {
        assert!(
            !required(),
            "{cmd:?} failed, and DLOCK_TEST_REQUIRE_BACKENDS=1:\n{}",
            describe(&out)
        );
        eprintln!("SKIPPED: {cmd:?} failed:\n{}", describe(&out));
        return None;
    }
    Some(Mounted(at.to_path_buf()))
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// `dlock run -b file -u URL -k KEY... -- sh -c SCRIPT`.
fn file_run(dir: &Path, keys: &[&str], extra: &[&str], script: &str) -> Command {
    let mut cmd = dlock();
    cmd.args(["run", "-b", "file", "-u", &file_url(dir)]);
    for k in keys {
        cmd.args(["-k", k]);
    }
    cmd.args(extra).arg("--").args(sh(script));
    cmd
}

/// A lock held on `dir` keeps a `--no-wait` run out (75), and the holder ends well.
fn excludes(dir: &Path) {
    let key = unique_key("ground");
    let marker = dir.join("held");
    let script = format!("echo held > {}; read _x || true", marker.display());
    let mut holder = Proc::spawn(&mut file_run(dir, &[&key], &[], &script));
    wait_for_file(&marker, std::time::Duration::from_secs(10));
    run_code(&mut file_run(dir, &[&key], &["-n"], "true"), 75);
    holder.close_stdin();
    let (out, _) = holder.wait(std::time::Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn file_doctor_on_a_local_directory() {
    let dir = scratch("doctor-local");
    let url = file_url(&dir);
    let out = run_ok(dlock().args(["doctor", "file", "-u", &url]));
    has_line(
        &out,
        "ok      directory: ",
        &[&dir.display().to_string(), "mode 0"],
    );
    has_line(
        &out,
        "ok      filesystem: ",
        &["flock is kept by this kernel"],
    );
    has_line(&out, "ok      flock: ", &["keeps a second open file out"]);
    let out = run_ok(dlock().args(["doctor", "file", "-u", &url, "--json"]));
    let (code, checks) = json_checks(&out);
    assert_eq!(code, 0);
    let names: Vec<&str> = checks.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["directory", "filesystem", "flock"]);
    assert!(checks.iter().all(|(_, v)| v == "ok"), "{checks:?}");
}

#[test]
fn file_on_tmpfs_is_sound() {
    let dir = scratch("ground-tmpfs");
    let Some(_m) = mount(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir),
        &dir,
    ) else {
        return;
    };
    let out = run_ok(dlock().args(["doctor", "file", "-u", &file_url(&dir)]));
    has_line(&out, "ok      filesystem: tmpfs", &[]);
    let out = run_ok(&mut file_run(&dir, &["t"], &[], "true"));
    assert!(warnings(&out).is_empty(), "{}", describe(&out));
    excludes(&dir);
}

#[test]
fn file_on_overlayfs_is_sound() {
    let base = scratch("ground-overlay");
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| {
        let p = base.join(d);
        std::fs::create_dir(&p).unwrap();
        p
    });
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let Some(_m) = mount(
        Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged),
        &merged,
    ) else {
        return;
    };
    let out = run_ok(dlock().args(["doctor", "file", "-u", &file_url(&merged)]));
    has_line(&out, "ok      filesystem: overlay", &["overlay mount"]);
    let out = run_ok(&mut file_run(&merged, &["o"], &[], "true"));
    assert!(warnings(&out).is_empty(), "{}", describe(&out));
    excludes(&merged);
}

#[test]
fn file_on_fuse_warns_once_per_run() {
    if !available("bindfs") {
        return;
    }
    let base = scratch("ground-fuse");
    let (src, mnt) = (base.join("src"), base.join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let Some(_m) = mount(Command::new("bindfs").arg(&src).arg(&mnt), &mnt) else {
        return;
    };
    let out = run_code(dlock().args(["doctor", "file", "-u", &file_url(&mnt)]), 1);
    has_line(
        &out,
        "warn    filesystem: FUSE (fuse",
        &["daemon", "local filesystem"],
    );
    // flock excludes on this host: bindfs leaves it to the kernel.
    has_line(&out, "ok      flock: ", &[]);
    let out = run_code(
        dlock().args(["doctor", "file", "-u", &file_url(&mnt), "--json"]),
        1,
    );
    let (code, checks) = json_checks(&out);
    assert_eq!(code, 1);
    assert!(
        checks.contains(&("filesystem".into(), "warn".into())),
        "{checks:?}"
    );
    // Two keys, one warning.
    let out = run_ok(&mut file_run(&mnt, &["a", "b"], &[], "true"));
    let said = warnings(&out);
    assert_eq!(said.len(), 1, "{}", describe(&out));
    assert!(
        said[0].starts_with("dlock: warning: filesystem: FUSE"),
        "{}",
        said[0]
    );
    excludes(&mnt);
}

#[test]
fn zookeeper_doctor_on_the_shared_server() {
    let Some(zk) = shared_zookeeper() else { return };
    let url = zk.url();
    let args = ["zookeeper", "-u", &url, "--ttl", "4s"];
    let out = run_ok(dlock().arg("doctor").args(args));
    let port = format!("127.0.0.1:{} ZooKeeper 3.", zk.members[0].port);
    has_line(&out, "ok      server: ", &[&port, "standalone"]);
    has_line(&out, "ok      session timeout: 4s, as asked", &[]);
    has_line(&out, "ok      quorum: sync answered", &[]);
    let out = run_ok(dlock().arg("doctor").args(args).arg("--json"));
    let (code, checks) = json_checks(&out);
    assert_eq!(code, 0);
    let names: Vec<&str> = checks.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["server", "session timeout", "quorum"]);
}

#[test]
fn zookeeper_that_cuts_the_session_timeout_is_named() {
    let Some(zk) = Zookeeper::start_configured("maxSessionTimeout=2000\n") else {
        return;
    };
    let url = zk.url();
    let out = run_code(
        dlock().args(["doctor", "zookeeper", "-u", &url, "--ttl", "5s"]),
        1,
    );
    let line = has_line(
        &out,
        "warn    session timeout: ",
        &["maxSessionTimeout", "to 2s"],
    );
    assert!(line.contains("at least 5000 ms"), "{line}");
    let (code, checks) = json_checks(&run_code(
        dlock().args(["doctor", "zookeeper", "-u", &url, "--ttl", "5s", "--json"]),
        1,
    ));
    assert_eq!(code, 1);
    assert!(
        checks.contains(&("session timeout".into(), "warn".into())),
        "{checks:?}"
    );
    // A run works on the shorter lease, and says so once.
    let out = run_ok(dlock().args([
        "run",
        "-b",
        "zookeeper",
        "-u",
        &url,
        "--ttl",
        "5s",
        "-k",
        "cut",
        "--",
        "true",
    ]));
    let said = warnings(&out);
    assert_eq!(said.len(), 1, "{}", describe(&out));
    assert!(said[0].contains("maxSessionTimeout"), "{}", said[0]);
    // Asked for no more than the server allows: fine.
    run_ok(dlock().args(["doctor", "zookeeper", "-u", &url, "--ttl", "2s"]));
}

#[test]
fn etcd_doctor_on_the_shared_server() {
    let Some(etcd) = shared_etcd() else { return };
    let url = etcd.url();
    let out = run_ok(dlock().args(["doctor", "etcd", "-u", &url, "--ttl", "3s"]));
    has_line(&out, "ok      server: etcd 3.", &["1 members"]);
    has_line(&out, "ok      auth: off", &["dlock/"]);
    has_line(&out, "ok      lease: 3s as asked", &[]);
    // A lease shorter than the server's minimum (1.5 election timeouts: 2 s by default) is
    // extended: said, not a weakness.
    let out = run_ok(dlock().args(["doctor", "etcd", "-u", &url, "--ttl", "1s"]));
    has_line(&out, "ok      lease: ", &["minimum lease TTL", "to 2s"]);
    let out = run_ok(dlock().args(["doctor", "etcd", "-u", &url, "--json"]));
    let (code, checks) = json_checks(&out);
    assert_eq!(code, 0);
    let names: Vec<&str> = checks.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["server", "auth", "lease"]);
}
