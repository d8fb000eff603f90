//! A key's queue as `status` and `break` see it: its contenders with what their nodes say of
//! their holders, and the children of other recipes.

use zookeeper_client::{Client, MultiReadResult, Stat};

use super::queue::{Entry, Kind, Recipe, holding, kind_of, lock_queue};
use super::session::retried;
use super::{ZkBackend, ZkError};
use crate::backend::Backend;
use crate::model::{Holder, Key, Mode, Status};

impl ZkBackend {
    /// The contenders of `key` with their metadata, holder first, and its children that are
    /// not lock nodes.
    pub(super) async fn queue_of(&self, client: &Client, key: &Key) -> anyhow::Result<Queue> {
        let parent = self.key_path(key);
        let (entries, others) = match retried(client, || client.list_children(&parent)).await {
            Ok(children) => lock_queue(children),
            Err(ZkError::NoNode) => Default::default(),
            Err(e) => return Err(self.fail("list the lock's queue", e)),
        };
        let mut queue = Queue {
            parent,
            entries: Vec::new(),
            holders: Vec::new(),
            others: Vec::new(),
        };
        if entries.is_empty() && others.is_empty() {
            return Ok(queue);
        }
        let names: Vec<&str> = entries
            .iter()
            .map(|e| e.name.as_str())
            .chain(others.iter().map(String::as_str))
            .collect();
        let parent = &queue.parent;
        let mut results = retried(client, || {
            let mut reader = client.new_multi_reader();
            for name in &names {
                let _ = reader.add_get_data(&format!("{parent}/{name}"));
            }
            reader.commit()
        })
        .await
        .map_err(|e| self.fail("read the lock's nodes", e))?
        .into_iter();
        for e in entries {
            // (One not there any more was deleted meanwhile.)
            if let Some(MultiReadResult::Data { data, stat }) = results.next() {
                queue.holders.push(holder_from(&e.name, &data, &stat));
                queue.entries.push(e);
            }
        }
        for name in others {
            if let Some(MultiReadResult::Data { data, stat }) = results.next() {
                queue.others.push(holder_from(&name, &data, &stat));
            }
        }
        Ok(queue)
    }

    /// The status a key's queue (holder first) makes.
    pub(super) fn status_of(&self, key: &Key, queue: Queue) -> Status {
        let Queue {
            parent,
            entries,
            mut holders,
            others,
        } = queue;
        let location = format!("{} (node {parent})", self.addr);
        let mut status = Status::new(key, self.kind(), location);
        status.server_name = Some(parent);
        let rest = holders.split_off(holding(&entries));
        status.waiters = Some(rest.len() as u64);
        if let Some(first) = entries.first() {
            let mode = match first.kind {
                Kind::Lock(mode) => mode,
                Kind::Foreign(_) => Mode::Exclusive,
            };
            status.mode = Some(mode);
            status.limit = mode.limit();
        }
        status.holders = holders;
        if !others.is_empty() {
            status.notes.push(
                "the lock's path has nodes of another recipe that are not lock nodes (a \
                 semaphore's?): dlock refuses to run on it (exit 75)"
                    .into(),
            );
        }
        status.holders.extend(others);
        status.held = !status.holders.is_empty();
        status.queue = rest;
        status
    }
}

/// A key's children as `status` and `break` see them.
pub(super) struct Queue {
    /// The key's node.
    pub(super) parent: String,
    /// Its contenders, first holder first.
    pub(super) entries: Vec<Entry>,
    /// What each of `entries` says of its holder (or waiter).
    pub(super) holders: Vec<Holder>,
    /// Its children that are not lock nodes (another recipe's).
    pub(super) others: Vec<Holder>,
}

/// The holder record in a node's data, if it is dlock's.
pub(super) fn dlock_record(data: &[u8]) -> Option<Holder> {
    crate::backend::read_record(data).filter(|h| h.pid.is_some())
}

/// What a child of a key's node says of its holder: dlock's record with the facts only the
/// node's stat knows, or for another recipe's node what its name tells.
pub(super) fn holder_from(name: &str, data: &[u8], stat: &Stat) -> Holder {
    let mut h = match dlock_record(data) {
        Some(mut h) => {
            h.fencing_token = u64::try_from(stat.czxid).ok();
            // Its data was set again: a safe break's mark (see `lease::UNTOUCHED`).
            h.broken = stat.version != super::lease::UNTOUCHED;
            h
        }
        None => Holder {
            foreign: Some(
                match kind_of(name) {
                    Some(Kind::Foreign(r)) => r.describe(),
                    Some(Kind::Lock(_)) => Recipe::CuratorMutex.describe(),
                    None => "another recipe's node (not a lock node)",
                }
                .into(),
            ),
            ..Holder::default()
        },
    };
    if stat.ephemeral_owner != 0 {
        h.session = Some(format!("0x{:x}", stat.ephemeral_owner));
    }
    h.node = Some(name.to_string());
    h
}
