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
//!   it may remove, from a random place in the list, their ages read in two pipelined batches:
//!   four round trips when nothing is due.

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
        // Escaped keys are one segment; anything else under these nodes is not dlock's.
        let candidates: Vec<&String> = names
            .iter()
            .cycle()
            .skip(start)
            .take(look)
            .filter(|n| !n.contains('/') && !n.is_empty())
            .collect();
        // The ages, pipelined (a session's requests are answered in order): the children of
        // every candidate's history node, then the stat of each one's newest event, so that a
        // pass that finds nothing due costs four round trips.
        let parent = |n: &str| format!("{history_root}/{n}");
        let histories: Vec<_> = candidates
            .iter()
            .filter(|n| known.contains(*n))
            .map(|n| {
                let p = parent(n);
                let listing = client.list_children(&p);
                (n.to_string(), p, listing)
            })
            .collect();
        let mut newest = Vec::new();
        for (name, p, listing) in histories {
            let Ok(children) = op(listing).await else {
                continue;
            };
            let path = match history::newest_first(&children).first() {
                Some((_, e)) => format!("{p}/{e}"),
                None => p.clone(),
            };
            let stat = client.check_stat(&path);
            newest.push((name, stat));
        }
        let mut due = Vec::new();
        for (name, stat) in newest {
            if let Ok(Some(stat)) = op(stat).await
                && stat.ctime < cutoff_ms
            {
                due.push(name);
            }
        }
        let mut removed = 0;
        for name in due {
            if removed >= most {
                break;
            }
            let place = history::Place {
                parent: parent(&name),
                private: self.digest.is_some(),
            };
            if self
                .prune_key(client, &place, &format!("{lock_root}/{name}"))
                .await
            {
                removed += 1;
            }
        }
        let lock_only: Vec<_> = candidates
            .iter()
            .filter(|n| !known.contains(*n))
            .map(|n| {
                let p = format!("{lock_root}/{n}");
                let stat = client.check_stat(&p);
                (p, stat)
            })
            .collect();
        let mut empty = Vec::new();
        for (p, stat) in lock_only {
            if let Ok(Some(stat)) = op(stat).await
                && stat.ctime < cutoff_ms
                && stat.num_children == 0
            {
                empty.push(p);
            }
        }
        for p in empty {
            if removed >= most {
                break;
            }
            if op(client.delete(&p, None)).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// A key with a history found aged out: removed unless its lock node has children.
    async fn prune_key(&self, client: &Client, place: &history::Place, lock: &str) -> bool {
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
}

/// Whether the lock node has children (holders or waiters), or cannot be told.
async fn held(client: &Client, lock: &str) -> bool {
    match op(client.check_stat(lock)).await {
        Ok(Some(stat)) => stat.num_children != 0,
        Ok(None) => false,
        Err(_) => true,
    }
}
