//! What dlock says on stderr (and `status` on stdout): the verbosity switch, `-v` event lines,
//! warnings and status formatting (the waiting line on a terminal is `waiting`).
//!
//! It never sees URLs: callers pass locations that are already free of credentials.

use std::fmt::Arguments;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::model::{Holder, Mode, Status, Verbosity};

static LEVEL: AtomicU8 = AtomicU8::new(1);

/// Sets the process-wide verbosity.
pub(crate) fn set_verbosity(v: Verbosity) {
    LEVEL.store(v as u8, Ordering::Relaxed);
}

fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// Whether `-q` asked for nothing but errors.
pub(crate) fn is_quiet() -> bool {
    level() < Verbosity::Normal as u8
}

/// The longest line dlock prints about one event: error chains that quote servers stay readable.
const MAX_LINE: usize = 2000;
/// The longest a holder's host, command or session is shown in text.
pub(crate) const MAX_FIELD: usize = 256;

/// `text` made safe for a terminal: control characters (C0, DEL, C1) and the invisible
/// formatting ones (bidirectional overrides, zero-width characters) become escapes such as
/// `\x1b`, `\n` or `\u{202e}`, and anything past `max` characters is cut with `…`. Everything
/// shown in text form that came from a server or another process goes through here; `--json`
/// output does not (JSON escapes control characters itself, and must stay exact).
pub(crate) fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max.saturating_add(8)));
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if invisible(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Whether `c` changes how a terminal lays text out without being seen: Unicode's format
/// characters (bidirectional controls, zero-width ones, the soft hyphen, tags) and the line and
/// paragraph separators U+2028/U+2029, which some terminals and log viewers break lines at.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{ad}'
        | '\u{600}'..='\u{605}'
        | '\u{61c}'
        | '\u{6dd}'
        | '\u{70f}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e007f}')
}

