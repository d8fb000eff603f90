//! The command line: every bad input is one `dlock: ` line and exit 2, never a panic, never a
//! password; help and version work.

use crate::util::*;

/// Each entry: the arguments after `dlock`, and a word the one-line message must contain.
const BAD: &[(&[&str], &str)] = &[
    (&[], "subcommand"),
    (&["frobnicate"], "frobnicate"),
    (&["run", "--", "true"], "--key"),
    (&["run", "-k", "x"], "COMMAND"),
    (&["run", "-k", "", "--", "true"], "empty"),
    (&["run", "-k", "a\nb", "--", "true"], "control"),
    (&["run", "-k", "a\tb", "--", "true"], "control"),
    (&["run", "-k", "a\u{7f}b", "--", "true"], "control"),
    (&["run", "-k", "a", "-k", "a", "--", "true"], "twice"),
    (&["run", "-k", "a", "--limit", "0", "--", "true"], "--limit"),
    (
        &["run", "-k", "a", "--limit", "257", "--", "true"],
        "--limit",
    ),
    (&["run", "-k", "a", "--limit", "x", "--", "true"], "--limit"),
    (
        &["run", "-k", "a", "--shared", "--limit", "2", "--", "true"],
        "--shared",
    ),
    (
        &[
            "run", "-b", "mysql", "-k", "a", "--limit", "33", "--", "true",
        ],
        "too large",
    ),
    (
        &[
            "run",
            "-u",
            "redis://h1",
            "-u",
            "redis://h2",
            "-u",
            "redis://h3",
            "-k",
            "a",
            "--limit",
            "2",
            "--",
            "true",
        ],
        "not supported",
    ),
    (&["run", "--ttl", "abc", "-k", "x", "--", "true"], "--ttl"),
    (&["run", "--ttl", "5", "-k", "x", "--", "true"], "--ttl"),
    (&["run", "--ttl", "-5s", "-k", "x", "--", "true"], "-5"),
    (&["run", "--ttl", "0s", "-k", "x", "--", "true"], "--ttl"),
    (&["run", "--ttl", "100ms", "-k", "x", "--", "true"], "--ttl"),
    (
        &["run", "--wait", "soon", "-k", "x", "--", "true"],
        "--wait",
    ),
    (
        &["run", "--kill-grace", "1y2", "-k", "x", "--", "true"],
        "--kill-grace",
    ),
    (&["run", "-E", "256", "-k", "x", "--", "true"], "256"),
    (&["run", "-E", "-1", "-k", "x", "--", "true"], "-1"),
    (&["run", "-E", "abc", "-k", "x", "--", "true"], "abc"),
    // A misspelled URL parameter is not ignored (every backend: here Redis's).
    (
        &[
            "run",
            "-u",
            "redis://h?min-replica=1",
            "-k",
            "x",
            "--",
            "true",
        ],
        "unknown parameter 'min-replica'",
    ),
    (
        &[
            "run",
            "-u",
            "postgres://h/db?sslmod=disable",
            "-k",
            "x",
            "--",
            "true",
        ],
        "unknown option `sslmod`",
    ),
    (
        &["run", "--no-wait", "--wait", "5s", "-k", "x", "--", "true"],
        "--wait",
    ),
    (&["run", "-v", "-q", "-k", "x", "--", "true"], "--quiet"),
    (
        &["run", "--backend", "consul", "-k", "x", "--", "true"],
        "consul",
    ),
    (
        &[
            "run",
            "--backend",
            "redis",
            "--url",
            "zk://h:2181",
            "-k",
            "x",
            "--",
            "true",
        ],
        "zookeeper",
    ),
    (
        &["run", "--url", "http://h", "-k", "x", "--", "true"],
        "http://h",
    ),
    (
        &[
            "run",
            "--url",
            "file://relative/dir",
            "-k",
            "x",
            "--",
            "true",
        ],
        "absolute",
    ),
    (
        &["run", "--url", "file:///a%zz", "-k", "x", "--", "true"],
        "escape",
    ),
    (
        &[
            "run",
            "--url",
            "file:///a",
            "--url",
            "file:///b",
            "-k",
            "x",
            "--",
            "true",
        ],
        "one --url",
    ),
    (&["run", "--bogus", "-k", "x", "--", "true"], "--bogus"),
    (&["break"], "--key"),
    (&["status", "-k", ""], "empty"),
    (&["status", "-k", "x", "--url", "nonsense"], "nonsense"),
    (&["break", "-k", "x", "--backend", "nope"], "nope"),
    (&["bench", "--clients", "1"], "--clients"),
    (&["bench", "--clients", "257"], "--clients"),
    (&["bench", "--ops", "0"], "--ops"),
    (&["bench", "--duration", "0s"], "--duration"),
    (&["bench", "--duration", "2h"], "--duration"),
    (&["bench", "--duration", "1s", "--ops", "5"], "--ops"),
    (&["bench", "--ttl", "100ms"], "--ttl"),
    (&["bench", "--url", "nonsense"], "nonsense"),
    (&["bench", "--shared"], "--shared"),
    (
        &[
            "run",
            "-k",
            "x",
            "--once-per",
            "1m",
            "--shared",
            "--",
            "true",
        ],
        "exclusive",
    ),
    (
        &[
            "run",
            "-k",
            "x",
            "--once-per",
            "1m",
            "-l",
            "3",
            "--",
            "true",
        ],
        "exclusive",
    ),
    (
        &[
            "run",
            "-k",
            "x",
            "-k",
            "y",
            "--once-per",
            "1m",
            "--",
            "true",
        ],
        "one --key",
    ),
    (
        &["run", "-k", "x", "--once-per", "0s", "--", "true"],
        "--once-per",
    ),
    (
        &["run", "-k", "x", "--once-per", "soon", "--", "true"],
        "--once-per",
    ),
    (
        &[
            "run",
            "-k",
            "x",
            "--once-per",
            "1m",
            "--no-history",
            "--",
            "true",
        ],
        "--no-history",
    ),
    (&["log"], "--key"),
    (&["log", "-k", "x", "-r", "0"], "--runs"),
    (&["log", "-k", "x", "-n", "0"], "-n"),
    (&["log", "-k", "x", "--runs", "101"], "--runs"),
    (&["log", "-k", ""], "empty"),
    (&["completions", "tcsh"], "tcsh"),
    (&["completions"], "SHELL"),
];

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let long_key = "k".repeat(257);
    let mut cases: Vec<(Vec<&str>, &str)> = BAD.iter().map(|(a, w)| (a.to_vec(), *w)).collect();
    cases.push((vec!["run", "-k", &long_key, "--", "true"], "257"));
    assert!(cases.len() >= 25);
    for (args, word) in cases {
        let out = output(dlock().args(&args));
        assert_eq!(
            out.status.code(),
            Some(2),
            "dlock {args:?}\n{}",
            describe(&out)
        );
        let line = one_error_line(&out);
        assert!(
            line.contains(word),
            "dlock {args:?}: expected {word:?} in {line:?}"
        );
        assert!(out.stdout.is_empty(), "dlock {args:?} printed on stdout");
    }
}

