//! A held ZooKeeper lock: the session is the lease; renewals `sync` and check the node, and
//! watches report an expired session, a deleted node or a node marked by a safe break at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;
use zookeeper_client::{Client, EventType, SessionState};

use super::history::Place;
use super::queue::{Kind, lock_queue};
use super::{COMMAND_TIMEOUT, ZkError, close, op};
use crate::backend::{Begun, Grant};
use crate::backend::{Lease, Loss, LossNotifier, RenewError};

/// The data version of a lock node as created. dlock never changes its own node's data: a
/// safe `dlock break` does (the same data again, so the version goes up), and that is the mark
/// its holder stops on.
pub(super) const UNTOUCHED: i32 = 0;

/// Why a holder whose node a safe break marked stops.
fn broken(path: &str) -> String {
    format!("dlock break told it to stop (it marked the lock node {path})")
}

/// A held lock: our node, kept alive by the session.
pub(super) struct ZkLease {
    pub(super) rt: Arc<Runtime>,
    pub(super) client: Option<Client>,
    pub(super) path: String,
    pub(super) session: i64,
    /// The fencing token, when the acquiring request was sent, any hold-back.
    pub(super) grant: Grant,
    /// The negotiated session timeout.
    pub(super) ttl: Duration,
    pub(super) addr: String,
    pub(super) watch: Option<tokio::task::JoinHandle<()>>,
    /// Where the key's run history lives: exclusive leases only.
    pub(super) history: Option<Place>,
    /// The run's start went with the lock node (one `multi`: [`super::create`]).
    pub(super) started: bool,
}

