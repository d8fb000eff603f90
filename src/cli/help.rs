//! The texts of `--help` and the man pages beyond the options: exit statuses, environment,
//! examples, and the tables they are set in.

use crate::model::BackendKind;

/// Exit statuses, for `--help` and the man page (docs/design.md, "Exit codes").
pub(crate) const EXIT_STATUS: &[(&str, &str)] = &[
    ("child's code", "the command ran and exited with this code"),
    (
        "128+N",
        "the command was killed by signal N, or dlock was stopped by signal N",
    ),
    ("2", "usage error: bad flag, duration, key or URL"),
    (
        "69",
        "the backend was unavailable or failed before the command started",
    ),
    (
        "75",
        "lock not acquired: busy with --no-wait, --wait ran out, or skipped by --once-per (change with -E)",
    ),
    (
        "78",
        "no lock can be sound there (a pooler in transaction mode, a multi-primary cluster): refused before the command ran; `dlock doctor` says why",
    ),
    (
        "79",
        "the lock was lost while the command ran; the command was terminated",
    ),
    ("126", "the command was found but could not be executed"),
    ("127", "the command was not found"),
];

/// `dlock acquire`'s exit statuses.
pub(crate) const ACQUIRE_EXIT_STATUS: &[(&str, &str)] = &[
    (
        "0",
        "the lock is held; the handle and variables are printed",
    ),
    ("2", "usage error: bad flag, duration, key, URL or owner"),
    ("69", "the backend was unavailable or failed"),
    (
        "75",
        "lock not acquired: busy with --no-wait, --wait ran out, or skipped by --once-per (change with -E)",
    ),
    (
        "78",
        "no lock can be sound there (a pooler in transaction mode, a multi-primary cluster); `dlock doctor` says why",
    ),
    ("128+N", "interrupted by signal N while waiting"),
];

/// `dlock release`'s exit statuses.
pub(crate) const RELEASE_EXIT_STATUS: &[(&str, &str)] = &[
    (
        "0",
        "the lock was held from acquire to release, and is given back",
    ),
    (
        "2",
        "no handle, or a malformed, another user's or already released one",
    ),
    (
        "69",
        "the holder process could not be asked (its socket failed, or no reply came)",
    ),
    (
        "79",
        "the lock was lost or given up on the way: lost, --max-hold, the owner exited, or the holder process was killed",
    ),
];

/// Environment variables dlock reads or sets, for `--help` and the man page.
pub(crate) fn environment() -> Vec<(&'static str, String)> {
    let backends: Vec<&str> = BackendKind::all().iter().map(|k| k.name()).collect();
    let backend_set = format!("set for the command: {}", backends.join(", "));
    ENVIRONMENT
        .iter()
        .map(|&(name, text)| match name {
            BACKEND_SET => (name, backend_set.clone()),
            _ => (name, text.to_string()),
        })
        .collect()
}

/// The row of [`ENVIRONMENT`] whose text lists the backends (made by [`environment`]).
const BACKEND_SET: &str = "DLOCK_BACKEND (in the command)";

const ENVIRONMENT: &[(&str, &str)] = &[
    ("DLOCK_BACKEND", "default for --backend"),
    (
        "DLOCK_URL",
        "default for --url (several, space-separated, for Redlock); keep credentials here rather than on the command line, where ps shows them",
    ),
    ("DLOCK_KEY", "set for the command: the key it runs under"),
    (
        BACKEND_SET,
        "set for the command: the backend's name (see --backend)",
    ),
    (
        "DLOCK_FENCING_TOKEN",
        "set for the command: a number greater than every token handed out before for this key (the first --key)",
    ),
    (
        "DLOCK_KEYS, DLOCK_FENCING_TOKENS",
        "set for the command: every key, and its token, one per line, in the order given",
    ),
    (
        "DLOCK_HELD",
        "set for the command: the locks it runs under, so that a nested dlock run on the same lock does not wait for itself",
    ),
    (
        crate::history::NO_HISTORY_ENV,
        "any value but 0, false, no, off or empty: as --no-history, leave no record of runs in the history (except runs with --once-per, which needs it)",
    ),
    (
        "DLOCK_HANDLE, DLOCK_HOLDER_PID",
        "printed by dlock acquire (with the variables above): what dlock release gives back, and the holder process",
    ),
];