#[test]
fn passwords_are_never_printed() {
    let secret = "s3cr3t-pw";
    let urls = [
        format!("redis://user:{secret}@127.0.0.1:1"),
        format!("mysql://root:{secret}@127.0.0.1:1/db"),
        format!("zk://user:{secret}@127.0.0.1:1/chroot"),
        format!("http://user:{secret}@host"),
    ];
    for url in &urls {
        for args in [
            vec!["run", "--url", url, "-k", "x", "--", "true"],
            vec![
                "run",
                "--backend",
                "zk",
                "--url",
                url,
                "-k",
                "x",
                "--",
                "true",
            ],
            vec!["status", "--url", url, "-k", "x"],
            vec!["bench", "--url", url, "--ops", "1"],
        ] {
            let out = output(dlock().args(&args));
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !all.contains(secret),
                "dlock {args:?} printed the password:\n{all}"
            );
            assert_ne!(out.status.code(), Some(0));
        }
        let out = output(dlock().env("DLOCK_URL", url).args(["run", "--help"]));
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(secret),
            "--help shows DLOCK_URL's value"
        );
    }
}

/// Malformed URLs with a planted password, fuzz-style: every scheme dlock knows (and some it
/// does not), the password with each character a URL parser splits on, forms without `//` or a
/// scheme, query-string passwords. No output of `run`, `status` or `break`, with the URL in
/// `--url` or `DLOCK_URL`, may contain any piece of the password. Regression: 34 of 3,200
/// fuzzed command lines printed it (a raw `/`, `?`, `#` or space in it, `redis:u:PW@h`,
/// `u:PW@h`, `redis+unix:///s?pass=PW`; then `zk://PW@h` and a Sentinel primary named
/// `acc?password=PW`).
#[test]
fn no_malformed_url_prints_its_password() {
    let pieces = ["Pl4nted", "S3cret"];
    let mut urls = Vec::new();
    for sep in [
        "", "/", "?", "#", " ", "@", ":", "%", "%zz", "\\", "[", "]", ",", "&", "=",
    ] {
        let pw = format!("{}{sep}{}", pieces[0], pieces[1]);
        for scheme in [
            "redis",
            "rediss",
            "mysql",
            "mariadb",
            "zk",
            "zookeeper",
            "postgres",
            "postgresql",
            "http",
            "etcd",
            "etcds",
        ] {
            urls.push(format!("{scheme}://user:{pw}@127.0.0.1:1/0"));
            urls.push(format!("{scheme}://:{pw}@127.0.0.1:1"));
            urls.push(format!("{scheme}:user:{pw}@127.0.0.1:1"));
        }
        // etcd takes a user only with a password: a lone user information is a password
        // typed without its user (`etcd://PW@h`), and must not be printed either.
        for scheme in ["etcd", "etcds"] {
            urls.push(format!("{scheme}://{pw}@127.0.0.1:1"));
            urls.push(format!("{scheme}://{pw}@127.0.0.1:1,127.0.0.1:2"));
        }
        urls.push(format!("user:{pw}@127.0.0.1:1"));
        urls.push(format!("redis+unix:///tmp/none.sock?pass={pw}"));
        urls.push(format!("redis+unix:///tmp/none.sock?db=0&password={pw}"));
        urls.push(format!("postgres://user@127.0.0.1:1/db?password={pw}"));
        urls.push(format!("postgres:///db?host=/tmp/none&password={pw}"));
        // A password typed without its user where only user:password is taken; a query put
        // after a Sentinel URL's `#`, where it is part of the primary's name.
        urls.push(format!("zk://{pw}@127.0.0.1:1"));
        urls.push(format!("redis-sentinel://127.0.0.1:1#acc?password={pw}"));
        urls.push(format!("rediss-sentinel://u:{pw}@127.0.0.1:1#acc"));
    }
    for url in &urls {
        let runs: [Vec<&str>; 3] = [
            vec!["run", "-n", "-k", "x", "--", "true"],
            vec!["status", "-k", "x"],
            vec!["break", "-k", "x"],
        ];
        for args in &runs {
            for via_env in [false, true] {
                let mut cmd = dlock();
                cmd.arg(args[0]);
                if via_env {
                    cmd.env("DLOCK_URL", url);
                } else {
                    cmd.args(["--url", url]);
                }
                let out = output(cmd.args(&args[1..]));
                let all = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                for piece in pieces {
                    assert!(
                        !all.contains(piece),
                        "dlock {args:?} with {url:?} (env: {via_env}) printed the password:\n{all}"
                    );
                }
                assert_ne!(out.status.code(), Some(0), "{url}: {all}");
            }
        }
    }
}

