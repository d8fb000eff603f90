//! From clap's types to a checked configuration: the key is valid, the backend is chosen and
//! agrees with the URLs, durations are sane. Nothing below this module sees clap, and nothing
//! below it has to validate user input again (backends still parse their own URL forms).

use std::ffi::OsString;
use std::time::Duration;

use crate::cli;
use crate::exit::Usage;
use crate::model::{BackendKind, Key, Mode, Verbosity};

mod secrets;

pub(crate) use secrets::{hide_credentials, redact, secrets};

/// Decodes `%XX` escapes (as in a URL's path or credentials); `None` for a malformed escape.
pub(crate) fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Shortest `--ttl`: renewing every ttl/3 must leave time for a round trip.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(300);
/// Longest `--ttl` and `--kill-grace`: beyond a week they are typos, and servers cap them anyway.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Which backend, and where. URLs may hold credentials: print them only through [`redact`].
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The chosen backend.
    pub kind: BackendKind,
    /// The URLs as given (possibly none: the backend's default).
    pub urls: Vec<String>,
}

impl Target {
    pub(crate) fn from_args(args: &cli::BackendArgs) -> Result<Target, Usage> {
        let mut schemes = Vec::new();
        // clap splits --url and DLOCK_URL at spaces (several URLs for Redlock): a password with
        // a raw space in it is only whole in the joined text.
        crate::report::hide_secrets(&secrets(&args.urls.join(" ")));
        for url in &args.urls {
            // Whatever a parser later says about this URL, no piece of its password is printed.
            crate::report::hide_secrets(&secrets(url));
            let scheme = url.split_once("://").map(|(s, _)| s).or_else(|| {
                // `unix:/path` and `file:/path` have no authority part.
                url.split_once(':')
                    .map(|(s, _)| s)
                    .filter(|s| !s.is_empty())
            });
            let kind = scheme.and_then(BackendKind::from_scheme).ok_or_else(|| {
                Usage(format!(
                    "unsupported URL '{}': expected one of {}",
                    redact(url),
                    BackendKind::all_schemes()
                ))
            })?;
            schemes.push(kind);
        }
        let kind = match (args.backend, schemes.first()) {
            (Some(b), _) => b,
            (None, Some(k)) => *k,
            (None, None) => BackendKind::File,
        };
        if let Some((url, k)) = args.urls.iter().zip(&schemes).find(|(_, k)| **k != kind) {
            return Err(Usage(format!(
                "URL '{}' is a {} URL, but the backend is {}",
                redact(url),
                k.name(),
                kind.name()
            )));
        }
        Ok(Target {
            kind,
            urls: args.urls.iter().map(|u| absolute_query_paths(u)).collect(),
        })
    }
}

/// The query parameters that name a file (a CA certificate), relative to the directory dlock
/// runs in.
const PATH_PARAMS: &[&str] = &["sslrootcert", "ssl-ca", "ssl_ca", "sslca"];

/// `url` with the files its query names ([`PATH_PARAMS`]) made absolute against the current
/// directory: the acquire holder works in `/` once it holds the lock, and opens the backend
/// again from there (a lost lease's end is recorded on a new connection). Anything else, and
/// a URL without such a parameter, is left as it is.
fn absolute_query_paths(url: &str) -> String {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let Some((k, v)) = pair
                .split_once('=')
                .filter(|(k, _)| PATH_PARAMS.contains(k))
            else {
                return pair.to_string();
            };
            let Some(bytes) = percent_decode(v) else {
                return pair.to_string();
            };
            let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&bytes));
            if bytes.is_empty() || path.is_absolute() {
                return pair.to_string();
            }
            match std::path::absolute(path) {
                Ok(abs) => {
                    let mut v = String::new();
                    for b in abs.into_os_string().into_vec() {
                        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
                            v.push(char::from(b));
                        } else {
                            v.push_str(&format!("%{b:02X}"));
                        }
                    }
                    format!("{k}={v}")
                }
                Err(_) => pair.to_string(),
            }
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// How long to wait for a busy lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Try once (`--no-wait`, or `--wait 0`).
    No,
    /// Wait at most this long.
    For(Duration),
    /// Wait until acquired or interrupted (the default).
    Forever,
}

