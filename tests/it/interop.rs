//! dlock beside the applications' own lock recipes on the same lock, with the real third-party
//! clients: Apache Curator 5 (Java, Debian's libcurator-recipes-java, helper
//! tests/interop/Recipes.java compiled here) and kazoo (Python, from PyPI in a venv, helper
//! tests/interop/kazoo_recipes.py) on ZooKeeper. Pairings dlock claims are shown to exclude each
//! other with a shared read-sleep-write counter, both ways; every other pairing on the same path
//! is shown never to hold silently beside dlock (dlock waits for it, refuses, stops its command or
//! warns).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::servers::{Zookeeper, required, shared_zookeeper};
use crate::util::*;

/// Where this test binary keeps the compiled helper and the venv (kept between runs).
fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("interop")
}

fn helpers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop")
}

/// Skips loudly (`None`), or fails under `DLOCK_TEST_REQUIRE_BACKENDS=1`.
fn missing<T>(what: &str) -> Option<T> {
    assert!(!required(), "{what}, and DLOCK_TEST_REQUIRE_BACKENDS=1");
    eprintln!("SKIPPED: {what}");
    None
}

fn ran(cmd: &mut Command) -> bool {
    cmd.status().is_ok_and(|s| s.success())
}

/// The jars Curator's recipes need (Debian's, in /usr/share/java).
const JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-transport",
    "netty-common",
    "netty-buffer",
    "netty-resolver",
    "netty-codec",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

/// The class path with the compiled helpers, once per test binary.
fn curator() -> Option<&'static String> {
    static CP: OnceLock<Option<String>> = OnceLock::new();
    CP.get_or_init(|| {
        let jars: Vec<String> = JARS
            .iter()
            .map(|j| format!("/usr/share/java/{j}.jar"))
            .collect();
        if let Some(j) = jars.iter().find(|j| !Path::new(j).is_file()) {
            return missing(&format!("{j} is missing (apt-get install libcurator-recipes-java)"));
        }
        let classes = tools_dir().join("classes");
        std::fs::create_dir_all(&classes).unwrap();
        let cp = jars.join(":");
        let compiled = ran(Command::new("javac")
            .arg("-d")
            .arg(&classes)
            .args(["-cp", &cp])
            .arg(helpers().join("Recipes.java")));
        if !compiled {
            return missing("javac cannot compile tests/interop/Recipes.java (apt-get install default-jdk-headless)");
        }
        Some(format!("{}:{cp}", classes.display()))
    })
    .as_ref()
}

/// A venv's python with kazoo, made once (kept in the target directory between runs).
pub(crate) fn kazoo() -> Option<&'static PathBuf> {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = tools_dir().join("venv");
        let python = venv.join("bin/python");
        let ready = || ran(Command::new(&python).args(["-c", "import kazoo, redis"]));
        if !ready() {
            let _ = std::fs::remove_dir_all(&venv);
            let made = ran(Command::new("python3").arg("-m").arg("venv").arg(&venv))
                && ran(Command::new(venv.join("bin/pip")).args([
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "kazoo==2.11.0",
                    "redis==5.2.1",
                ]));
            if !made || !ready() {
                return missing("cannot make a venv with kazoo and redis-py (python3-venv, PyPI)");
            }
        }
        Some(python)
    })
    .as_ref()
}

