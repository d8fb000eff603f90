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
//! - Fencing token: the lock node's czxid (64-bit, grows across the whole ensemble; the sequence
//!   number is 32-bit and restarts with the parent).
//! - Release: delete our node, then close the session (both leave at once), so the next waiter
//!   proceeds at once. The key's node is a container, left for the server to reap when empty.
//! - Digest credentials (`zk://user:password@host`) are sent with `addauth digest`; the key's node
//!   and its lock nodes are then `creator_all`: only that user can take, see or break those locks
//!   (the chroot and `/dlock` stay open, see [`ZkBackend::make_parents`]). Without credentials
//!   nodes are open to all (`world:anyone`).
//! - The client crate (`zookeeper-client`) is async; it runs here on a tokio runtime with one
//!   worker thread (a current-thread runtime would not answer the server's pings while dlock
//!   waits for its command). The rest of dlock stays synchronous.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::runtime::Runtime;
use tokio::sync::Notify;
use zookeeper_client::{
    Acl, Acls, AuthId, Client, CreateMode, CreateSequence, EventType, MultiReadResult, Permission,
    SessionState, Stat,
};

use super::{
    Backend, Holder, Lease, LossNotifier, Mode, RenewError, Request, Status, escape_key,
    percent_decode,
};
use crate::clock::BootInstant;
use crate::config::{BackendKind, Key, redact};
use crate::exit::{Interrupted, Unavailable, Usage};

type ZkError = zookeeper_client::Error;

const DEFAULT_URL: &str = "zk://127.0.0.1:2181";
const DEFAULT_PORT: u16 = 2181;
/// One attempt to connect to one server (TCP and the session handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One request.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long closing waits for the server to confirm (the session then ends by timeout anyway).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// The session timeout asked for by `status` and `break`.
const ADMIN_SESSION: Duration = Duration::from_secs(10);
/// The part of a lock node's name between the uuid and the sequence: Curator's `-lock-` for an
/// exclusive lock, `-read-` for a shared one, `-limitN-` for a slot of a semaphore of N.
fn node_kind(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "-lock-".into(),
        Mode::Shared => "-read-".into(),
        Mode::Limit(n) => format!("-limit{n}-"),
    }
}

/// The mode a lock node's name says (`None`: not a lock node of ours).
fn kind_of(name: &str) -> Option<Mode> {
    let (head, seq) = name.rsplit_once('-')?;
    seq.parse::<u32>().ok()?;
    match head.rsplit_once('-')?.1 {
        "lock" => Some(Mode::Exclusive),
        "read" => Some(Mode::Shared),
        k => Some(Mode::Limit(k.strip_prefix("limit")?.parse().ok()?)),
    }
}

