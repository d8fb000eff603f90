//! Creating our lock node, and with it, for one exclusive key without `--once-per`, the run's
//! start event ([`Request::start`](crate::backend::Request::start)): one `multi` creates both
//! (one transaction, one zxid: the start's czxid is the lock node's, which is the fencing token;
//! the lock node's stat is read from the same reply, see [`ZkBackend::create_node`])
//! and the listing of the key's queue and of its history go right behind it, in the same round
//! trip. A transaction cannot ask "is the queue empty" (a `check` op compares a node's data
//! version only), so the start is written before the answer is known: when the listing shows a
//! node before ours, the run must queue and the start is taken back at once (a delete, before
//! any wait), and written again when the lock is ours ([`Place::begin`], as without the fold).
//! A `--once-per` reader never counts such a start of a run queued behind it (its czxid is
//! after the reader's own lock node: [`Place::begin`]).
//!
//! The lock node itself is as without the fold: same name, data, mode and ACL; Curator and
//! kazoo clients see nothing else.

use zookeeper_client::{
    Client, CreateMode, CreateSequence, MultiWriteError, MultiWriteResult, Stat,
};

use super::history::Place;
use super::queue::{node_kind, uuid_v4};
use super::session::{op, reconnected, retried};
use super::{COMMAND_TIMEOUT, Listing, OurNode, ZkBackend, ZkError};
use crate::clock::BootInstant;
use crate::exit::Unavailable;
use crate::model::Mode;

/// The start to write with the lock node.
#[derive(Clone, Copy)]
pub(super) struct Start<'a> {
    pub(super) place: &'a Place,
    pub(super) body: &'a [u8],
}

/// A created lock node.
pub(super) struct Created {
    pub(super) node: OurNode,
    /// The key's children, listed right behind the create, and when that was sent.
    pub(super) listing: Option<Listing>,
    /// The start event written with the node (its path), and the key's history as listed
    /// right behind it.
    pub(super) start: Option<(String, Option<Vec<String>>)>,
}

/// Why one create attempt did not make a node.
enum Failure {
    /// A parent of the lock node is missing.
    NoLockParent,
    /// A parent of the history's node is missing.
    NoHistoryParent,
    /// The reply was lost: the create may have happened.
    Lost,
    /// An operation on the history failed (its node is another user's, or read-only): the
    /// transaction did nothing, and the start must not cost the lock.
    History(ZkError),
    Other(ZkError),
}

impl From<ZkError> for Failure {
    fn from(e: ZkError) -> Failure {
        match e {
            ZkError::NoNode => Failure::NoLockParent,
            ZkError::ConnectionLoss => Failure::Lost,
            e => Failure::Other(e),
        }
    }
}

/// After the history refused the start `e`: none goes with the lock node (the lease's
/// `begin_run` writes it as without the fold, and says so when it cannot).
fn without_start(e: &ZkError) -> Option<Start<'static>> {
    crate::report::verbose(format_args!(
        "the history refused the start written with the lock node ({e}); the node alone"
    ));
    None
}

/// A multi's outcome in one error type, bounded as [`op`] bounds one request.
async fn committed(
    commit: impl Future<Output = Result<Vec<MultiWriteResult>, MultiWriteError>>,
) -> Result<Vec<MultiWriteResult>, Failure> {
    match tokio::time::timeout(COMMAND_TIMEOUT, commit).await {
        Err(_) => Err(Failure::Lost),
        Ok(Ok(results)) => Ok(results),
        Ok(Err(MultiWriteError::OperationFailed {
            index: 1,
            source: ZkError::NoNode,
        })) => Err(Failure::NoHistoryParent),
        Ok(Err(MultiWriteError::OperationFailed { index: 1.., source }))
            if !matches!(source, ZkError::ConnectionLoss) =>
        {
            Err(Failure::History(source))
        }
        Ok(Err(MultiWriteError::OperationFailed { source, .. })) => Err(source.into()),
        Ok(Err(MultiWriteError::RequestFailed { source })) => Err(source.into()),
    }
}

/// The name (last segment) and stat of a multi's create result.
fn created(result: Option<MultiWriteResult>) -> Result<(String, Stat), Failure> {
    match result {
        Some(MultiWriteResult::Create { path, stat }) => {
            let name = path.rsplit('/').next().unwrap_or_default().to_string();
            Ok((name, stat))
        }
        _ => Err(Failure::Other(ZkError::UnexpectedError(
            "a multi's create answered with something else".into(),
        ))),
    }
}