/// A third-party client taking `recipe` on `path`.
#[derive(Clone, Copy, Debug)]
enum Client {
    Curator(&'static str),
    Kazoo(&'static str),
}

impl Client {
    /// The helper with `action` (see tests/interop/Recipes.java), or `None` if it cannot run here.
    fn cmd(self, zk: &Zookeeper, path: &str, action: &[&str]) -> Option<Command> {
        let mut c = match self {
            Client::Curator(recipe) => {
                let mut c = Command::new("java");
                c.args(["-cp", curator()?, "Recipes", &zk.hosts(), path, recipe]);
                c
            }
            Client::Kazoo(recipe) => {
                let mut c = Command::new(kazoo()?);
                c.arg(helpers().join("kazoo_recipes.py"));
                c.args([&zk.hosts(), path, recipe]);
                c
            }
        };
        c.args(action);
        Some(c)
    }

    /// Takes the lock and holds it until stdin closes; returns once it holds. A client that
    /// exits instead (a lost ZooKeeper connection ends Curator's acquire), or does not hold
    /// within 30 s, fails the test with what it printed (a JVM is asked for its threads' stacks
    /// first: SIGQUIT).
    fn hold(self, zk: &Zookeeper, path: &str) -> Option<Proc> {
        let marker = scratch("foreign").join("held");
        let mut p = Proc::spawn(&mut self.cmd(zk, path, &["hold", marker.to_str().unwrap()])?);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !marker.exists() {
            if p.child.try_wait().unwrap().is_some() {
                let (out, _) = p.wait(Duration::from_secs(5));
                panic!("{self:?} exited without holding:\n{}", describe(&out));
            }
            if Instant::now() > deadline {
                if matches!(self, Client::Curator(_)) {
                    p.signal(libc::SIGQUIT);
                    std::thread::sleep(Duration::from_millis(500));
                }
                // Panics with the output and the process tree (the client is killed).
                let (out, _) = p.wait(Duration::ZERO);
                panic!("{self:?} did not hold within 30 s:\n{}", describe(&out));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(p)
    }

    /// Whether it gets the lock at once.
    fn gets_it_now(self, zk: &Zookeeper, path: &str) -> bool {
        let out = output(&mut self.cmd(zk, path, &["try"]).unwrap());
        match out.status.code() {
            Some(0) => true,
            Some(1) => false,
            _ => panic!("{self:?} try:\n{}", describe(&out)),
        }
    }
}

/// The shared ZooKeeper, a dlock backend on it, a fresh key and the path dlock locks it at.
fn setup(name: &str) -> Option<(&'static Zookeeper, TestBackend, String, String)> {
    let zk = shared_zookeeper()?;
    let b = TestBackend::zookeeper(&zk.url());
    let key = unique_key(name);
    let path = b.status(&key)["server_name"].as_str().unwrap().to_string();
    Some((zk, b, key, path))
}

/// A read-sleep-write step on a counter file, as a script (`sh STEP`): any overlap of two
/// steps loses an increment.
fn counter(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let (counter, step) = (dir.join("counter"), dir.join("step.sh"));
    std::fs::write(&counter, "0\n").unwrap();
    let c = counter.display();
    std::fs::write(
        &step,
        format!("x=$(cat {c}); sleep 0.005; echo $((x + 1)) > {c}\n"),
    )
    .unwrap();
    (counter, step)
}

/// Runs a dlock worker beside each of `apps` (each adding `n` under the application's lock),
/// each adding 1 to `counter` `n` times with `step`; checks nothing was lost.
fn counter_is_exact(
    b: &TestBackend,
    key: &str,
    n: u32,
    (counter, step): (&Path, &Path),
    apps: Vec<Command>,
) {
    let mut workers = Vec::new();
    let dlock_runs = format!(
        "for i in $(seq {n}); do {} || exit 1; done",
        shell_words(&b.run(
            key,
            &["--wait", "60s", "-q"],
            &["sh", step.to_str().unwrap()]
        ))
    );
    // One dlock worker beside each application.
    let total = n * 2 * apps.len() as u32;
    for mut app in apps {
        workers.push(Proc::spawn(Command::new("sh").args(["-c", &dlock_runs])));
        workers.push(Proc::spawn(&mut app));
    }
    for w in workers {
        let (out, _) = w.wait(Duration::from_secs(120));
        assert!(out.status.success(), "{}", describe(&out));
    }
    let got: u32 = std::fs::read_to_string(counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(got, total, "an application's lock and dlock overlapped");
}

/// Two dlock workers and two running `app` (made for the counter's step script) `n` times each.
pub(crate) fn app_counter_is_exact(
    b: &TestBackend,
    key: &str,
    name: &str,
    n: u32,
    app: impl FnOnce(&str) -> Command,
) {
    let (counter, step) = counter(name);
    let app = app(step.to_str().unwrap());
    let apps = vec![repeated(&app, n), repeated(&app, n)];
    counter_is_exact(b, key, n, (&counter, &step), apps);
}

/// `app` run `n` times in a row by `sh`, stopping at the first failure.
fn repeated(app: &Command, n: u32) -> Command {
    let mut c = Command::new("sh");
    c.args([
        "-c",
        &format!(
            "for i in $(seq {n}); do {} || exit 1; done",
            shell_words(app)
        ),
    ]);
    for (k, v) in app.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c
}

/// Two dlock workers and two of `client` each add 1 to a counter file `n` times under the lock.
fn client_counter_is_exact(client: Client, name: &str) {
    let Some((zk, b, key, path)) = setup(name) else {
        return;
    };
    if client.cmd(zk, &path, &[]).is_none() {
        return;
    }
    let n = 6;
    let (counter, step) = counter(name);
    let c = counter.to_str().unwrap();
    let apps = (0..2)
        .map(|_| {
            client
                .cmd(zk, &path, &["count", c, &n.to_string()])
                .unwrap()
        })
        .collect();
    counter_is_exact(&b, &key, n, (&counter, &step), apps);
}

/// The code block after `<!-- snippet: NAME -->` in docs/interop.md.
pub(crate) fn snippet(name: &str) -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interop.md"))
            .unwrap();
    let marker = format!("<!-- snippet: {name} -->\n```");
    let at = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("no snippet {name} in docs/interop.md"));
    let block = &doc[at + marker.len()..];
    let block = &block[block.find('\n').unwrap() + 1..];
    block[..block.find("```").unwrap()].to_string()
}

/// A command line for `sh -c`, every word quoted.
pub(crate) fn shell_words(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|w| format!("'{}'", w.to_str().unwrap().replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn curator_mutex_and_dlock_exclude_each_other() {
    client_counter_is_exact(Client::Curator("mutex"), "curator-counter");
}

#[test]
fn kazoo_lock_with_dlocks_pattern_and_dlock_exclude_each_other() {
    client_counter_is_exact(Client::Kazoo("lock-dlock"), "kazoo-counter");
}

/// The Java and Python snippets of docs/interop.md, run as they are, exclude dlock and are
/// excluded by it.
#[test]
fn zookeeper_snippets_of_the_docs_share_dlocks_lock() {
    let Some((zk, b, key, path)) = setup("zk-snippets") else {
        return;
    };
    let (Some(cp), Some(python)) = (curator(), kazoo()) else {
        return;
    };
    let dir = scratch("zk-snippets");
    std::fs::write(dir.join("ZkLock.java"), snippet("curator")).unwrap();
    std::fs::write(dir.join("zk_lock.py"), snippet("kazoo")).unwrap();
    let compiled = output(
        Command::new("javac")
            .arg("-d")
            .arg(&dir)
            .args(["-cp", cp])
            .arg(dir.join("ZkLock.java")),
    );
    assert!(compiled.status.success(), "{}", describe(&compiled));
    let (counter, step_path) = counter("zk-snippets");
    let name = path.strip_prefix("/dlock/").unwrap();
    let step = step_path.to_str().unwrap();
    let mut java = Command::new("java");
    java.args([
        "-cp",
        &format!("{}:{cp}", dir.display()),
        "ZkLock",
        name,
        "sh",
        step,
    ]);
    java.env("ZK_HOSTS", zk.hosts());
    let mut py = Command::new(python);
    py.arg(dir.join("zk_lock.py")).args([name, "sh", step]);
    py.env("ZK_HOSTS", zk.hosts());
    // One application at a time beside dlock: Curator does not see kazoo's `__lock__` nodes, so
    // the two snippets can hold together (that is between them, not dlock's; it made this test
    // fail now and then when they ran at once).
    let n = 3;
    counter_is_exact(
        &b,
        &key,
        n,
        (&counter, &step_path),
        vec![repeated(&java, n)],
    );
    std::fs::write(&counter, "0\n").unwrap();
    counter_is_exact(&b, &key, n, (&counter, &step_path), vec![repeated(&py, n)]);
}

/// dlock's shared and semaphore nodes are contenders for Curator's mutex and for kazoo with
/// `extra_lock_patterns`; their holders make every dlock mode wait (75 with `--no-wait`, never
/// the usage error of a mode mismatch).
#[test]
fn shared_and_limit_holders_exclude_mutex_recipes_both_ways() {
    let Some((zk, b, key, path)) = setup("sharers") else {
        return;
    };
    let (Some(_), Some(_)) = (curator(), kazoo()) else {
        return;
    };
    for mode in [&["--shared"][..], &["--limit", "2"]] {
        let dir = scratch("sharers");
        let mut h = b.holding(&key, mode, &dir.join("held"));
        for client in [Client::Curator("mutex"), Client::Kazoo("lock-dlock")] {
            assert!(
                !client.gets_it_now(zk, &path),
                "{client:?} got the lock beside a dlock {mode:?} holder"
            );
        }
        h.close_stdin();
        h.wait(Duration::from_secs(10));
    }
    for client in [Client::Curator("mutex"), Client::Kazoo("lock-dlock")] {
        let mut f = client.hold(zk, &path).unwrap();
        for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
            let extra = [mode, &["--no-wait"]].concat();
            let out = run_code(&mut b.run(&key, &extra, &["true"]), 75);
            assert!(
                one_error_line(&out).contains("not dlock"),
                "{client:?} {mode:?}: {}",
                describe(&out)
            );
        }
        let s = b.status(&key);
        assert_eq!(s["held"], true, "{s}");
        assert!(s["holders"][0]["foreign"].is_string(), "{s}");
        assert!(s["holders"][0]["node"].is_string(), "{s}");
        assert!(s["holders"][0]["session"].is_string(), "{s}");
        // A waiting dlock gets it as soon as the other client lets go.
        let waiter = Proc::spawn(&mut b.run(&key, &["--shared", "--wait", "30s"], &["true"]));
        crate::conformance::wait_until_waiting(&b, &key, 1);
        f.close_stdin();
        let (out, _) = waiter.wait(Duration::from_secs(30));
        assert!(out.status.success(), "{}", describe(&out));
        f.wait(Duration::from_secs(30));
    }
}

/// Recipes that never look at dlock's nodes (Curator's read/write lock and semaphore, kazoo's
/// semaphore): holding first, they make dlock wait or refuse (75); arriving second, they make
/// dlock stop its command (lock lost, 79) rather than run beside them.
#[test]
fn recipes_blind_to_dlock_never_hold_beside_it() {
    let Some((zk, b, _, _)) = setup("blind") else {
        return;
    };
    let (Some(_), Some(_)) = (curator(), kazoo()) else {
        return;
    };
    let clients = [
        Client::Curator("write"),
        Client::Curator("read"),
        Client::Curator("semaphore"),
        Client::Kazoo("semaphore"),
        Client::Kazoo("lock"),
        Client::Kazoo("rlock"),
    ];
    for client in clients {
        let key = unique_key("blind");
        let path = b.status(&key)["server_name"].as_str().unwrap().to_string();
        // It holds first: no dlock mode runs beside it.
        let mut f = client.hold(zk, &path).unwrap();
        for mode in [&[][..], &["--shared"], &["--limit", "2"]] {
            let extra = [mode, &["--no-wait"]].concat();
            let out = run_code(&mut b.run(&key, &extra, &["true"]), 75);
            let line = one_error_line(&out);
            assert!(line.contains("busy"), "{client:?} {mode:?}: {line}");
        }
        let s = b.status(&key);
        assert_eq!(s["held"], true, "{client:?}: {s}");
        assert!(s["holders"][0]["foreign"].is_string(), "{client:?}: {s}");
        f.close_stdin();
        f.wait(Duration::from_secs(30));
        // dlock holds first; it arrives.
        let key = unique_key("blind");
        let path = b.status(&key)["server_name"].as_str().unwrap().to_string();
        let dir = scratch("blind");
        let (held, errors) = (dir.join("held"), dir.join("stderr"));
        let script = format!("echo held > {}; read _x || true", held.display());
        let holder = format!(
            "exec {} 2> {}",
            shell_words(&b.run(&key, &[], &sh(&script))),
            errors.display()
        );
        let mut h = Proc::spawn(Command::new("sh").args(["-c", &holder]));
        wait_for_file(&held, Duration::from_secs(10));
        let mut f = client.hold(zk, &path).unwrap();
        match client {
            Client::Kazoo("lock") | Client::Kazoo("rlock") => {
                // It may be a kazoo lock made to see dlock's nodes, which waits: dlock cannot
                // tell, keeps its command and says so.
                wait_until(Duration::from_secs(10), "dlock's warning", || {
                    let err = std::fs::read_to_string(&errors).unwrap_or_default();
                    err.contains("warning: a kazoo") && err.contains("extra_lock_patterns")
                });
                h.close_stdin();
                let (out, _) = h.wait(Duration::from_secs(10));
                assert!(out.status.success(), "{client:?}: {}", describe(&out));
            }
            _ => {
                let (out, _) = h.wait(Duration::from_secs(10));
                let err = std::fs::read_to_string(&errors).unwrap();
                assert_eq!(out.status.code(), Some(79), "{client:?}: {err}");
                assert!(err.contains("does not see dlock"), "{client:?}: {err}");
            }
        }
        f.close_stdin();
        f.wait(Duration::from_secs(30));
    }
}
