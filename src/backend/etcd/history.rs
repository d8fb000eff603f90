//! The etcd backend's run history (docs/history.md). etcd has no clock to read, so events carry
//! the writing host's (`host_ms`, [`Stored::at_ms`] is `None`) and are ordered by revision:
//!
//! - Events: `dlock/%history/E(KEY)/<16 hex digits>`, one key per event, its value the event
//!   ([`names::HISTORY`]: inside `dlock/`, which dlock's users may read and write, never in a
//!   lock's range; `E` has no `/`, so the prefix of one key never holds another key's events). Read newest first by create revision,
//!   at most [`MAX_EVENTS`]; a start that finds more than that plus a slack deletes the oldest.
//! - `--once-per DUR`: the marker `dlock/%history/E(KEY)`, bound to a lease of DUR (rounded up to
//!   whole seconds). One transaction puts the marker and the start if the marker does not exist;
//!   else the run skips, naming the start in the marker. A marker whose lease is due but not yet
//!   reaped by etcd (it revokes expired leases every half second or so), or longer than DUR
//!   (whole seconds, etcd's minimum TTL), is taken over when the lease has under a second left
//!   or is DUR old by its own count, and its start is DUR old by this host's clock. The marker
//!   lives as long as the window of the run that wrote it, so before it the run also reads the
//!   last start event and skips if that is younger than DUR by the hosts' clocks (its `host_ms`
//!   and ours): a longer window than the last run's, or a marker lost, still skips.

use std::time::Duration;

use serde_json::{Value, json};

use super::http::{Client, Error, b64, prefix_end};
use super::names::{HISTORY, escape};
use super::reply::{self, decode};
use crate::history::{Begun, Event, MAX_EVENT_BYTES, MAX_EVENTS, Stored, now_ms};
use crate::model::Key;

/// Events past [`MAX_EVENTS`] before a start prunes: every few runs, not on every one.
const SLACK: usize = 10;
/// The most of one event's value a reader keeps (a bigger one is unreadable anyway).
const MAX_BODY: usize = 16 * MAX_EVENT_BYTES;
/// The most keys one pruning deletes (etcd takes 128 operations per transaction by default).
const MAX_PRUNE: usize = 100;

/// How a failed request becomes an error (the backend's, or the lease's).
pub(super) type Fail<'a> = &'a dyn Fn(Error) -> anyhow::Error;

/// Where a key's history lives.
#[derive(Clone, Debug)]
pub(super) struct Place {
    /// `dlock/%history/E(KEY)/`.
    pub(super) prefix: Vec<u8>,
    /// `dlock/%history/E(KEY)`: no key's prefix holds it (`E` has no `/`).
    pub(super) marker: Vec<u8>,
}

impl Place {
    pub(super) fn of(key: &Key) -> Place {
        let name = escape(key.as_str());
        Place {
            prefix: format!("{HISTORY}{name}/").into_bytes(),
            marker: format!("{HISTORY}{name}").into_bytes(),
        }
    }

