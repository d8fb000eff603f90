//! The ZooKeeper backend: Curator's lock recipe, with the session as the lease.
//!
//! - Layout: `[/chroot]/dlock/<escaped KEY>/_c_<uuid>-lock-<sequence>`, ephemeral-sequential
//!   nodes with Curator's "protected" names (its InterProcessMutex uses the same `lock-` name, so a
//!   Curator or kazoo client locking `/dlock/<escaped KEY>` shares the lock). The key's node is a
//!   container (the server removes it once empty); a
//!   lock node's data is its holder's metadata (JSON).
//! - Acquire: create our node, list the children, the lowest sequence holds. Any other waits on a
//!   watch of its predecessor only (FIFO, no herd), and looks again when that one goes. A create
//!   whose reply is lost to a connection loss is resolved by finding the child with our uuid and
//!   checking that its ephemeral owner is our session (CURATOR-498), never by creating another.
//! - Lease: the session; its timeout is `--ttl` as the server negotiates it (servers clamp it to
//!   their `[minSessionTimeout, maxSessionTimeout]`, and the negotiated value is what dlock uses).
//!   Every third of it the keeper sends `sync` (answered only through the leader, so a server cut
//!   off from the quorum cannot vouch) and checks that our node still exists and is ours. The
//!   supervisor stops the command once no check has succeeded for a session timeout, so a
//!   disconnected holder's command is stopped before the server could expire the session. An
//!   expired session or a deleted node is reported at once, by watches.
//! - Modes: a shared lock's node is `-read-` (it holds when no `-lock-` node is before it, and
//!   watches the nearest earlier one: a reader that arrives after a waiting writer queues behind
//!   it, so writers are not starved); a semaphore slot's is `-limitN-` (the N lowest hold; a
//!   waiter watches the children, as ZooKeeper cannot watch "any of N", so a release wakes every
//!   waiter of that key). Nodes of different modes (another N) before ours: a mode mismatch.
//! - A safe `dlock break` writes each holder's node's data again (the same record: only the
//!   version moves, see [`lease::UNTOUCHED`]); the holder's watch fires, it stops its command,
//!   then deletes its node, and only that wakes the next waiter. `--force` deletes the nodes.
//! - Fencing token: the lock node's czxid (64-bit, grows across the whole ensemble; the sequence
//!   number is 32-bit and restarts with the parent).
//! - Release: delete our node, then close the session (both leave at once), so the next waiter
//!   proceeds at once. The key's node is a container, left for the server to reap when empty.
//! - Digest credentials (`zk://user:password@host`) are sent with `addauth digest`; the key's node
//!   and its lock nodes are then `creator_all`: only that user can take, see or break those locks
//!   (the chroot and `/dlock` stay open, see [`ZkBackend::make_parents`]). Without credentials
//!   nodes are open to all (`world:anyone`).
//! - Run history ([`history`]): persistent-sequential nodes under `[/chroot]/dlock-history/<escaped
//!   KEY>`, their ctime the server's clock.
//! - The client crate (`zookeeper-client`) is async; it runs here on a tokio runtime with one
//!   worker thread (a current-thread runtime would not answer the server's pings while dlock
//!   waits for its command). The rest of dlock stays synchronous.

mod create;
mod ground;
mod history;
mod lease;
mod queue;
mod retention;
mod session;
mod url;
mod view;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::Notify;
use zookeeper_client::{Acl, Acls, AuthId, Client, CreateMode, Permission, Stat};

use super::{Backend, BreakHow, Broken, Lease, Reach, Request, escape_key};
use crate::backend::Grant;
use crate::clock::BootInstant;
use crate::exit::{Busy, Interrupted, Usage};
use crate::model::{BackendKind, Key};
use crate::model::{Holder, Mode, Status};

use self::lease::ZkLease;
use self::queue::{Kind, blocked_by, compatible, holding, lock_queue};
use self::session::{close, op, retried};
use self::url::parse_url;
use self::view::{dlock_record, holder_from};