/// Whether a node of kind `theirs` and a request for `want` can share a queue: semaphores only
/// with the same N, exclusive and shared locks with each other.
fn compatible(want: Mode, theirs: Mode) -> bool {
    match (want, theirs) {
        (Mode::Limit(a), Mode::Limit(b)) => a == b,
        (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
        _ => true,
    }
}

/// What the node at `pos` of a queue waits for: `None` if it holds; `Some(Some(i))`: the node at
/// `i` (the predecessor of an exclusive node, the nearest earlier exclusive node of a shared
/// one); `Some(None)`: any change of the queue (a semaphore slot frees when any holder goes).
fn blocked_by(queue: &[String], pos: usize) -> Option<Option<usize>> {
    match kind_of(&queue[pos])? {
        Mode::Exclusive => (pos > 0).then(|| Some(pos - 1)),
        Mode::Shared => queue[..pos]
            .iter()
            .rposition(|n| kind_of(n) == Some(Mode::Exclusive))
            .map(Some),
        Mode::Limit(n) => (pos >= n as usize).then_some(None),
    }
}
/// The top node under the chroot.
const ROOT: &str = "dlock";

/// Locks on one ZooKeeper ensemble.
pub struct ZkBackend {
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
}

/// The parts of a `zk://` URL.
#[derive(Debug, PartialEq, Eq)]
struct ZkUrl {
    hosts: Vec<String>,
    chroot: String,
    digest: Option<String>,
}

/// `zk://[user:password@]host[:port][,host[:port]...][/chroot]` (or `zookeeper://`).
fn parse_url(url: &str) -> Result<ZkUrl, Usage> {
    let bad = |why: &str| Usage(format!("bad zookeeper URL '{}': {why}", redact(url)));
    let rest = match url.split_once("://") {
        Some((scheme, rest))
            if matches!(scheme.to_ascii_lowercase().as_str(), "zk" | "zookeeper") =>
        {
            rest
        }
        _ => return Err(bad("expected zk://host:port[,host:port...][/chroot]")),
    };
    if rest.contains(['?', '#']) {
        return Err(bad("no query or fragment is understood"));
    }
    let (authority, chroot) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let digest = match userinfo {
        None => None,
        Some(u) => {
            let (user, pass) = u
                .split_once(':')
                .ok_or_else(|| bad("credentials must be user:password"))?;
            let decode = |s: &str| {
                percent_decode(s)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| bad("invalid %-escape in the credentials"))
            };
            let user = decode(user)?;
            if user.is_empty() || user.contains(':') {
                return Err(bad("the user name must be non-empty and without ':'"));
            }
            Some(format!("{user}:{}", decode(pass)?))
        }
    };
    let mut hosts = Vec::new();
    for part in hostlist.split(',') {
        let (host, port) = match part.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => {
                let port: u16 = p
                    .parse()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| bad(&format!("bad port '{p}'")))?;
                (h, port)
            }
            _ => (part, DEFAULT_PORT),
        };
        if host.is_empty() || host.contains(['@', ' ']) {
            return Err(bad("expected host[:port] for every server"));
        }
        hosts.push(format!("{host}:{port}"));
    }
    let chroot = chroot.trim_end_matches('/');
    for segment in chroot.split('/').skip(1) {
        if segment.is_empty()
            || segment == "."
            || segment == ".."
            || segment.contains(char::is_control)
        {
            return Err(bad("the chroot must be a plain absolute path"));
        }
    }
    Ok(ZkUrl {
        hosts,
        chroot: chroot.to_string(),
        digest,
    })
}

/// A random (version 4) UUID, as Curator's protected names use.
fn uuid_v4() -> anyhow::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).context("no randomness for a lock node name")?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// The lock nodes among a key's children, lowest sequence (the holder) first. Other children
/// (not made by a lock recipe) are ignored, as Curator does.
fn lock_queue(children: Vec<String>) -> Vec<String> {
    let mut queue: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| {
            kind_of(&c)?;
            let seq = c.rsplit_once('-')?.1.parse::<i64>().ok()?;
            Some((seq, c))
        })
        .collect();
    queue.sort();
    queue.into_iter().map(|(_, c)| c).collect()
}

/// Runs one request, bounded by [`COMMAND_TIMEOUT`] (a lost reply counts as a connection loss).
async fn op<T>(request: impl Future<Output = Result<T, ZkError>>) -> Result<T, ZkError> {
    tokio::time::timeout(COMMAND_TIMEOUT, request)
        .await
        .unwrap_or(Err(ZkError::ConnectionLoss))
}

/// Waits (up to `limit`) until the session is connected again after a connection loss.
async fn reconnected(client: &Client, limit: Duration) -> Result<(), ZkError> {
    let mut states = client.state_watcher();
    let until = Instant::now() + limit;
    loop {
        match client.state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
            SessionState::Expired => return Err(ZkError::SessionExpired),
            SessionState::AuthFailed => return Err(ZkError::AuthFailed),
            SessionState::Closed => return Err(ZkError::ClientClosed),
            SessionState::Disconnected => {}
        }
        let left = until.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, states.changed()).await.is_err() {
            return Err(ZkError::ConnectionLoss);
        }
    }
}

/// Runs `request` again after connection losses while the session may still be alive.
async fn retried<T, F, Fut>(client: &Client, mut request: F) -> Result<T, ZkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ZkError>>,
{
    let until = Instant::now() + client.session_timeout();
    loop {
        match op(request()).await {
            Err(ZkError::ConnectionLoss) if Instant::now() < until => {
                reconnected(client, until.saturating_duration_since(Instant::now())).await?;
            }
            other => return other,
        }
    }
}

