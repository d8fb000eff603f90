//! A lock's queue on etcd: the keys of its prefix in create-revision order, and where a run
//! stands among them (see the module documentation of [`super`]).

use serde_json::{Value, json};

use super::MAX_QUEUE;
use super::http::{b64, prefix_end};
use super::reply::Kv;
use crate::model::{Holder, Mode};

/// One key of a lock's prefix, in create-revision order.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) key: Vec<u8>,
    pub(super) rev: i64,
    pub(super) lease: i64,
    /// dlock's record, or `None` for a key that is not dlock's (etcdctl lock, a Go Mutex).
    pub(super) record: Option<Holder>,
    /// The lease the key is named after (its holder's), where the name is one.
    pub(super) named: Option<i64>,
}

impl Entry {
    fn from_kv(kv: Kv) -> Entry {
        let record = crate::backend::read_record(&kv.value).filter(|h| h.pid.is_some());
        let own = kv.key.rsplit(|&b| b == b'/').next().unwrap_or_default();
        let named = std::str::from_utf8(own)
            .ok()
            .and_then(|hex| i64::from_str_radix(hex, 16).ok());
        Entry {
            key: kv.key,
            rev: kv.create_revision,
            lease: kv.lease,
            record,
            named,
        }
    }

    /// Whether a safe `dlock break` made this dlock key a tombstone: moved it from the lease it
    /// is named after (its holder's, which the break revoked) to a lease of the break's own.
    pub(super) fn broken(&self) -> bool {
        self.record.is_some() && self.named.is_some_and(|n| n != self.lease)
    }

    /// The mode it holds (or waits) in; a foreign key is exclusive.
    pub(super) fn mode(&self) -> Mode {
        self.record
            .as_ref()
            .and_then(|h| h.mode)
            .unwrap_or(Mode::Exclusive)
    }

    /// What status and messages show of it.
    pub(super) fn holder(&self) -> Holder {
        let node = String::from_utf8_lossy(&self.key).into_owned();
        let mut h = match &self.record {
            Some(h) => h.clone(),
            None => Holder {
                foreign: Some("an etcd lock without a dlock record (etcdctl lock, a Mutex)".into()),
                ..Holder::default()
            },
        };
        h.fencing_token = u64::try_from(self.rev).ok();
        h.node = Some(node);
        // A tombstone is still its holder's: named by the holder's lease (which `break --wait`
        // follows), not by the lease that keeps it.
        h.broken = self.broken();
        let lease = if h.broken { self.named } else { None };
        h.session = Some(format!("lease {:x}", lease.unwrap_or(self.lease)));
        h
    }
}

/// A range request for the keys of `prefix` in create-revision order (the oldest
/// [`MAX_QUEUE`]), those older than `before` if given.
pub(super) fn range_request(prefix: &[u8], before: Option<i64>) -> Value {
    let mut range = json!({
        "key": b64(prefix),
        "range_end": b64(&prefix_end(prefix)),
        "sort_order": "ASCEND",
        "sort_target": "CREATE",
        "limit": MAX_QUEUE.to_string(),
    });
    if let Some(rev) = before {
        range["max_create_revision"] = json!((rev - 1).to_string());
    }
    range
}

/// Whether `key` is an entry of the lock `prefix`: `<prefix><anything without '/'>`. The range
/// of `dlock/a/` also holds keys deeper down, `dlock/a/b/<lease>` — `etcdctl lock dlock/a/b`,
/// or a dlock from before names were escaped — which are no lock of dlock's key `a`.
pub(super) fn in_lock(prefix: &[u8], key: &[u8]) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|own| !own.is_empty() && !own.contains(&b'/'))
}

/// The entries of the lock `prefix` in a range reply. A reply cut at [`MAX_QUEUE`] keys of
/// which some were deeper ones (not this lock's) may have left the lock's own older entries
/// out: then nobody can tell from it who holds, and it is an error, never "none older".
pub(super) fn entries(prefix: &[u8], kvs: Vec<Kv>) -> Result<Vec<Entry>, String> {
    let cut = kvs.len() >= MAX_QUEUE;
    let read = kvs.len();
    let entries: Vec<Entry> = kvs
        .into_iter()
        .filter(|kv| in_lock(prefix, &kv.key))
        .map(Entry::from_kv)
        .collect();
    if cut && entries.len() < read {
        return Err(format!(
            "the range of {} holds over {MAX_QUEUE} keys, keys below the lock among them: \
             dlock cannot tell who holds it",
            String::from_utf8_lossy(prefix)
        ));
    }
    Ok(entries)
}