    /// A new event's key: the prefix and 16 hex digits from the body, the time and the process.
    fn event_key(&self, body: &[u8]) -> Vec<u8> {
        use sha2::{Digest, Sha256};
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut h = Sha256::new();
        h.update(body);
        h.update(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
                .to_le_bytes(),
        );
        h.update(std::process::id().to_le_bytes());
        h.update(
            COUNT
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .to_le_bytes(),
        );
        let mut key = self.prefix.clone();
        for b in h.finalize().iter().take(8) {
            key.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        key
    }

    /// The operation that adds the event `body`.
    fn put_event(&self, body: &[u8]) -> Value {
        json!({ "request_put": { "key": b64(&self.event_key(body)), "value": b64(body) } })
    }

    /// The transaction that deletes the lock key `own`, adds the end `body` and deletes the
    /// events `past` (at most [`MAX_PRUNE`]: etcd takes 128 operations in one).
    pub(super) fn release_txn(&self, own: &[u8], body: &[u8], past: &[Vec<u8>]) -> Value {
        let mut ops = vec![
            json!({ "request_delete_range": { "key": b64(own) } }),
            self.put_event(body),
        ];
        ops.extend(
            past.iter()
                .take(MAX_PRUNE)
                .filter(|k| is_event(&self.prefix, k))
                .map(|k| json!({ "request_delete_range": { "key": b64(k) } })),
        );
        json!({ "success": ops })
    }

    /// The operations that add the start `body` and count the events, for the lock's own
    /// transaction ([`crate::history::Opening`]): the start has no token, and its create
    /// revision, the lock key's, is it ([`Place::read`] adds it).
    pub(super) fn start_ops(&self, body: &[u8]) -> [Value; 2] {
        [self.put_event(body), self.count()]
    }

    /// After a start recorded in the lock's transaction that counted `count` events: the keys
    /// of the oldest, if there are too many, for the release's transaction to delete
    /// ([`Place::release_txn`]: no write of their own). Best effort: none on a failed read.
    pub(super) fn past(&self, c: &mut Client, fail: Fail<'_>, count: i64) -> Vec<Vec<u8>> {
        let count = usize::try_from(count).unwrap_or(0);
        if count <= MAX_EVENTS + SLACK {
            return Vec::new();
        }
        let n = (count - MAX_EVENTS).min(MAX_PRUNE);
        self.range(c, fail, "ASCEND", n, true)
            .map(|kvs| kvs.into_iter().map(|kv| kv.key).collect())
            .unwrap_or_default()
    }

    /// The operation that counts the stored events (and keys deeper down, which nobody makes).
    fn count(&self) -> Value {
        json!({ "request_range": {
            "key": b64(&self.prefix),
            "range_end": b64(&prefix_end(&self.prefix)),
            "count_only": true,
        }})
    }

    /// Adds the start `body` (see the module comment for `once_per`).
    pub(super) fn begin(
        &self,
        c: &mut Client,
        fail: Fail<'_>,
        body: &[u8],
        once_per: Option<Duration>,
    ) -> anyhow::Result<Begun> {
        let Some(d) = once_per else {
            let txn = json!({ "success": [self.put_event(body), self.count()] });
            let r = call_txn(c, fail, &txn)?;
            self.prune_past(c, fail, r.range(1).map_or(0, |r| r.count));
            return Ok(Begun::Started);
        };
        // The last start, by the clocks of its host and this one: for a window longer than the
        // marker's (which lives as long as the window of the run that wrote it).
        if let Some((last, ago)) = self.last_start(c, fail, d)?
            && ago < d
        {
            return Ok(Begun::Skip { last, ago });
        }
        let ttl = crate::backend::ttl_secs_up(d);
        let g = c
            .call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))
            .map_err(fail)?;
        let lease = decode::<reply::Grant>(&g, "lease grant")
            .map_err(|e| anyhow::anyhow!("etcd: {e}"))?
            .id;
        // The marker must not exist (or be the one last seen, overdue).
        let mut compare = json!({
            "key": b64(&self.marker), "target": "CREATE", "result": "EQUAL", "create_revision": "0"
        });
        for _ in 0..3 {
            let txn = json!({
                "compare": [compare],
                "success": [
                    { "request_put": {
                        "key": b64(&self.marker), "value": b64(body), "lease": lease.to_string()
                    }},
                    self.put_event(body),
                    self.count(),
                ],
                "failure": [{ "request_range": { "key": b64(&self.marker) } }],
            });
            let r = call_txn(c, fail, &txn);
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    let _ = c.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }));
                    return Err(e);
                }
            };
            if r.succeeded {
                self.prune_past(c, fail, r.range(2).map_or(0, |r| r.count));
                return Ok(Begun::Started);
            }
            let Some(marker) = r.range(0).ok().and_then(|r| r.kvs.first()) else {
                // Gone meanwhile: try again.
                compare["create_revision"] = json!("0");
                continue;
            };
            let (ago, overdue) = judge(marker, d, lease_left(c, marker.lease));
            if !overdue {
                let _ = c.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }));
                let last = Stored {
                    at_ms: None,
                    body: marker.value.clone(),
                };
                return Ok(Begun::Skip { last, ago });
            }
            compare = json!({
                "key": b64(&self.marker), "target": "MOD", "result": "EQUAL",
                "mod_revision": marker.mod_revision.to_string()
            });
        }
        let _ = c.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }));
        anyhow::bail!(
            "etcd: the --once-per marker {} keeps changing",
            String::from_utf8_lossy(&self.marker)
        )
    }

    /// The newest start among the newest few events, and how long ago it started by its
    /// `host_ms` and this host's clock (one "in the future" started just now).
    fn last_start(
        &self,
        c: &mut Client,
        fail: Fail<'_>,
        within: Duration,
    ) -> anyhow::Result<Option<(Stored, Duration)>> {
        for kv in self.range(c, fail, "DESCEND", 8, false)? {
            let mut body = kv.value;
            body.truncate(MAX_BODY);
            let s = Stored { at_ms: None, body };
            if let Some(e) = Event::read(&s).filter(|e| e.ev == "start") {
                // A start more than DUR ahead of this host's clock (its host's clock was far
                // ahead) does not count here: the marker decides.
                let ago = e
                    .host_ms
                    .and_then(|ms| crate::history::age(now_ms(), ms, within))
                    .unwrap_or(Duration::MAX);
                return Ok(Some((s, ago)));
            }
        }
        Ok(None)
    }

    /// Deletes the oldest events when a start found `count` of them, more than [`MAX_EVENTS`]
    /// plus a slack; best effort (the next start tries again).
    fn prune_past(&self, c: &mut Client, fail: Fail<'_>, count: i64) {
        let count = usize::try_from(count).unwrap_or(0);
        if count <= MAX_EVENTS + SLACK {
            return;
        }
        let _ = self.prune(c, fail, (count - MAX_EVENTS).min(MAX_PRUNE));
    }

    fn prune(&self, c: &mut Client, fail: Fail<'_>, n: usize) -> anyhow::Result<()> {
        let old = self.range(c, fail, "ASCEND", n, true)?;
        let deletes: Vec<Value> = old
            .iter()
            .map(|kv| json!({ "request_delete_range": { "key": b64(&kv.key) } }))
            .collect();
        if !deletes.is_empty() {
            call_txn(c, fail, &json!({ "success": deletes }))?;
        }
        Ok(())
    }

    /// The event keys of the prefix in create-revision order, at most `limit`.
    fn range(
        &self,
        c: &mut Client,
        fail: Fail<'_>,
        order: &str,
        limit: usize,
        keys_only: bool,
    ) -> anyhow::Result<Vec<reply::Kv>> {
        let r = c
            .call(
                "/v3/kv/range",
                &json!({
                    "key": b64(&self.prefix),
                    "range_end": b64(&prefix_end(&self.prefix)),
                    "sort_order": order,
                    "sort_target": "CREATE",
                    "limit": limit.to_string(),
                    "keys_only": keys_only,
                }),
            )
            .map_err(fail)?;
        let r: reply::Range = decode(&r, "range").map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
        Ok(r.kvs
            .into_iter()
            .filter(|kv| is_event(&self.prefix, &kv.key))
            .collect())
    }

    /// Adds the end `body`.
    pub(super) fn end(&self, c: &mut Client, fail: Fail<'_>, body: &[u8]) -> anyhow::Result<()> {
        call_txn(c, fail, &json!({ "success": [self.put_event(body)] })).map(drop)
    }

    /// The stored events, newest first, at most [`MAX_EVENTS`].
    pub(super) fn read(&self, c: &mut Client, fail: Fail<'_>) -> anyhow::Result<Vec<Stored>> {
        Ok(self
            .range(c, fail, "DESCEND", MAX_EVENTS, false)?
            .into_iter()
            .map(|kv| {
                let mut body = kv.value;
                body.truncate(MAX_BODY);
                // A start written in the lock's own transaction: its revision is the token.
                if let Ok(token) = u64::try_from(kv.create_revision) {
                    body = crate::history::add_token(body, token);
                }
                Stored { at_ms: None, body }
            })
            .collect())
    }

    /// Deletes the events and the marker.
    pub(super) fn purge(&self, c: &mut Client, fail: Fail<'_>) -> anyhow::Result<()> {
        loop {
            let n = self.range(c, fail, "ASCEND", MAX_PRUNE, true)?.len();
            if n == 0 {
                break;
            }
            self.prune(c, fail, MAX_PRUNE)?;
        }
        c.call("/v3/kv/deleterange", &json!({ "key": b64(&self.marker) }))
            .map_err(fail)?;
        Ok(())
    }
}

