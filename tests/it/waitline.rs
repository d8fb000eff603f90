//! The waiting line on a terminal: a waiter runs in a pty of 45 columns that script(1) makes
//! (`stty cols 45` sets the size its TIOCGWINSZ reads), and what it writes is played on a small
//! screen model. Holder A hands over to holder B while the waiter waits: the line must come to
//! name B (not A), never pass the width (never wrap), and be gone when the waiter's command
//! starts.

use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::conformance::wait_until_waiting;
use crate::util::*;

/// The terminal's width.
const COLS: usize = 45;

/// What a terminal shows of the bytes dlock writes: printable characters, `\r`, `\n`, and
/// "erase to the end of the line" (`ESC [ K`); any other escape sequence is a failure (the
/// line must not move the cursor about). Writing past the last column wraps, and is recorded.
struct Screen {
    cols: usize,
    rows: Vec<Vec<char>>,
    row: usize,
    col: usize,
    wrapped: Vec<String>,
    /// Escape sequences other than `ESC [ K`.
    odd: Vec<String>,
    esc: Option<String>,
}

impl Screen {
    fn new(cols: usize) -> Screen {
        Screen {
            cols,
            rows: vec![Vec::new()],
            row: 0,
            col: 0,
            wrapped: Vec::new(),
            odd: Vec::new(),
            esc: None,
        }
    }

    fn feed(&mut self, text: &str) {
        for c in text.chars() {
            if let Some(esc) = &mut self.esc {
                esc.push(c);
                if esc.len() > 1 && c.is_ascii_alphabetic() || esc.len() > 16 {
                    let esc = self.esc.take().unwrap();
                    if esc == "[K" {
                        self.rows[self.row].truncate(self.col);
                    } else {
                        self.odd.push(esc);
                    }
                }
                continue;
            }
            match c {
                '\x1b' => self.esc = Some(String::new()),
                '\r' => self.col = 0,
                '\n' => {
                    self.row += 1;
                    if self.rows.len() <= self.row {
                        self.rows.push(Vec::new());
                    }
                }
                c => {
                    if self.col == self.cols {
                        self.wrapped.push(self.current());
                        self.col = 0;
                        self.row += 1;
                        if self.rows.len() <= self.row {
                            self.rows.push(Vec::new());
                        }
                    }
                    let line = &mut self.rows[self.row];
                    if line.len() <= self.col {
                        line.resize(self.col, ' ');
                        line.push(c);
                    } else {
                        line[self.col] = c;
                    }
                    self.col += 1;
                }
            }
        }
    }

    /// The row the cursor is on.
    fn current(&self) -> String {
        self.rows[self.row].iter().collect()
    }

    fn all(&self) -> String {
        let rows: Vec<String> = self.rows.iter().map(|r| r.iter().collect()).collect();
        rows.join("\n")
    }
}

/// A waiter in a pty, and its screen.
struct Waiter {
    script: Proc,
    /// The waiting dlock's pid.
    pid: i32,
    out: Receiver<Vec<u8>>,
    screen: Screen,
    raw: String,
}

impl Waiter {
    /// Starts `dlock run <b's args> EXTRA -k KEY -- echo WAITER-RAN` in a pty of [`COLS`]
    /// columns.
    fn start(b: &TestBackend, key: &str, extra: &[&str], dir: &std::path::Path) -> Waiter {
        Waiter::start_in(COLS, b, key, extra, dir)
    }