/// Where `mode`, whose key has revision `mine`, stands among the older `entries`.
pub(super) enum Verdict {
    Holds,
    /// Wait for the deletion of this older key (exclusive, shared), or of any key of the
    /// prefix (`None`: a slot). The oldest key is the holder to name.
    Waits(Option<usize>),
    /// A dlock holder of the key in another mode.
    Mismatch(Mode),
}

pub(super) fn judge(mode: Mode, older: &[Entry]) -> Verdict {
    // Another dlock mode that cannot be waited for: a mismatch (exit 2).
    let clash = older.iter().find_map(|e| {
        let theirs = e.record.as_ref()?.mode.unwrap_or(Mode::Exclusive);
        let ok = match mode {
            Mode::Exclusive | Mode::Shared => !matches!(theirs, Mode::Limit(_)),
            Mode::Limit(n) => theirs == Mode::Limit(n),
        };
        (!ok).then_some(theirs)
    });
    if let Some(theirs) = clash {
        return Verdict::Mismatch(theirs);
    }
    if older.is_empty() {
        return Verdict::Holds;
    }
    match mode {
        Mode::Exclusive => Verdict::Waits(Some(older.len() - 1)),
        Mode::Shared => match older.iter().rposition(|e| e.mode() != Mode::Shared) {
            Some(i) => Verdict::Waits(Some(i)),
            None => Verdict::Holds,
        },
        Mode::Limit(n) => match older.iter().rposition(|e| e.record.is_none()) {
            Some(i) => Verdict::Waits(Some(i)),
            None if older.len() < n as usize => Verdict::Holds,
            None => Verdict::Waits(None),
        },
    }
}