/// A long generated password with a raw `/` (base64 makes them) splits a URL where a host list
/// is read: the host-list parser quotes the piece it refuses, cut to a length — and a cut piece
/// was no longer one the scrubber recognized. Regression: `bad port 'q8Zx3Kf0Lw9mR2tY7uB5…'`.
#[test]
fn a_long_password_split_into_a_host_list_is_not_printed() {
    let pw = "q8Zx3Kf0Lw9mR2tY7uB5nC1vD4eH6jA+/x";
    let pieces = ["q8Zx3Kf0Lw9mR2tY7uB5", "nC1vD4eH6jA"];
    for url in [
        format!("zk://u:{pw}@127.0.0.1:1"),
        format!("redis://u:{pw}@127.0.0.1:1,127.0.0.1:2"),
        format!("redis-sentinel://u:{pw}@127.0.0.1:1,127.0.0.1:2#p"),
        format!("etcd://u:{pw}@127.0.0.1:1,127.0.0.1:2"),
    ] {
        let out = output(dlock().args(["run", "-n", "-k", "x", "--url", &url, "--", "true"]));
        let all = describe(&out);
        for piece in pieces {
            assert!(!all.contains(piece), "{url}: printed the password:\n{all}");
        }
        assert_ne!(out.status.code(), Some(0), "{all}");
    }
}

