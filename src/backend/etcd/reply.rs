//! etcd's replies as typed structs. The gateway leaves out zero values (a key without a lease,
//! a count of 0, `succeeded: false`), so those default to zero; the revisions the queue is
//! ordered by (`header.revision`, a key's `create_revision`) are never zero on a real etcd, so
//! a reply without them — or with anything but a positive 64-bit integer there — is an error,
//! not a 0 that would put the own key ahead of every other ("held").

use base64::Engine;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::Value;

/// Decodes `value` as a `T`; what a malformed reply fails with.
pub(super) fn decode<T: for<'de> Deserialize<'de>>(value: &Value, what: &str) -> Result<T, String> {
    T::deserialize(value).map_err(|e| {
        format!(
            "a malformed {what} reply: {}",
            crate::report::clean(&e.to_string(), 120)
        )
    })
}

/// A 64-bit integer: a decimal string (as the gateway writes them) or a JSON number.
struct Int;

impl Visitor<'_> for Int {
    type Value = i64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a 64-bit integer")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| E::custom("an integer out of range"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
        v.parse().map_err(|_| E::custom("not a decimal integer"))
    }
}

/// An integer field that may be left out (zero).
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    d.deserialize_any(Int)
}

/// A revision: a positive integer.
fn revision<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match d.deserialize_any(Int)? {
        r if r > 0 => Ok(r),
        r => Err(de::Error::custom(format!("a revision of {r}"))),
    }
}

/// A base64 field.
fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = <&str>::deserialize(d)?;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| de::Error::custom("bad base64"))
}

#[derive(Debug, Deserialize)]
pub(super) struct Header {
    #[serde(deserialize_with = "revision")]
    pub(super) revision: i64,
}

/// A key as a range returns it.
#[derive(Debug, Deserialize)]
pub(super) struct Kv {
    #[serde(deserialize_with = "bytes")]
    pub(super) key: Vec<u8>,
    #[serde(default, deserialize_with = "bytes")]
    pub(super) value: Vec<u8>,
    #[serde(deserialize_with = "revision")]
    pub(super) create_revision: i64,
    /// The revision of the key's last change (0 where a reply leaves it out; only compared).
    #[serde(default, deserialize_with = "int")]
    pub(super) mod_revision: i64,
    #[serde(default, deserialize_with = "int")]
    pub(super) lease: i64,
}

/// `/v3/kv/range`.
#[derive(Debug, Deserialize)]
pub(super) struct Range {
    pub(super) header: Header,
    #[serde(default)]
    pub(super) kvs: Vec<Kv>,
    #[serde(default, deserialize_with = "int")]
    pub(super) count: i64,
}

/// A range inside a transaction (its own header is empty).
#[derive(Debug, Default, Deserialize)]
pub(super) struct TxnRange {
    #[serde(default)]
    pub(super) kvs: Vec<Kv>,
    #[serde(default, deserialize_with = "int")]
    pub(super) count: i64,
}

#[derive(Debug, Deserialize)]
pub(super) struct ResponseOp {
    #[serde(default)]
    pub(super) response_range: Option<TxnRange>,
}

/// `/v3/kv/txn`.
#[derive(Debug, Deserialize)]
pub(super) struct Txn {
    pub(super) header: Header,
    #[serde(default)]
    pub(super) succeeded: bool,
    #[serde(default)]
    pub(super) responses: Vec<ResponseOp>,
}

impl Txn {
    /// The range of the `i`th operation.
    pub(super) fn range(&self, i: usize) -> Result<&TxnRange, String> {
        self.responses
            .get(i)
            .and_then(|r| r.response_range.as_ref())
            .ok_or_else(|| format!("a transaction reply without its range {i}"))
    }
}

/// `/v3/lease/grant`.
#[derive(Debug, Deserialize)]
pub(super) struct Grant {
    #[serde(rename = "ID", deserialize_with = "revision")]
    pub(super) id: i64,
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub(super) ttl: i64,
}

/// `/v3/lease/timetolive`, and a keep-alive's result.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Ttl {
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub(super) ttl: i64,
    /// The TTL the lease was granted with (`/v3/lease/timetolive`).
    #[serde(rename = "grantedTTL", default, deserialize_with = "int")]
    pub(super) granted: i64,
}

