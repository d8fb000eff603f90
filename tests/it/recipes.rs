//! The recipes of README.md and docs/acquire.md, run as written: a bash and a dash script
//! section, GitHub Actions steps (each its own process, the variables passed through a
//! `$GITHUB_ENV` file as the runner does, the release in an `if: always()` step), GitLab CI's
//! `before_script`/`after_script` (separate shells), and the commands of a systemd unit
//! (`ExecStartPre=`, `EnvironmentFile=`, `ExecStopPost=`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::acquire::runtime_dir;
use crate::servers::shared_redis;
use crate::util::*;

/// `SHELL -c SCRIPT` with `$D` the binary, `$B` the backend's arguments, `$T` its `--ttl`
/// (a young test server holds a lock back for one TTL), `$K` the key, the
/// test's runtime directory and `env`; every DLOCK_* variable of the test removed.
fn shell(
    shell: &str,
    b: &TestBackend,
    key: &str,
    script: &str,
    env: &BTreeMap<String, String>,
) -> Command {
    let mut c = Command::new(shell);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DLOCK_") {
            c.env_remove(k);
        }
    }
    c.env("D", DLOCK)
        .env("B", b.args.join(" "))
        .env("T", format!("--ttl={}ms", b.ttl.as_millis()))
        .env("K", key)
        .env("XDG_RUNTIME_DIR", runtime_dir())
        .envs(b.env.iter().cloned())
        .envs(env)
        .args(["-c", script]);
    c
}

/// The section of a deploy script that holds the lock across several steps; each step checks
/// that the lock is held (a run from outside the section is refused) and leaves a mark.
const SECTION: &str = r#"
eval "$("$D" acquire $B $T -k "$K" --wait 30s --reason 'deploy v1.4')"
step() {
    env -u DLOCK_HELD "$D" run $B -k "$K" -n -- true 2>/dev/null && { echo "step $1 ran unlocked"; exit 1; }
    echo "step $1 token $DLOCK_FENCING_TOKEN"
}
step migrate
step switch
"$D" run $B -k "$K" -n -- sh -c 'echo "nested run under $DLOCK_KEY"'
"$D" release
"#;