type ZkError = zookeeper_client::Error;

const DEFAULT_URL: &str = "zk://127.0.0.1:2181";
/// One attempt to connect to one server (TCP and the session handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One request.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long closing waits for the server to confirm (the session then ends by timeout anyway).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// The session timeout asked for by `status` and `break`.
const ADMIN_SESSION: Duration = Duration::from_secs(10);
/// How soon a connected holder sees a safe break's mark: its watch on its own node is pushed
/// to it at once (within a request's time). A holder cut off from the ensemble does not see it,
/// but stops its command within its session timeout anyway, and keeps the node (and the lock)
/// until then.
const NOTICED_WITHIN: Duration = COMMAND_TIMEOUT;
/// The top node under the chroot.
const ROOT: &str = "dlock";

/// Locks on one ZooKeeper ensemble.
pub(crate) struct ZkBackend {
    /// `host:port,host:port` for the client.
    hosts: String,
    servers: u32,
    /// `""` or `/some/chroot`.
    chroot: String,
    /// `user:password` for `addauth digest`.
    digest: Option<String>,
    /// hosts and chroot, no credentials.
    addr: String,
    /// The ACL of the chroot and `/dlock` when dlock creates them.
    ancestor_acl: Vec<Acl>,
    rt: OnceLock<Arc<Runtime>>,
    /// Whether this process reached the ensemble (see [`Reach`]).
    reach: Reach,
}

/// A key's children, and when the request that listed them was sent.
type Listing = (Vec<String>, BootInstant);

/// A lock node we created and the state it was created in.
struct OurNode {
    name: String,
    stat: Stat,
}

impl ZkBackend {
    /// `urls` empty: `zk://127.0.0.1:2181`; one URL: that ensemble.
    pub(crate) fn open(urls: &[String]) -> anyhow::Result<ZkBackend> {
        let url = match urls {
            [] => DEFAULT_URL,
            [u] => u.as_str(),
            _ => {
                return Err(Usage(
                    "the zookeeper backend takes one --url (list the servers in it: zk://a:2181,b:2181,c:2181)"
                        .into(),
                )
                .into());
            }
        };
        let url = parse_url(url)?;
        let hosts = url.hosts.join(",");
        Ok(ZkBackend {
            addr: format!("{hosts}{}", url.chroot),
            servers: url.hosts.len() as u32,
            hosts,
            chroot: url.chroot,
            digest: url.digest,
            ancestor_acl: vec![Acl::new(
                Permission::READ | Permission::CREATE | Permission::DELETE,
                AuthId::anyone(),
            )],
            rt: OnceLock::new(),
            reach: Reach::default(),
        })
    }

    /// `[/chroot]/dlock/<escaped key>`.
    fn key_path(&self, key: &Key) -> String {
        format!("{}/{ROOT}/{}", self.chroot, escape_key(key))
    }

    /// Where `key`'s run history lives ([`history`]).
    fn history(&self, key: &Key) -> history::Place {
        history::Place {
            parent: history::parent_of(&self.chroot, key),
            private: self.digest.is_some(),
        }
    }