/// `/v3/lease/keepalive` (a stream of one message): a missing result is a TTL of 0, lost.
#[derive(Debug, Deserialize)]
pub(super) struct KeepAlive {
    #[serde(default)]
    pub(super) result: Ttl,
}

/// A key alone: of a watch event (a deletion has no create revision), or of a listing.
#[derive(Debug, Deserialize)]
pub(super) struct KeyOnly {
    #[serde(deserialize_with = "bytes")]
    pub(super) key: Vec<u8>,
}

/// `/v3/kv/range` with `keys_only`, for the listing.
#[derive(Debug, Deserialize)]
pub(super) struct ListedKeys {
    #[serde(default)]
    pub(super) kvs: Vec<KeyOnly>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Event {
    pub(super) kv: KeyOnly,
}

/// One message of a watch stream (its `result`).
#[derive(Debug, Deserialize)]
pub(super) struct WatchMsg {
    pub(super) header: Header,
    #[serde(default)]
    pub(super) created: bool,
    #[serde(default)]
    pub(super) events: Vec<Event>,
    /// The server ended this watch (permission denied, a compacted revision): no event comes.
    #[serde(default)]
    pub(super) canceled: bool,
    #[serde(default)]
    pub(super) cancel_reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn revisions_are_required_and_positive() {
        let kv = |rev: Value| {
            json!({"header": {"revision": "3"}, "kvs": [
                {"key": "YQ==", "create_revision": rev}
            ]})
        };
        assert_eq!(
            decode::<Range>(&kv(json!("2")), "range").unwrap().kvs[0].create_revision,
            2
        );
        assert_eq!(
            decode::<Range>(&kv(json!(2)), "range").unwrap().kvs[0].create_revision,
            2
        );
        for bad in [
            json!(null),
            json!("0"),
            json!("-1"),
            json!("x"),
            json!(1.5),
            json!([]),
        ] {
            assert!(decode::<Range>(&kv(bad.clone()), "range").is_err(), "{bad}");
        }
        assert!(decode::<Range>(&json!({"kvs": []}), "range").is_err());
        assert!(decode::<Range>(&json!({"header": {}}), "range").is_err());
        let r = decode::<Range>(&json!({"header": {"revision": "1"}}), "range").unwrap();
        assert_eq!((r.kvs.len(), r.count), (0, 0));
        assert!(decode::<Txn>(&json!({"header": {}, "succeeded": true}), "txn").is_err());
        let k = decode::<KeepAlive>(&json!({}), "keep-alive").unwrap();
        assert_eq!(k.result.ttl, 0);
        assert!(decode::<Grant>(&json!({"TTL": "5"}), "grant").is_err());
    }

    /// Arbitrary JSON-ish values, deep enough to reach every field.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            "[0-9a-zA-Z=+/ -]{0,12}".prop_map(Value::from),
            any::<i64>().prop_map(|i| Value::from(i.to_string())),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let names = prop_oneof![
                Just("header"),
                Just("revision"),
                Just("kvs"),
                Just("key"),
                Just("value"),
                Just("create_revision"),
                Just("mod_revision"),
                Just("grantedTTL"),
                Just("lease"),
                Just("count"),
                Just("succeeded"),
                Just("responses"),
                Just("response_range"),
                Just("ID"),
                Just("TTL"),
                Just("result"),
                Just("events"),
                Just("kv"),
                Just("created"),
                Just("x"),
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::vec((names, inner), 0..6).prop_map(|kvs| {
                    Value::Object(kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn no_reply_panics(v in json_value()) {
            let _ = decode::<Range>(&v, "range");
            let _ = decode::<Txn>(&v, "txn").map(|t| t.range(1).map(|r| r.kvs.len()));
            let _ = decode::<Grant>(&v, "grant");
            let _ = decode::<KeepAlive>(&v, "keep-alive");
            let _ = decode::<Ttl>(&v, "timetolive");
            let _ = decode::<WatchMsg>(&v, "watch");
            let _ = decode::<ListedKeys>(&v, "range");
        }

        #[test]
        fn a_decoded_revision_is_positive(v in json_value()) {
            if let Ok(r) = decode::<Range>(&v, "range") {
                prop_assert!(r.header.revision > 0);
                prop_assert!(r.kvs.iter().all(|kv| kv.create_revision > 0));
            }
            if let Ok(w) = decode::<WatchMsg>(&v, "watch") {
                prop_assert!(w.header.revision > 0);
            }
        }
    }
}
