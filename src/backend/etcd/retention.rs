//! Retention on etcd ([`crate::history::retention`]), on a connection of its own, after a run
//! has let go: events written more than the retention ago (by their `host_ms`: etcd has no clock
//! to read) go, oldest first, so a key untouched for the retention loses all of its events
//! `dlock/%history/E(KEY)/…`. Nothing else stays behind: a lock's keys live only while held or
//! waited for (leased, deleted on release), and the `--once-per` marker is bound to a lease.
//!
//! - **Bounded, ~0 when nothing is due**: one range request reads the oldest events of every key
//!   (sorted by create revision, at most a few hundred); it stops at the first that is younger
//!   than the retention. An event that does not read as dlock's (no `host_ms`) counts as aged:
//!   left there, it would hold every later one back.
//! - **Held or waited for**: only history events go, never a lock key; a run that has held its
//!   lock for longer than the retention may lose its own start (as on the SQL backends).
//! - **Fencing**: tokens are the lock key's create revision, the cluster's: it grows for every
//!   key whatever is deleted, so a key used again gets a larger token. No floor needed.

use std::time::Duration;

use serde_json::json;

use super::EtcdBackend;
use super::http::{b64, prefix_end};
use super::names::HISTORY;
use super::reply::{self, decode};
use crate::history::now_ms;

/// The most events one request reads, and one prune looks at per key it may remove.
const MAX_READ: usize = 512;
const EVENTS_PER_KEY: usize = 4;
/// etcd takes 128 operations per transaction by default.
const PER_TXN: usize = 100;

impl EtcdBackend {
    pub(super) fn prune_keys(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        let mut c = self.client();
        let fail = |e| self.fail(e);
        let cutoff =
            now_ms().saturating_sub(u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX));
        let root = HISTORY.as_bytes();
        let limit = most.saturating_mul(EVENTS_PER_KEY).clamp(1, MAX_READ);
        let r = c
            .call(
                "/v3/kv/range",
                &json!({ "key": b64(root), "range_end": b64(&prefix_end(root)),
                         "sort_order": "ASCEND", "sort_target": "CREATE",
                         "limit": limit.to_string() }),
            )
            .map_err(fail)?;
        let r: reply::Range = decode(&r, "range").map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
        let mut old = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for kv in &r.kvs {
            let Some(own) = kv.key.strip_prefix(root) else {
                continue;
            };
            // A `--once-per` marker (no `/`): it expires with its lease.
            let Some(slash) = own.iter().position(|&b| b == b'/') else {
                continue;
            };
            let written = serde_json::from_slice::<serde_json::Value>(
                &kv.value[..kv.value.len().min(crate::history::MAX_EVENT_BYTES * 2)],
            )
            .ok()
            .and_then(|v| v.get("host_ms").and_then(serde_json::Value::as_u64));
            if written.is_some_and(|ms| ms >= cutoff) {
                break;
            }
            names.insert(own[..slash].to_vec());
            old.push(kv.key.clone());
        }
        for chunk in old.chunks(PER_TXN) {
            let deletes: Vec<_> = chunk
                .iter()
                .map(|k| json!({ "request_delete_range": { "key": b64(k) } }))
                .collect();
            c.call("/v3/kv/txn", &json!({ "success": deletes }))
                .map_err(fail)?;
        }
        Ok(names.len())
    }
}
