//! Retention as dlock goes ([`after_run`]) and at once (`dlock prune`, [`prune_all`]); the rule
//! is [`crate::history::retention`]'s.

use std::time::Duration;

use crate::backend::Backend;
use crate::history::retention::{AT_ONCE, BATCH, due, retention};
use crate::report;

/// After a run has let go of its lock: prunes up to [`BATCH`] aged-out keys when this run is
/// due to. A failure is a `-v` line: pruning is housekeeping, never a run's failure.
pub(crate) fn after_run(backend: &dyn Backend) {
    if !due() {
        return;
    }
    match backend.prune(retention(), BATCH) {
        Ok(0) => {}
        Ok(n) => report::verbose(format_args!("pruned {n} key(s) untouched for {}", show())),
        Err(e) => report::verbose(format_args!("cannot prune aged-out keys: {e:#}")),
    }
}

/// `dlock prune`: removes every key untouched for the retention (or `older_than`), batch by
/// batch; prints how many. Exit 0, or 69 when the backend could not be asked.
pub(crate) fn prune_all(backend: &dyn Backend, older_than: Option<Duration>, quiet: bool) -> u8 {
    let older_than = older_than.unwrap_or_else(retention);
    let mut total = 0usize;
    // Batch after batch until one removes nothing (every batch that goes on removed something,
    // so this ends); a batch looks at more than a run's does.
    loop {
        match backend.prune(older_than, AT_ONCE) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => {
                report::error(format_args!(
                    "cannot prune {} (removed {total} key(s) first): {e:#}",
                    backend.location()
                ));
                return crate::exit::UNAVAILABLE;
            }
        }
    }
    if !quiet {
        println!(
            "pruned {total} key(s) untouched for {} on {}",
            humantime::format_duration(older_than),
            report::clean(&backend.location(), report::MAX_FIELD)
        );
    }
    0
}

fn show() -> String {
    humantime::format_duration(retention()).to_string()
}
