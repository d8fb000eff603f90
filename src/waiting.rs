//! The waiting line: while a run waits for a busy lock, and stderr is a terminal (and not `-q`),
//! one line says whom it waits for — the holder now (host, pid, for how long, `--reason`), how
//! long this run has waited, what is left of `--wait`, its place in the queue where the backend
//! keeps one — fitted to the terminal's width, redrawn in place every second, erased when the
//! wait ends. Nothing at all off a terminal.
//!
//! Two threads of its own, never the waiting one (whose wait is the backend's own wake-up by its
//! server, and must not be held up):
//! - the *drawer* only writes to stderr; it is joined when the wait ends, so the line is gone
//!   before the command starts;
//! - the *looker* asks the backend's [`status`](crate::backend::Backend::status) on a handle (a
//!   connection) of its own: every [`LOOK_EVERY`], and sooner (at most every [`LOOK_GAP`])
//!   when the waiting thread learned something (a wake-up). It is never joined: a lookup stuck
//!   on a slow server cannot delay the command; it sees the stop when it returns and ends.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::model::{Deadline, Holder, Record, Status};
use crate::report::{MAX_FIELD, clean, short_duration};

/// The line appears after this long: a short wait says nothing.
const SHOW_AFTER: Duration = Duration::from_secs(1);
/// How often the looker asks who holds the lock.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// The least time between two lookups (a wake-up asks sooner than [`LOOK_EVERY`]).
const LOOK_GAP: Duration = Duration::from_millis(500);
/// The first lookup comes this long before the line appears, so that it has news to show.
const LOOK_AHEAD: Duration = Duration::from_millis(300);

/// Opens, on the looker's thread, a status lookup of its own (a second backend handle):
/// `None` from the lookup when the server could not be asked this time.
pub(crate) type Lookup = Box<dyn FnOnce() -> Box<dyn FnMut() -> Option<Status>> + Send>;

/// The line of one wait; dropping it erases the line (waiting for the drawer, never the looker).
pub(crate) struct WaitingLine {
    shared: Arc<Shared>,
    drawer: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the drawer and the looker: a stop, news to draw, a wake-up to look up.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    stopped: bool,
    /// News since the last draw.
    redraw: bool,
    /// The waiting thread learned something: look up soon.
    nudged: bool,
    view: View,
}

/// What is known of the lock.
#[derive(Clone, Default)]
struct View {
    /// Its holders (empty: unknown, or free just now).
    holders: Vec<Holder>,
    /// How many wait (this run included), where the backend can tell.
    waiters: Option<u64>,
    /// This run's place in the queue and the queue's length, where the backend keeps one.
    place: Option<(usize, usize)>,
}

/// What the line says before the news: "waiting for 'job'", and until when.
struct Head {
    what: String,
    key: Option<String>,
    deadline: Deadline,
}

impl WaitingLine {
    /// The line of a wait for `key` until `deadline` by the run whose record is `me`, told who
    /// holds it by `lookup` (if any) as well as by [`WaitingLine::holder`].
    pub(crate) fn start(
        key: &str,
        deadline: Deadline,
        me: &Record,
        lookup: Option<Lookup>,
    ) -> WaitingLine {
        let head = Head {
            what: "waiting for ".into(),
            key: Some(key.to_string()),
            deadline,
        };
        // A try that does not wait (--no-wait) has nothing to show.
        let line = WaitingLine::begin(head, deadline != Deadline::Now);
        if let (Some(lookup), true) = (lookup, line.drawer.is_some()) {
            let shared = line.shared.clone();
            let me = me.clone();
            // Detached: see the module's comment. Without the thread, the line still shows what
            // the waiting thread learns.
            let _ = std::thread::Builder::new()
                .name("dlock-look".into())
                .spawn(move || look(&shared, lookup, &me));
        }
        line
    }

    /// A line that says `what` ("holding 'job' back after a server restart") and how long it
    /// has been.
    pub(crate) fn saying(what: String) -> WaitingLine {
        let head = Head {
            what,
            key: None,
            deadline: Deadline::Never,
        };
        WaitingLine::begin(head, true)
    }

