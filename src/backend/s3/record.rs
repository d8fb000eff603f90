//! The lock object's JSON record, and the few values dlock reads from S3's XML (a listing's
//! keys, an error's code). Both come from the server: bounded, and no input panics.

use serde::{Deserialize, Serialize};

use crate::model::Record;

/// The most a lock object may hold.
pub(crate) const MAX_OBJECT: usize = 64 << 10;

/// Whether the lock is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LockState {
    Held,
    Free,
}

/// One key's object, `PREFIX/E(KEY).lock`. Every write replaces it whole, conditionally.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LockRecord {
    /// The format's version (1).
    pub(crate) dlock: u32,
    pub(crate) state: LockState,
    /// The fencing token of the latest acquisition: +1 on each, kept by a release.
    pub(crate) counter: u64,
    /// The holder's renewals: each makes a new object, so a new ETag, for waiters to see.
    #[serde(default)]
    pub(crate) beat: u64,
    /// The holder's lease: a waiter that sees the same ETag this long (on its own clock) may
    /// take over.
    #[serde(default)]
    pub(crate) ttl_ms: u64,
    /// The holding process's random id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
    /// Set by a safe `dlock break`: the holder stops at its next renewal, then frees the lock.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) broken: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) holder: Option<Record>,
}

impl LockRecord {
    /// The record in `bytes`, `None` when it is not one of dlock's (another program's object
    /// at the lock's name: a holder that never expires).
    pub(crate) fn parse(bytes: &[u8]) -> Option<LockRecord> {
        if bytes.len() > MAX_OBJECT {
            return None;
        }
        serde_json::from_slice::<LockRecord>(bytes)
            .ok()
            .filter(|r| r.dlock == 1)
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record serializes")
    }

    /// This record, free (the counter kept).
    pub(crate) fn freed(&self) -> LockRecord {
        LockRecord {
            state: LockState::Free,
            owner: None,
            broken: false,
            holder: None,
            beat: 0,
            ..self.clone()
        }
    }

    /// Whether `owner` holds it.
    pub(crate) fn held_by(&self, owner: &str) -> bool {
        self.state == LockState::Held && self.owner.as_deref() == Some(owner)
    }
}

/// The text of every `<tag>…</tag>` in `xml`, entities decoded; at most 10 000.
pub(crate) fn xml_values(xml: &[u8], tag: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(xml);
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = text.as_ref();
    while let Some(i) = rest.find(&open) {
        rest = &rest[i + open.len()..];
        let Some(j) = rest.find(&close) else { break };
        out.push(unescape(&rest[..j]));
        rest = &rest[j + close.len()..];
        if out.len() >= 10_000 {
            break;
        }
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn records_round_trip_and_others_are_not_records() {
        let r = LockRecord {
            dlock: 1,
            state: LockState::Held,
            counter: 7,
            beat: 2,
            ttl_ms: 2000,
            owner: Some("abc".into()),
            broken: false,
            holder: None,
        };
        let back = LockRecord::parse(&r.to_bytes()).unwrap();
        assert!(back.held_by("abc") && back.counter == 7);
        assert!(!back.freed().held_by("abc"));
        assert_eq!(back.freed().counter, 7);
        assert!(LockRecord::parse(b"locked by terraform").is_none());
        assert!(LockRecord::parse(br#"{"dlock":2,"state":"held","counter":1}"#).is_none());
    }

    #[test]
    fn xml_values_are_found_and_decoded() {
        let xml = b"<R><Contents><Key>a&amp;b.lock</Key></Contents><Contents><Key>c</Key></Contents><IsTruncated>false</IsTruncated></R>";
        assert_eq!(xml_values(xml, "Key"), ["a&b.lock", "c"]);
        assert_eq!(xml_values(xml, "IsTruncated"), ["false"]);
        assert!(xml_values(b"<Key>unclosed", "Key").is_empty());
    }

    proptest! {
        #[test]
        fn server_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), text in "\\PC{0,200}") {
            let _ = LockRecord::parse(&bytes);
            let _ = LockRecord::parse(text.as_bytes());
            let _ = xml_values(&bytes, "Key");
            let _ = xml_values(format!("<Key>{text}</Key><Key>").as_bytes(), "Key");
        }
    }
}