#[test]
fn help_and_version_exit_0() {
    let out = run_ok(dlock().arg("--help"));
    let help = String::from_utf8(out.stdout).unwrap();
    for word in [
        "run",
        "status",
        "break",
        "completions",
        "Exit status",
        "DLOCK_URL",
    ] {
        assert!(help.contains(word), "--help lacks {word}");
    }
    let out = run_ok(dlock().args(["run", "--help"]));
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--backend",
        "--url",
        "--key",
        "--ttl",
        "--wait",
        "--no-wait",
        "--conflict-exit-code",
        "--kill-grace",
        "--verbose",
        "--quiet",
    ] {
        assert!(help.contains(flag), "run --help lacks {flag}");
    }
    let out = run_ok(dlock().arg("--version"));
    assert!(String::from_utf8(out.stdout).unwrap().starts_with("dlock "));
}

#[test]
fn backend_comes_from_flag_env_or_url_scheme() {
    // Each way of choosing reaches the chosen backend at the expected address: `status` shows
    // them when a server answers there, the one-line error names them when none does (the test
    // holds either way, whatever runs on this machine's default ports).
    for (env, args, backend, addr) in [
        (None, vec!["--backend", "redis"], "redis", "127.0.0.1:6379"),
        (
            Some(("DLOCK_URL", "mysql://127.0.0.1/db")),
            vec![],
            "mysql",
            "127.0.0.1:3306",
        ),
        (
            Some(("DLOCK_BACKEND", "zk")),
            vec![],
            "zookeeper",
            "127.0.0.1:2181",
        ),
        (
            Some(("DLOCK_URL", "redis://127.0.0.1:1")),
            vec![],
            "redis",
            "127.0.0.1:1",
        ),
    ] {
        let mut c = dlock();
        c.arg("status").args(&args).args(["-k", "x", "--json"]);
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = output(&mut c);
        if out.status.code() == Some(0) {
            let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(s["backend"], backend, "{s}");
            assert!(s["location"].as_str().unwrap().starts_with(addr), "{s}");
        } else {
            assert_eq!(out.status.code(), Some(69), "{}", describe(&out));
            let line = one_error_line(&out);
            assert!(
                line.starts_with(&format!("dlock: {backend}: ")) && line.contains(addr),
                "{line}"
            );
        }
    }
    // An explicit backend must agree with the environment's URL scheme.
    let out = output(
        dlock()
            .env("DLOCK_URL", "redis://h")
            .args(["run", "-b", "file", "-k", "x", "--", "true"]),
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn dash_dash_is_optional_and_everything_after_it_is_the_commands() {
    let b = TestBackend::file();
    let key = unique_key("dashdash");
    let out = run_ok(&mut b.run(&key, &[], &["echo", "-k", "--ttl", "--"]));
    assert_eq!(out.stdout, b"-k --ttl --\n");
    let mut c = b.cmd("run");
    c.args(["-k", &key, "echo", "-n", "plain"]);
    assert_eq!(run_ok(&mut c).stdout, b"plain");
}

#[test]
fn quiet_silences_and_verbose_reports_timings() {
    let b = TestBackend::file();
    let key = unique_key("verbosity");
    let out = run_ok(&mut b.run(&key, &["-v"], &["true"]));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("acquired") && err.contains("released"),
        "{err}"
    );
    let out = run_ok(&mut b.run(&key, &["-q"], &["true"]));
    assert!(out.stderr.is_empty());
}

/// Regression: dlock blocks the signals it waits for, and the command once inherited that mask,
/// so `kill -TERM` never reached it. It must start with nothing blocked and exactly the ignored
/// signals dlock itself inherited (nohup's SIGHUP stays ignored; nothing is added).
#[test]
fn command_starts_with_no_blocked_signals_and_inherited_ignores() {
    let sig_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("SigBlk") || l.starts_with("SigIgn"))
            .map(String::from)
            .collect()
    };
    let b = TestBackend::file();
    let out = run_ok(&mut b.run(&unique_key("sigmask"), &[], &["cat", "/proc/self/status"]));
    let child = sig_lines(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(child[0], "SigBlk:\t0000000000000000");
    // Standard signals 1-31 only (32 and 33 are glibc's own); dlock was started by std, which
    // resets SIGPIPE, so nothing standard may be ignored.
    let ignored = u64::from_str_radix(child[1].trim_start_matches("SigIgn:\t"), 16).unwrap();
    assert_eq!(ignored & 0x7fff_ffff, 0, "{}", child[1]);

    // Under nohup, SIGHUP is ignored: dlock must neither exit on it nor forward it.
    let dir = scratch("nohup");
    let m = dir.join("started");
    let mut c = std::process::Command::new("nohup");
    c.arg(DLOCK)
        .arg("run")
        .args(&b.args)
        .args(["-k", &unique_key("nohup"), "--"]);
    c.args(sh(&format!("echo > {}; sleep 0.5", m.display())));
    c.current_dir(&dir);
    let p = Proc::spawn(&mut c);
    wait_for_file(&m, std::time::Duration::from_secs(5));
    p.signal(libc::SIGHUP);
    let (out, _) = p.wait(std::time::Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn redlock_needs_an_odd_number_of_urls() {
    for n in [2, 4] {
        let mut c = dlock();
        c.args(["run", "-b", "redis"]);
        for i in 0..n {
            c.args(["--url", &format!("redis://127.0.0.1:{}", 1 + i)]);
        }
        c.args(["-k", "x", "--", "true"]);
        let out = run_code(&mut c, 2);
        assert!(one_error_line(&out).contains("odd number"));
    }
}

/// Regression: started with SIGCHLD ignored (some supervisors do that), the kernel reaped the
/// command by itself and dlock waited forever for its exit status.
#[test]
fn inherited_ignored_sigchld_does_not_hang() {
    let b = TestBackend::file();
    let mut c = std::process::Command::new("python3");
    c.args(["-c", "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"]);
    c.arg(DLOCK).arg("run").args(&b.args).args([
        "-k",
        &unique_key("sigchld"),
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    let (out, took) = Proc::spawn(&mut c).wait(std::time::Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    assert!(took < std::time::Duration::from_secs(2));
}

/// Regression: a --wait too long for the clock panicked; it means wait forever.
#[test]
fn enormous_wait_is_forever_not_a_panic() {
    let b = TestBackend::file();
    run_ok(&mut b.run(
        &unique_key("huge-wait"),
        &["--wait", "584000000000y"],
        &["true"],
    ));
}

/// `--once-per` on the default file backend (no backend or URL given anywhere) warns once, naming
/// DLOCK_URL: cron lines on several hosts would each lock their own file. Chosen explicitly, it
/// is not warned of.
#[test]
fn once_per_on_the_implicit_file_backend_warns() {
    let key = unique_key("implicit");
    let out = run_ok(dlock().args(["run", "-k", &key, "--once-per", "1s", "--", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("dlock: warning: --once-per") && err.contains("DLOCK_URL"),
        "{err}"
    );
    let dir = scratch("implicit");
    let url = format!("file://{}", dir.display());
    let out = run_ok(dlock().args([
        "run",
        "-u",
        &url,
        "-k",
        &key,
        "--once-per",
        "1s",
        "--",
        "true",
    ]));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
}

/// The small things a person meets first: a transposed flag gets a "did you mean", `dlock` alone
/// lists every subcommand, and a command line given as one word (a shell's job) gets a hint,
/// in plain words.
#[test]
fn first_mistakes_get_plain_hints() {
    let out = run_code(dlock().args(["run", "--kye", "x", "--", "true"]), 2);
    let line = one_error_line(&out);
    assert!(line.contains("did you mean '--key'?"), "{line}");
    let out = run_code(&mut dlock(), 2);
    let line = one_error_line(&out);
    for sub in [
        "run", "acquire", "release", "status", "log", "break", "doctor",
    ] {
        assert!(line.contains(sub), "{sub} missing: {line}");
    }
    let dir = scratch("hint");
    let url = format!("file://{}", dir.display());
    let run = |cmd: &str| {
        dlock()
            .args(["run", "-u", &url, "-k", "hint", "--", cmd])
            .output()
            .unwrap()
    };
    let out = run("echo hi && echo there");
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
    let line = one_error_line(&out);
    assert!(line.contains("sh -c 'echo hi && echo there'"), "{line}");
    assert!(!line.contains("os error"), "{line}");
    let out = run("/nonexistent-dlock-test");
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
    assert_eq!(
        one_error_line(&out),
        "dlock: cannot run '/nonexistent-dlock-test': not found"
    );
}