impl From<&cli::OutputArgs> for Verbosity {
    fn from(o: &cli::OutputArgs) -> Self {
        match (o.quiet, o.verbose) {
            (true, _) => Verbosity::Quiet,
            (false, 0) => Verbosity::Normal,
            (false, _) => Verbosity::Verbose,
        }
    }
}

/// The longest `--reason` kept: longer text is cut (it is stored beside the lock on every
/// backend and shown in messages).
pub(crate) const MAX_REASON: usize = 200;

/// A checked lock request, shared by `dlock run` and `dlock acquire`.
#[derive(Clone, Debug)]
pub(crate) struct LockConfig {
    /// Where the lock lives.
    pub target: Target,
    /// The locks' names, as given (at least one, no repeats).
    pub keys: Vec<Key>,
    /// Exclusive, shared or a semaphore slot.
    pub mode: Mode,
    /// Lease length on the server.
    pub ttl: Duration,
    /// How long to wait.
    pub wait: Wait,
    /// Exit code when the lock is not acquired.
    pub conflict_code: u8,
    /// SIGTERM-to-SIGKILL delay.
    pub kill_grace: Duration,
    /// `--reason`, cut to [`MAX_REASON`] characters.
    pub reason: Option<String>,
    /// `--once-per`: skip when a run of the key started less than this ago.
    pub once_per: Option<Duration>,
    /// Whether runs are recorded in the key's history (not with `--no-history`, and only for
    /// exclusive locks: see docs/history.md).
    pub history: bool,
    /// Diagnostics level.
    pub verbosity: Verbosity,
    /// Whether the backend is the default one, chosen by nothing the user gave (no
    /// `--backend`, no URL, neither in the environment): the file backend, one host's.
    pub implicit_backend: bool,
}

impl LockConfig {
    /// Validates the lock options.
    pub(crate) fn from_args(
        backend: &cli::BackendArgs,
        a: &cli::LockArgs,
        output: &cli::OutputArgs,
    ) -> Result<LockConfig, Usage> {
        if a.ttl < MIN_TTL {
            return Err(Usage(format!(
                "--ttl {} is too short; the minimum is {}",
                humantime::format_duration(a.ttl),
                humantime::format_duration(MIN_TTL)
            )));
        }
        for (flag, d) in [("--ttl", a.ttl), ("--kill-grace", a.kill_grace)] {
            check_max(flag, d)?;
        }
        let wait = match (a.no_wait, a.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) if d.is_zero() => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        let mut keys: Vec<Key> = Vec::with_capacity(a.key.len());
        for k in &a.key {
            let key = Key::new(k)?;
            if keys.contains(&key) {
                return Err(Usage(format!("--key '{key}' is given twice")));
            }
            keys.push(key);
        }
        let mode = match (a.shared, a.limit) {
            (true, _) => Mode::Shared,
            (false, 0 | 1) => Mode::Exclusive,
            (false, n) => Mode::Limit(n),
        };
        let reason = a
            .reason
            .as_deref()
            .filter(|r| !r.trim().is_empty())
            .map(|r| r.chars().take(MAX_REASON).collect());
        if let Some(d) = a.once_per {
            check_max("--once-per", d)?;
            if d.is_zero() {
                return Err(Usage("--once-per must be longer than 0s".into()));
            }
            if mode != Mode::Exclusive {
                return Err(Usage(format!(
                    "--once-per needs an exclusive lock, not {}: only one run at a time can judge whether another started",
                    mode.describe()
                )));
            }
            if keys.len() > 1 {
                return Err(Usage(
                    "--once-per takes one --key: which key's runs would count?".into(),
                ));
            }
            if a.no_history {
                return Err(Usage(
                    "--once-per needs the run history, which --no-history switches off".into(),
                ));
            }
        }
        Ok(LockConfig {
            target: Target::from_args(backend)?,
            implicit_backend: backend.backend.is_none() && backend.urls.is_empty(),
            once_per: a.once_per,
            // The variable is a default for every run; --once-per on a command line asks for
            // the history explicitly (a global DLOCK_NO_HISTORY=1 must not make every cron
            // line with --once-per fail).
            history: !a.no_history
                && (a.once_per.is_some() || !history_off_by_env())
                && mode == Mode::Exclusive,
            keys,
            mode,
            ttl: a.ttl,
            wait,
            conflict_code: a.conflict_exit_code,
            kill_grace: a.kill_grace,
            reason,
            verbosity: Verbosity::from(output),
        })
    }

