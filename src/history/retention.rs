//! Retention (docs/history.md, "Retention"): what a key leaves on a backend — its history, and
//! whatever else stays there once it is free (a lock file, a fencing row, a ZooKeeper node) — is
//! removed once the key has been untouched for [`RETENTION`], so that per-build keys
//! (`deploy-$CI_PIPELINE_ID`) do not grow a directory, a table or ZooKeeper's in-memory tree
//! forever.
//!
//! The rule lives here, once; each backend's [`Backend::prune`] applies it to what it stores:
//! removes at most `most` keys untouched for `older_than`, never a key that is held or waited
//! for, and keeps its fencing tokens growing for a key that is used again (each backend says how
//! in its `prune`, and docs/history.md has the table).
//!
//! It is pruned as dlock goes: after a run has given its lock back (never while holding it),
//! one run in [`ODDS`] prunes at most [`BATCH`] keys, through a connection of its own — on
//! average two keys removed per run, more than the one key a run can create, so what has aged
//! out stays bounded. `dlock prune` removes everything aged out at once.

use std::time::Duration;

/// How long a key may stay untouched before its traces go: 30 days.
pub(crate) const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// For tests only: a shorter retention (a duration such as `2s`), with which *every* run prunes
/// (not one in [`ODDS`]), so that a test can age keys out in seconds. Documented in
/// docs/history.md as not meant for production.
pub(crate) const TEST_RETENTION_ENV: &str = "DLOCK_TEST_RETENTION";
/// The most keys one run's pruning removes.
pub(crate) const BATCH: usize = 64;
/// The most keys one batch of `dlock prune` removes.
pub(crate) const AT_ONCE: usize = 10_000;
/// One run in this many prunes (drawn at random): a backend's pruning costs a connection and
/// a query, which most runs do not pay.
pub(crate) const ODDS: u32 = 32;

/// The retention in force: [`RETENTION`], or the tests' override.
pub(crate) fn retention() -> Duration {
    test_override().unwrap_or(RETENTION)
}

/// [`retention`] in milliseconds, for a server's expiry (Redis).
pub(crate) fn retention_ms() -> u64 {
    u64::try_from(retention().as_millis()).unwrap_or(u64::MAX)
}

fn test_override() -> Option<Duration> {
    let v = std::env::var(TEST_RETENTION_ENV).ok()?;
    humantime::parse_duration(v.trim())
        .ok()
        .filter(|d| !d.is_zero())
}

/// Whether this run prunes: one in [`ODDS`], every one under the tests' override.
pub(crate) fn due() -> bool {
    if test_override().is_some() {
        return true;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // The low bits of the clock's nanoseconds, mixed with the pid: random enough for a draw.
    let mixed = nanos ^ std::process::id().wrapping_mul(2_654_435_761);
    (mixed >> 4).is_multiple_of(ODDS)
}

/// The floor a backend keeps for its pruned keys' fencing counters, as text: the largest
/// token a pruned key had. `None` for anything that is not a plain decimal number of at most
/// 20 digits (the floor is stored where users can write it; a forged one is ignored, and the
/// clock still orders tokens).
pub(crate) fn parse_floor(text: &[u8]) -> Option<u64> {
    let t = text.strip_suffix(b"\n").unwrap_or(text);
    if t.is_empty() || t.len() > 20 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_are_plain_numbers() {
        assert_eq!(parse_floor(b"42\n"), Some(42));
        assert_eq!(parse_floor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_floor(b"18446744073709551616"), None);
        assert_eq!(parse_floor(b""), None);
        assert_eq!(parse_floor(b"-1"), None);
        assert_eq!(parse_floor(b"1 2"), None);
    }

    #[test]
    fn the_rule_is_thirty_days() {
        assert_eq!(RETENTION.as_secs(), 2_592_000);
        // A run prunes on average BATCH / ODDS keys: more than the one a run can create.
        assert!(BATCH as u32 / ODDS >= 2);
    }
}
