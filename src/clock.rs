//! A monotonic clock that keeps counting while the machine is suspended.
//!
//! Lease deadlines must be measured on `CLOCK_BOOTTIME`: `std::time::Instant` is
//! `CLOCK_MONOTONIC` on Linux, which stops during suspend, so after a resume a deadline measured
//! with it would lie in the future although the server's TTL has long run out.

use std::time::Duration;

/// A point on `CLOCK_BOOTTIME`. Copy, ordered, and only meaningful within one boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Now, on `CLOCK_BOOTTIME`.
    pub fn now() -> Self {
        BootInstant(crate::sys::boottime())
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since the clock's origin (the boot).
    pub(crate) fn since_boot(self) -> Duration {
        self.0
    }

    /// Time from now until `self`, zero if `self` has passed.
    pub fn remaining(self) -> Duration {
        self.saturating_duration_since(BootInstant::now())
    }
}

impl std::ops::Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

/// Saturates at the clock's origin.
impl std::ops::Sub<Duration> for BootInstant {
    type Output = BootInstant;
    fn sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

/// The part of a TTL that is not trusted: 1% of it for clock drift between us and the server,
/// plus 2 ms for the time a request takes to reach the server (docs/design.md, "The lease").
pub(crate) fn drift_margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// For a lock just granted by a server that reports an uptime of `uptime_s` seconds: the
/// instant before which its command must not start, if any. A server that forgot its locks in a
/// restart (MySQL's GET_LOCKs; the keys of a Redis without persistence, or of a Redlock majority)
/// grants a lock that a holder from before the restart still believes it holds until its next
/// renewal fails; that holder's command is gone by its lease deadline, at most one TTL after the
/// server went down, so at most one TTL after the server started. (Holders of one key are assumed
/// to use the same TTL.) `None` for a server up for a TTL and a second already.
///
/// Both servers count the uptime as whole seconds of the clock now minus whole seconds of the
/// clock at start (Redis `unixtime - stat_starttime`, MySQL `UNIX_TIMESTAMP()` minus
/// `UUID_SHORT()`'s start second), so the server may have been up for almost a second less than
/// it says: a server started at 10.9 s says 1 at 11.0 s. The hold-back counts one second more
/// (CI saw a command start 2.04 s after a restart with a 3 s TTL without it).
pub(crate) fn hold_back_until(uptime_s: u64, ttl: Duration) -> Option<BootInstant> {
    let need = hold_back_span(ttl).as_secs();
    // Counted from now, when the uptime has been read: the server started less than
    // `uptime_s + 1` seconds ago.
    (uptime_s < need).then(|| BootInstant::now() + Duration::from_secs(need - uptime_s))
}

/// How long after a restart a server's locks are held back: the TTL rounded up to whole
/// seconds, plus one (see [`hold_back_until`]).
pub(crate) fn hold_back_span(ttl: Duration) -> Duration {
    Duration::from_secs(ttl_secs_up(ttl) + 1)
}

/// `--ttl` in whole seconds, rounded *up* (at least 1): what a server-side timeout or lease
/// counted in seconds must be so that it never ends before the client's lease. (Rounded down,
/// MySQL's `wait_timeout` of 1 s for `--ttl 1900ms` freed a cut-off holder's lock while its
/// command ran on.)
pub(crate) fn ttl_secs_up(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_advances_and_saturates() {
        let a = BootInstant::now();
        std::thread::sleep(Duration::from_millis(5));
        let b = BootInstant::now();
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(5));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!(a.remaining(), Duration::ZERO);
        assert!((b + Duration::from_secs(1)).remaining() > Duration::from_millis(900));
    }

    #[test]
    fn margin_is_one_percent_plus_two_ms() {
        assert_eq!(
            drift_margin(Duration::from_secs(30)),
            Duration::from_millis(302)
        );
    }
}