    /// The keys as one text for messages: "a, b".
    pub(crate) fn keys_text(&self) -> String {
        let keys: Vec<&str> = self.keys.iter().map(|k| k.as_str()).collect();
        keys.join(", ")
    }
}

fn check_max(flag: &str, d: Duration) -> Result<(), Usage> {
    if d > MAX_DURATION {
        return Err(Usage(format!(
            "{flag} {} is too long; the maximum is {}",
            humantime::format_duration(d),
            humantime::format_duration(MAX_DURATION)
        )));
    }
    Ok(())
}

/// Whether `DLOCK_NO_HISTORY` switches history off: set to anything but empty, `0`, `false`,
/// `no` or `off` (any case).
fn history_off_by_env() -> bool {
    std::env::var(crate::history::NO_HISTORY_ENV).is_ok_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off"
        )
    })
}

/// A checked `dlock run`.
#[derive(Clone, Debug)]
pub(crate) struct RunConfig {
    /// The lock.
    pub lock: LockConfig,
    /// The command and its arguments; never empty.
    pub command: Vec<OsString>,
}

impl RunConfig {
    /// Validates `dlock run`'s arguments.
    pub(crate) fn from_args(a: cli::RunArgs) -> Result<RunConfig, Usage> {
        let lock = LockConfig::from_args(&a.backend, &a.lock, &a.output)?;
        if a.command.first().is_none_or(|c| c.is_empty()) {
            return Err(Usage("COMMAND must not be empty".into()));
        }
        Ok(RunConfig {
            lock,
            command: a.command,
        })
    }
}

/// For whom `dlock acquire` holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerChoice {
    /// The process that ran `dlock acquire` (its parent).
    Caller,
    /// The process with this id.
    Pid(u32),
    /// Nobody: the lock is given up after `--max-hold`.
    Nobody,
}

/// A checked `dlock acquire`.
#[derive(Clone, Debug)]
pub(crate) struct AcquireConfig {
    /// The lock.
    pub lock: LockConfig,
    /// How to print the result.
    pub format: cli::Format,
    /// Whom the lock is held for.
    pub owner: OwnerChoice,
    /// Give the lock up after this long.
    pub max_hold: Option<Duration>,
}

impl AcquireConfig {
    /// Validates `dlock acquire`'s arguments.
    pub(crate) fn from_args(a: &cli::AcquireArgs) -> Result<AcquireConfig, Usage> {
        let lock = LockConfig::from_args(&a.backend, &a.lock, &a.output)?;
        if lock.conflict_code == 0 {
            return Err(Usage(
                "acquire -E 0 would make a busy lock look taken to `eval`, and the script would \
                 run its section without it; keep the default (75) and skip with \
                 `|| exit 0` after the eval"
                    .into(),
            ));
        }
        let owner = match a.owner.as_deref().map(str::trim) {
            None => OwnerChoice::Caller,
            Some("none") => OwnerChoice::Nobody,
            Some(text) => match text.parse::<u32>() {
                Ok(pid) if pid <= i32::MAX as u32 => OwnerChoice::Pid(pid),
                _ => {
                    return Err(Usage(format!(
                        "--owner '{}' is neither a process id nor 'none'",
                        crate::report::clean(text, 40)
                    )));
                }
            },
        };
        if let Some(d) = a.max_hold {
            check_max("--max-hold", d)?;
            if d.is_zero() {
                return Err(Usage("--max-hold must be longer than 0".into()));
            }
        }
        if owner == OwnerChoice::Nobody && a.max_hold.is_none() {
            return Err(Usage(
                "--owner none needs --max-hold DURATION: with nobody to stop, the lock must end by itself"
                    .into(),
            ));
        }
        Ok(AcquireConfig {
            lock,
            format: a.format,
            owner,
            max_hold: a.max_hold,
        })
    }
}

/// How long each `dlock bench` phase runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Amount {
    /// For this long.
    For(Duration),
    /// This many acquisitions.
    Ops(u64),
}