impl Lease for ZkLease {
    fn grant(&self) -> Grant {
        self.grant
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn lives_unattended(&self) -> bool {
        // The client pings the server by itself; a lost session is pushed by `watch_loss`.
        true
    }

    fn renew(&mut self) -> Result<(), RenewError> {
        let Some(client) = self.client.as_ref() else {
            return Err(RenewError::Lost("the session is closed".into()));
        };
        let limit = COMMAND_TIMEOUT.min(self.ttl / 3);
        let checked = self.rt.block_on(async {
            // Both requests leave now, in order; the answer to `exists` comes after the leader's.
            let synced = client.sync(&self.path);
            let stat = client.check_stat(&self.path);
            tokio::time::timeout(limit, async { synced.await.and(stat.await) }).await
        });
        let lost = |why: String| Err(RenewError::Lost(format!("{}: {why}", self.addr)));
        match checked {
            Ok(Ok(Some(stat))) if stat.ephemeral_owner == self.session => {
                if stat.version != UNTOUCHED {
                    return lost(broken(&self.path));
                }
                Ok(())
            }
            Ok(Ok(_)) | Ok(Err(ZkError::NoNode)) => lost(format!(
                "the lock node {} was deleted (dlock break?)",
                self.path
            )),
            Ok(Err(
                e @ (ZkError::SessionExpired | ZkError::AuthFailed | ZkError::ClientClosed),
            )) => lost(format!("the session ended: {e}")),
            Ok(Err(e)) => Err(RenewError::Failed(anyhow::anyhow!("{}: {e}", self.addr))),
            Err(_) => Err(RenewError::Failed(anyhow::anyhow!(
                "{}: no answer within {limit:?}",
                self.addr
            ))),
        }
    }

    fn watch_loss(&mut self, lost: LossNotifier) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let mut states = client.state_watcher();
        let (addr, path) = (self.addr.clone(), self.path.clone());
        let (parent, ours) = path.rsplit_once('/').unwrap_or_default();
        let (parent, ours) = (parent.to_string(), ours.to_string());
        self.watch = Some(self.rt.spawn(async move {
            let tell = |why: String| lost(Loss::Ended(format!("{addr}: {why}")));
            // The session or the lock node gone, another recipe's contender in: the lock may
            // be another's now.
            let freed = |why: String| lost(Loss::Freed(format!("{addr}: {why}")));
            let deleted = || freed(format!("the lock node {path} was deleted (dlock break?)"));
            let mut warned = std::collections::HashSet::new();
            loop {
                // (An exists watch fires on a change of the node's data too: a safe break.)
                let node = match op(client.check_and_watch_stat(&path)).await {
                    Ok((Some(stat), _)) if stat.version != UNTOUCHED => return tell(broken(&path)),
                    Ok((Some(_), watcher)) => Some(watcher),
                    Ok((None, _)) => return deleted(),
                    Err(_) => None, // disconnected: watch the state; renewals check the node
                };
                // Other recipes' contenders that arrive while we hold: one that never looks at
                // dlock's nodes holds too, so the command must stop.
                let children = match op(client.list_and_watch_children(&parent)).await {
                    Ok((children, watcher)) => {
                        if let Some(why) = intruder(&children, &ours, &mut warned) {
                            return freed(why);
                        }
                        Some(watcher)
                    }
                    Err(_) => None,
                };
                let watched = node.is_some() && children.is_some();
                let mut changed = std::pin::pin!(async {
                    match node {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                });
                let mut listed = std::pin::pin!(async {
                    match children {
                        Some(w) => {
                            w.changed().await;
                        }
                        None => std::future::pending().await,
                    }
                });
                // Until a watch fires (then look again), or the session ends.
                loop {
                    tokio::select! {
                        state = states.changed() => match state {
                            SessionState::Expired => return freed("the session expired".into()),
                            SessionState::AuthFailed => return tell("authentication failed".into()),
                            SessionState::Closed => return freed("the session was closed".into()),
                            SessionState::Disconnected => crate::report::verbose(format_args!(
                                "disconnected from zookeeper {addr}; the lease holds until the session could expire"
                            )),
                            // Reconnected: watches are restored, but look again if there was none.
                            _ if !watched => break,
                            _ => {}
                        },
                        event = &mut changed => {
                            if event.event_type == EventType::NodeDeleted {
                                return deleted();
                            }
                            break;
                        }
                        _ = &mut listed => break,
                    }
                }
            }
        }));
    }

    fn release(self: Box<Self>) -> anyhow::Result<()> {
        self.finish(None);
        Ok(())
    }

    fn begin_run(&mut self, start: &[u8], once_per: Option<Duration>) -> anyhow::Result<Begun> {
        let (Some(history), Some(client)) = (self.history.as_ref(), self.client.as_ref()) else {
            return Ok(Begun::NotKept);
        };
        if std::mem::take(&mut self.started) && once_per.is_none() {
            return Ok(Begun::Started);
        }
        let ours = self.grant.fence.and_then(|f| i64::try_from(f).ok());
        self.rt
            .block_on(history.begin(client, start, once_per, ours.unwrap_or(i64::MAX)))
    }

    fn release_with_end(self: Box<Self>, end: &[u8]) -> anyhow::Result<bool> {
        Ok(self.finish(Some(end)))
    }
}

impl ZkLease {
    /// Releases the lock; with `end`, adds it to the history in the same round trip (before
    /// the delete of our node, on the same session): whether that was written.
    fn finish(mut self: Box<Self>, end: Option<&[u8]>) -> bool {
        if let Some(watch) = self.watch.take() {
            // Gone before our own delete could look like a break; its client goes with it.
            watch.abort();
            let _ = self.rt.block_on(watch);
        }
        let Some(client) = self.client.take() else {
            return false;
        };
        let history = self.history.take();
        // Our node goes first (the waiter watching it proceeds at once), then the session. The
        // key's node is a container: the server removes it when it is left empty.
        self.rt.block_on(async {
            let (Some(end), Some(h)) = (end, &history) else {
                close(client, Some(&self.path)).await;
                return false;
            };
            // The end and the delete are one transaction (one log write; the waiter proceeds on
            // the delete), and the session's close goes right behind it: one round trip.
            let prefix = h.event_prefix();
            let options = zookeeper_client::CreateMode::PersistentSequential.with_acls(h.acls());
            let mut multi = client.new_multi_writer();
            if multi.add_create(&prefix, end, &options).is_err()
                || multi.add_delete(&self.path, None).is_err()
            {
                close(client, Some(&self.path)).await;
                return false;
            }
            let commit = multi.commit();
            drop(multi);
            let (committed, ()) = tokio::join!(
                tokio::time::timeout(COMMAND_TIMEOUT, commit),
                close(client, None)
            );
            // Neither happened when it failed (our node gone after a forced break, the history
            // purged) or no answer came: the close deletes our node anyway, and the caller
            // writes the end on a session of its own.
            matches!(committed, Ok(Ok(_)))
        })
    }
}

/// Looks at a held lock's siblings (`children` of the key's node; ours is `ours`) for another
/// recipe's contender that came after us: the reason to stop the command if that recipe never
/// sees dlock's nodes (a Curator read/write lock, or a child that is not a lock node at all, such
/// as a semaphore's), else `None`. A kazoo contender sees dlock's nodes only when its lock was
/// made with `extra_lock_patterns=["-lock-"]`, which dlock cannot tell: it is warned of once.
fn intruder(
    children: &[String],
    ours: &str,
    warned: &mut std::collections::HashSet<String>,
) -> Option<String> {
    let (queue, others) = lock_queue(children.to_vec());
    if let Some(other) = others.first() {
        return Some(format!(
            "another recipe made a node '{}' beside the lock that is not a lock node (a \
             semaphore's?): it does not see dlock's lock, so it may hold too",
            crate::report::clean(other, crate::report::MAX_FIELD)
        ));
    }
    let ours = queue.iter().find(|e| e.name == ours)?.seq;
    for e in queue.iter().filter(|e| e.seq > ours) {
        let Kind::Foreign(recipe) = e.kind else {
            continue;
        };
        if recipe.ignores_dlock() {
            return Some(format!(
                "{} (node {}) joined the lock; that recipe does not see dlock's nodes, so it \
                 holds too",
                recipe.describe(),
                crate::report::clean(&e.name, crate::report::MAX_FIELD)
            ));
        }
        if warned.insert(e.name.clone()) {
            crate::report::warn(format_args!(
                "{} (node {}) queued for the lock; it waits for dlock only if it sees dlock's \
                 lock- nodes (kazoo: extra_lock_patterns=[\"-lock-\"]), else it holds too",
                recipe.describe(),
                crate::report::clean(&e.name, crate::report::MAX_FIELD)
            ));
        }
    }
    None
}
