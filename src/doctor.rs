//! `dlock doctor`: asks the backend whether a lock there can be sound and prints one line per
//! check (docs/backends.md, "What stands between dlock and the server"). Takes no lock.

use std::io::Write;
use std::time::Duration;

use crate::backend::{self, ground::Finding, ground::Verdict};
use crate::config::Target;
use crate::exit;
use crate::report;

/// Exit 1: something weakens the lock.
const WEAKENED: u8 = 1;

/// Runs the checks of `target`'s backend for leases of `ttl`, prints them (lines or one JSON
/// object) and returns the exit code: 0 all well, 1 weakened, 78 unsound, 69 not asked.
pub(crate) fn run(target: &Target, ttl: Duration, json: bool) -> u8 {
    let name = target.kind.name();
    let opened = backend::open(target);
    let location = opened.as_ref().map(|b| b.location()).unwrap_or_default();
    let findings = match opened.and_then(|b| b.doctor(ttl)) {
        Ok(f) => f,
        Err(e) => return report::fail(name, &e.context("cannot check the server"), 0),
    };
    let code = code_of(&findings);
    let mut out = std::io::stdout().lock();
    let text = if json {
        let all = serde_json::json!({
            "backend": name,
            "location": location,
            "exit": code,
            "checks": findings,
        });
        format!("{all}\n")
    } else {
        lines(&findings)
    };
    let _ = out.write_all(text.as_bytes());
    code
}

/// The exit code for a set of findings: the worst verdict's.
fn code_of(findings: &[Finding]) -> u8 {
    match findings.iter().map(|f| f.verdict).max() {
        Some(Verdict::Unsafe) => exit::UNSOUND,
        Some(Verdict::Warn) => WEAKENED,
        _ => 0,
    }
}

/// One line per finding: "ok      check: found", "warn    check: found; fix". What came from a
/// server is escaped.
fn lines(findings: &[Finding]) -> String {
    let mut text = String::new();
    for f in findings {
        text.push_str(&format!(
            "{:<7} {}\n",
            f.verdict.word(),
            report::clean(&f.sentence(), 1000)
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_verdict_chooses_the_code() {
        let ok = Finding::ok("a", "fine");
        let unknown = Finding::unknown("b", "CONFIG is denied");
        let warn = Finding::warn("c", "evicts", "set noeviction");
        let bad = Finding::unsafe_("d", "pooled", "use session mode");
        assert_eq!(code_of(&[]), 0);
        assert_eq!(code_of(&[ok.clone(), unknown.clone()]), 0);
        assert_eq!(code_of(&[ok.clone(), warn.clone()]), 1);
        assert_eq!(code_of(&[warn, bad, ok]), 78);
    }

    #[test]
    fn a_servers_words_are_escaped() {
        let f = Finding::ok("server", "evil\x1b[2Jname");
        assert_eq!(lines(&[f]), "ok      server: evil\\x1b[2Jname\n");
    }
}