/// Pieces of the passwords in the URLs given (see [`hide_secrets`]).
static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// From now on, no usage error ([`usage_error`]) shows `secrets`, or any piece of one: a URL
/// parser's error may quote a fragment of a URL it split in the wrong place ("bad port 'PW1'"
/// for `u:PW1/PW2@h`), so each secret is also hidden piece by piece, split at the characters
/// parsers split on. (Only usage errors: URLs are parsed before anything else happens, and a
/// password that is a common word must not blank it out of every other message.)
pub(crate) fn hide_secrets(secrets: &[String]) {
    let mut hidden = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    for s in secrets {
        hidden.push(s.clone());
        hidden.extend(
            s.split(|c: char| !c.is_alphanumeric())
                .filter(|p| p.len() >= 3 && p.len() < s.len())
                .map(String::from),
        );
    }
    // Longest first, so that a piece never cuts a longer secret in two.
    hidden.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` (a piece of a URL that a message echoes, such as a Sentinel primary's name) without
/// any secret of the URLs given, or piece of one (see [`hide_secrets`]).
pub(crate) fn without_secrets(text: &str) -> String {
    scrub(text.to_string())
}

/// `line` without any registered secret.
fn scrub(line: String) -> String {
    let hidden = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    let mut line = line;
    for s in hidden.iter() {
        if line.contains(s.as_str()) {
            line = line.replace(s.as_str(), "***");
        }
    }
    line
}

/// An event line, shown with `-v` only.
pub(crate) fn verbose(args: Arguments<'_>) {
    if level() >= Verbosity::Verbose as u8 {
        eprintln!("dlock: {}", clean(&plain(args.to_string()), MAX_LINE));
    }
}

/// A notice of something the user should know (a lock held back), hidden by `-q`.
pub(crate) fn notice(args: Arguments<'_>) {
    if level() >= Verbosity::Normal as u8 {
        eprintln!("dlock: {}", clean(&plain(args.to_string()), MAX_LINE));
    }
}

/// A warning, hidden by `-q`.
pub(crate) fn warn(args: Arguments<'_>) {
    if level() >= Verbosity::Normal as u8 {
        eprintln!(
            "dlock: warning: {}",
            clean(&plain(scrub(args.to_string())), MAX_LINE)
        );
    }
}

/// An error: always shown, one line (a newline in a server's message is escaped too).
pub(crate) fn error(args: Arguments<'_>) {
    eprintln!("dlock: {}", clean(&plain(args.to_string()), MAX_LINE));
}

/// A usage error (exit 2), which may quote a URL: as [`error`], without any secret of the URLs
/// given ([`hide_secrets`]).
pub(crate) fn usage_error(args: Arguments<'_>) {
    eprintln!(
        "dlock: {}",
        clean(&plain(scrub(args.to_string())), MAX_LINE)
    );
}

/// `text` without the error numbers Rust's `io::Error` appends to the system's words ("No such
/// file or directory (os error 2)"): whichever library formatted an I/O error, the line says
/// what happened in words only. Applied once, to every line dlock prints on stderr.
pub(crate) fn plain(text: String) -> String {
    const MARK: &str = " (os error ";
    if !text.contains(MARK) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && after[digits..].starts_with(')') {
            out.push_str(&rest[..at]);
            rest = &after[digits + 1..];
        } else {
            out.push_str(&rest[..at + MARK.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// An I/O error in the system's words, without "(os error N)" and starting lower-case, to follow
/// a colon: "no such file or directory", "connection refused".
pub(crate) fn io_words(e: &std::io::Error) -> String {
    let text = plain(e.to_string());
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        // "No such file", but not "TLS" or "EOF".
        (Some(first), Some(second)) if first.is_uppercase() && !second.is_uppercase() => {
            first.to_lowercase().chain(text.chars().skip(1)).collect()
        }
        _ => text,
    }
}

/// A holder record's `since_ms` as a date; a value past the year 9999 (no real record has one)
/// is shown as the number it is.
pub(crate) fn since_text(ms: u64) -> String {
    const LAST_MS: u64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    match std::time::UNIX_EPOCH.checked_add(Duration::from_millis(ms)) {
        Some(t) if ms <= LAST_MS => humantime::format_rfc3339_seconds(t).to_string(),
        _ => format!("{ms} ms after 1970 (not a date)"),
    }
}

/// Whole seconds or milliseconds, for humans.
pub(crate) fn short_duration(d: Duration) -> String {
    if d >= Duration::from_secs(60) {
        let s = d.as_secs();
        if s >= 3600 {
            format!("{}h{:02}m", s / 3600, s / 60 % 60)
        } else {
            format!("{}m{:02}s", s / 60, s % 60)
        }
    } else if d >= Duration::from_secs(1) {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `dlock status` for humans.
/// `dlock status` without `--key`: one line per lock (key, mode, holders, since, waiters),
/// everything that came from a server escaped.
pub(crate) fn list_text(
    backend: &str,
    location: &str,
    locks: &[Status],
    last_runs: &[String],
) -> String {
    if locks.is_empty() {
        return format!("no lock held or waited for on {backend} ({location})\n");
    }
    let rows: Vec<[String; 6]> = locks
        .iter()
        .zip(last_runs.iter().chain(std::iter::repeat(&String::new())))
        .map(|(s, last)| {
            let mode = match (s.mode.map(Mode::name), s.limit) {
                (Some(m), Some(n)) => format!("{m} {n}"),
                (Some(m), None) => m.to_string(),
                (None, _) => "-".into(),
            };
            let holder = match s.holders.as_slice() {
                [] => "-".to_string(),
                [h] => h.short(),
                [h, rest @ ..] => format!("{} and {} more", h.short(), rest.len()),
            };
            let holder = if s.holders.iter().any(|h| h.held_back_ms.is_some()) {
                format!("{holder} (held back)")
            } else {
                holder
            };
            let since = s
                .holders
                .iter()
                .filter_map(Holder::held_for)
                .max()
                .map_or("-".into(), short_duration);
            let waiting = s.waiters.map_or("?".into(), |w| w.to_string());
            [
                clean(&s.key, MAX_FIELD),
                mode,
                holder,
                since,
                waiting,
                last.clone(),
            ]
        })
        .collect();
    let header = ["KEY", "MODE", "HOLDER", "FOR", "WAITING", "LAST RUN"].map(String::from);
    let widths: Vec<usize> = (0..6)
        .map(|i| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

pub(crate) fn status_text(s: &Status) -> String {
    let mut out = format!("{} on {} ({})\n", s.key, s.backend, s.location);
    if !s.held {
        out.push_str("  free\n");
    }
    match (s.mode.map(Mode::name), s.limit) {
        (Some("exclusive"), _) | (None, _) => {}
        (Some(m), Some(n)) => {
            out.push_str(&format!("  mode: {m} {n} ({} held)\n", s.holders.len()))
        }
        (Some(m), None) => out.push_str(&format!("  mode: {m} ({} holders)\n", s.holders.len())),
    }
    for h in &s.holders {
        out.push_str(&format!("  held by {}", h.short()));
        if let Some(d) = h.held_for() {
            out.push_str(&format!(" for {}", short_duration(d)));
        }
        if h.broken {
            out.push_str(" (broken: stopping its command)");
        }
        if h.held_back_ms.is_some() {
            out.push_str(" (held back)");
        }
        out.push('\n');
        if let Some(ms) = h.held_back_ms {
            out.push_str(&held_back_text(ms, s.server_up_s));
        }
        if let Some(c) = &h.command {
            out.push_str(&format!("    command: {}\n", clean(c, MAX_FIELD)));
        }
        if let Some(o) = &h.owner {
            out.push_str(&format!("    {}\n", owner_text(o)));
        }
        if let Some(r) = &h.reason {
            out.push_str(&format!("    reason: {}\n", clean(r, MAX_FIELD)));
        }
        if let Some(n) = &h.node {
            out.push_str(&format!("    node: {}\n", clean(n, MAX_FIELD)));
        }
        if let Some(ms) = h.since_ms {
            out.push_str(&format!("    since: {}\n", since_text(ms)));
        }
        match h.lease_left_ms {
            Some(ms) => out.push_str(&format!(
                "    lease left: {}\n",
                short_duration(Duration::from_millis(ms))
            )),
            None if s.backend == "file" => out.push_str("    lease: until the process exits\n"),
            None => {}
        }
        if let Some(t) = h.fencing_token {
            out.push_str(&format!("    fencing token: {t}\n"));
        }
        if let (Some(session), None) = (&h.session, &h.foreign) {
            out.push_str(&format!("    session: {}\n", clean(session, MAX_FIELD)));
        }
    }
    if let Some(w) = s.waiters {
        out.push_str(&format!("  waiting: {w}\n"));
    }
    for (i, w) in s.queue.iter().enumerate() {
        out.push_str(&format!("    {}. {}", i + 1, w.short()));
        if let Some(d) = w.held_for() {
            out.push_str(&format!(", waiting {}", short_duration(d)));
        }
        if let (Some(session), None) = (&w.session, &w.foreign) {
            out.push_str(&format!(", session {}", clean(session, MAX_FIELD)));
        }
        out.push('\n');
    }
    for n in &s.notes {
        out.push_str(&format!("  note: {}\n", clean(n, MAX_LINE)));
    }
    out
}

/// The line under a held-back holder: "    held back: 29s more before its command starts (the
/// server started 2s ago; if it restarted, a holder from before may still run)".
fn held_back_text(ms: u64, up: Option<u64>) -> String {
    // Whole seconds, rounded up: never shorter than the run's own count.
    let left = short_duration(Duration::from_secs(ms.div_ceil(1000)));
    let started = match up {
        Some(0) => "the server started less than a second ago; ".to_string(),
        Some(s) => format!(
            "the server started {} ago; ",
            short_duration(Duration::from_secs(s))
        ),
        None => String::new(),
    };
    format!(
        "    held back: {left} more before its command starts ({started}if it restarted, a \
         holder from before may still run)\n"
    )
}

/// How `status` shows an acquire-held lock: "held by dlock acquire for pid 4200 (bash
/// deploy.sh), at most 10m".
fn owner_text(o: &crate::model::OwnerRecord) -> String {
    let mut text = String::from("held by dlock acquire for ");
    match o.pid {
        Some(pid) => text.push_str(&format!("pid {pid}")),
        None => text.push_str("no owner process"),
    }
    if let Some(c) = &o.command {
        text.push_str(&format!(" ({})", clean(c, MAX_FIELD)));
    }
    if let Some(ms) = o.max_hold_ms {
        text.push_str(&format!(
            ", at most {}",
            short_duration(Duration::from_millis(ms))
        ));
    }
    text
}

/// `dlock break`'s report of what it removed.
/// What `dlock break` did: "{verb} 'KEY' on BACKEND (held by …){then}", or that nothing was
/// held. `then` is the command's own words (when the lock is free), never a server's.
pub(crate) fn broke_text(s: &Status, verb: &str, then: &str) -> String {
    if !s.held {
        return format!(
            "'{}' on {} was not held; nothing to break\n",
            s.key, s.backend
        );
    }
    let holders: Vec<String> = s
        .holders
        .iter()
        .map(|h| {
            let mut d = h.short();
            if let Some(c) = &h.command {
                d.push_str(&format!(" running '{}'", clean(c, MAX_FIELD)));
            }
            d
        })
        .collect();
    format!(
        "{verb} '{}' on {} (held by {}){then}\n",
        s.key,
        s.backend,
        holders.join(", ")
    )
}

/// Prints a usage error (exit 2) and returns its exit code.
pub(crate) fn usage(e: &crate::exit::Usage) -> u8 {
    usage_error(format_args!("{e}"));
    crate::exit::USAGE
}

/// Prints a backend failure as "dlock: BACKEND: cause" and returns its exit code.
pub(crate) fn fail(backend: &str, err: &anyhow::Error, conflict_code: u8) -> u8 {
    let code = crate::exit::code_for(err, conflict_code);
    if code == crate::exit::USAGE {
        usage_error(format_args!("{err:#}"));
    } else {
        error(format_args!("{backend}: {err:#}"));
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_numbers_are_dropped_and_io_errors_are_words() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(io_words(&e), "no such file or directory");
        assert_eq!(
            plain(format!(
                "cannot create /x: {e}; and (os error 111) (os error x)"
            )),
            "cannot create /x: No such file or directory; and (os error x)"
        );
        assert_eq!(
            plain("a: Connection refused (os error 111), b (os error 2)".into()),
            "a: Connection refused, b"
        );
        assert_eq!(
            io_words(&std::io::Error::other("TLS says no")),
            "TLS says no"
        );
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let hostile = "a\x1b]0;pwned\x07\x1b[2J\r\nFAKE: held by nobody\u{202e}\u{9b}z";
        let c = clean(hostile, 100);
        assert!(!c.chars().any(|c| c.is_control()), "{c:?}");
        assert_eq!(
            c,
            "a\\x1b]0;pwned\\x07\\x1b[2J\\r\\nFAKE: held by nobody\\u{202e}\\x9bz"
        );
        assert_eq!(clean(&"é".repeat(10), 4), "éééé…");
        assert_eq!(
            clean("a\u{2028}b\u{2029}c\u{ad}d\u{e0041}", 100),
            "a\\u{2028}b\\u{2029}c\\u{ad}d\\u{e0041}"
        );
        assert_eq!(clean(&c, 100), c, "escaping twice changes nothing");
    }

    /// Any holder record a server could hand back: every field present or not, any text.
    fn any_holder() -> impl proptest::strategy::Strategy<Value = Holder> {
        use proptest::prelude::*;
        let text = || proptest::option::of("\\PC{0,40}|.{0,40}");
        (
            (
                text(),
                text(),
                any::<Option<u32>>(),
                any::<Option<u64>>(),
                text(),
            ),
            (
                any::<Option<u64>>(),
                any::<Option<u64>>(),
                any::<Option<u64>>(),
                text(),
            ),
            (proptest::option::of(0u32..5), text(), text()),
        )
            .prop_map(|(a, b, c)| Holder {
                record: crate::model::Record {
                    key: a.0,
                    host: a.1,
                    pid: a.2,
                    pidns: a.3,
                    command: a.4,
                    since_ms: b.0,
                    mode: c.0.map(|n| match n {
                        0 => Mode::Exclusive,
                        1 => Mode::Shared,
                        n => Mode::Limit(n),
                    }),
                    ..Default::default()
                },
                fencing_token: b.1,
                lease_left_ms: b.2,
                session: b.3,
                foreign: c.1,
                node: c.2,
                broken: b.1.is_some_and(|t| t % 2 == 0),
                ..Default::default()
            })
    }

    proptest::proptest! {
        /// Any holder records, shown by `status`, `status` without a key and `break`: no panic,
        /// and no control character but the line breaks of the text itself.
        #[test]
        fn any_holder_record_is_shown_safely(
            holders in proptest::collection::vec(any_holder(), 0..4),
            queue in proptest::collection::vec(any_holder(), 0..3),
            waiters: Option<u64>,
        ) {
            let key = crate::model::Key::new("k").unwrap();
            let mut s = Status::new(&key, crate::model::BackendKind::Redis, "h:1".into());
            s.held = !holders.is_empty();
            s.holders = holders;
            s.queue = queue;
            s.waiters = waiters;
            let s = s.with_mode();
            let list = list_text("redis", "h:1", std::slice::from_ref(&s), &[]);
            for text in [status_text(&s), broke_text(&s, "broke", ""), list] {
                proptest::prop_assert!(
                    !text.chars().any(|c| (c.is_control() && c != '\n') || invisible(c)),
                    "{:?}", text
                );
            }
        }

        /// A record read back from a server is a record or an error, never a panic; a record
        /// dlock writes reads back the same; what only a server may say of a holder (a token, a
        /// session, "not dlock") is never read from a record.
        #[test]
        fn holder_records_read_back(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            h in any_holder(),
        ) {
            let _ = crate::backend::read_record(&bytes);
            let written = serde_json::to_vec(&h.record).unwrap();
            proptest::prop_assert_eq!(
                crate::backend::read_record(&written).map(|r| r.record),
                Some(h.record.clone())
            );
            let forged = serde_json::to_vec(&h).unwrap();
            let read = crate::backend::read_record(&forged).unwrap();
            proptest::prop_assert_eq!(read.foreign, None);
            proptest::prop_assert_eq!(read.fencing_token, None);
            proptest::prop_assert_eq!(read.session, None);
        }
    }

    proptest::proptest! {
        /// Whatever a server sends, what reaches the terminal has no control or invisible
        /// character, is at most `max` characters and an ellipsis, and is cleaned once for all.
        #[test]
        fn nothing_cleaned_lays_out_a_terminal(text in "\\PC*|.*", max in 0usize..64) {
            let c = clean(&text, max);
            proptest::prop_assert!(!c.chars().any(|c| c.is_control() || invisible(c)), "{:?}", c);
            proptest::prop_assert_eq!(clean(&c, usize::MAX), c.clone());
        }
    }

    #[test]
    fn any_since_value_is_shown() {
        assert_eq!(since_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(since_text(253_402_300_799_999), "9999-12-31T23:59:59Z");
        assert!(since_text(253_402_300_800_000).contains("not a date"));
        assert!(since_text(u64::MAX).contains("not a date"));
        let h = Holder::from(crate::model::Record {
            since_ms: Some(u64::MAX),
            host: Some("h\x1b[2J".into()),
            command: Some("x\ny".into()),
            ..crate::model::Record::default()
        });
        let s = Status {
            held: true,
            holders: vec![h],
            ..Status::new(
                &crate::model::Key::new("k").unwrap(),
                crate::model::BackendKind::Redis,
                "here".into(),
            )
        };
        let text = status_text(&s);
        assert!(!text.contains('\x1b') && text.contains("x\\ny"), "{text}");
        assert_eq!(text.lines().count(), 4, "{text}");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(short_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(short_duration(Duration::from_secs(12)), "12s");
        assert_eq!(short_duration(Duration::from_secs(125)), "2m05s");
        assert_eq!(short_duration(Duration::from_secs(3725)), "1h02m");
    }
}