    /// [`Waiter::start`] in a pty of `cols` columns.
    fn start_in(
        cols: usize,
        b: &TestBackend,
        key: &str,
        extra: &[&str],
        dir: &std::path::Path,
    ) -> Waiter {
        let pidfile = dir.join("waiter.pid");
        let mut words = b.run_words();
        words.extend(extra.iter().map(|s| s.to_string()));
        words.extend(["-k", key, "--", "echo", "WAITER-RAN"].map(String::from));
        let quoted: Vec<String> = words
            .iter()
            .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
            .collect();
        let inner = format!(
            "echo $$ > '{}'; stty cols {cols} rows 24; exec {}",
            pidfile.display(),
            quoted.join(" ")
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &inner, "/dev/null"]);
        for (k, v) in &b.env {
            cmd.env(k, v);
        }
        let mut script = Proc::spawn(&mut cmd);
        let stdout = script.child.stdout.take().unwrap();
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut stdout = stdout;
            let mut buf = [0u8; 512];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let pid = wait_for_file(&pidfile, Duration::from_secs(10))
            .parse()
            .unwrap();
        Waiter {
            script,
            pid,
            out,
            screen: Screen::new(cols),
            raw: String::new(),
        }
    }

    /// Reads the output until `cond` holds of the screen, at most `limit`.
    #[track_caller]
    fn until(&mut self, limit: Duration, what: &str, cond: impl Fn(&Screen) -> bool) {
        let deadline = Instant::now() + limit;
        while !cond(&self.screen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(chunk) => {
                    let text = String::from_utf8_lossy(&chunk).into_owned();
                    self.screen.feed(&text);
                    self.raw.push_str(&text);
                }
                Err(_) => panic!(
                    "{what}: not within {limit:?}; the screen:\n{}\nraw: {:?}",
                    self.screen.all(),
                    self.raw
                ),
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill of a process this test started (the dlock script(1) runs).
        unsafe { libc::kill(self.pid, sig) };
    }
}

/// Kills the waiting dlock if the test fails: it may be left stopped (SIGSTOP).
struct KillOnPanic(i32);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill of a process this test started.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// A holds, B waits, the waiter queues behind B; A hands over to B; the waiter's line comes to
/// name B, then is erased before its command prints. The waiter is stopped (SIGSTOP) during the
/// hand-over so that B, not the waiter, takes the lock (flock wakes every waiter at once and
/// the first to run wins; a Redis release wakes whichever BLPOP came first), then continued:
/// its line must then find B by itself.
pub(crate) fn the_line_follows_a_hand_over(b: &TestBackend) {
    assert!(
        crate::servers::available("script"),
        "util-linux `script` is needed for the terminal test"
    );
    let key = unique_key("waitline");
    let dir = scratch("waitline");
    let mut a = b.holding(&key, &["--reason", "first holder"], &dir.join("a"));
    let mut bh = b.holding_later(&key, &dir.join("b"));
    wait_until_waiting(b, &key, 1);
    let mut w = Waiter::start(b, &key, &["--wait", "60s"], &dir);
    let _kill = KillOnPanic(w.pid);
    wait_until_waiting(b, &key, 2);

    let a_pid = format!("pid {}", a.pid());
    let b_pid = format!("pid {}", bh.pid());
    w.until(Duration::from_secs(10), "the line names A", |s| {
        s.current().contains(&a_pid)
    });
    w.signal(libc::SIGSTOP);
    a.close_stdin();
    wait_for_file(&dir.join("b"), b.ttl + Duration::from_secs(10));
    // script(1) stops itself when its child stops: both go on.
    w.signal(libc::SIGCONT);
    w.script.signal(libc::SIGCONT);
    w.until(Duration::from_secs(5), "the line names B", |s| {
        let line = s.current();
        line.contains(&b_pid) && !line.contains(&a_pid)
    });
    bh.close_stdin();
    w.until(Duration::from_secs(10), "the waiter's command", |s| {
        s.all().contains("WAITER-RAN")
    });
    let (out, _) = w.script.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let screen = w.screen.all();
    assert!(
        w.screen.wrapped.is_empty(),
        "wrapped: {:?}",
        w.screen.wrapped
    );
    assert!(w.screen.odd.is_empty(), "escapes: {:?}", w.screen.odd);
    let ran: Vec<&str> = screen
        .lines()
        .filter(|l| l.contains("WAITER-RAN"))
        .collect();
    assert_eq!(ran, ["WAITER-RAN"], "the line was erased first:\n{screen}");
    assert!(!screen.contains("dlock:"), "nothing left behind:\n{screen}");
    // Each drawing of the line (between a `\r` and the erase) fits the width.
    for drawn in w.raw.split('\r').filter_map(|s| s.strip_suffix("\x1b[K")) {
        assert!(drawn.chars().count() < COLS, "too wide: {drawn:?}");
    }
}