fn script_section(sh: &str, b: &TestBackend) {
    let key = unique_key(&format!("recipe-{sh}"));
    let prefix = if sh == "bash" {
        "set -euo pipefail"
    } else {
        "set -eu"
    };
    let out = run_ok(&mut shell(
        sh,
        b,
        &key,
        &format!("{prefix}\n{SECTION}"),
        &BTreeMap::new(),
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{}", describe(&out));
    assert!(lines[0].starts_with("step migrate token "), "{text}");
    assert_eq!(
        lines[0].replace("migrate", "switch"),
        lines[1],
        "one token for the section"
    );
    assert_eq!(lines[2], format!("nested run under {key}"));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert!(b.is_free(&key), "released at the end of the section");
}

#[test]
fn bash_script_section() {
    script_section("bash", &TestBackend::file());
    if let Some(url) = shared_redis() {
        script_section("bash", &TestBackend::redis(&url));
    }
}

#[test]
fn dash_script_section() {
    script_section("dash", &TestBackend::file());
}

/// `$GITHUB_ENV` as the runner reads it: `NAME=value` lines and `NAME<<DELIMITER` blocks.
fn read_github_env(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut env = BTreeMap::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some((name, delimiter)) = line.split_once("<<") {
            let value: Vec<&str> = lines.by_ref().take_while(|l| *l != delimiter).collect();
            env.insert(name.to_string(), value.join("\n"));
        } else if let Some((name, value)) = line.split_once('=') {
            env.insert(name.to_string(), value.to_string());
        }
    }
    env
}

/// Three steps of one job, each its own process: acquire (for nobody, bounded by --max-hold:
/// the step's shell exits at once), a step that runs under the lock, and the release in an
/// `if: always()` step after a failed one.
#[test]
fn github_actions_steps() {
    let b = TestBackend::file();
    let (k1, k2) = (unique_key("recipe-gh-a"), unique_key("recipe-gh-b"));
    let dir = scratch("github");
    let github_env = dir.join("github_env");
    std::fs::write(&github_env, "EARLIER=1\n").unwrap();
    let mut env = BTreeMap::from([("GITHUB_ENV".to_string(), github_env.display().to_string())]);
    // - run: dlock acquire -k deploy -k db --owner none --max-hold 30m --format github >> "$GITHUB_ENV"
    let acquire = format!(
        r#""$D" acquire $B -k "$K" -k {k2} --owner none --max-hold 30m --format github >> "$GITHUB_ENV""#
    );
    run_ok(&mut shell("bash", &b, &k1, &acquire, &env));
    env.extend(read_github_env(&github_env));
    assert_eq!(env["DLOCK_KEYS"], format!("{k1}\n{k2}"), "{env:?}");
    assert!(!b.is_free(&k1) && !b.is_free(&k2), "held between the steps");
    // - run: ./deploy.sh   (under the lock: a dlock run inside it does not wait for it)
    let step = r#""$D" run $B -k "$K" -n -- sh -c 'echo "$DLOCK_FENCING_TOKEN"'; exit 1"#;
    let out = run_code(&mut shell("bash", &b, &k1, step, &env), 1);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        env["DLOCK_FENCING_TOKEN"]
    );
    // - if: always()
    //   run: dlock release
    run_ok(&mut shell("bash", &b, &k1, r#""$D" release"#, &env));
    assert!(b.is_free(&k1) && b.is_free(&k2));
}

/// GitLab CI runs `before_script` and `script` in one shell and `after_script` in a new one:
/// the variables go through a file in the build directory.
#[test]
fn gitlab_before_and_after_script() {
    let b = TestBackend::file();
    let key = unique_key("recipe-gitlab");
    let dir = scratch("gitlab");
    let env = BTreeMap::from([("CI_PROJECT_DIR".to_string(), dir.display().to_string())]);
    let job = r#"cd "$CI_PROJECT_DIR"
"$D" acquire $B -k "$K" --owner none --max-hold 1h > dlock.env
. ./dlock.env
env -u DLOCK_HELD "$D" run $B -k "$K" -n -q -- true && exit 1
echo "deploying with token $DLOCK_FENCING_TOKEN""#;
    let out = run_ok(&mut shell("sh", &b, &key, job, &env));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("deploying with token "));
    assert!(!b.is_free(&key), "held after the job's shell exited");
    let after = r#"cd "$CI_PROJECT_DIR" && . ./dlock.env && "$D" release"#;
    run_ok(&mut shell("sh", &b, &key, after, &env));
    assert!(b.is_free(&key));
}

/// systemd's `EnvironmentFile=` reading of `NAME="value"` lines (backslash escapes, values
/// that run over several lines).
fn read_environment_file(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut env = BTreeMap::new();
    let mut rest = text.as_str();
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        env.insert(name.trim().to_string(), value);
        rest = &after[end..];
    }
    env
}