    fn acls(&self) -> Acls<'static> {
        if self.digest.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// Creates the chroot, `/dlock` (persistent) and the key's node (a container) where missing.
    /// With credentials, the ancestors stay open to all (read, create and delete, which only
    /// works on empty nodes), so that users with other credentials can lock other keys; the key's
    /// node and its lock nodes are the credentials' alone.
    async fn make_parents(&self, client: &Client, parent: &str) -> anyhow::Result<()> {
        // Usually only the key's node is missing (it is a container: the server removes it
        // when its last lock node goes).
        let options = CreateMode::Container.with_acls(self.acls());
        match retried(client, || client.create(parent, &[], &options)).await {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.fail(&format!("create {parent}"), e)),
        }
        let mut path = String::new();
        let segments: Vec<&str> = parent.split('/').skip(1).collect();
        for (i, segment) in segments.iter().enumerate() {
            path.push('/');
            path.push_str(segment);
            let options = if i + 1 == segments.len() {
                CreateMode::Container.with_acls(self.acls())
            } else {
                CreateMode::Persistent.with_acls(Acls::new(&self.ancestor_acl))
            };
            match retried(client, || client.create(&path, &[], &options)).await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(self.fail(&format!("create {path}"), e)),
            }
        }
        Ok(())
    }

    /// The metadata of lock node `name` under `parent`, best effort.
    async fn holder_of(&self, client: &Client, parent: &str, name: &str) -> Option<Holder> {
        let (data, stat) = op(client.get_data(&format!("{parent}/{name}")))
            .await
            .ok()?;
        Some(holder_from(name, &data, &stat))
    }

    /// Whether lock node `name` under `parent` is dlock's (its data is a dlock record), rather
    /// than a Curator mutex's of the same form. A node gone meanwhile is not.
    async fn is_dlock_node(&self, client: &Client, parent: &str, name: &str) -> bool {
        let path = format!("{parent}/{name}");
        match retried(client, || client.get_data(&path)).await {
            Ok((data, _)) => dlock_record(&data).is_some(),
            Err(_) => false,
        }
    }

    /// Refuses a lock whose path has children that are not lock nodes (another recipe's, such
    /// as a semaphore's): dlock cannot tell whether they hold, and that recipe never looks at
    /// dlock's nodes. Exit 75 (busy), with `--wait` or without.
    fn not_ours(&self, parent: &str, others: &[String]) -> anyhow::Result<()> {
        let Some(other) = others.first() else {
            return Ok(());
        };
        Err(Busy {
            holder: Some(format!(
                "another recipe: {parent} has a node '{}' that is not a lock node",
                crate::report::clean(other, crate::report::MAX_FIELD)
            )),
            waited: false,
            why: Some(
                "a Curator or kazoo semaphore (or another recipe that ignores lock nodes) uses \
                 this path, and dlock cannot share it; lock another key"
                    .into(),
            ),
        }
        .into())
    }

    /// Joins the queue and waits for our turn. Returns our node, when the request that showed
    /// it first was sent, and whether the run's start went with it (`req.start`, see
    /// [`create`]).
    async fn contend(
        &self,
        client: &Client,
        parent: &str,
        req: &Request<'_>,
        created: &mut Option<String>,
    ) -> anyhow::Result<(OurNode, BootInstant, bool)> {
        let data = serde_json::to_vec(req.holder)?;
        let history = self.history(req.key);
        let body = req
            .start
            .filter(|_| req.mode == Mode::Exclusive)
            .map(|o| o.body());
        let start = body.map(|body| create::Start {
            place: &history,
            body,
        });
        let made = self
            .create_node(client, parent, &data, req.mode, start)
            .await?;
        let (mut ours, mut listing) = (made.node, made.listing);
        *created = Some(format!("{parent}/{}", ours.name));
        // The start written with our node stands if the listing sent behind it shows the node
        // first, else it is taken back before anything else.
        let mut folded = made.start;
        let mut started = false;
        let notify = Arc::new(Notify::new());
        let mut guard = None;
        let mut told = None::<String>;
        loop {
            if listing.is_none()
                && let Some((path, _)) = folded.take()
            {
                self.take_back(client, &path).await?;
            }
            let (children, sent) = match listing.take() {
                Some(listed) => listed,
                None => {
                    let sent = BootInstant::now();
                    match retried(client, || client.list_children(parent)).await {
                        Ok(children) => (children, sent),
                        Err(ZkError::NoNode) => (Vec::new(), sent),
                        Err(e) => return Err(self.fail("list the lock's queue", e)),
                    }
                }
            };
            let (queue, others) = lock_queue(children);
            // (Still here only on the listing sent with the create.)
            if let Some((path, events)) = folded.take() {
                let first = queue.first().is_some_and(|e| e.name == ours.name);
                if first && others.is_empty() {
                    if let Some(events) = events {
                        history.prune_behind(client, &events);
                    }
                    started = true;
                } else {
                    self.take_back(client, &path).await?;
                }
            }
            self.not_ours(parent, &others)?;
            let Some(pos) = queue.iter().position(|e| e.name == ours.name) else {
                // Our node is gone while we waited (`dlock break` deletes the holder's node):
                // join the queue again.
                crate::report::verbose(format_args!("our lock node vanished; queueing again"));
                let made = self
                    .create_node(client, parent, &data, req.mode, None)
                    .await?;
                (ours, listing) = (made.node, made.listing);
                *created = Some(format!("{parent}/{}", ours.name));
                continue;
            };
            // A dlock user of this key in another mode before us: a usage error (exit 2). A
            // `lock-` node that is not dlock's (Curator's mutex) is waited for, never refused.
            for e in &queue[..pos] {
                let Kind::Lock(theirs) = e.kind else { continue };
                if compatible(req.mode, theirs)
                    || theirs == Mode::Exclusive
                        && !self.is_dlock_node(client, parent, &e.name).await
                {
                    continue;
                }
                return Err(super::mode_mismatch(req.key, req.mode, &theirs.describe()));
            }
            let Some(blocker) = blocked_by(&queue, pos) else {
                return Ok((ours, sent, started));
            };
            if req.waited_out() {
                let holder = self.holder_of(client, parent, &queue[0].name).await;
                return Err(req.busy(holder.as_ref()));
            }
            if told.as_deref() != Some(queue[0].name.as_str()) {
                if let Some(h) = self.holder_of(client, parent, &queue[0].name).await {
                    (req.on_holder)(&h);
                }
                told = Some(queue[0].name.clone());
            }
            let watcher = match blocker {
                Some(i) => {
                    let node = format!("{parent}/{}", queue[i].name);
                    match retried(client, || client.check_and_watch_stat(&node)).await {
                        Ok((Some(_), watcher)) => watcher,
                        Ok((None, _)) => continue, // gone already
                        Err(e) => return Err(self.fail("watch the lock's queue", e)),
                    }
                }
                None => {
                    // A semaphore: any holder's going frees a slot. ZooKeeper has no watch for
                    // "one of these N", so watch the children (every waiter of the key wakes).
                    let sent = BootInstant::now();
                    match retried(client, || client.list_and_watch_children(parent)).await {
                        Ok((children, watcher)) => {
                            if lock_queue(children.clone()) != (queue, Vec::new()) {
                                listing = Some((children, sent));
                                continue; // changed since we looked: look again first
                            }
                            watcher
                        }
                        Err(e) => return Err(self.fail("watch the lock's queue", e)),
                    }
                }
            };
            if guard.is_none() {
                let n = notify.clone();
                guard = Some(req.interrupt.on_fire(move || n.notify_one())?);
            }
            if let Some(sig) = req.interrupt.fired() {
                return Err(Interrupted(sig).into());
            }
            let left = req.deadline.remaining();
            tokio::select! {
                // The predecessor went (or changed, or the session did): look again.
                _ = watcher.changed() => {}
                _ = notify.notified() => {}
                _ = tokio::time::sleep(left.unwrap_or_default()), if left.is_some() => {}
            }
            if let Some(sig) = req.interrupt.fired() {
                return Err(Interrupted(sig).into());
            }
        }
    }
}