impl super::EtcdBackend {
    /// The lock and the run's start in one transaction, when nobody else is in the key's queue
    /// (no key under `prefix`: etcd compares every key of a range, and none passes): the own
    /// key, the start event and the count of the key's events. `None`: someone is (or was)
    /// there, nothing was written, [`EtcdBackend::queue`] takes its turn. Else the create
    /// revision, the own key and the count of events.
    pub(super) fn alone(
        &self,
        c: &mut Client,
        req: &crate::backend::Request<'_>,
        prefix: &[u8],
        lease: i64,
        start: &crate::history::Opening,
    ) -> anyhow::Result<Option<(i64, Vec<u8>, i64)>> {
        let mut own = prefix.to_vec();
        own.extend_from_slice(format!("{lease:x}").as_bytes());
        let record = serde_json::to_vec(req.holder)?;
        let [event, count] = Place::of(req.key).start_ops(start.body());
        let txn = json!({
            "compare": [{
                "key": b64(prefix), "range_end": b64(&prefix_end(prefix)),
                "target": "CREATE", "result": "EQUAL", "create_revision": "0"
            }],
            "success": [
                { "request_put": {
                    "key": b64(&own), "value": b64(&record), "lease": lease.to_string()
                }},
                event,
                count,
            ],
        });
        let r = c.call("/v3/kv/txn", &txn).map_err(|e| self.fail(e))?;
        let r: reply::Txn = decode(&r, "transaction").map_err(|e| self.bad_reply(e))?;
        // A success must answer the three operations (two puts, then the count): anything else
        // is not etcd's answer to this transaction, and the run queues as usual (whose
        // transaction finds the own key if it was made).
        let shaped = r.responses.len() == 3
            && r.responses[..2]
                .iter()
                .all(|op| op.response_range.is_none())
            && r.range(2).is_ok();
        if !r.succeeded || !shaped {
            return Ok(None);
        }
        let count = r.range(2).map_or(0, |r| r.count);
        Ok(Some((r.header.revision, own, count)))
    }
}

