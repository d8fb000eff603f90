//! The ZooKeeper backend's run history (docs/history.md): `[/chroot]/dlock-history/<escaped
//! KEY>`, beside `/dlock` (never under the key's lock node, whose children are the lock's queue,
//! and never a child of `/dlock`, whose children are keys). Each event is a persistent-sequential
//! child `e-<sequence>` whose data is the event and whose ctime is the server's clock at the
//! write: the sequence orders them, the ctime is [`Stored::at_ms`]. `--once-per` creates its
//! start first (so its ctime is "now" by the server), then reads the previous start: if that one
//! is younger than the window, it deletes its own and skips. The start that finds more than
//! [`MAX_EVENTS`] plus a slack deletes the oldest. A reader reads at most [`MAX_EVENTS`] nodes, a
//! few at a time, and keeps at most [`MAX_BODY`] bytes of each.

use std::time::Duration;

use zookeeper_client::{Acl, Acls, AuthId, Client, CreateMode, Permission, Stat};

use super::{ROOT, ZkError, op};
use crate::history::{Begun, MAX_EVENT_BYTES, MAX_EVENTS, RunEvent, Stored};
use crate::model::Key;

/// Events past [`MAX_EVENTS`] before a start prunes: every few runs, not on every one.
const SLACK: usize = 10;
/// The most of one node's data a reader keeps (a bigger one is unreadable anyway; its first
/// bytes are shown).
pub(super) const MAX_BODY: usize = 16 * MAX_EVENT_BYTES;
/// How many nodes are read at once (each reply is at most the server's `jute.maxbuffer`).
const BATCH: usize = 16;
/// The name of an event node, before its sequence.
const EVENT: &str = "e-";

/// Where a key's history lives, and who may read it.
#[derive(Clone, Debug)]
pub(super) struct Place {
    /// `[/chroot]/dlock-history/<escaped key>`.
    pub(super) parent: String,
    /// With digest credentials: the nodes are the credentials' alone (`creator_all`).
    pub(super) private: bool,
}

/// `[/chroot]/dlock-history/<escaped key>`: the escaped key is one path segment (no `/`), so
/// no other key's history is inside it.
pub(super) fn parent_of(chroot: &str, key: &Key) -> String {
    format!(
        "{chroot}/{ROOT}-history/{}",
        crate::backend::escape_key(key)
    )
}

/// The sequence of an event node's name, `None` for anything else.
pub(super) fn sequence(name: &str) -> Option<i64> {
    let digits = name.strip_prefix(EVENT)?;
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The event nodes among `children`, newest first.
pub(super) fn newest_first(children: &[String]) -> Vec<(i64, &str)> {
    let mut events: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| sequence(c).map(|s| (s, c.as_str())))
        .collect();
    events.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
    events
}

/// An event as read. A start written with its lock node has no token in its body: its czxid,
/// the lock node's, is the token, spliced in here.
fn stored(mut data: Vec<u8>, stat: &Stat) -> Stored {
    data.truncate(MAX_BODY);
    if let Ok(token) = u64::try_from(stat.czxid) {
        data = crate::history::add_token(data, token);
    }
    Stored {
        at_ms: u64::try_from(stat.ctime).ok(),
        body: data,
    }
}