impl ZkBackend {
    /// The keys a node below the chroot has as children (each an escaped key; at most
    /// `MAX_LISTED`); none when the node is missing.
    fn keys_below(&self, node: &str) -> anyhow::Result<Vec<Key>> {
        let root = format!("{}/{node}", self.chroot);
        self.admin(
            async |client| match retried(client, || client.list_children(&root)).await {
                Ok(children) => Ok(children
                    .iter()
                    .filter_map(|c| super::unescape_key(c))
                    .take(super::MAX_LISTED)
                    .collect()),
                Err(ZkError::NoNode) => Ok(Vec::new()),
                Err(e) => Err(self.fail(&format!("list {root}"), e)),
            },
        )
    }
}

impl Backend for ZkBackend {
    /// The children of `/dlock`: each is an escaped key.
    fn list_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_below(ROOT)
    }

    /// The children of `/dlock-history`: each is an escaped key.
    fn history_keys(&self) -> anyhow::Result<Vec<Key>> {
        self.keys_below(&format!("{ROOT}-history"))
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Zookeeper
    }

    fn location(&self) -> String {
        self.addr.clone()
    }

    fn unsupported(&self, _mode: Mode) -> Option<String> {
        None
    }

    fn acquire(&self, req: &Request<'_>) -> anyhow::Result<Box<dyn Lease>> {
        let rt = self.runtime()?;
        let parent = self.key_path(req.key);
        // A signal must end the connect too (a server that never answers would hold it for
        // the whole connect timeout).
        let notify = Arc::new(Notify::new());
        let n = notify.clone();
        let connecting = req.interrupt.on_fire(move || n.notify_one())?;
        if let Some(sig) = req.interrupt.fired() {
            return Err(Interrupted(sig).into());
        }
        let (client, ours, sent, started) = rt.block_on(async {
            let client = tokio::select! {
                client = self.connect(req.ttl) => client?,
                _ = notify.notified() => return Err(Interrupted(req.interrupt.fired().unwrap_or(libc::SIGINT)).into()),
            };
            drop(connecting);
            if let Some(sig) = req.interrupt.fired() {
                close(client, None).await;
                return Err(Interrupted(sig).into());
            }
            let mut created = None;
            match self.contend(&client, &parent, req, &mut created).await {
                Ok((ours, sent, started)) => Ok((client, ours, sent, started)),
                Err(e) => {
                    // Nothing stays queued: our node goes (closing the session would delete it
                    // too), and the session.
                    close(client, created.as_deref()).await;
                    Err(e)
                }
            }
        })?;
        let ttl = client.session_timeout();
        if ttl < req.ttl {
            // A shorter lease than asked: said once (doctor says it too).
            crate::backend::ground::warn_once(&ground::session_finding(req.ttl, ttl));
        } else if ttl != req.ttl {
            crate::report::verbose(format_args!(
                "the server set the session timeout to {ttl:?} (asked {:?}); that is the lease",
                req.ttl
            ));
        }
        Ok(Box::new(ZkLease {
            session: client.session_id().0,
            grant: Grant {
                fence: Some(u64::try_from(ours.stat.czxid).unwrap_or_default()),
                acquired_at: sent,
                held_back_until: None,
            },
            path: format!("{parent}/{}", ours.name),
            client: Some(client),
            ttl,
            addr: self.addr.clone(),
            watch: None,
            rt,
            history: (req.mode == Mode::Exclusive).then(|| self.history(req.key)),
            started,
        }))
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let queue = self.admin(async |client| self.queue_of(client, key).await)?;
        Ok(self.status_of(key, queue))
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let parent = self.key_path(key);
        let history = self.history(key);
        self.admin(async |client| {
            history.purge(client).await?;
            match retried(client, || client.delete(&parent, None)).await {
                Ok(()) | Err(ZkError::NoNode) | Err(ZkError::NotEmpty) => Ok(()),
                Err(e) => Err(self.fail(&format!("delete {parent}"), e)),
            }
        })
    }

    fn prune(&self, older_than: Duration, most: usize) -> anyhow::Result<usize> {
        self.prune_keys(older_than, most)
    }

    fn runs(&self, key: &Key) -> anyhow::Result<Vec<crate::history::Stored>> {
        let history = self.history(key);
        self.admin(async |client| history.read(client).await)
    }

    fn end_run(&self, key: &Key, end: &[u8]) -> anyhow::Result<()> {
        let history = self.history(key);
        self.admin(async |client| history.end(client, end).await)
    }

    fn doctor(&self, ttl: Duration) -> anyhow::Result<Vec<crate::backend::ground::Finding>> {
        self.checks(ttl)
    }

    /// Safe: marks each dlock holder's node by writing its data again (the same record, so only
    /// the version moves: [`lease::UNTOUCHED`]). The node stays, and with it the lock: the
    /// holder's watch on its node fires, it stops its command as on any loss, then deletes its
    /// node, and only that wakes the next waiter (which watches its predecessor's deletion). The
    /// node is ephemeral: a holder that died takes it along when its session expires. Forced:
    /// deletes the holders' nodes, and the first waiter gets the lock at once. Waiters keep their
    /// places either way. Another recipe's nodes are left alone: their clients do not watch
    /// their own nodes, so they would go on as holders (a safe break is refused before this).
    fn break_lock(&self, key: &Key, how: BreakHow) -> anyhow::Result<Broken> {
        let (queue, kept, marked) = self.admin(async |client| {
            let queue = self.queue_of(client, key).await?;
            let mut kept = Vec::new();
            let mut marked = Vec::new();
            let held = holding(&queue.entries);
            for (i, (e, h)) in queue.entries[..held].iter().zip(&queue.holders).enumerate() {
                if h.foreign.is_some() {
                    kept.push(e.name.clone());
                    continue;
                }
                let path = format!("{}/{}", queue.parent, e.name);
                match how {
                    BreakHow::Safe => {
                        if self.mark(client, &path).await? {
                            marked.push(i);
                        }
                    }
                    BreakHow::Force => match retried(client, || client.delete(&path, None)).await {
                        Ok(()) | Err(ZkError::NoNode) => {}
                        Err(e) => return Err(self.fail(&format!("delete {path}"), e)),
                    },
                }
            }
            Ok((queue, kept, marked))
        })?;
        let mut status = self.status_of(key, queue);
        for name in kept {
            status.notes.push(format!(
                "node {name} is not dlock's and was left in place: its client would not notice \
                 its deletion and would go on holding"
            ));
        }
        if marked.is_empty() {
            return Ok(Broken::now(status));
        }
        for i in marked {
            if let Some(h) = status.holders.get_mut(i) {
                h.broken = true;
            }
        }
        Ok(Broken {
            status,
            frees: super::Frees::WhenStopped(NOTICED_WITHIN),
            keep: None,
        })
    }
}

impl ZkBackend {
    /// Marks the lock node at `path` as broken (see [`lease::UNTOUCHED`]): whether it is marked
    /// now (by this break or an earlier one), `false` when it is gone. The write is conditional
    /// on the version just read, so it never lands on a node that changed meanwhile.
    async fn mark(&self, client: &Client, path: &str) -> anyhow::Result<bool> {
        for _ in 0..5 {
            let (data, stat) = match retried(client, || client.get_data(path)).await {
                Ok(read) => read,
                Err(ZkError::NoNode) => return Ok(false),
                Err(e) => return Err(self.fail(&format!("read {path}"), e)),
            };
            if stat.version != lease::UNTOUCHED {
                return Ok(true);
            }
            match retried(client, || client.set_data(path, &data, Some(stat.version))).await {
                Ok(_) => return Ok(true),
                Err(ZkError::NoNode) => return Ok(false),
                // Written meanwhile (by another break, or by this one before a lost reply).
                Err(ZkError::BadVersion) => continue,
                Err(e) => return Err(self.fail(&format!("mark {path}"), e)),
            }
        }
        Err(self.fail(&format!("mark {path}"), ZkError::BadVersion))
    }
}