impl ZkBackend {
    /// Creates our ephemeral-sequential node under `parent` (with `start`: and the start event,
    /// see the module comment). After a connection loss the create may have happened: look for
    /// our uuid (owned by our session) before trying again.
    pub(super) async fn create_node(
        &self,
        client: &Client,
        parent: &str,
        data: &[u8],
        mode: Mode,
        mut start: Option<Start<'_>>,
    ) -> anyhow::Result<Created> {
        let uuid = uuid_v4()?;
        let kind = node_kind(mode);
        let prefix = format!("{parent}/_c_{uuid}{kind}");
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let named = |seq: CreateSequence| format!("_c_{uuid}{kind}{seq}");
        for _ in 0..10 {
            // The listing is sent right behind the create, in one round trip: a session's
            // requests are answered in order, so it includes our node.
            let sent = BootInstant::now();
            let made = match start {
                None => {
                    let created = client.create(&prefix, data, &options);
                    let listed = client.list_children(parent);
                    let (created, listed) = tokio::join!(op(created), op(listed));
                    created.map_err(Failure::from).map(|(stat, seq)| Created {
                        node: OurNode {
                            name: named(seq),
                            stat,
                        },
                        listing: listed.ok().map(|children| (children, sent)),
                        start: None,
                    })
                }
                Some(s) => {
                    self.create_with_start(client, parent, &prefix, data, s, sent)
                        .await
                }
            };
            match made {
                Ok(made) => return Ok(made),
                Err(Failure::NoLockParent) => self.make_parents(client, parent).await?,
                Err(Failure::NoHistoryParent) => {
                    if let Some(s) = start
                        && let Err(e) = s.place.make_parents(client).await
                    {
                        // As a history that refuses the start: the lock goes on without it.
                        start = without_start(&e);
                    }
                }
                Err(Failure::History(e)) => start = without_start(&e),
                Err(Failure::Lost) => {
                    reconnected(client, client.session_timeout())
                        .await
                        .map_err(|e| self.fail("create a lock node", e))?;
                    if let Some(node) = self.find_ours(client, parent, &uuid).await? {
                        crate::report::verbose(format_args!(
                            "the connection was lost during the create; found our node {}",
                            node.name
                        ));
                        // A start written with it has its czxid (one transaction).
                        let start = match start {
                            Some(s) => s
                                .place
                                .find_created(client, node.stat.czxid)
                                .await
                                .map(|path| (path, None)),
                            None => None,
                        };
                        return Ok(Created {
                            node,
                            listing: None,
                            start,
                        });
                    }
                    crate::report::verbose(format_args!(
                        "the connection was lost during the create, which did not happen; again"
                    ));
                }
                Err(Failure::Other(e)) => {
                    return Err(self.fail(&format!("create a lock node under {parent}"), e));
                }
            }
        }
        Err(Unavailable(format!(
            "{}: cannot create a lock node under {parent}: the connection keeps failing",
            self.addr
        ))
        .into())
    }

    /// One `multi` creating the lock node `prefix…` and the start event, with the key's
    /// children and its history's listed behind it.
    async fn create_with_start(
        &self,
        client: &Client,
        parent: &str,
        prefix: &str,
        data: &[u8],
        start: Start<'_>,
        sent: BootInstant,
    ) -> Result<Created, Failure> {
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let event_options = CreateMode::PersistentSequential.with_acls(start.place.acls());
        let mut multi = client.new_multi_writer();
        multi.add_create(prefix, data, &options)?;
        multi.add_create(&start.place.event_prefix(), start.body, &event_options)?;
        // A server with ZOOKEEPER-4026 (3.8.0 among others) answers a multi's create without
        // its stat, and the lock node's czxid is the fencing token: a write of the history's
        // node (its data stays empty) answers with its stat, whose mzxid is the transaction's
        // zxid — the lock node's czxid — in the same reply.
        multi.add_set_data(&start.place.parent, &[], None)?;
        let commit = multi.commit();
        let listed = client.list_children(parent);
        let events = client.list_children(&start.place.parent);
        let (results, listed, events) = tokio::join!(committed(commit), op(listed), op(events));
        let mut results = results?.into_iter();
        let (name, mut stat) = created(results.next())?;
        let (event, _) = created(results.next())?;
        if stat.is_invalid()
            && let Some(MultiWriteResult::SetData { stat: written }) = results.next()
            && !written.is_invalid()
        {
            stat.czxid = written.mzxid;
        }
        if stat.is_invalid() {
            let path = format!("{parent}/{name}");
            stat = match retried(client, || client.check_stat(&path)).await? {
                Some(stat) => stat,
                None => return Err(Failure::Other(ZkError::NoNode)),
            };
        }
        Ok(Created {
            node: OurNode { name, stat },
            listing: listed.ok().map(|children| (children, sent)),
            start: Some((format!("{}/{event}", start.place.parent), events.ok())),
        })
    }

    pub(super) async fn find_ours(
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

    /// Takes back a start written with our lock node when the run must queue (see the module
    /// comment).
    pub(super) async fn take_back(&self, client: &Client, path: &str) -> anyhow::Result<()> {
        crate::report::verbose(format_args!(
            "the lock is held: the start written with our node goes until the lock is ours"
        ));
        match retried(client, || client.delete(path, None)).await {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.fail(&format!("take back the start {path}"), e)),
        }
    }
}
