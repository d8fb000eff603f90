//! `dlock metrics`: the last runs and the locks in Prometheus' text exposition format
//! (docs/monitoring.md), on stdout or written atomically for node_exporter's textfile
//! collector.
//!
//! Each key's history is read as `dlock log` reads it (bounded by the history's caps), and its
//! status once. Every family has its HELP and TYPE lines and its samples together; every label
//! value is escaped ([`label_value`]); a host name from the server is [`clean`]ed and cut
//! first. The output is bounded: at most [`MAX_KEYS`] keys, a few lines each.

use std::io::Write;
use std::path::Path;

use crate::backend::{self, Backend};
use crate::config::MetricsConfig;
use crate::history::{MAX_RUNS, Run, merge, show};
use crate::model::{Key, Status};
use crate::report::clean;

use crate::config::MAX_REPORTED as MAX_KEYS;
/// The longest host name in a label, in characters.
const MAX_HOST: usize = 64;
/// The exit code of a `--write` that failed (sysexits' EX_CANTCREAT).
const CANNOT_WRITE: u8 = 73;

/// What one key contributes.
#[derive(Debug, Default)]
pub(crate) struct KeyMetrics {
    pub key: String,
    /// Runs in its history (0: never ran, or its history aged out).
    pub runs: usize,
    /// The newest run, if any.
    pub last: Option<Run>,
    /// Whether the newest run is running now (its process holds the lock).
    pub running: bool,
    pub held: bool,
    pub held_ms: Option<u64>,
    pub waiters: Option<u64>,
}

