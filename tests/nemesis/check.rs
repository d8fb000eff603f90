//! The checker: a sweep over the sections of each key on the one clock (scripts/nemesis-sweep
//! recomputes the same numbers on its own from history.jsonl).
//!
//! - overlaps: for a key's sections in start order, each pair (a, b), a before b, with
//!   `b.start_ns < a.end_ns` where either is exclusive; and for `limit:N`, each section that
//!   starts while N others of its key still run.
//! - token regressions: a key's exclusive sections in start order, each token not greater than
//!   every earlier one's.
//! - recovery: after each fault ends, the time to the next section of its backend that starts.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::faults::Fault;

/// A section of history.jsonl.
#[derive(Clone, Debug)]
pub(crate) struct Section {
    pub backend: &'static str,
    pub key: String,
    pub mode: String,
    pub client: usize,
    pub token: Option<u64>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ended: String,
    pub via: &'static str,
    pub fence: char,
}

impl Section {
    pub(crate) fn json(&self) -> Value {
        json!({
            "backend": self.backend,
            "key": self.key,
            "mode": self.mode,
            "client": self.client,
            "token": self.token,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "ended": self.ended,
            "via": self.via,
            "fence": match self.fence { 'A' => "accepted", 'R' => "refused", _ => "none" },
        })
    }
}

/// The bound on recovery this campaign states: after a fault heals, a section of its backend
/// starts within it (a lease of 2 s that may have to run out, a 3 s wait, a server's start).
pub(crate) const RECOVERY_BOUND_MS: u64 = 15_000;

/// Overlaps and token regressions among the sections of one key.
pub(crate) fn key_counts(sections: &[&Section]) -> (u64, u64) {
    let mut s: Vec<&Section> = sections.to_vec();
    s.sort_by_key(|x| (x.start_ns, x.end_ns));
    let mut overlaps = 0u64;
    for (j, b) in s.iter().enumerate() {
        let earlier = &s[..j];
        let running: Vec<&&Section> = earlier.iter().filter(|a| b.start_ns < a.end_ns).collect();
        let excl = |x: &Section| x.mode == "exclusive";
        overlaps += running.iter().filter(|a| excl(a) || excl(b)).count() as u64;
        if let Some(n) = b
            .mode
            .strip_prefix("limit:")
            .and_then(|n| n.parse::<usize>().ok())
        {
            let same = running.iter().filter(|a| a.mode == b.mode).count();
            if same >= n {
                overlaps += 1;
            }
        }
    }
    let mut regressions = 0u64;
    let mut highest: Option<u64> = None;
    for x in s.iter().filter(|x| x.mode == "exclusive") {
        let Some(t) = x.token else { continue };
        if highest.is_some_and(|h| t <= h) {
            regressions += 1;
        }
        highest = Some(highest.map_or(t, |h| h.max(t)));
    }
    (overlaps, regressions)
}

/// report.json's value, and whether the campaign passes (no overlap or token regression on a
/// backend called safe, and a section at least on every backend). `backends`: each name, and why it is unsafe by design if it is.
pub(crate) fn report(
    backends: &[(&'static str, Option<&'static str>)],
    sections: &[Section],
    faults: &[Fault],
) -> (Value, bool) {
    let mut out = serde_json::Map::new();
    let mut pass = true;
    for &(name, why_unsafe) in backends {
        let safe = why_unsafe.is_none();
        let mine: Vec<&Section> = sections.iter().filter(|s| s.backend == name).collect();
        let mut by_key: BTreeMap<&str, Vec<&Section>> = BTreeMap::new();
        for s in &mine {
            by_key.entry(s.key.as_str()).or_default().push(s);
        }
        let (mut overlaps, mut regressions) = (0, 0);
        for list in by_key.values() {
            let (o, r) = key_counts(list);
            overlaps += o;
            regressions += r;
        }
        let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
        let mut max_recovery_ms = 0u64;
        let mut slow = 0u64;
        for f in faults.iter().filter(|f| f.backend == name) {
            *kinds.entry(f.kind).or_default() += 1;
            let next = mine
                .iter()
                .map(|s| s.start_ns)
                .filter(|&s| s >= f.end_ns)
                .min();
            if let Some(next) = next {
                let ms = (next - f.end_ns) / 1_000_000;
                max_recovery_ms = max_recovery_ms.max(ms);
                slow += u64::from(ms > RECOVERY_BOUND_MS);
            }
        }
        let refusals = mine.iter().filter(|s| s.fence == 'R').count();
        if safe && (overlaps > 0 || regressions > 0) {
            pass = false;
        }
        // A backend whose clients never entered a section shows nothing: a failure too.
        if mine.is_empty() {
            eprintln!("nemesis: {name}: no section at all (its clients' logs say why)");
            pass = false;
        }
        let mut entry = json!({
                "safe": safe,
                "sections": mine.len(),
                "overlaps": overlaps,
                "token_regressions": regressions,
                "faults": kinds,
                "max_recovery_ms": max_recovery_ms,
                "recovery_bound_ms": RECOVERY_BOUND_MS,
                "slow_recoveries": slow,
                "fence_refusals": refusals,
        });
        if let Some(why) = why_unsafe {
            entry["unsafe_by_design"] = json!(why);
        }
        out.insert(name.to_string(), entry);
    }
    (json!({ "backends": out }), pass)
}

/// The checker on a history whose answer is known (what `cargo test --test nemesis` runs):
/// touching sections do not overlap, an exclusive section inside a shared one does, a third
/// `limit:2` section at once does, and a token lower than an earlier one is a regression.
pub(crate) fn self_test() {
    let s = |key: &str, mode: &str, start: u64, end: u64, token: Option<u64>| Section {
        backend: "test",
        key: key.into(),
        mode: mode.into(),
        client: 0,
        token,
        start_ns: start,
        end_ns: end,
        ended: "ok".into(),
        via: "run --wait",
        fence: 'N',
    };
    let count = |list: &[Section]| key_counts(&list.iter().collect::<Vec<_>>());
    let touching = [
        s("x", "exclusive", 0, 10, Some(1)),
        s("x", "exclusive", 10, 20, Some(2)),
    ];
    assert_eq!(count(&touching), (0, 0), "touching sections");
    let crossing = [
        s("x", "exclusive", 0, 10, Some(5)),
        s("x", "exclusive", 10, 20, Some(7)),
        s("x", "exclusive", 15, 25, Some(6)),
    ];
    assert_eq!(count(&crossing), (1, 1), "an overlap and a regression");
    let readers = [
        s("s", "shared", 0, 10, None),
        s("s", "shared", 5, 15, None),
        s("s", "exclusive", 12, 13, Some(1)),
    ];
    assert_eq!(count(&readers), (1, 0), "a writer among readers");
    let limit = [
        s("l", "limit:2", 0, 10, None),
        s("l", "limit:2", 1, 10, None),
        s("l", "limit:2", 2, 10, None),
        s("l", "limit:2", 10, 12, None),
    ];
    assert_eq!(count(&limit), (1, 0), "three of limit:2 at once");
    let killed_at_start = [
        s("x", "exclusive", 5, 5, Some(1)),
        s("x", "exclusive", 5, 9, Some(2)),
    ];
    assert_eq!(count(&killed_at_start), (0, 0), "a section of no length");
}
