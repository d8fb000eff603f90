//! `dlock status`: one key's holders and last run, or every lock held or waited for.

use std::io::Write;

use crate::backend;
use crate::config::KeyConfig;
use crate::report;

pub(crate) fn status(cfg: &KeyConfig, json: bool) -> u8 {
    report::set_verbosity(cfg.verbosity);
    let name = cfg.target.kind.name();
    let result = backend::open_existing(&cfg.target).and_then(|b| {
        let s = b.status(&cfg.key)?;
        Ok((s, crate::cmd::log::last_run(b.as_ref(), &cfg.key)))
    });
    match result {
        Ok((s, last)) => {
            let s = s.with_mode();
            let text = if json {
                crate::cmd::log::status_json(&s, last)
            } else {
                report::status_text(&s)
                    + &crate::cmd::log::status_line(last.as_ref(), s.holders.first())
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(e) => report::fail(
            name,
            &e.context(format!("cannot read the status of '{}'", cfg.key)),
            0,
        ),
    }
}

/// `dlock status` without `--key`: every lock held or waited for, as a table or a JSON array.
pub(crate) fn list(
    target: &crate::config::Target,
    verbosity: crate::model::Verbosity,
    json: bool,
) -> u8 {
    report::set_verbosity(verbosity);
    let name = target.kind.name();
    let found = backend::open_existing(target).and_then(|b| {
        let mut busy = Vec::new();
        let keys = b.list_keys()?;
        if keys.len() >= backend::MAX_LISTED {
            report::warn(format_args!(
                "the list stops at {} keys held or waited for: there may be more; give --key \
                 for one past them",
                backend::MAX_LISTED
            ));
        }
        for key in keys {
            let s = b.status(&key)?;
            if s.held || s.waiters.is_some_and(|w| w > 0) || !s.queue.is_empty() {
                let last = crate::cmd::log::last_run(b.as_ref(), &key);
                busy.push((s.with_mode(), last));
            }
        }
        busy.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        Ok((b.location(), busy))
    });
    match found {
        Ok((location, busy)) => {
            let text = if json {
                let all: Vec<String> = busy
                    .into_iter()
                    .map(|(s, last)| {
                        crate::cmd::log::status_json(&s, last)
                            .trim_end()
                            .to_string()
                    })
                    .collect();
                format!("[{}]\n", all.join(","))
            } else {
                let lasts: Vec<String> = busy
                    .iter()
                    .map(|(s, last)| {
                        crate::history::show::last_run_cell(last.as_ref(), s.holders.first())
                    })
                    .collect();
                let locks: Vec<crate::model::Status> = busy.into_iter().map(|(s, _)| s).collect();
                report::list_text(name, &location, &locks, &lasts)
            };
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            0
        }
        Err(e) => report::fail(name, &e.context("cannot list the locks"), 0),
    }
}
