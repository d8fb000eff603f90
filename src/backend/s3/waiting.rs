//! Waiters leave a mark, `E(KEY).lock.w/OWNER` beside the lock's object, so that `status` can
//! count them (S3 keeps no queue). The mark only counts; it decides nothing. A waiter writes it
//! when it starts waiting, again every [`REFRESH`], and deletes it when it stops waiting;
//! `status` counts the marks the server wrote in the last [`FRESH`] by the server's own clock
//! (the mark of a waiter killed with SIGKILL then drops out of the count).

use std::time::{Duration, Instant};

use super::client::{Client, Cond};
use super::record;

const REFRESH: Duration = Duration::from_secs(10);
const FRESH: u64 = 30;

/// The marks' common prefix for a lock's object.
pub(super) fn marks(object: &str) -> String {
    format!("{object}.w/")
}

/// One waiter's mark.
pub(super) struct Mark {
    name: String,
    body: Vec<u8>,
    written: Option<Instant>,
}

impl Mark {
    pub(super) fn new(object: &str, owner: &str, body: Vec<u8>) -> Mark {
        Mark {
            name: format!("{}{owner}", marks(object)),
            body,
            written: None,
        }
    }

    /// Writes the mark if it is not there or is getting old; failures are ignored (it only
    /// counts).
    pub(super) fn keep(&mut self, c: &mut Client) {
        if self.written.is_some_and(|t| t.elapsed() < REFRESH) {
            return;
        }
        if c.put(&self.name, Cond::None, &self.body).is_ok() {
            self.written = Some(Instant::now());
        }
    }

    /// Deletes the mark, if written.
    pub(super) fn leave(&mut self, c: &mut Client) {
        if self.written.take().is_some() {
            let _ = c.delete(&self.name);
        }
    }
}

/// How many fresh marks a LIST reply of the marks' prefix holds.
pub(super) fn count_fresh(reply_body: &[u8], server_now: Option<u64>) -> u64 {
    let mut n = 0u64;
    for entry in record::xml_values(reply_body, "Contents") {
        let modified = record::xml_values(entry.as_bytes(), "LastModified")
            .into_iter()
            .next()
            .and_then(|t| humantime::parse_rfc3339_weak(&t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs());
        let fresh = match (server_now, modified) {
            (Some(now), Some(m)) => now.saturating_sub(m) <= FRESH,
            _ => true,
        };
        if fresh {
            n = n.saturating_add(1);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fresh_marks_count() {
        let body = b"<ListBucketResult><Contents><Key>a.lock.w/1</Key><LastModified>2026-11-29T05:00:00.000Z</LastModified></Contents><Contents><Key>a.lock.w/2</Key><LastModified>2026-11-29T04:00:00Z</LastModified></Contents></ListBucketResult>";
        let now = humantime::parse_rfc3339("2026-11-29T05:00:10Z")
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(count_fresh(body, Some(now)), 1);
        assert_eq!(count_fresh(body, None), 2);
        assert_eq!(count_fresh(b"<Contents>junk", Some(now)), 0);
    }
}