/// Deletes `node` (if any) and closes the session (the server deletes its ephemeral nodes at
/// once and wakes their watchers), waiting briefly for the server to confirm. The two requests
/// leave together: one round trip.
async fn close(client: Client, node: Option<&str>) {
    let mut states = client.state_watcher();
    let deleted = node.map(|path| client.delete(path, None));
    drop(client);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        if let Some(deleted) = deleted {
            let _ = deleted.await;
        }
        while !states.changed().await.is_terminated() {}
    })
    .await;
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
    pub fn open(urls: &[String]) -> anyhow::Result<ZkBackend> {
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
        })
    }

    fn runtime(&self) -> anyhow::Result<Arc<Runtime>> {
        if let Some(rt) = self.rt.get() {
            return Ok(rt.clone());
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .thread_name("dlock-zk")
            .enable_time()
            .build()
            .context("cannot start the ZooKeeper client's runtime")?;
        Ok(self.rt.get_or_init(|| Arc::new(rt)).clone())
    }

    /// `[/chroot]/dlock/<escaped key>`.
    fn key_path(&self, key: &Key) -> String {
        format!("{}/{ROOT}/{}", self.chroot, escape_key(key))
    }

    fn acls(&self) -> Acls<'static> {
        if self.digest.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    fn fail(&self, doing: &str, e: ZkError) -> anyhow::Error {
        match e {
            ZkError::NoAuth => Unavailable(format!(
                "{}: not authorized to {doing}: the lock's nodes belong to other \
                 credentials (give them in DLOCK_URL as zk://user:password@host)",
                self.addr
            ))
            .into(),
            e => Unavailable(format!("{}: cannot {doing}: {e}", self.addr)).into(),
        }
    }

    /// A new session. Each server is tried once, for at most [`CONNECT_TIMEOUT`].
    async fn connect(&self, session_timeout: Duration) -> anyhow::Result<Client> {
        let mut connector = Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(CONNECT_TIMEOUT)
            .with_fail_eagerly();
        if let Some(d) = &self.digest {
            connector = connector.with_auth("digest", d.as_bytes());
        }
        let bound = CONNECT_TIMEOUT * (self.servers + 1);
        let client = match tokio::time::timeout(bound, connector.connect(&self.hosts)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                let e = match e {
                    ZkError::NoHosts => "no server answered".to_string(),
                    e => e.to_string(),
                };
                return Err(Unavailable(format!("cannot connect to {}: {e}", self.addr)).into());
            }
            Err(_) => {
                return Err(Unavailable(format!(
                    "cannot connect to {}: no answer within {bound:?}",
                    self.addr
                ))
                .into());
            }
        };
        Ok(client)
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

    /// Creates our ephemeral-sequential node under `parent`. After a connection loss the create
    /// may have happened: look for our uuid (owned by our session) before trying again.
    async fn create_node(
        &self,
        client: &Client,
        parent: &str,
        data: &[u8],
        mode: Mode,
    ) -> anyhow::Result<(OurNode, Option<Listing>)> {
        let uuid = uuid_v4()?;
        let kind = node_kind(mode);
        let prefix = format!("{parent}/_c_{uuid}{kind}");
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let named = |seq: CreateSequence| format!("_c_{uuid}{kind}{seq}");
        for _ in 0..10 {
            // The listing is sent right behind the create, in one round trip: a session's
            // requests are answered in order, so it includes our node.
            let sent = BootInstant::now();
            let created = client.create(&prefix, data, &options);
            let listed = client.list_children(parent);
            let (created, listed) = tokio::join!(op(created), op(listed));
            match created {
                Ok((stat, seq)) => {
                    let node = OurNode {
                        name: named(seq),
                        stat,
                    };
                    return Ok((node, listed.ok().map(|children| (children, sent))));
                }
                Err(ZkError::NoNode) => self.make_parents(client, parent).await?,
                Err(ZkError::ConnectionLoss) => {
                    reconnected(client, client.session_timeout())
                        .await
                        .map_err(|e| self.fail("create a lock node", e))?;
                    if let Some(node) = self.find_ours(client, parent, &uuid).await? {
                        crate::report::verbose(format_args!(
                            "the connection was lost during the create; found our node {}",
                            node.name
                        ));
                        return Ok((node, None));
                    }
                    crate::report::verbose(format_args!(
                        "the connection was lost during the create, which did not happen; again"
                    ));
                }
                Err(e) => return Err(self.fail(&format!("create a lock node under {parent}"), e)),
            }
        }
        Err(Unavailable(format!(
            "{}: cannot create a lock node under {parent}: the connection keeps failing",
            self.addr
        ))
        .into())
    }

    async fn find_ours(
        &self,
        client: &Client,
        parent: &str,
        uuid: &str,
    ) -> anyhow::Result<Option<OurNode>> {
        let children = match retried(client, || client.list_children(parent)).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.fail("list the lock's queue", e)),
        };
        let mine = format!("_c_{uuid}");
        for name in children.into_iter().filter(|c| c.starts_with(&mine)) {
            let path = format!("{parent}/{name}");
            match retried(client, || client.get_data(&path)).await {
                Ok((_, stat)) if stat.ephemeral_owner == client.session_id().0 => {
                    return Ok(Some(OurNode { name, stat }));
                }
                Ok(_) | Err(ZkError::NoNode) => {}
                Err(e) => return Err(self.fail("read a lock node", e)),
            }
        }
        Ok(None)
    }

    /// The metadata of lock node `name` under `parent`, best effort.
    async fn holder_of(&self, client: &Client, parent: &str, name: &str) -> Option<Holder> {
        let (data, stat) = op(client.get_data(&format!("{parent}/{name}")))
            .await
            .ok()?;
        Some(holder_from(&data, &stat))
    }

    /// Joins the queue and waits for our turn. Returns our node and when the request that showed
    /// it first was sent.
    async fn contend(
        &self,
        client: &Client,
        parent: &str,
        req: &Request<'_>,
        created: &mut Option<String>,
    ) -> anyhow::Result<(OurNode, BootInstant)> {
        let data = serde_json::to_vec(req.holder)?;
        let (mut ours, mut listing) = self.create_node(client, parent, &data, req.mode).await?;
        *created = Some(format!("{parent}/{}", ours.name));
        let notify = Arc::new(Notify::new());
        let mut guard = None;
        let mut told = None::<String>;
        loop {
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
            let queue = lock_queue(children);
            let Some(pos) = queue.iter().position(|n| *n == ours.name) else {
                // Our node is gone while we waited (`dlock break` deletes the holder's node):
                // join the queue again.
                crate::report::verbose(format_args!("our lock node vanished; queueing again"));
                (ours, listing) = self.create_node(client, parent, &data, req.mode).await?;
                *created = Some(format!("{parent}/{}", ours.name));
                continue;
            };
            if let Some(theirs) = queue[..pos]
                .iter()
                .filter_map(|n| kind_of(n))
                .find(|k| !compatible(req.mode, *k))
            {
                return Err(super::mode_mismatch(req.key, req.mode, &theirs.describe()));
            }
            let Some(blocker) = blocked_by(&queue, pos) else {
                return Ok((ours, sent));
            };
            if req.waited_out() {
                let holder = self.holder_of(client, parent, &queue[0]).await;
                return Err(req.busy(holder.as_ref()));
            }
            if told.as_deref() != Some(queue[0].as_str()) {
                if let Some(h) = self.holder_of(client, parent, &queue[0]).await {
                    (req.on_holder)(&h);
                }
                told = Some(queue[0].clone());
            }
            let watcher = match blocker {
                Some(i) => {
                    let node = format!("{parent}/{}", queue[i]);
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
                            if lock_queue(children.clone()) != queue {
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

    /// The lock nodes of `key` with their metadata, holder first.
    async fn queue_of(
        &self,
        client: &Client,
        key: &Key,
    ) -> anyhow::Result<(String, Vec<(String, Holder)>)> {
        let parent = self.key_path(key);
        let names = match retried(client, || client.list_children(&parent)).await {
            Ok(children) => lock_queue(children),
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(self.fail("list the lock's queue", e)),
        };
        if names.is_empty() {
            return Ok((parent, Vec::new()));
        }
        let results = retried(client, || {
            let mut reader = client.new_multi_reader();
            for name in &names {
                let _ = reader.add_get_data(&format!("{parent}/{name}"));
            }
            reader.commit()
        })
        .await
        .map_err(|e| self.fail("read the lock's nodes", e))?;
        let queue = names
            .into_iter()
            .zip(results)
            .filter_map(|(name, r)| match r {
                MultiReadResult::Data { data, stat } => Some((name, holder_from(&data, &stat))),
                _ => None, // deleted meanwhile
            })
            .collect();
        Ok((parent, queue))
    }

    /// The status a key's queue (holder first) makes.
    fn status_of(&self, key: &Key, parent: &str, mut queue: Vec<(String, Holder)>) -> Status {
        // The holders are a prefix of the queue: all nodes up to the first one that waits.
        let location = format!("{} (node {parent})", self.addr);
        let mut status = Status::new(key, self.kind(), location);
        let names: Vec<String> = queue.iter().map(|(n, _)| n.clone()).collect();
        let holding = (0..names.len())
            .take_while(|&i| blocked_by(&names, i).is_none())
            .count();
        let rest = queue.split_off(holding);
        status.held = !queue.is_empty();
        status.waiters = Some(rest.len() as u64);
        if let Some(mode) = names.first().and_then(|n| kind_of(n)) {
            status.mode = Some(mode.name());
            status.limit = mode.limit();
        }
        status.holders = queue.into_iter().map(|(_, h)| h).collect();
        status.queue = rest.into_iter().map(|(_, h)| h).collect();
        status
    }

    /// Runs `f` with a short session on this backend's runtime, and closes it.
    fn admin<T>(&self, f: impl AsyncFnOnce(&Client) -> anyhow::Result<T>) -> anyhow::Result<T> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let client = self.connect(ADMIN_SESSION).await?;
            let result = f(&client).await;
            close(client, None).await;
            result
        })
    }
}

/// A lock node's holder metadata, with the facts only the node's stat knows.
fn holder_from(data: &[u8], stat: &Stat) -> Holder {
    let mut h: Holder = serde_json::from_slice(data).unwrap_or_default();
    h.fencing_token = u64::try_from(stat.czxid).ok();
    h.session = Some(format!("0x{:x}", stat.ephemeral_owner));
    h
}

impl Backend for ZkBackend {
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
        let (client, ours, sent) = rt.block_on(async {
            let client = self.connect(req.ttl).await?;
            let mut created = None;
            match self.contend(&client, &parent, req, &mut created).await {
                Ok((ours, sent)) => Ok((client, ours, sent)),
                Err(e) => {
                    // Nothing stays queued: our node goes (closing the session would delete it
                    // too), and the session.
                    close(client, created.as_deref()).await;
                    Err(e)
                }
            }
        })?;
        let ttl = client.session_timeout();
        if ttl != req.ttl {
            crate::report::verbose(format_args!(
                "the server set the session timeout to {ttl:?} (asked {:?}); that is the lease",
                req.ttl
            ));
        }
        Ok(Box::new(ZkLease {
            session: client.session_id().0,
            fence: u64::try_from(ours.stat.czxid).unwrap_or_default(),
            path: format!("{parent}/{}", ours.name),
            client: Some(client),
            ttl,
            acquired_at: sent,
            addr: self.addr.clone(),
            watch: None,
            rt,
        }))
    }

    fn status(&self, key: &Key) -> anyhow::Result<Status> {
        let (parent, queue) = self.admin(async |client| self.queue_of(client, key).await)?;
        Ok(self.status_of(key, &parent, queue))
    }

    fn purge(&self, key: &Key) -> anyhow::Result<()> {
        let parent = self.key_path(key);
        self.admin(
            async |client| match retried(client, || client.delete(&parent, None)).await {
                Ok(()) | Err(ZkError::NoNode) | Err(ZkError::NotEmpty) => Ok(()),
                Err(e) => Err(self.fail(&format!("delete {parent}"), e)),
            },
        )
    }

    /// Deletes the holder's node (the holder sees it go and stops its command); waiters keep
    /// their places, and the first of them gets the lock. One session reads and deletes.
    fn break_lock(&self, key: &Key) -> anyhow::Result<Status> {
        let (parent, queue) = self.admin(async |client| {
            let (parent, queue) = self.queue_of(client, key).await?;
            let names: Vec<String> = queue.iter().map(|(n, _)| n.clone()).collect();
            let holding = (0..names.len()).take_while(|&i| blocked_by(&names, i).is_none());
            for i in holding {
                let path = format!("{parent}/{}", names[i]);
                match retried(client, || client.delete(&path, None)).await {
                    Ok(()) | Err(ZkError::NoNode) => {}
                    Err(e) => return Err(self.fail(&format!("delete {path}"), e)),
                }
            }
            Ok((parent, queue))
        })?;
        Ok(self.status_of(key, &parent, queue))
    }
}