impl Place {
    pub(super) fn acls(&self) -> Acls<'static> {
        if self.private {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// The path an event node is created at (the server appends the sequence).
    pub(super) fn event_prefix(&self) -> String {
        format!("{}/{EVENT}", self.parent)
    }

    /// Creates `/dlock-history` (open to all to read, create and delete, as `/dlock`) and the
    /// key's node where missing.
    pub(super) async fn make_parents(&self, client: &Client) -> Result<(), ZkError> {
        let ancestors = [Acl::new(
            Permission::READ | Permission::CREATE | Permission::DELETE,
            AuthId::anyone(),
        )];
        let segments: Vec<&str> = self.parent.split('/').skip(1).collect();
        let mut path = String::new();
        for (i, segment) in segments.iter().enumerate() {
            path.push('/');
            path.push_str(segment);
            let options = if i + 1 == segments.len() {
                CreateMode::Persistent.with_acls(self.acls())
            } else {
                CreateMode::Persistent.with_acls(Acls::new(&ancestors))
            };
            match op(client.create(&path, &[], &options)).await {
                Ok(_) | Err(ZkError::NodeExists) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Adds one event node; its name and stat, and the children listed right behind it (in
    /// the same round trip: a session's requests are answered in order).
    async fn add(
        &self,
        client: &Client,
        body: &[u8],
    ) -> Result<(String, Stat, Result<Vec<String>, ZkError>), ZkError> {
        let prefix = self.event_prefix();
        let options = CreateMode::PersistentSequential.with_acls(self.acls());
        for _ in 0..3 {
            let created = client.create(&prefix, body, &options);
            let listed = client.list_children(&self.parent);
            let (created, listed) = tokio::join!(op(created), op(listed));
            match created {
                Ok((stat, seq)) => return Ok((format!("{EVENT}{seq}"), stat, listed)),
                Err(ZkError::NoNode) => self.make_parents(client).await?,
                Err(e) => return Err(e),
            }
        }
        Err(ZkError::NoNode)
    }

    /// Adds the start `body` of the run holding the lock node created at zxid `held`; with
    /// `once_per`, first (by the server's clock) looks for a start younger than that (see the
    /// module comment).
    pub(super) async fn begin(
        &self,
        client: &Client,
        body: &[u8],
        once_per: Option<Duration>,
        held: i64,
    ) -> anyhow::Result<Begun> {
        let (ours, stat, children) = self
            .add(client, body)
            .await
            .map_err(|e| self.fail("add a start event", e))?;
        let children = match children {
            Ok(c) => c,
            Err(e) => {
                // Without the listing nothing can be decided: the start goes again.
                let _ = op(client.delete(&format!("{}/{ours}", self.parent), None)).await;
                return Err(self.fail("list the history", e));
            }
        };
        let events = newest_first(&children);
        if let Some(d) = once_per {
            let mine = sequence(&ours).unwrap_or(i64::MAX);
            let older: Vec<&str> = events
                .iter()
                .filter(|(s, _)| *s < mine)
                .map(|(_, n)| *n)
                .take(MAX_EVENTS)
                .collect();
            if let Some(last) = self.last_start(client, &older, held).await? {
                let now = u64::try_from(stat.ctime).unwrap_or(0);
                // A start more than DUR in the future (a leader whose clock was ahead, a forged
                // node) does not count; one less far ahead counts as just now.
                let ago = last
                    .at_ms
                    .and_then(|its| crate::history::age(now, its, d))
                    .unwrap_or(Duration::MAX);
                if ago < d {
                    let path = format!("{}/{ours}", self.parent);
                    op(client.delete(&path, None))
                        .await
                        .map_err(|e| self.fail("delete the skipped start", e))?;
                    return Ok(Begun::Skip { last, ago });
                }
            }
        }
        if events.len() > MAX_EVENTS + SLACK {
            self.prune(client, &events[MAX_EVENTS..]).await;
        }
        Ok(Begun::Started)
    }

    /// After a start written with the lock node: deletes the oldest events when `children`
    /// (the history listed in the same round trip) holds too many. The deletes are sent and
    /// not waited for (best effort, as [`Place::prune`]; the session answers them in order,
    /// before its later requests).
    pub(super) fn prune_behind(&self, client: &Client, children: &[String]) {
        let events = newest_first(children);
        if events.len() > MAX_EVENTS + SLACK {
            for (_, name) in &events[MAX_EVENTS..] {
                drop(client.delete(&format!("{}/{name}", self.parent), None));
            }
        }
    }

    /// The event node created at zxid `czxid` (a start written with a lock node whose reply
    /// was lost), among the newest few.
    pub(super) async fn find_created(&self, client: &Client, czxid: i64) -> Option<String> {
        let children = op(client.list_children(&self.parent)).await.ok()?;
        let paths: Vec<String> = newest_first(&children)
            .iter()
            .take(BATCH)
            .map(|(_, n)| format!("{}/{n}", self.parent))
            .collect();
        let stats: Vec<_> = paths.iter().map(|p| client.check_stat(p)).collect();
        for (path, stat) in paths.iter().zip(stats) {
            if let Ok(Some(stat)) = op(stat).await
                && stat.czxid == czxid
            {
                return Some(path.clone());
            }
        }
        None
    }

    /// The newest start event among the event nodes `older` (newest first), for the holder of
    /// the lock node created at zxid `ours`. A start without a token was written with its lock
    /// node, so its czxid is that node's: one after ours is a run queued behind us, whose start
    /// is being taken back ([`super::create`]), never a run that started.
    async fn last_start(
        &self,
        client: &Client,
        older: &[&str],
        ours: i64,
    ) -> anyhow::Result<Option<Stored>> {
        // The previous run's end, then its start: usually found in the first few.
        for batch in older.chunks(4) {
            let paths: Vec<String> = batch
                .iter()
                .map(|n| format!("{}/{n}", self.parent))
                .collect();
            let reads: Vec<_> = paths.iter().map(|p| client.get_data(p)).collect();
            for read in reads {
                match op(read).await {
                    Ok((data, stat)) => {
                        let queued = stat.czxid > ours;
                        let s = Stored {
                            at_ms: u64::try_from(stat.ctime).ok(),
                            body: data,
                        };
                        let counts = RunEvent::read(&s)
                            .is_some_and(|e| e.ev == "start" && (e.token.is_some() || !queued));
                        if counts {
                            return Ok(Some(stored(s.body, &stat)));
                        }
                    }
                    Err(ZkError::NoNode) => {}
                    Err(e) => return Err(self.fail("read the history", e)),
                }
            }
        }
        Ok(None)
    }

    /// Deletes the event nodes `old`, best effort (the next start tries again).
    async fn prune(&self, client: &Client, old: &[(i64, &str)]) {
        let paths: Vec<String> = old
            .iter()
            .map(|(_, n)| format!("{}/{n}", self.parent))
            .collect();
        let deletes: Vec<_> = paths.iter().map(|p| client.delete(p, None)).collect();
        for d in deletes {
            let _ = op(d).await;
        }
    }

    /// Adds the end `body`.
    pub(super) async fn end(&self, client: &Client, body: &[u8]) -> anyhow::Result<()> {
        self.add(client, body)
            .await
            .map(drop)
            .map_err(|e| self.fail("add an end event", e))
    }

    /// The stored events, newest first, at most [`MAX_EVENTS`].
    pub(super) async fn read(&self, client: &Client) -> anyhow::Result<Vec<Stored>> {
        let children = match op(client.list_children(&self.parent)).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.fail("list the history", e)),
        };
        let events = newest_first(&children);
        let mut out = Vec::new();
        for batch in events[..events.len().min(MAX_EVENTS)].chunks(BATCH) {
            let paths: Vec<String> = batch
                .iter()
                .map(|(_, n)| format!("{}/{n}", self.parent))
                .collect();
            let reads: Vec<_> = paths.iter().map(|p| client.get_data(p)).collect();
            for read in reads {
                match op(read).await {
                    Ok((data, stat)) => out.push(stored(data, &stat)),
                    Err(ZkError::NoNode) => {} // pruned meanwhile
                    Err(e) => return Err(self.fail("read the history", e)),
                }
            }
        }
        Ok(out)
    }

    /// Deletes every event node and the key's history node.
    pub(super) async fn purge(&self, client: &Client) -> anyhow::Result<()> {
        let children = match op(client.list_children(&self.parent)).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(()),
            Err(e) => return Err(self.fail("list the history", e)),
        };
        let events = newest_first(&children);
        self.prune(client, &events).await;
        match op(client.delete(&self.parent, None)).await {
            Ok(()) | Err(ZkError::NoNode) | Err(ZkError::NotEmpty) => Ok(()),
            Err(e) => Err(self.fail("delete the history", e)),
        }
    }

    fn fail(&self, doing: &str, e: ZkError) -> anyhow::Error {
        anyhow::anyhow!("zookeeper: cannot {doing} under {}: {e}", self.parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn event_names_and_order() {
        assert_eq!(sequence("e-0000000007"), Some(7));
        assert_eq!(sequence("e-0000000000000000012"), Some(12));
        for bad in [
            "e-",
            "e-12a",
            "e--1",
            "x-0000000001",
            "e-+1",
            "e-99999999999999999999",
        ] {
            assert_eq!(sequence(bad), None, "{bad}");
        }
        let children: Vec<String> = ["e-0000000002", "junk", "e-0000000010", "e-0000000001"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let names: Vec<&str> = newest_first(&children).iter().map(|e| e.1).collect();
        assert_eq!(names, ["e-0000000010", "e-0000000002", "e-0000000001"]);
        let k = Key::new("a/b").unwrap();
        assert_eq!(parent_of("/c", &k), "/c/dlock-history/a%2Fb");
    }

    proptest! {
        #[test]
        fn sequence_never_panics(s in "\\PC{0,30}") {
            let _ = sequence(&s);
        }

        #[test]
        fn histories_of_two_keys_never_nest(a in "[a/%.b-]{1,8}", b in "[a/%.b-]{1,8}") {
            prop_assume!(a != b);
            let (pa, pb) = (
                parent_of("", &Key::new(&a).unwrap()),
                parent_of("", &Key::new(&b).unwrap()),
            );
            let inside = format!("{}/", pa);
            prop_assert!(!pb.starts_with(&inside));
            prop_assert_ne!(pa, pb);
        }
    }
}