/// Examples, for `--help` and the man page.
pub(crate) const EXAMPLES: &[(&str, &str)] = &[
    (
        "dlock run --key nightly-report -- ./report.sh",
        "run report.sh unless another run on this host holds 'nightly-report' (waits for it)",
    ),
    (
        "dlock run -k deploy --wait 10m -- ./deploy.sh",
        "wait at most ten minutes for the lock, then exit 75",
    ),
    (
        "dlock run -k backup --no-wait -E 0 -- ./backup.sh",
        "skip quietly (exit 0) when a backup is running",
    ),
    (
        "dlock run -k schema --shared -- ./read-report.sh",
        "many readers at once; a run without --shared waits for them all and is not starved",
    ),
    (
        "dlock run -k gpu --limit 4 -- ./train.sh",
        "at most four runs of train.sh at once",
    ),
    (
        "dlock run -k db --key cache -- ./migrate.sh",
        "hold both locks (taken in one order, so two such runs never deadlock)",
    ),
    (
        "eval \"$(dlock acquire -k deploy --reason v1.4)\"; ./migrate.sh; dlock release",
        "hold 'deploy' across several commands of a script; release exits 79 if it was lost",
    ),
    (
        "dlock bench --backend redis --url redis://10.0.0.5 --clients 16",
        "how fast this Redis hands a lock from one client to the next",
    ),
    (
        "dlock status -k deploy --json",
        "who holds 'deploy', as JSON",
    ),
    (
        "dlock break -k deploy",
        "remove a stale lock; its holder notices and stops its command",
    ),
];

/// The width `--help`'s tables fit in: a pager or an 80-column terminal shows every line whole
/// (clap wraps only lines longer than the terminal, and then mid-phrase, without the indent).
pub(super) const HELP_WIDTH: usize = 80;
/// A first column wider than this puts each description under its term instead of beside it.
const BESIDE_AT_MOST: usize = 16;

/// A titled table for `--help`, every line at most [`HELP_WIDTH`] columns: each description
/// wrapped beside its term (with a hanging indent) when the terms are short, else under it.
pub(super) fn table<A: AsRef<str>, B: AsRef<str>>(title: &str, rows: &[(A, B)]) -> String {
    let width = rows
        .iter()
        .map(|(a, _)| a.as_ref().chars().count())
        .max()
        .unwrap_or(0);
    let mut s = format!("{title}:\n");
    for (a, b) in rows {
        let (a, b) = (a.as_ref(), b.as_ref());
        if width <= BESIDE_AT_MOST {
            let indent = 2 + width + 2;
            for (i, line) in wrap(b, HELP_WIDTH - indent).iter().enumerate() {
                let term = if i == 0 { a } else { "" };
                s.push_str(&format!("  {term:width$}  {line}\n"));
            }
        } else {
            s.push_str(&format!("  {a}\n"));
            for line in wrap(b, HELP_WIDTH - 6) {
                s.push_str(&format!("      {line}\n"));
            }
        }
    }
    s
}

/// `text` in lines of at most `width` columns, broken between words (a longer word stands
/// alone on its line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

/// `dlock -h`'s line.
pub(super) fn about() -> String {
    let names: Vec<&str> = BackendKind::all()
        .iter()
        .map(|k| match k {
            BackendKind::File => "file",
            _ => k.title(),
        })
        .collect();
    let (last, rest) = names.split_last().expect("backends");
    format!(
        "Run a command while holding a named lock ({} or {last})",
        rest.join(", ")
    )
}

/// `dlock --help`'s opening.
pub(super) fn long_about() -> String {
    format!(
        "Run a command while holding a named lock on {}. The lease is renewed in the \
         background; if it is lost, the command is terminated before anyone else can take the \
         lock, and dlock exits 79.",
        BackendKind::prose(" (the default)")
    )
}

/// The text after `dlock --help`: exit statuses, environment and examples.
pub(crate) fn after_long_help() -> String {
    [
        table("Exit status", EXIT_STATUS),
        table("Environment", &environment()),
        table("Examples", EXAMPLES),
    ]
    .join("\n")
}

/// `dlock doctor`'s exit statuses.
pub(crate) const CHECK_EXIT_STATUS: &[(&str, &str)] = &[
    (
        "0",
        "OK: every KEY's newest run started within --max-age (and --warn-age) and ended well, or runs",
    ),
    (
        "1",
        "WARNING: a newest run started longer ago than --warn-age",
    ),
    (
        "2",
        "CRITICAL: a KEY never ran, its newest run started longer ago than --max-age, or ended \
         badly (non-zero exit, signal, lost lock, no end recorded and no longer held)",
    ),
    (
        "3",
        "UNKNOWN: the backend could not be asked, a history could not be read, or a usage error",
    ),
];

pub(crate) const DOCTOR_EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "every check passed (or could not be made)"),
    ("1", "something weakens the lock (a warn line says what)"),
    ("2", "usage error: bad flag or URL"),
    ("69", "the server could not be asked"),
    (
        "78",
        "no lock can be sound there (an unsafe line says what)",
    ),
];
