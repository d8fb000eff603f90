//! Retention on etcd ([`crate::history::retention`]), on a connection of its own, after a run
//! has let go: a key whose newest event was written more than the retention ago (by its
//! `host_ms`: etcd has no clock to read) loses its events `dlock/%history/E(KEY)/…`. Nothing else
//! stays behind: a lock's keys live only while held or waited for (leased, deleted on release),
//! and the `--once-per` marker is bound to a lease.
//!
//! - **Held or waited for**: the events go in one transaction that compares the lock's range
//!   `dlock/E(KEY)/` empty (every key in it at create revision 0, which etcd says of an empty
//!   range) and no event newer than the one judged: a holder or a waiter, or a start written
//!   meanwhile, makes it fail and the key stays.
//! - **Fencing**: tokens are the lock key's create revision, the cluster's: it grows for every
//!   key whatever is deleted, so a key used again gets a larger token. No floor needed.
//! - **Bounded**: it walks the history's key names from a random place, one small range request
//!   per name (skipping a name's events at once), at most 4 names per key it may remove.

use std::time::Duration;

use serde_json::json;

use super::EtcdBackend;
use super::http::{Client, b64, prefix_end};
use super::names::{HISTORY, ROOT};
use super::reply::{self, decode};
use crate::history::now_ms;

impl EtcdBackend {
    pub(super) fn prune_keys(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        let mut c = self.client();
        let fail = |e| self.fail(e);
        let cutoff =
            now_ms().saturating_sub(u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX));
        let root = HISTORY.as_bytes();
        let end = prefix_end(root);
        // A random place to start from: a printable byte after the prefix.
        let mut at = root.to_vec();
        at.push(b' ' + u8::try_from(now_ms() % 95).unwrap_or(0));
        let start = at.clone();
        let mut wrapped = false;
        let mut removed = 0;
        for _ in 0..most.saturating_mul(4) {
            if removed >= most {
                break;
            }
            let r = c
                .call(
                    "/v3/kv/range",
                    &json!({ "key": b64(&at), "range_end": b64(&end), "limit": "1", "keys_only": true }),
                )
                .map_err(fail)?;
            let r: reply::Range = decode(&r, "range").map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
            let Some(kv) = r.kvs.into_iter().next() else {
                if wrapped {
                    break;
                }
                wrapped = true;
                at = root.to_vec();
                continue;
            };
            let Some(own) = kv.key.strip_prefix(root) else {
                break;
            };
            let (name, next) = match own.iter().position(|&b| b == b'/') {
                // An event: the next name comes after all of this one's events.
                Some(i) => {
                    let name = own[..i].to_vec();
                    let mut events = root.to_vec();
                    events.extend_from_slice(&name);
                    events.push(b'/');
                    (Some(name), prefix_end(&events))
                }
                // A marker (it expires with its lease): the next key is right after it.
                None => {
                    let mut next = kv.key.clone();
                    next.push(0);
                    (None, next)
                }
            };
            // Once around: back where this pass started.
            if wrapped && kv.key >= start {
                break;
            }
            at = next;
            if let Some(name) = name
                && prune_name(&mut c, &name, cutoff, &fail)?
            {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// One key's events, when its newest is older than `cutoff_ms` and its lock is free.
fn prune_name(
    c: &mut Client,
    name: &[u8],
    cutoff_ms: u64,
    fail: &dyn Fn(super::http::Error) -> anyhow::Error,
) -> anyhow::Result<bool> {
    let mut events = HISTORY.as_bytes().to_vec();
    events.extend_from_slice(name);
    events.push(b'/');
    let events_end = prefix_end(&events);
    let r = c
        .call(
            "/v3/kv/range",
            &json!({ "key": b64(&events), "range_end": b64(&events_end), "limit": "1",
                     "sort_order": "DESCEND", "sort_target": "CREATE" }),
        )
        .map_err(fail)?;
    let r: reply::Range = decode(&r, "range").map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
    let Some(newest) = r.kvs.into_iter().next() else {
        return Ok(false);
    };
    // Bounded: an event is a few KiB; anything that does not read as one is judged by nothing
    // and left alone.
    let written = serde_json::from_slice::<serde_json::Value>(
        &newest.value[..newest.value.len().min(crate::history::MAX_EVENT_BYTES * 2)],
    )
    .ok()
    .and_then(|v| v.get("host_ms").and_then(serde_json::Value::as_u64));
    if written.is_none_or(|ms| ms >= cutoff_ms) {
        return Ok(false);
    }
    let mut lock = ROOT.as_bytes().to_vec();
    lock.extend_from_slice(name);
    lock.push(b'/');
    let txn = json!({
        "compare": [
            { "key": b64(&lock), "range_end": b64(&prefix_end(&lock)),
              "target": "CREATE", "result": "EQUAL", "create_revision": "0" },
            { "key": b64(&events), "range_end": b64(&events_end),
              "target": "CREATE", "result": "LESS",
              "create_revision": newest.create_revision.saturating_add(1).to_string() },
        ],
        "success": [{ "request_delete_range": { "key": b64(&events), "range_end": b64(&events_end) } }],
    });
    let r = c.call("/v3/kv/txn", &txn).map_err(fail)?;
    let t: reply::Txn = decode(&r, "transaction").map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
    Ok(t.succeeded)
}