/// Whether `key` is an event of the history `prefix`: `<prefix><anything without '/'>`.
pub(super) fn is_event(prefix: &[u8], key: &[u8]) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|own| !own.is_empty() && !own.contains(&b'/'))
}

fn call_txn(c: &mut Client, fail: Fail<'_>, txn: &Value) -> anyhow::Result<reply::Txn> {
    let r = c.call("/v3/kv/txn", txn).map_err(fail)?;
    decode(&r, "transaction").map_err(|e| anyhow::anyhow!("etcd: {e}"))
}

/// What `/v3/lease/timetolive` says of `lease`: (seconds left, seconds granted); `None` for no
/// lease or one not found (expired: etcd answers a TTL of -1). No answer, or one that does not
/// read, is not "gone": it says the lease is young (`(1, 1)`), so that the host clock alone
/// never takes a marker over.
fn lease_left(c: &mut Client, lease: i64) -> Option<(i64, i64)> {
    if lease == 0 {
        return None;
    }
    let young = Some((1, 1));
    let Ok(t) = c.call("/v3/lease/timetolive", &json!({ "ID": lease.to_string() })) else {
        return young;
    };
    match decode::<reply::Ttl>(&t, "timetolive") {
        Ok(t) => Some((t.ttl, t.granted)),
        Err(_) => young,
    }
}