/// A checked `dlock check`: the backend, 1 to [`MAX_CHECKED`] keys, the ages.
#[derive(Clone, Debug)]
pub(crate) struct CheckConfig {
    pub target: Target,
    pub keys: Vec<Key>,
    /// CRITICAL past this age.
    pub max_age: Duration,
    /// WARNING past this age (at most `max_age`).
    pub warn_age: Option<Duration>,
    pub verbosity: Verbosity,
}

/// The most keys one `dlock check` judges.
pub(crate) const MAX_CHECKED: usize = 100;
/// The most keys one `dlock metrics` reports (named, or listed from the history: as many as a
/// history read's events, the cap the SQL backends' listings share).
pub(crate) const MAX_REPORTED: usize = crate::history::MAX_EVENTS;

impl CheckConfig {
    /// Validates `dlock check`'s arguments.
    pub(crate) fn from_args(a: &cli::CheckArgs) -> Result<CheckConfig, Usage> {
        if let Some(w) = a.warn_age.filter(|w| *w > a.max_age) {
            return Err(Usage(format!(
                "--warn-age {} is longer than --max-age {}: it could never warn",
                humantime::format_duration(w),
                humantime::format_duration(a.max_age)
            )));
        }
        Ok(CheckConfig {
            target: Target::from_args(&a.backend)?,
            keys: keys_of(&a.keys, MAX_CHECKED)?,
            max_age: a.max_age,
            warn_age: a.warn_age,
            verbosity: Verbosity::from(&a.output),
        })
    }
}

/// A checked `dlock metrics`: the backend, the keys named (none: every key with a history),
/// the file to write.
#[derive(Clone, Debug)]
pub(crate) struct MetricsConfig {
    pub target: Target,
    pub keys: Vec<Key>,
    pub write: Option<std::path::PathBuf>,
    pub verbosity: Verbosity,
}

impl MetricsConfig {
    /// Validates `dlock metrics`'s arguments.
    pub(crate) fn from_args(a: &cli::MetricsArgs) -> Result<MetricsConfig, Usage> {
        if let Some(w) = a.write.as_ref().filter(|w| w.file_name().is_none()) {
            return Err(Usage(format!("--write {}: not a file name", w.display())));
        }
        Ok(MetricsConfig {
            target: Target::from_args(&a.backend)?,
            keys: keys_of(&a.keys, MAX_REPORTED)?,
            write: a.write.clone(),
            verbosity: Verbosity::from(&a.output),
        })
    }
}

