//! `dlock log`, and the last run that `dlock status` shows.

use std::io::Write;

use crate::backend::{self, Backend};
use crate::config::KeyConfig;
use crate::history::{Run, merge, show};
use crate::model::{Holder, Key, Status};
use crate::report;

/// `dlock log -k KEY [-n N] [--json]`.
pub(crate) fn log(cfg: &KeyConfig, n: usize, json: bool) -> u8 {
    report::set_verbosity(cfg.verbosity);
    let name = cfg.target.kind.name();
    let found = backend::open_existing(&cfg.target).and_then(|b| {
        let runs = merge(&b.runs(&cfg.key)?, n);
        // A run without an end may be the one holding the lock now.
        let holder = match runs.first() {
            Some(r) if r.state == "no end recorded" => b
                .status(&cfg.key)
                .ok()
                .and_then(|s| s.holders.into_iter().next()),
            _ => None,
        };
        Ok((b.location(), runs, holder))
    });
    match found {
        Ok((location, mut runs, holder)) => {
            let text = if json {
                if let Some(r) = runs.first_mut()
                    && show::is_running(r, holder.as_ref())
                {
                    r.state = "running";
                }
                serde_json::to_string(&runs).unwrap_or_default() + "\n"
            } else {
                show::log_text(&cfg.key, &location, &runs, holder.as_ref())
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(e) => report::fail(
            name,
            &e.context(format!("cannot read the run history of '{}'", cfg.key)),
            0,
        ),
    }
}

/// The last run of `key`, if the history has one; a history that cannot be read is a warning
/// (`status` is about the lock first).
pub(crate) fn last_run(b: &dyn Backend, key: &Key) -> Option<Run> {
    match b.runs(key) {
        Ok(stored) => merge(&stored, 1).pop(),
        Err(e) => {
            report::warn(format_args!(
                "cannot read the run history of '{key}': {e:#}"
            ));
            None
        }
    }
}

/// `status -k KEY` as JSON, with the last run (`last_run`, with `running` where its process
/// holds the lock now).
pub(crate) fn status_json(s: &Status, last: Option<Run>) -> String {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    if let (Some(map), Some(mut run)) = (v.as_object_mut(), last) {
        if show::is_running(&run, s.holders.first()) {
            run.state = "running";
        }
        map.insert(
            "last_run".into(),
            serde_json::to_value(run).unwrap_or_default(),
        );
    }
    serde_json::to_string(&v).unwrap_or_default() + "\n"
}

/// The "last run:" line of `status -k KEY`.
pub(crate) fn status_line(last: Option<&Run>, holder: Option<&Holder>) -> String {
    match last {
        Some(r) => format!("  last run: {}\n", show::line(r, holder)),
        None => "  last run: none recorded\n".into(),
    }
}