/// Which of a prefix's entries (in order) hold: the first, and behind a shared or slot holder
/// the ones that may hold beside it.
pub(super) fn holders(entries: &[Entry]) -> usize {
    let Some(first) = entries.first() else {
        return 0;
    };
    match first.mode() {
        Mode::Exclusive => 1,
        Mode::Shared => entries
            .iter()
            .take_while(|e| e.mode() == Mode::Shared)
            .count(),
        Mode::Limit(n) => entries
            .iter()
            .take(n as usize)
            .take_while(|e| e.mode() == Mode::Limit(n))
            .count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rev: i64, mode: Option<Mode>) -> Entry {
        Entry {
            key: format!("dlock/k/{rev:x}").into_bytes(),
            rev,
            lease: rev,
            named: Some(rev),
            record: mode.map(|m| {
                Holder::from(crate::model::Record {
                    pid: Some(1),
                    mode: (m != Mode::Exclusive).then_some(m),
                    ..crate::model::Record::default()
                })
            }),
        }
    }

    fn kv(key: &str, rev: i64) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            value: Vec::new(),
            create_revision: rev,
            mod_revision: rev,
            lease: rev,
        }
    }

    /// A dlock key on another lease than the one it is named after is a safe break's tombstone,
    /// shown broken under its holder's lease; a key of another client, or a name that is no
    /// lease id, never is.
    #[test]
    fn a_key_moved_off_its_named_lease_is_a_tombstone() {
        let record = br#"{"pid":7,"host":"h"}"#.to_vec();
        let kv = |key: &str, lease: i64, value: &[u8]| Kv {
            value: value.to_vec(),
            lease,
            ..kv(key, 5)
        };
        let own = Entry::from_kv(kv("dlock/k/1f", 0x1f, &record));
        assert!(!own.broken());
        let moved = Entry::from_kv(kv("dlock/k/1f", 0x2a, &record));
        assert!(moved.broken());
        let h = moved.holder();
        assert!(h.broken);
        assert_eq!(h.session.as_deref(), Some("lease 1f"));
        assert!(!Entry::from_kv(kv("dlock/k/1f", 0x2a, b"")).broken());
        assert!(!Entry::from_kv(kv("dlock/k/zz", 0x2a, &record)).broken());
    }

    /// A page cut at MAX_QUEUE with deeper keys in it cannot say "none older" (which would be
    /// "I hold"): it is an error. Regression: 10,000 keys of `dlock/a/x/…` made before `a`'s
    /// holder filtered down to an empty queue.
    #[test]
    fn a_cut_page_with_deeper_keys_is_an_error() {
        let deeper: Vec<Kv> = (1..=MAX_QUEUE as i64)
            .map(|r| kv(&format!("dlock/a/x/{r:x}"), r))
            .collect();
        assert!(entries(b"dlock/a/", deeper).is_err());
        let own: Vec<Kv> = (1..=MAX_QUEUE as i64)
            .map(|r| kv(&format!("dlock/a/{r:x}"), r))
            .collect();
        assert_eq!(entries(b"dlock/a/", own).unwrap().len(), MAX_QUEUE);
        let few = vec![kv("dlock/a/x/1", 1), kv("dlock/a/2", 2)];
        assert_eq!(entries(b"dlock/a/", few).unwrap().len(), 1);
    }

    #[test]
    fn modes_wait_for_what_they_must() {
        let ex = Some(Mode::Exclusive);
        let sh = Some(Mode::Shared);
        assert!(matches!(judge(Mode::Exclusive, &[]), Verdict::Holds));
        // A reader behind readers holds; behind a foreign key or a writer it waits.
        assert!(matches!(
            judge(Mode::Shared, &[entry(1, sh), entry(2, sh)]),
            Verdict::Holds
        ));
        match judge(Mode::Shared, &[entry(1, sh), entry(2, ex), entry(3, sh)]) {
            Verdict::Waits(Some(t)) => assert_eq!(t, 1),
            _ => panic!("a reader behind a waiting writer must wait for it"),
        }
        match judge(Mode::Shared, &[entry(1, None)]) {
            Verdict::Waits(Some(t)) => assert_eq!(t, 0),
            _ => panic!("a foreign key is an exclusive holder"),
        }
        // The exclusive waits for the newest older key only.
        match judge(Mode::Exclusive, &[entry(1, sh), entry(2, sh)]) {
            Verdict::Waits(Some(t)) => assert_eq!(t, 1),
            _ => panic!(),
        }
        let l2 = Some(Mode::Limit(2));
        assert!(matches!(
            judge(Mode::Limit(2), &[entry(1, l2)]),
            Verdict::Holds
        ));
        assert!(matches!(
            judge(Mode::Limit(2), &[entry(1, l2), entry(2, l2)]),
            Verdict::Waits(None)
        ));
        assert!(matches!(
            judge(Mode::Limit(3), &[entry(1, l2)]),
            Verdict::Mismatch(_)
        ));
        assert!(matches!(
            judge(Mode::Exclusive, &[entry(1, l2)]),
            Verdict::Mismatch(_)
        ));
    }

    #[test]
    fn deeper_keys_are_not_entries() {
        assert!(in_lock(b"dlock/a/", b"dlock/a/694d"));
        assert!(!in_lock(b"dlock/a/", b"dlock/a/b/694d"));
        assert!(!in_lock(b"dlock/a/", b"dlock/a/"));
        assert!(!in_lock(b"dlock/a/", b"dlock/a%2Fb/694d"));
    }

    #[test]
    fn holders_follow_the_first_mode() {
        let sh = Some(Mode::Shared);
        let l2 = Some(Mode::Limit(2));
        assert_eq!(holders(&[]), 0);
        assert_eq!(holders(&[entry(1, None), entry(2, None)]), 1);
        assert_eq!(
            holders(&[
                entry(1, sh),
                entry(2, sh),
                entry(3, Some(Mode::Exclusive)),
                entry(4, sh)
            ]),
            2
        );
        assert_eq!(holders(&[entry(1, l2), entry(2, l2), entry(3, l2)]), 2);
    }
}