/// `-k` values as keys, at most `most`, each once.
fn keys_of(given: &[String], most: usize) -> Result<Vec<Key>, Usage> {
    if given.len() > most {
        return Err(Usage(format!(
            "at most {most} --key at once ({} given)",
            given.len()
        )));
    }
    let mut keys: Vec<Key> = Vec::with_capacity(given.len());
    for k in given {
        let key = Key::new(k)?;
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    Ok(keys)
}

/// A checked `dlock bench`.
#[derive(Clone, Debug)]
pub(crate) struct BenchConfig {
    /// Where the locks live.
    pub target: Target,
    /// Contending clients in the hand-off phase.
    pub clients: u32,
    /// How long each phase runs.
    pub amount: Amount,
    /// Lease length.
    pub ttl: Duration,
    /// JSON output.
    pub json: bool,
    /// Diagnostics level.
    pub verbosity: Verbosity,
}

impl BenchConfig {
    /// Validates `dlock bench`'s arguments.
    pub(crate) fn from_args(a: &cli::BenchArgs) -> Result<BenchConfig, Usage> {
        if a.ttl < MIN_TTL || a.ttl > MAX_DURATION {
            return Err(Usage(format!(
                "--ttl {} is out of range ({} to {})",
                humantime::format_duration(a.ttl),
                humantime::format_duration(MIN_TTL),
                humantime::format_duration(MAX_DURATION)
            )));
        }
        let amount = match (a.ops, a.duration) {
            (Some(n), _) => Amount::Ops(n),
            (None, Some(d)) if d.is_zero() || d > Duration::from_secs(3600) => {
                return Err(Usage(
                    "--duration must be more than 0 and at most 1h".into(),
                ));
            }
            (None, Some(d)) => Amount::For(d),
            (None, None) => Amount::For(Duration::from_secs(3)),
        };
        Ok(BenchConfig {
            target: Target::from_args(&a.backend)?,
            clients: a.clients,
            amount,
            ttl: a.ttl,
            json: a.json,
            verbosity: Verbosity::from(&a.output),
        })
    }
}

/// A checked `dlock status` or `dlock break`.
#[derive(Clone, Debug)]
pub(crate) struct KeyConfig {
    /// Where the lock lives.
    pub target: Target,
    /// The lock's name.
    pub key: Key,
    /// Diagnostics level.
    pub verbosity: Verbosity,
}

impl KeyConfig {
    /// Validates the arguments shared by `status` and `break`.
    pub(crate) fn new(
        backend: &cli::BackendArgs,
        key: &str,
        output: &cli::OutputArgs,
    ) -> Result<Self, Usage> {
        Ok(KeyConfig {
            target: Target::from_args(backend)?,
            key: Key::new(key)?,
            verbosity: Verbosity::from(output),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts that cannot be made from [`BackendKind`] name every backend.
    #[test]
    fn every_text_that_lists_the_backends_names_them_all() {
        let readme = include_str!("../../README.md");
        let opening = readme.split("\n\n").nth(1).unwrap_or_default();
        let texts = [
            (
                "Cargo.toml's description",
                env!("CARGO_PKG_DESCRIPTION").to_string(),
            ),
            (
                "src/lib.rs",
                include_str!("../lib.rs")
                    .lines()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            ("README.md's opening", opening.to_string()),
        ];
        for k in BackendKind::all() {
            for (what, text) in &texts {
                let text = text.replace("\n", " ").replace("//! ", "");
                assert!(
                    text.contains(k.title()),
                    "{what} does not name {}: {text}",
                    k.title()
                );
            }
            assert_eq!(
                clap::ValueEnum::to_possible_value(k).unwrap().get_name(),
                k.name()
            );
            for scheme in k.schemes() {
                assert_eq!(BackendKind::from_scheme(scheme), Some(*k));
                assert!(BackendKind::all_schemes().contains(scheme));
            }
        }
        assert_eq!(
            BackendKind::prose(" (the default)"),
            "a local file (the default), Redis, ZooKeeper, MySQL/MariaDB, PostgreSQL, etcd or S3"
        );
    }

    #[test]
    fn keys_follow_the_spec() {
        assert!(Key::new("a").is_ok());
        assert!(Key::new("../etc/passwd with spaces/ünïcode").is_ok());
        assert!(Key::new(&"x".repeat(256)).is_ok());
        assert!(Key::new(&"x".repeat(257)).is_err());
        assert!(Key::new("").is_err());
        assert!(Key::new("a\nb").is_err());
        assert!(Key::new("a\u{7f}").is_err());
    }

    #[test]
    fn relative_ca_files_are_made_absolute() {
        let here = std::env::current_dir().unwrap();
        let here = here.to_str().unwrap();
        assert_eq!(
            absolute_query_paths("postgres://h/db?sslmode=verify-ca&sslrootcert=c%20a.pem&x=y"),
            format!("postgres://h/db?sslmode=verify-ca&sslrootcert={here}/c%20a.pem&x=y")
        );
        for same in [
            "mysql://h/db?ssl-mode=REQUIRED&ssl-ca=/etc/ca.pem",
            "redis://h:1",
            "postgres://h/db?sslrootcert=",
        ] {
            assert_eq!(absolute_query_paths(same), same);
        }
    }

    #[test]
    fn scheme_chooses_backend_and_must_agree() {
        let args = |b: Option<BackendKind>, urls: &[&str]| cli::BackendArgs {
            backend: b,
            urls: urls.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            Target::from_args(&args(None, &[])).unwrap().kind,
            BackendKind::File
        );
        let t = Target::from_args(&args(None, &["redis://h"])).unwrap();
        assert_eq!(t.kind, BackendKind::Redis);
        assert!(Target::from_args(&args(Some(BackendKind::Mysql), &["redis://h"])).is_err());
        assert!(Target::from_args(&args(None, &["http://h"])).is_err());
        let err = Target::from_args(&args(None, &["http://u:pw@h"])).unwrap_err();
        assert!(!err.0.contains("pw"), "{err}");
    }
}