/// Where the backend keeps a queue (ZooKeeper, etcd), a wide terminal shows the waiter's place
/// in it: behind B, the 2nd of 2.
pub(crate) fn the_line_shows_the_place_in_line(b: &TestBackend) {
    let key = unique_key("waitline-place");
    let dir = scratch("waitline-place");
    let _a = b.holding(&key, &[], &dir.join("a"));
    let _b = b.holding_later(&key, &dir.join("b"));
    wait_until_waiting(b, &key, 1);
    let mut w = Waiter::start_in(200, b, &key, &["--wait", "60s"], &dir);
    w.until(Duration::from_secs(10), "the place in line", |s| {
        s.current().contains("; 2nd of 2 in line")
    });
}

/// With `-q` nothing is drawn, even on a terminal: a waiter that gives up after 2 s (past the
/// second after which the line shows, and a lookup) says only why it gave up.
pub(crate) fn quiet_draws_nothing(b: &TestBackend) {
    let key = unique_key("waitline-q");
    let dir = scratch("waitline-q");
    let _a = b.holding(&key, &[], &dir.join("a"));
    let mut w = Waiter::start(b, &key, &["-q", "--wait", "2s"], &dir);
    w.until(Duration::from_secs(10), "the busy error", |s| {
        s.all().contains("busy")
    });
    let (out, _) = w.script.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(!w.raw.contains("waiting for"), "{:?}", w.raw);
    assert!(!w.raw.contains('\x1b'), "{:?}", w.raw);
}

mod file {
    #[test]
    fn the_line_follows_a_hand_over() {
        super::the_line_follows_a_hand_over(&crate::util::TestBackend::file());
    }

    #[test]
    fn quiet_draws_nothing() {
        super::quiet_draws_nothing(&crate::util::TestBackend::file());
    }
}

mod redis {
    #[test]
    fn the_line_follows_a_hand_over() {
        let Some(url) = crate::servers::shared_redis() else {
            return;
        };
        super::the_line_follows_a_hand_over(&crate::util::TestBackend::redis(&url));
    }
}

mod zookeeper {
    #[test]
    fn the_line_shows_the_place_in_line() {
        let Some(zk) = crate::servers::shared_zookeeper() else {
            return;
        };
        super::the_line_shows_the_place_in_line(&crate::util::TestBackend::zookeeper(&zk.url()));
    }

    #[test]
    fn the_line_follows_a_hand_over() {
        let Some(zk) = crate::servers::shared_zookeeper() else {
            return;
        };
        super::the_line_follows_a_hand_over(&crate::util::TestBackend::zookeeper(&zk.url()));
    }
}

mod etcd {
    #[test]
    fn the_line_shows_the_place_in_line() {
        let Some(e) = crate::servers::shared_etcd() else {
            return;
        };
        super::the_line_shows_the_place_in_line(&crate::util::TestBackend::etcd(&e.url()));
    }

    #[test]
    fn the_line_follows_a_hand_over() {
        let Some(e) = crate::servers::shared_etcd() else {
            return;
        };
        super::the_line_follows_a_hand_over(&crate::util::TestBackend::etcd(&e.url()));
    }
}

mod postgres {
    #[test]
    fn the_line_follows_a_hand_over() {
        let Some(p) = crate::servers::shared_postgres() else {
            return;
        };
        super::the_line_follows_a_hand_over(&crate::util::TestBackend::postgres(&p.url()));
    }
}

mod mysql {
    #[test]
    fn the_line_follows_a_hand_over() {
        let Some(m) = crate::servers::shared_mariadb() else {
            return;
        };
        super::the_line_follows_a_hand_over(&crate::util::TestBackend::mysql(&m.url()));
    }
}