/// `dlock metrics [BACKEND] [-k KEY]… [--write FILE]`.
pub(crate) fn metrics(cfg: &MetricsConfig) -> u8 {
    crate::report::set_verbosity(cfg.verbosity);
    let (target, keys, write) = (&cfg.target, &cfg.keys, cfg.write.as_deref());
    let name = target.kind.name();
    let found = backend::open_existing(target).and_then(|b| {
        let (keys, cut) = if keys.is_empty() {
            let mut all = b.history_keys()?;
            all.sort();
            all.dedup();
            // A listing cut at the cap (the SQL backends' is) may have had more.
            let cut = all.len() >= MAX_KEYS;
            all.truncate(MAX_KEYS);
            (all, cut)
        } else {
            (keys.to_vec(), false)
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in &keys {
            out.push(read_key(b.as_ref(), key)?);
        }
        Ok((out, cut))
    });
    let (text, code) = match found {
        Ok((keys, cut)) => (exposition(name, &keys, cut, crate::history::now_ms()), 0),
        Err(e) => {
            let code = crate::report::fail(
                name,
                &e.context("cannot read the metrics"),
                crate::exit::UNAVAILABLE,
            );
            (down(name), code)
        }
    };
    match write {
        None => {
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            code
        }
        Some(path) => match write_atomically(path, text.as_bytes()) {
            Ok(()) => code,
            Err(e) => {
                crate::report::error(format_args!("cannot write {}: {e:#}", path.display()));
                if code == 0 { CANNOT_WRITE } else { code }
            }
        },
    }
}

/// What `key` contributes: its history (at most the history's caps) and its status.
fn read_key(b: &dyn Backend, key: &Key) -> anyhow::Result<KeyMetrics> {
    let runs = merge(&b.runs(key)?, MAX_RUNS);
    let status: Status = b.status(key)?;
    let holder = status.holders.first();
    let last = runs.first().cloned();
    let running = last.as_ref().is_some_and(|r| show::is_running(r, holder));
    let since = holder.and_then(|h| h.held_for());
    Ok(KeyMetrics {
        key: key.as_str().to_string(),
        runs: runs.len(),
        last,
        running,
        held: status.held,
        held_ms: if status.held {
            since.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        } else {
            None
        },
        waiters: status.waiters,
    })
}

/// Writes `bytes` to `path` atomically: a new file beside it (same directory, so the rename
/// cannot cross filesystems; a name node_exporter does not read: it ends in `.tmp`), flushed
/// to disk, then renamed over `path`. Readers see the old file or the new one, never a part.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Some(name) = path.file_name() else {
        anyhow::bail!("not a file name");
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot rename {} over it", tmp.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A label value in the exposition format: `\`, `"` and a line feed escaped; any other UTF-8
/// as it is.
pub(crate) fn label_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Milliseconds as seconds, exactly ("1700000000.123").
fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// One metric family: its HELP, TYPE and samples (`(labels, value)`), or nothing without
/// samples.
fn family(out: &mut String, name: &str, help: &str, samples: &[(String, String)]) {
    if samples.is_empty() {
        return;
    }
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
    for (labels, value) in samples {
        if labels.is_empty() {
            out.push_str(&format!("{name} {value}\n"));
        } else {
            out.push_str(&format!("{name}{{{labels}}} {value}\n"));
        }
    }
}

/// The exposition for a backend that could not be asked: `dlock_backend_up 0`.
fn down(backend: &str) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "dlock_backend_up",
        "Whether dlock could read the backend (1) or not (0).",
        &[(format!("backend=\"{}\"", label_value(backend)), "0".into())],
    );
    out
}

/// The whole exposition for `keys` read from `backend` at `now_ms` (`cut`: the list of keys
/// was cut at [`MAX_KEYS`]).
pub(crate) fn exposition(backend: &str, keys: &[KeyMetrics], cut: bool, now_ms: u64) -> String {
    let mut out = String::new();
    let b = format!("backend=\"{}\"", label_value(backend));
    family(
        &mut out,
        "dlock_backend_up",
        "Whether dlock could read the backend (1) or not (0).",
        &[(b.clone(), "1".into())],
    );
    family(
        &mut out,
        "dlock_metrics_keys",
        "How many keys this exposition reports.",
        &[(b.clone(), keys.len().to_string())],
    );
    family(
        &mut out,
        "dlock_metrics_keys_cut",
        "1 when there may be more keys with a history than one exposition reports (200).",
        &[(b, u8::from(cut).to_string())],
    );
    let label = |k: &KeyMetrics| format!("key=\"{}\"", label_value(&k.key));
    let each = |f: &dyn Fn(&KeyMetrics) -> Option<String>| -> Vec<(String, String)> {
        keys.iter()
            .filter_map(|k| f(k).map(|v| (label(k), v)))
            .collect()
    };
    let last = |k: &KeyMetrics| k.last.as_ref().filter(|r| r.unreadable.is_none()).cloned();
    family(
        &mut out,
        "dlock_history_runs",
        "Runs recorded in the key's history (at most 100; 0: never ran, or aged out).",
        &each(&|k| Some(k.runs.to_string())),
    );
    family(
        &mut out,
        "dlock_last_run_start_timestamp_seconds",
        "When the key's newest run started (Unix time, by the backend's clock where it has one).",
        &each(&|k| last(k)?.started_ms.map(seconds)),
    );
    family(
        &mut out,
        "dlock_last_run_end_timestamp_seconds",
        "When the key's newest run ended (absent while it runs, or when no end was recorded).",
        &each(&|k| last(k)?.ended_ms.map(seconds)),
    );
    family(
        &mut out,
        "dlock_last_run_duration_seconds",
        "How long the key's newest run took (absent until it ended).",
        &each(&|k| last(k)?.duration_ms.map(seconds)),
    );
    family(
        &mut out,
        "dlock_last_run_exit_code",
        "dlock's exit code for the key's newest run: the command's, 128+N for signal N, 79 for a lost lock.",
        &each(&|k| last(k)?.ending?.code.map(|c| c.to_string())),
    );
    family(
        &mut out,
        "dlock_last_run_running",
        "1 while the key's newest run is running (its process holds the lock).",
        &each(&|k| last(k).map(|_| u8::from(k.running).to_string())),
    );
    family(
        &mut out,
        "dlock_last_run_success",
        "1 when the key's newest run ended with exit 0 (no signal, lock kept); 0 when it failed, was lost, or left no end and is not running; absent while it runs.",
        &each(&|k| {
            let r = last(k)?;
            if k.running {
                return None;
            }
            let good = r
                .ending
                .as_ref()
                .is_some_and(|e| e.code == Some(0) && e.signal.is_none() && e.lost.is_none());
            Some(u8::from(r.state == "ended" && good).to_string())
        }),
    );
    family(
        &mut out,
        "dlock_last_run_info",
        "The host of the key's newest run, and its state (ended, running, no end recorded, unreadable).",
        &keys
            .iter()
            .filter_map(|k| {
                let r = k.last.as_ref()?;
                let state = if k.running { "running" } else { r.state };
                let host = r
                    .host
                    .as_deref()
                    .map(|h| clean(h, MAX_HOST))
                    .unwrap_or_default();
                Some((
                    format!(
                        "{},host=\"{}\",state=\"{}\"",
                        label(k),
                        label_value(&host),
                        label_value(state)
                    ),
                    "1".into(),
                ))
            })
            .collect::<Vec<_>>(),
    );
    family(
        &mut out,
        "dlock_lock_held",
        "1 when the lock is held now.",
        &each(&|k| Some(u8::from(k.held).to_string())),
    );
    family(
        &mut out,
        "dlock_lock_held_seconds",
        "How long the lock's holder has held it (its record's start, by this host's clock).",
        &each(&|k| k.held_ms.map(seconds)),
    );
    family(
        &mut out,
        "dlock_lock_waiters",
        "How many wait for the lock, where the backend can tell.",
        &each(&|k| k.waiters.map(|w| w.to_string())),
    );
    family(
        &mut out,
        "dlock_metrics_timestamp_seconds",
        "When these metrics were read (Unix time, this host's clock).",
        &[(String::new(), seconds(now_ms))],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Ending;

    fn sample(key: &str, host: &str) -> KeyMetrics {
        KeyMetrics {
            key: key.into(),
            runs: 2,
            last: Some(Run {
                run: "r".into(),
                state: "ended",
                host: Some(host.into()),
                started_ms: Some(1_700_000_000_123),
                ended_ms: Some(1_700_000_042_123),
                duration_ms: Some(42_000),
                ending: Some(Ending {
                    code: Some(3),
                    ..Ending::default()
                }),
                ..Run::default()
            }),
            held: true,
            held_ms: Some(1500),
            waiters: Some(2),
            ..KeyMetrics::default()
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd é"), "a\\\"b\\\\c\\nd é");
    }

    #[test]
    fn a_failed_run_and_a_key_that_never_ran() {
        let never = KeyMetrics {
            key: "never".into(),
            ..KeyMetrics::default()
        };
        let text = exposition("redis", &[sample("k\"1", "h\n\x1b"), never], false, 5);
        for want in [
            "dlock_last_run_exit_code{key=\"k\\\"1\"} 3\n",
            "dlock_last_run_success{key=\"k\\\"1\"} 0\n",
            "dlock_last_run_start_timestamp_seconds{key=\"k\\\"1\"} 1700000000.123\n",
            "dlock_last_run_duration_seconds{key=\"k\\\"1\"} 42.000\n",
            "dlock_history_runs{key=\"never\"} 0\n",
            "dlock_lock_held{key=\"never\"} 0\n",
            "dlock_lock_waiters{key=\"k\\\"1\"} 2\n",
            "host=\"h\\\\n\\\\x1b\"",
            "dlock_backend_up{backend=\"redis\"} 1\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("dlock_last_run_start_timestamp_seconds{key=\"never\"}"));
    }

    /// Lines as the exposition format's grammar has them: a comment (HELP or TYPE), or
    /// `name{labels} value` with every label value a closed, escaped string.
    fn valid(text: &str) -> Result<(), String> {
        let mut families = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or("");
                if !families.insert(name.to_string()) {
                    return Err(format!("family {name} twice"));
                }
                current = name.to_string();
                continue;
            }
            if line.starts_with("# TYPE ") {
                continue;
            }
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != current {
                return Err(format!("sample outside its family: {line}"));
            }
            let mut rest = &line[name.len()..];
            if let Some(labels) = rest.strip_prefix('{') {
                // name="value",... with escapes, then '}'.
                let mut chars = labels.char_indices();
                let mut in_value = false;
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match (in_value, c) {
                        (true, '\\') => match chars.next() {
                            Some((_, '\\' | '"' | 'n')) => {}
                            other => return Err(format!("bad escape {other:?}: {line}")),
                        },
                        (true, '"') => in_value = false,
                        (true, '\n') => return Err(line.into()),
                        (false, '"') => in_value = true,
                        (false, '}') => {
                            end = Some(i);
                            break;
                        }
                        _ => {}
                    }
                }
                let Some(end) = end else {
                    return Err(format!("labels not closed: {line}"));
                };
                rest = &labels[end + 1..];
            }
            let value = rest.strip_prefix(' ').ok_or_else(|| line.to_string())?;
            value
                .parse::<f64>()
                .map_err(|_| format!("bad value: {line}"))?;
        }
        Ok(())
    }

    #[test]
    fn the_grammar_check_catches_what_it_should() {
        assert!(valid("# HELP a x\n# TYPE a gauge\na{k=\"a\\\"\"} 1\n").is_ok());
        assert!(valid("# HELP a x\n# TYPE a gauge\na{k=\"a\"\"} 1\n").is_err());
        assert!(valid("# HELP a x\n# TYPE a gauge\na{k=\"a\\x\"} 1\n").is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_key_host_or_command_gives_a_valid_exposition(
            key in "\\PC{1,64}",
            host in "\\PC{0,300}|[\\x00-\\x7f]{0,40}",
            command in proptest::option::of("(?s).{0,300}"),
            code in proptest::option::of(proptest::num::i64::ANY),
            started in proptest::option::of(proptest::num::u64::ANY),
        ) {
            let mut k = sample(&key, &host);
            if let Some(r) = k.last.as_mut() {
                r.command = command;
                r.started_ms = started;
                r.ending.as_mut().unwrap().code = code;
            }
            let text = exposition("file", &[k], false, u64::MAX);
            proptest::prop_assert!(valid(&text).is_ok(), "{:?}\n{}", valid(&text), text);
            proptest::prop_assert!(text.len() < 8192);
        }
    }
}