/// A held lock: our node, kept alive by the session.
struct ZkLease {
    rt: Arc<Runtime>,
    client: Option<Client>,
    path: String,
    session: i64,
    fence: u64,
    /// The negotiated session timeout.
    ttl: Duration,
    acquired_at: BootInstant,
    addr: String,
    watch: Option<tokio::task::JoinHandle<()>>,
}

impl Lease for ZkLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fence)
    }

    fn ttl(&self) -> Option<Duration> {
        Some(self.ttl)
    }

    fn acquired_at(&self) -> BootInstant {
        self.acquired_at
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
            Ok(Ok(Some(stat))) if stat.ephemeral_owner == self.session => Ok(()),
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
        self.watch = Some(self.rt.spawn(async move {
            let tell = |why: String| lost(format!("{addr}: {why}"));
            let deleted = || tell(format!("the lock node {path} was deleted (dlock break?)"));
            loop {
                let node = match op(client.check_and_watch_stat(&path)).await {
                    Ok((Some(_), watcher)) => Some(watcher),
                    Ok((None, _)) => return deleted(),
                    Err(_) => None, // disconnected: watch the state; renewals check the node
                };
                let watched = node.is_some();
                let mut changed = std::pin::pin!(async {
                    match node {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                });
                // Until the node's watch fires (then look again), or the session ends.
                loop {
                    tokio::select! {
                        state = states.changed() => match state {
                            SessionState::Expired => return tell("the session expired".into()),
                            SessionState::AuthFailed => return tell("authentication failed".into()),
                            SessionState::Closed => return tell("the session was closed".into()),
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
                    }
                }
            }
        }));
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        if let Some(watch) = self.watch.take() {
            // Gone before our own delete could look like a break; its client goes with it.
            watch.abort();
            let _ = self.rt.block_on(watch);
        }
        let Some(client) = self.client.take() else {
            return Ok(());
        };
        // Our node goes first (the waiter watching it proceeds at once), then the session. The
        // key's node is a container: the server removes it when it is left empty.
        self.rt.block_on(close(client, Some(&self.path)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("zk://a:1,b,[::1]:3/app/locks/").unwrap();
        assert_eq!(u.hosts, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(u.chroot, "/app/locks");
        assert_eq!(u.digest, None);
        let u = parse_url("zookeeper://bob:p%40ss:w@h").unwrap();
        assert_eq!(u.digest.as_deref(), Some("bob:p@ss:w"));
        assert_eq!(u.chroot, "");
        for bad in [
            "zk://",
            "zk://a:0",
            "zk://a:x",
            "zk://a,,b",
            "zk://a/x/../y",
            "zk://a//b",
            "zk://a?x=1",
            "redis://a",
            "zk://:pw@a",
        ] {
            let e = parse_url(bad).unwrap_err().0;
            assert!(e.starts_with("bad zookeeper URL"), "{bad}: {e}");
        }
        assert!(
            !parse_url("zk://u:secret@")
                .unwrap_err()
                .0
                .contains("secret")
        );
    }

    #[test]
    fn queue_order_is_by_sequence() {
        let q = lock_queue(vec![
            "_c_b-lock-0000000010".into(),
            "_c_a-lock-0000000002".into(),
            "other".into(),
            "_c_c-lock-0000000009".into(),
        ]);
        assert_eq!(
            q,
            [
                "_c_a-lock-0000000002",
                "_c_c-lock-0000000009",
                "_c_b-lock-0000000010"
            ]
        );
    }

    #[test]
    fn who_holds_in_each_mode() {
        let q = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let rw = q(&[
            "_c_a-read-0000000001",
            "_c_b-read-0000000002",
            "_c_c-lock-0000000003",
            "_c_d-read-0000000004",
        ]);
        assert_eq!(blocked_by(&rw, 0), None);
        assert_eq!(blocked_by(&rw, 1), None);
        assert_eq!(
            blocked_by(&rw, 2),
            Some(Some(1)),
            "a writer waits for its predecessor"
        );
        assert_eq!(
            blocked_by(&rw, 3),
            Some(Some(2)),
            "a reader waits for the earlier writer"
        );
        let sem = q(&[
            "_c_a-limit2-0000000001",
            "_c_b-limit2-0000000002",
            "_c_c-limit2-0000000003",
        ]);
        assert_eq!(blocked_by(&sem, 1), None);
        assert_eq!(blocked_by(&sem, 2), Some(None));
        assert_eq!(kind_of("_c_x-limit12-0000000007"), Some(Mode::Limit(12)));
        assert_eq!(kind_of("_c_x-other-0000000007"), None);
        assert!(!compatible(Mode::Limit(2), Mode::Limit(3)));
        assert!(!compatible(Mode::Exclusive, Mode::Limit(3)));
        assert!(compatible(Mode::Shared, Mode::Exclusive));
    }

    #[test]
    fn uuids_look_like_curators() {
        let u = uuid_v4().unwrap();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, uuid_v4().unwrap());
    }
}
