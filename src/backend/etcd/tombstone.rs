//! A safe `dlock break` on etcd: each holder's key becomes a tombstone that keeps the lock for
//! as long as the holder may still run its command, and no longer than it has to.
//!
//! The break grants a lease of its own, as long as the longest the holders' leases were
//! granted for (and a second), and moves each holder's key onto it: a put on an existing key
//! keeps its create revision, so the key keeps its place at the head of the queue, and the
//! waiters, which watch their predecessor's deletion (puts filtered out), keep waiting. Then it
//! revokes the holders' own leases. The holder's next renewal fails (its keep-alive finds no
//! lease; its key is on another lease): it stops its command as on any loss, and then deletes
//! its tombstone (only while the key is the one it created: a compare on the create revision),
//! which hands the lock on at once. A holder that never comes back ran its command at most a
//! lease past its last renewal, and that renewal was before the move (its check of the key
//! found it on its own lease); the tombstone's lease, granted just before the move, runs out
//! only after that.

use std::time::{Duration, Instant};

use serde_json::json;

use super::http::{Client, b64};
use super::names::lock_prefix;
use super::queue::{Entry, holders};
use super::reply::{self, decode};
use super::{EtcdBackend, revoke_lease};
use crate::backend::{Backend, Broken, Frees};
use crate::model::Key;

/// Added to the tombstones' lease: more than the move takes after the grant (else the break
/// keeps the lease alive once more).
const MARGIN: Duration = Duration::from_secs(1);

impl EtcdBackend {
    /// The safe break (see the module documentation).
    pub(super) fn break_safely(&self, key: &Key) -> anyhow::Result<Broken> {
        let mut status = self.status(key)?;
        let mut c = self.client();
        let (entries, _) = self.entries(&mut c, &lock_prefix(key), None)?;
        let held = &entries[..holders(&entries)];
        // dlock's holders not broken yet (another recipe's are refused by the command first).
        let targets: Vec<&Entry> = held
            .iter()
            .filter(|e| e.record.is_some() && !e.broken())
            .collect();
        let mut longest = 0;
        for e in &targets {
            longest = longest.max(self.granted(&mut c, e.lease)?);
        }
        let mut moved = Vec::new();
        let mut ttl = 0;
        if longest > 0 {
            ttl = longest.saturating_add(MARGIN.as_secs() as i64);
            let sent = Instant::now();
            let g = c
                .call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))
                .map_err(|e| self.fail(e))?;
            let g: reply::Grant = decode(&g, "lease grant").map_err(|e| self.bad_reply(e))?;
            ttl = ttl.max(g.ttl);
            for e in &targets {
                if self.entomb(&mut c, e, g.id)? {
                    moved.push(e.key.clone());
                }
            }
            if moved.is_empty() {
                let _ = revoke_lease(&mut c, g.id);
            } else if sent.elapsed() >= MARGIN {
                // The moves took longer than the margin: the tombstones' lease starts again.
                c.call("/v3/lease/keepalive", &json!({ "ID": g.id.to_string() }))
                    .map_err(|e| self.fail(e))?;
            }
            for e in targets.iter().filter(|e| moved.contains(&e.key)) {
                // What makes the holder's keep-alive fail (a dlock that only checks its lease
                // notices too); its key is on the tombstones' lease now, so nothing goes.
                if let Err(err) = revoke_lease(&mut c, e.lease) {
                    status.notes.push(format!(
                        "could not revoke lease {:x} ({err}): its holder still sees the break at \
                         its next renewal (its key is on another lease)",
                        e.lease
                    ));
                }
            }
        }
        let mut left = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
        let mut any = false;
        for h in &mut status.holders {
            let node = h.node.as_deref().map(str::as_bytes);
            if moved.iter().any(|k| Some(k.as_slice()) == node) {
                h.broken = true;
            }
            if h.broken {
                any = true;
                let was = Duration::from_millis(h.lease_left_ms.unwrap_or(0));
                left = left.max(was);
            }
        }
        if !any {
            return Ok(Broken::now(status));
        }
        Ok(Broken {
            status,
            frees: Frees::Within(left),
            keep: None,
        })
    }

    /// The TTL `lease` was granted with, in seconds; 0 for a lease that is gone.
    fn granted(&self, c: &mut Client, lease: i64) -> anyhow::Result<i64> {
        let t = c
            .call("/v3/lease/timetolive", &json!({ "ID": lease.to_string() }))
            .map_err(|e| self.fail(e))?;
        let t: reply::Ttl = decode(&t, "timetolive").map_err(|e| self.bad_reply(e))?;
        Ok(if t.ttl > 0 { t.granted.max(t.ttl) } else { 0 })
    }

    /// Moves the holder's key `e` onto `lease` (the same record), only while it is the key the
    /// holder created: whether it moved.
    fn entomb(&self, c: &mut Client, e: &Entry, lease: i64) -> anyhow::Result<bool> {
        let Some(record) = &e.record else {
            return Ok(false);
        };
        let value = serde_json::to_vec(&record.record)?;
        let txn = json!({
            "compare": [{
                "key": b64(&e.key), "target": "CREATE", "result": "EQUAL",
                "create_revision": e.rev.to_string(),
            }],
            "success": [{ "request_put": {
                "key": b64(&e.key), "value": b64(&value), "lease": lease.to_string()
            }}],
        });
        let r = c.call("/v3/kv/txn", &txn).map_err(|e| self.fail(e))?;
        let r: reply::Txn = decode(&r, "transaction").map_err(|e| self.bad_reply(e))?;
        Ok(r.succeeded)
    }
}

/// The holder's own key as its renewal reads it (keys only): its create revision and lease.
pub(super) fn own_key(c: &mut Client, key: &[u8]) -> Result<Option<reply::Kv>, String> {
    let r = c
        .call(
            "/v3/kv/range",
            &json!({ "key": b64(key), "keys_only": true }),
        )
        .map_err(|e| e.to_string())?;
    let r: reply::Range = decode(&r, "range")?;
    Ok(r.kvs.into_iter().find(|kv| kv.key == key))
}

/// A broken holder's last step, once its command has stopped: deletes its tombstone (only while
/// the key is the one it created), which hands the lock on without waiting for the tombstone's
/// lease. Best effort: the tombstone's lease ends it anyway.
pub(super) fn clear(c: &mut Client, key: &[u8], rev: i64) {
    let txn = json!({
        "compare": [{
            "key": b64(key), "target": "CREATE", "result": "EQUAL",
            "create_revision": rev.to_string(),
        }],
        "success": [{ "request_delete_range": { "key": b64(key) } }],
    });
    let _ = c.call("/v3/kv/txn", &txn);
}