    fn begin(head: Head, waits: bool) -> WaitingLine {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let shown = waits && !crate::report::is_quiet() && std::io::stderr().is_terminal();
        let drawer = shown
            .then(|| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name("dlock-line".into())
                    .spawn(move || draw(&shared, &head))
                    .ok()
            })
            .flatten();
        WaitingLine { shared, drawer }
    }

    /// Records who holds the lock, as the waiting thread just learned it (a wake-up): drawn
    /// next, and a lookup follows soon. Never blocks on more than the line's own lock.
    pub(crate) fn holder(&self, h: &Holder) {
        let mut st = self.shared.lock();
        st.view.holders = vec![h.clone()];
        st.redraw = true;
        st.nudged = true;
        drop(st);
        self.shared.changed.notify_all();
    }
}

impl Drop for WaitingLine {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.drawer.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a change or until `until`; returns the guard.
    fn wait_until<'a>(&self, st: MutexGuard<'a, State>, until: Instant) -> MutexGuard<'a, State> {
        let left = until.saturating_duration_since(Instant::now());
        self.changed
            .wait_timeout(st, left)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

/// The drawer: the first draw after [`SHOW_AFTER`], then every second and on news; erases the
/// line on the stop.
fn draw(shared: &Shared, head: &Head) {
    let started = Instant::now();
    let mut next = started + SHOW_AFTER;
    let mut drawn = false;
    let mut st = shared.lock();
    loop {
        while !st.stopped && Instant::now() < next && !(drawn && st.redraw) {
            st = shared.wait_until(st, next);
        }
        if st.stopped {
            if drawn {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(b"\r\x1b[K");
                let _ = err.flush();
            }
            return;
        }
        st.redraw = false;
        let view = st.view.clone();
        drop(st);
        let width = crate::sys::terminal_width().unwrap_or(80);
        // One column short of the width: a line that fills the last column leaves some
        // terminals waiting to wrap.
        let text = fit(
            compose(head, &view, started.elapsed()),
            width.saturating_sub(1),
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{text}\x1b[K");
        let _ = err.flush();
        drop(err);
        drawn = true;
        let now = Instant::now();
        if now >= next {
            next = now + Duration::from_secs(1);
        }
        st = shared.lock();
    }
}

/// The looker: asks the backend through a handle of its own, never faster than [`LOOK_GAP`].
fn look(shared: &Shared, lookup: Lookup, me: &Record) {
    let first = Instant::now() + SHOW_AFTER - LOOK_AHEAD;
    let mut lookup = Some(lookup);
    let mut status: Option<Box<dyn FnMut() -> Option<Status>>> = None;
    let mut last: Option<Instant> = None;
    let mut st = shared.lock();
    loop {
        loop {
            if st.stopped {
                return;
            }
            let due = match last {
                None => first,
                Some(l) if st.nudged => l + LOOK_GAP,
                Some(l) => l + LOOK_EVERY,
            };
            if Instant::now() >= due {
                break;
            }
            st = shared.wait_until(st, due);
        }
        st.nudged = false;
        drop(st);
        let ask = match (&mut status, lookup.take()) {
            (Some(ask), _) => ask,
            (None, Some(open)) => status.insert(open()),
            (None, None) => return,
        };
        let seen = ask();
        last = Some(Instant::now());
        st = shared.lock();
        if let Some(s) = seen {
            st.view = View::of(&s, me);
            st.redraw = true;
            shared.changed.notify_all();
        }
    }
}

impl View {
    /// What `status` says, with this run's (`me`) place in the queue.
    fn of(s: &Status, me: &Record) -> View {
        let mine = |h: &Holder| {
            h.pid == me.pid
                && h.host == me.host
                && (h.pidns.is_none() || me.pidns.is_none() || h.pidns == me.pidns)
        };
        View {
            // This run, just granted the lock, is not whom it waits for.
            holders: s.holders.iter().filter(|h| !mine(h)).cloned().collect(),
            waiters: s.waiters,
            place: s
                .queue
                .iter()
                .position(mine)
                .map(|i| (i + 1, s.queue.len())),
        }
    }
}

/// One piece of the line: cut (those that may be) or dropped, lowest `rank` first, when the
/// line is too wide.
struct Piece {
    text: String,
    rank: u8,
    /// Whether it may be cut short (with `…`), down to [`MIN_CUT`] characters.
    cut: bool,
    /// Whether it stays even when nothing else is left (then only cut).
    keep: bool,
}

fn piece(text: String, rank: u8, cut: bool) -> Piece {
    Piece {
        text,
        rank,
        cut,
        keep: false,
    }
}

/// The pieces of the line, in the order they read. Ranks: what goes first when the terminal is
/// narrow — how long the holder has held, its reason, the queue, its host, the time left, the
/// words "waiting for"; then the key is cut; then how long this run has waited, the holder's
/// pid.
fn compose(head: &Head, view: &View, waited: Duration) -> Vec<Piece> {
    let mut p = vec![Piece {
        text: "dlock: ".into(),
        rank: u8::MAX,
        cut: false,
        keep: true,
    }];
    match &head.key {
        Some(key) => {
            p.push(piece(head.what.clone(), 6, false));
            p.push(Piece {
                text: format!("'{}'", clean(key, MAX_FIELD)),
                rank: 7,
                cut: true,
                keep: true,
            });
        }
        None => p.push(Piece {
            text: head.what.clone(),
            rank: 7,
            cut: true,
            keep: true,
        }),
    }
    p.push(piece(format!(" {}", short_duration(waited)), 8, false));
    if let Deadline::At(t) = head.deadline {
        let left = t.saturating_duration_since(Instant::now());
        p.push(piece(format!(" ({} left)", short_duration(left)), 5, false));
    }
    if let Some(h) = view.holders.first() {
        match (&h.foreign, &h.host, h.pid) {
            (None, host, pid) if host.is_some() || pid.is_some() => {
                match (host, pid) {
                    (host, Some(pid)) => {
                        p.push(piece(format!("; held by pid {pid}"), 9, false));
                        if let Some(host) = host {
                            p.push(piece(format!(" on {}", clean(host, MAX_FIELD)), 4, true));
                        }
                    }
                    (host, None) => p.push(piece(
                        format!(
                            "; held by {}",
                            clean(host.as_deref().unwrap_or(""), MAX_FIELD)
                        ),
                        9,
                        true,
                    )),
                }
                if let Some(d) = h.held_for() {
                    p.push(piece(format!(" for {}", short_duration(d)), 1, false));
                }
                if h.broken {
                    p.push(piece(" (broken, stopping)".into(), 3, false));
                }
                if let Some(r) = &h.reason {
                    p.push(piece(format!(": {}", clean(r, MAX_FIELD)), 2, true));
                }
            }
            _ => p.push(piece(format!("; held by {}", h.short()), 9, true)),
        }
        if view.holders.len() > 1 {
            let more = view.holders.len() - 1;
            p.push(piece(format!(" and {more} more"), 3, false));
        }
    }
    match (view.place, view.waiters) {
        (Some((n, of)), _) => p.push(piece(format!("; {} of {of} in line", ordinal(n)), 3, false)),
        (None, Some(w)) if w > 1 => p.push(piece(format!("; {w} waiting"), 3, false)),
        _ => {}
    }
    p
}

/// "1st", "2nd", "3rd", "4th", "11th", "21st".
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The fewest characters a piece is cut down to (then it is dropped instead).
const MIN_CUT: usize = 4;

/// `pieces` joined into at most `width` columns: the lowest-ranked piece is cut (if it may be)
/// or dropped (if it may be), then the next; never more than `width`.
fn fit(mut pieces: Vec<Piece>, width: usize) -> String {
    let total = |p: &[Piece]| p.iter().map(|p| columns(&p.text)).sum::<usize>();
    while total(&pieces) > width {
        let excess = total(&pieces) - width;
        let can_cut = |p: &Piece| p.cut && columns(&p.text) > MIN_CUT;
        let Some(i) = (0..pieces.len())
            .filter(|&i| !pieces[i].keep || can_cut(&pieces[i]))
            .min_by_key(|&i| pieces[i].rank)
        else {
            break;
        };
        let p = &mut pieces[i];
        let have = columns(&p.text);
        if can_cut(p) && (p.keep || have >= excess + MIN_CUT) {
            p.text = cut(&p.text, have.saturating_sub(excess).max(MIN_CUT));
        } else {
            pieces.remove(i);
        }
    }
    let line: String = pieces.into_iter().map(|p| p.text).collect();
    cut(&line, width)
}

/// `text` in at most `width` columns, ending in `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if columns(text) <= width {
        return text.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = char_columns(c);
        if used + w + 1 > width {
            break;
        }
        out.push(c);
        used += w;
    }
    if width > 0 {
        out.push('…');
    }
    out
}

