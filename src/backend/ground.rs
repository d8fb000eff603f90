//! What a backend stands on: the checks of `dlock doctor` and the refusals and warnings of a
//! run that come from them (docs/backends.md, "What stands between dlock and the server").
//!
//! A backend's [`Backend::doctor`](super::Backend::doctor) asks its server (and what stands
//! between) and returns one [`Finding`] per check. The same checks that make a lock unsound
//! there refuse a run on connect ([`Unsound`](crate::exit::Unsound), exit 78); those that only
//! weaken it make a run warn once ([`warn_once`]).

use serde::Serialize;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    /// Fine.
    Ok,
    /// The server would not say (a command renamed or denied): not a failure.
    Unknown,
    /// The lock is weakened: it holds, but something can take it away or void it.
    Warn,
    /// No lock can be sound here; a run is refused (78).
    Unsafe,
}

impl Verdict {
    /// The word `dlock doctor` prints.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Unknown => "unknown",
            Verdict::Warn => "warn",
            Verdict::Unsafe => "unsafe",
        }
    }
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Finding {
    /// What was checked, a few words ("pool mode", "maxmemory-policy").
    pub check: &'static str,
    pub verdict: Verdict,
    /// What was found, in words ("transaction pooling: …", "allkeys-lru").
    pub found: String,
    /// What to change, where something should change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub(crate) fn ok(check: &'static str, found: impl Into<String>) -> Finding {
        Finding {
            check,
            verdict: Verdict::Ok,
            found: found.into(),
            fix: None,
        }
    }

    /// A check the server would not answer ("could not check: …").
    pub(crate) fn unknown(check: &'static str, why: impl std::fmt::Display) -> Finding {
        Finding {
            check,
            verdict: Verdict::Unknown,
            found: format!("could not check: {why}"),
            fix: None,
        }
    }

    pub(crate) fn warn(
        check: &'static str,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::to_change(check, Verdict::Warn, found.into(), fix.into())
    }

    pub(crate) fn unsafe_(
        check: &'static str,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::to_change(check, Verdict::Unsafe, found.into(), fix.into())
    }

    /// A finding with something to change.
    fn to_change(check: &'static str, verdict: Verdict, found: String, fix: String) -> Finding {
        Finding {
            check,
            verdict,
            found,
            fix: Some(fix),
        }
    }

    /// "found; fix", the one line a run prints for it.
    pub(crate) fn sentence(&self) -> String {
        match &self.fix {
            Some(fix) => format!("{}: {}; {fix}", self.check, self.found),
            None => format!("{}: {}", self.check, self.found),
        }
    }
}

/// The restart hold-back for a server up `uptime_s` seconds, judged for leases of `ttl`: what a
/// lock granted now would do (informational: the hold-back is what keeps a restart sound).
pub(crate) fn hold_back(uptime_s: u64, ttl: std::time::Duration) -> Finding {
    let span = super::hold_back_span(ttl).as_secs();
    let found = if uptime_s < span {
        format!(
            "the server started {uptime_s} s ago: a lock granted now is held back {} s (it may \
             have forgotten a holder whose command still runs)",
            span - uptime_s
        )
    } else {
        format!("the server has been up {uptime_s} s, longer than a lease: no hold-back")
    };
    Finding::ok("restart", found)
}

/// Prints `finding` as a run's warning, at most once per process for each check (a run that
/// reconnects while waiting asks again and would say it again).
pub(crate) fn warn_once(finding: &Finding) {
    use std::sync::Mutex;
    static SAID: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.contains(&finding.check) {
        return;
    }
    said.push(finding.check);
    crate::report::warn(format_args!("{}", finding.sentence()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_order_by_severity() {
        assert!(Verdict::Ok < Verdict::Unknown);
        assert!(Verdict::Unknown < Verdict::Warn);
        assert!(Verdict::Warn < Verdict::Unsafe);
    }

    #[test]
    fn a_finding_reads_as_one_sentence() {
        let f = Finding::warn("maxmemory-policy", "allkeys-lru", "set noeviction");
        assert_eq!(
            f.sentence(),
            "maxmemory-policy: allkeys-lru; set noeviction"
        );
    }
}