/// For an existing marker of a window of `d`, whose lease has `left` (seconds left, granted):
/// how long ago its start was, and whether it is overdue: its lease has under a second left, is
/// gone, or is `d` old by its own count, and its start is `d` old by this host's clock.
pub(super) fn judge(marker: &reply::Kv, d: Duration, left: Option<(i64, i64)>) -> (Duration, bool) {
    let stored = Stored {
        at_ms: None,
        body: marker.value.clone(),
    };
    let host_ago = Event::read(&stored)
        .and_then(|e| e.host_ms)
        .map(|ms| Duration::from_millis(now_ms().saturating_sub(ms)));
    let lease_ago = left.map(|(left, granted)| {
        let gone = granted.saturating_sub(left.max(0)).max(0);
        Duration::from_secs(u64::try_from(gone).unwrap_or(0))
    });
    // The lease's age overstates the time since the grant by under a second (etcd truncates
    // the seconds left), so it is only trusted together with this host's clock.
    let due = left.is_none_or(|(left, _)| left <= 0) || lease_ago.is_some_and(|a| a >= d);
    let overdue = due && host_ago.is_none_or(|a| a >= d);
    let ago = match (host_ago, lease_ago) {
        (Some(a), _) if a < d => a,
        (_, Some(a)) => a.min(d),
        _ => d,
    };
    (ago, overdue)
}