/// How many columns `text` takes on a terminal (at most: see [`char_columns`]).
fn columns(text: &str) -> usize {
    text.chars().map(char_columns).sum()
}

/// Two for the East Asian wide and full-width characters and the emoji, one for the rest (a
/// combining mark counted as one only makes the line shorter than it could be). `text` has
/// been through [`clean`]: no control characters.
fn char_columns(c: char) -> usize {
    match c as u32 {
        0x1100..=0x115f
        | 0x2e80..=0x303e
        | 0x3041..=0x33ff
        | 0x3400..=0x4dbf
        | 0x4e00..=0x9fff
        | 0xa000..=0xa4cf
        | 0xac00..=0xd7a3
        | 0xf900..=0xfaff
        | 0xfe30..=0xfe4f
        | 0xff00..=0xff60
        | 0xffe0..=0xffe6
        | 0x1f300..=0x1f64f
        | 0x1f900..=0x1f9ff
        | 0x20000..=0x3fffd => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(host: &str, pid: u32, reason: Option<&str>) -> Holder {
        Holder::from(Record {
            host: Some(host.into()),
            pid: Some(pid),
            reason: reason.map(String::from),
            ..Record::default()
        })
    }

    fn head(key: &str, left: Option<Duration>) -> Head {
        Head {
            what: "waiting for ".into(),
            key: Some(key.into()),
            deadline: left.map_or(Deadline::Never, |l| Deadline::At(Instant::now() + l)),
        }
    }

    #[test]
    fn a_wide_terminal_shows_everything() {
        let view = View {
            holders: vec![holder("vm", 19490, Some("deploy v2"))],
            waiters: Some(2),
            place: Some((2, 2)),
        };
        let h = head("tty2", Some(Duration::from_secs(50)));
        let line = fit(compose(&h, &view, Duration::from_secs(6)), 200);
        assert!(line.starts_with("dlock: waiting for 'tty2' 6s ("), "{line}");
        assert!(line.contains(" left); held by pid 19490 on vm"), "{line}");
        assert!(line.ends_with(": deploy v2; 2nd of 2 in line"), "{line}");
    }

    #[test]
    fn a_narrow_terminal_keeps_the_pid_and_never_overflows() {
        let view = View {
            holders: vec![holder(
                "a-rather-long-host-name.example.com",
                19490,
                Some("deploying the whole fleet"),
            )],
            waiters: Some(5),
            place: None,
        };
        let h = head(
            "a-long-key-name-for-the-nightly-job",
            Some(Duration::from_secs(90)),
        );
        for width in [10, 20, 30, 44, 60, 80] {
            let line = fit(compose(&h, &view, Duration::from_secs(75)), width);
            assert!(columns(&line) <= width, "{width}: {line}");
            if width >= 44 {
                assert!(line.contains("pid 19490"), "{width}: {line}");
            }
        }
    }

    #[test]
    fn server_text_is_escaped_and_wide_characters_count_twice() {
        let view = View {
            holders: vec![holder("evil\x1b[2J", 1, Some("起動中のデプロイ\n"))],
            ..View::default()
        };
        let line = fit(compose(&head("k", None), &view, Duration::ZERO), 200);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("evil\\x1b[2J"), "{line}");
        let narrow = fit(compose(&head("k", None), &view, Duration::ZERO), 44);
        assert!(columns(&narrow) <= 44, "{narrow}");
        assert_eq!(columns("起動"), 4);
    }

    #[test]
    fn the_place_in_line_is_this_runs() {
        let me = Record {
            host: Some("h".into()),
            pid: Some(7),
            ..Record::default()
        };
        let mut s = Status::new(
            &crate::model::Key::new("k").unwrap(),
            crate::model::BackendKind::Zookeeper,
            String::new(),
        );
        s.held = true;
        s.holders = vec![holder("h", 1, None)];
        s.queue = vec![
            holder("h", 5, None),
            holder("h", 7, None),
            holder("h", 9, None),
        ];
        assert_eq!(View::of(&s, &me).place, Some((2, 3)));
        assert_eq!(ordinal(1), "1st");
        assert_eq!(ordinal(12), "12th");
        assert_eq!(ordinal(23), "23rd");
    }
}
