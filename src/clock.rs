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