impl super::EtcdBackend {
    /// [`Backend::history_keys`](crate::backend::Backend::history_keys): the keys with events
    /// under `dlock/%history/`: a walk of one keys-only range request per key (skipping past
    /// its events), at most [`MAX_EVENTS`] keys.
    pub(super) fn keys_with_history(&self) -> anyhow::Result<Vec<Key>> {
        let mut c = self.client();
        let root = HISTORY.as_bytes();
        let end = prefix_end(root);
        let mut from = root.to_vec();
        let mut keys: Vec<Key> = Vec::new();
        while keys.len() < MAX_EVENTS {
            let r = c
                .call(
                    "/v3/kv/range",
                    &json!({ "key": b64(&from), "range_end": b64(&end),
                             "keys_only": true, "limit": "1" }),
                )
                .map_err(|e| self.fail(e))?;
            let r: reply::ListedKeys = decode(&r, "range").map_err(|e| self.bad_reply(e))?;
            let Some(kv) = r.kvs.first() else { break };
            let Some(own) = kv.key.strip_prefix(root) else {
                break;
            };
            // `E(KEY)/<event>`: the next request starts past every name that begins with
            // `E(KEY)/` (names between, such as `E(KEY)-x/…`, sort before it and came first);
            // the `--once-per` marker `E(KEY)`: right after it.
            let (name, next) = match own.iter().position(|&b| b == b'/') {
                Some(slash) => (&own[..slash], [root, &own[..slash], b"0"].concat()),
                None => (own, [&kv.key[..], b"\0"].concat()),
            };
            let key = std::str::from_utf8(name)
                .ok()
                .and_then(super::names::unescape)
                .and_then(|k| Key::new(&k).ok());
            if let Some(k) = key.filter(|k| !keys.contains(k)) {
                keys.push(k);
            }
            from = next;
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kv(value: &[u8]) -> reply::Kv {
        reply::Kv {
            key: b"dlock/%history/k".to_vec(),
            value: value.to_vec(),
            create_revision: 5,
            mod_revision: 5,
            lease: 7,
        }
    }

    #[test]
    fn places_of_keys_never_hold_each_other() {
        let a = Place::of(&Key::new("a").unwrap());
        let ab = Place::of(&Key::new("a/b").unwrap());
        assert_eq!(a.prefix, b"dlock/%history/a/");
        assert_eq!(ab.prefix, b"dlock/%history/a%2Fb/");
        assert_eq!(a.marker, b"dlock/%history/a");
        assert!(!is_event(&a.prefix, &ab.marker) && !is_event(&a.prefix, &a.marker));
        let e = ab.event_key(b"x");
        assert!(is_event(&ab.prefix, &e) && !is_event(&a.prefix, &e));
        assert_eq!(e.len(), ab.prefix.len() + 16);
        assert!(!is_event(&a.prefix, b"dlock/%history/a/b/0123"));
        assert!(!is_event(&a.prefix, b"dlock/%history/a/"));
        assert_ne!(a.event_key(b"x"), a.event_key(b"x"));
    }

    #[test]
    fn a_marker_is_overdue_only_when_its_lease_and_its_start_say_so() {
        let d = Duration::from_secs(10);
        let start = |ago_ms: u64| {
            format!(
                r#"{{"run":"r1","ev":"start","host_ms":{}}}"#,
                now_ms() - ago_ms
            )
        };
        let (ago, overdue) = judge(&kv(start(3000).as_bytes()), d, Some((7, 10)));
        assert!(!overdue);
        assert!(ago >= Duration::from_secs(3) && ago < Duration::from_secs(4));
        // The lease is due, the start not yet DUR old by this clock: not overdue.
        assert!(!judge(&kv(start(9000).as_bytes()), d, Some((0, 10))).1);
        // The lease has seconds left: not overdue, however old the start says it is.
        let (ago, overdue) = judge(&kv(start(60_000).as_bytes()), d, Some((4, 10)));
        assert!(!overdue);
        assert_eq!(ago, Duration::from_secs(6));
        assert!(judge(&kv(start(10_500).as_bytes()), d, Some((0, 10))).1);
        // A window shorter than the lease's whole seconds (or etcd's minimum TTL).
        let short = Duration::from_millis(300);
        assert!(judge(&kv(start(1500).as_bytes()), short, Some((1, 2))).1);
        let (ago, overdue) = judge(&kv(start(100).as_bytes()), short, Some((1, 2)));
        assert!(!overdue && ago >= Duration::from_millis(100) && ago < short);
        assert!(judge(&kv(start(10_500).as_bytes()), d, None).1);
        // No host clock in the marker: the lease alone.
        let (ago, overdue) = judge(&kv(b"junk"), d, Some((2, 10)));
        assert!(!overdue);
        assert_eq!(ago, Duration::from_secs(8));
        assert!(judge(&kv(b"junk"), d, None).1);
    }

    proptest! {
        #[test]
        fn judge_never_panics(
            value in proptest::collection::vec(any::<u8>(), 0..64),
            ms in any::<u64>(),
            left in proptest::option::of((any::<i64>(), any::<i64>())),
            d in 0u64..1_000_000,
        ) {
            let d = Duration::from_millis(d);
            let (ago, _) = judge(&kv(&value), d, left);
            prop_assert!(ago <= d);
            let body = format!(r#"{{"run":"r","ev":"start","host_ms":{ms}}}"#);
            let (ago, _) = judge(&kv(body.as_bytes()), d, left);
            prop_assert!(ago <= d);
        }

        #[test]
        fn no_history_holds_another_keys_events(a in "[a/%:2Fb.]{1,8}", b in "[a/%:2Fb.]{1,8}") {
            prop_assume!(a != b);
            let pa = Place::of(&Key::new(&a).unwrap());
            let pb = Place::of(&Key::new(&b).unwrap());
            let theirs = pb.event_key(b"e");
            let end = prefix_end(&pa.prefix);
            prop_assert!(!(theirs >= pa.prefix && theirs < end), "{a:?} holds {b:?}'s event");
            prop_assert!(!is_event(&pa.prefix, &theirs));
            prop_assert!(!(pb.marker >= pa.prefix && pb.marker < end));
            prop_assert_ne!(pa.marker, pb.marker);
        }
    }
}
