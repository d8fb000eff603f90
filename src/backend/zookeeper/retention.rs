//! Retention on ZooKeeper ([`crate::history::retention`]), on an admin session of its own,
//! after a run has let go: a key whose newest history event was created more than the retention
//! ago loses its event nodes, its history node `[/chroot]/dlock-history/<key>` and its empty
//! lock node `[/chroot]/dlock/<key>`; an empty lock node of a key without history goes once it
//! is older than the retention (the server would reap the container too, in its own time).
//!
//! - **Held or waited for**: a key whose lock node has children (holders and waiters alike) is
//!   left alone; the lock node is deleted without a version, which the server refuses while it
//!   has children, so a lock taken meanwhile keeps it. A start or a lock node created after a
//!   delete finds its parent gone and creates it again (both writers do, on `NoNode`).
//! - **Fencing**: tokens are lock nodes' czxid, the ensemble's transaction id: it grows for
//!   every key whatever is deleted, so a key used again gets a larger token. No floor needed.
//! - **Age**: an event's ctime is the server's clock; it is compared with this host's clock, so
//!   a skew of S moves the retention by S (seconds against 30 days).
//! - **Bounded**: two listings (`/dlock-history`, `/dlock`), then at most 4 candidates per key
//!   it may remove, from a random place in the list, a few requests each.

use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError};

use super::session::op;
use super::{ROOT, ZkBackend, history};

impl ZkBackend {
    pub(super) fn prune_keys(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        let cutoff = i64::try_from(crate::history::now_ms())
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        self.admin(async |client| self.prune_in(client, cutoff, most).await)
    }

    async fn prune_in(
        &self,
        client: &Client,
        cutoff_ms: i64,
        most: usize,
    ) -> anyhow::Result<usize> {
        let history_root = format!("{}/{ROOT}-history", self.chroot);
        let lock_root = format!("{}/{ROOT}", self.chroot);
        let listed = |path: String| async move {
            match op(client.list_children(&path)).await {
                Ok(c) => Ok(c),
                Err(ZkError::NoNode) => Ok(Vec::new()),
                Err(e) => Err(anyhow::anyhow!("zookeeper: cannot list {path}: {e}")),
            }
        };
        let (with_history, locks) =
            tokio::join!(listed(history_root.clone()), listed(lock_root.clone()));
        let with_history = with_history?;
        let mut names = with_history.clone();
        let known: std::collections::HashSet<&String> = with_history.iter().collect();
        let lock_only: Vec<String> = locks?.into_iter().filter(|n| !known.contains(n)).collect();
        names.extend(lock_only.iter().cloned());
        if names.is_empty() {
            return Ok(0);
        }
        let start = usize::try_from(crate::history::now_ms()).unwrap_or(0) % names.len();
        let look = names.len().min(most.saturating_mul(4));
        let mut removed = 0;
        for name in names.iter().cycle().skip(start).take(look) {
            if removed >= most {
                break;
            }
            // Escaped keys are one segment; anything else under these nodes is not dlock's.
            if name.contains('/') || name.is_empty() {
                continue;
            }
            let lock = format!("{lock_root}/{name}");
            let gone = if known.contains(name) {
                let place = history::Place {
                    parent: format!("{history_root}/{name}"),
                    private: self.digest.is_some(),
                };
                self.prune_key(client, &place, &lock, cutoff_ms).await
            } else {
                self.prune_lock_node(client, &lock, cutoff_ms).await
            };
            if gone {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// A key with a history: removed when its newest event is older than the cutoff and its
    /// lock node has no children.
    async fn prune_key(
        &self,
        client: &Client,
        place: &history::Place,
        lock: &str,
        cutoff_ms: i64,
    ) -> bool {
        let Ok(children) = op(client.list_children(&place.parent)).await else {
            return false;
        };
        let events = history::newest_first(&children);
        if let Some((_, newest)) = events.first() {
            match op(client.check_stat(&format!("{}/{newest}", place.parent))).await {
                Ok(Some(stat)) if stat.ctime < cutoff_ms => {}
                _ => return false,
            }
        } else {
            match op(client.check_stat(&place.parent)).await {
                Ok(Some(stat)) if stat.ctime < cutoff_ms => {}
                _ => return false,
            }
        }
        if held(client, lock).await {
            return false;
        }
        if place.purge(client).await.is_err() {
            return false;
        }
        // Gone only if the history node is: a start written meanwhile keeps it (NotEmpty).
        let history_gone = matches!(op(client.check_stat(&place.parent)).await, Ok(None));
        let _ = op(client.delete(lock, None)).await;
        history_gone
    }

    /// A lock node without history: removed when older than the cutoff and empty.
    async fn prune_lock_node(&self, client: &Client, lock: &str, cutoff_ms: i64) -> bool {
        match op(client.check_stat(lock)).await {
            Ok(Some(stat)) if stat.ctime < cutoff_ms && stat.num_children == 0 => {}
            _ => return false,
        }
        op(client.delete(lock, None)).await.is_ok()
    }
}

/// Whether the lock node has children (holders or waiters), or cannot be told.
async fn held(client: &Client, lock: &str) -> bool {
    match op(client.check_stat(lock)).await {
        Ok(Some(stat)) => stat.num_children != 0,
        Ok(None) => false,
        Err(_) => true,
    }
}