/// The unit of docs/acquire.md: `ExecStartPre=` takes the lock for nobody (the unit's main
/// process does not exist yet) with `--max-hold` above `RuntimeMaxSec=`, systemd reads the
/// variables from the file before `ExecStart=`, and `ExecStopPost=` releases.
#[test]
fn systemd_unit_commands() {
    let b = TestBackend::file();
    let key = unique_key("recipe-systemd");
    let dir = scratch("systemd");
    let env = BTreeMap::from([("RUNTIME_DIRECTORY".to_string(), dir.display().to_string())]);
    // ExecStartPre=/bin/sh -c 'exec dlock acquire -k nightly --owner none --max-hold 2h
    //     --format env > "$RUNTIME_DIRECTORY/dlock.env"'
    let pre = r#"exec "$D" acquire $B -k "$K" --owner none --max-hold 2h --reason "nightly's run" --format env > "$RUNTIME_DIRECTORY/dlock.env""#;
    run_ok(&mut shell("sh", &b, &key, pre, &env));
    let mut unit_env = env.clone();
    unit_env.extend(read_environment_file(&dir.join("dlock.env")));
    assert_eq!(unit_env["DLOCK_KEY"], key);
    assert!(unit_env["DLOCK_HELD"].starts_with("[{\""), "{unit_env:?}");
    // ExecStart=/usr/local/bin/nightly   (here: checks the lock is held, and not for it)
    let main = r#"env -u DLOCK_HELD "$D" run $B -k "$K" -n -q -- true; echo "$?""#;
    let out = run_ok(&mut shell("sh", &b, &key, main, &unit_env));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "75");
    assert!(b.status(&key)["holders"][0]["reason"] == "nightly's run");
    // The main process has exited: systemd sends SIGTERM to what is left in the unit's
    // cgroup — the holder, which gives the lock back — and then runs
    // ExecStopPost=/usr/bin/dlock release, which says it was held throughout.
    let holder: i32 = unit_env["DLOCK_HOLDER_PID"].parse().unwrap();
    // SAFETY: plain kill of the holder this test started.
    unsafe { libc::kill(holder, libc::SIGTERM) };
    wait_until(Duration::from_secs(5), "the lock to be given back", || {
        b.is_free(&key)
    });
    let release = r#"exec "$D" release"#;
    let out = run_ok(&mut shell("sh", &b, &key, release, &unit_env));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("when its holder was stopped by SIGTERM"),
        "{}",
        describe(&out)
    );
    // Where nothing stopped the holder first, the release gives the lock back itself.
    run_ok(&mut shell("sh", &b, &key, pre, &env));
    let mut unit_env = env.clone();
    unit_env.extend(read_environment_file(&dir.join("dlock.env")));
    let out = run_ok(&mut shell("sh", &b, &key, release, &unit_env));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert!(b.is_free(&key));
}

/// However `dlock acquire` fails — a bad flag, a bad URL, a bad owner — `eval` of its output
/// fails with its code, so a script under `set -e` stops instead of going on without the lock.
#[test]
fn eval_of_acquire_with_bad_arguments_fails() {
    let b = TestBackend::file();
    let key = unique_key("recipe-eval-usage");
    for (args, env) in [
        ("--bogus", None),
        ("--wait 10x", None),
        ("--owner none", None),
        ("", Some(("DLOCK_URL", "nope://x"))),
    ] {
        let script = format!(
            r#"eval "$("$D" acquire -k "$K" {args} 2>/dev/null)" || {{ echo "eval=$?"; exit 0; }}
echo "went on without the lock""#
        );
        let env: BTreeMap<String, String> = env
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect();
        let out = run_ok(&mut shell("sh", &b, &key, &script, &env));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "eval=2",
            "{args}: {}",
            describe(&out)
        );
    }
}

/// `eval` of nothing succeeds: a failed acquire must make the `eval` fail (with its code), or a
/// script would go on without the lock, even under `set -e`.
#[test]
fn eval_of_a_failed_acquire_fails() {
    let b = TestBackend::file();
    let key = unique_key("recipe-eval-fails");
    let dir = scratch("eval-fails");
    let (holder, _) = b.hold(&key, &[]);
    let script = r#"set -e
eval "$("$D" acquire $B -k "$K" -n 2>/dev/null)" || { echo "eval=$?"; exit 0; }
echo "went on without the lock""#;
    for sh in ["bash", "dash"] {
        let out = run_ok(&mut shell(sh, &b, &key, script, &BTreeMap::new()));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "eval=75",
            "{sh}"
        );
    }
    let unguarded = format!(
        "set -e\neval \"$(\"$D\" acquire $B -k \"$K\" -n 2>/dev/null)\"\ntouch {}/ran",
        dir.display()
    );
    let out = output(&mut shell("sh", &b, &key, &unguarded, &BTreeMap::new()));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(!dir.join("ran").exists(), "set -e stopped the script");
    drop(holder);
}
