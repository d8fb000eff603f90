//! Lock node names and the queue they form: what a child of a key's node is (a lock node of
//! dlock or Curator's mutex, another recipe's contender, or not a lock node at all), the order
//! (by sequence number, which every sequential child of one parent shares), and whom a node
//! waits for.
//!
//! Every name dlock creates ends in `lock-<sequence>`, the form Curator's `InterProcessMutex`
//! (and kazoo with `extra_lock_patterns=["-lock-"]`) orders by: an exclusive lock's node is
//! `_c_<uuid>-lock-<seq>`, a shared one's `_c_<uuid>-read-lock-<seq>`, a semaphore slot's
//! `_c_<uuid>-limitN-lock-<seq>`.

use anyhow::Context;

use crate::model::Mode;

/// What a sequential child of a key's node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A lock node in dlock's naming: exclusive (dlock's, or Curator's mutex: the same name),
    /// shared or a semaphore slot.
    Lock(Mode),
    /// Another recipe's contender: waited for as an exclusive holder, never ignored.
    Foreign(Recipe),
}

/// The recipes dlock recognizes by their node names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Recipe {
    /// A `lock-` node whose data is not a dlock record: Curator's `InterProcessMutex`, or kazoo
    /// or any client of that naming.
    CuratorMutex,
    /// kazoo's `Lock` (`<hex>__lock__<seq>`).
    KazooLock,
    /// kazoo's `ReadLock` (`<hex>__rlock__<seq>`).
    KazooReadLock,
    /// Curator's `InterProcessReadWriteLock` (`-__WRIT__<seq>`, `-__READ__<seq>`).
    CuratorReadWrite,
    /// Some other sequential node.
    Unknown,
}

impl Recipe {
    /// For messages and `status`.
    pub(super) fn describe(self) -> &'static str {
        match self {
            Recipe::CuratorMutex => "a Curator InterProcessMutex (or another lock- client)",
            Recipe::KazooLock => "a kazoo Lock",
            Recipe::KazooReadLock => "a kazoo ReadLock",
            Recipe::CuratorReadWrite => "a Curator InterProcessReadWriteLock",
            Recipe::Unknown => "another recipe's sequential node",
        }
    }

    /// Whether the recipe can never see dlock's nodes: Curator's read/write lock orders only
    /// its own `__READ__`/`__WRIT__` names and takes everything else for later. (kazoo sees them
    /// when its lock is made with `extra_lock_patterns=["-lock-"]`; dlock cannot tell.)
    pub(super) fn ignores_dlock(self) -> bool {
        self == Recipe::CuratorReadWrite
    }
}

/// A sequential child of a key's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub name: String,
    pub seq: i32,
    pub kind: Kind,
}

/// The part of a lock node's name between the uuid and the sequence.
pub(super) fn node_kind(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "-lock-".into(),
        Mode::Shared => "-read-lock-".into(),
        Mode::Limit(n) => format!("-limit{n}-lock-"),
    }
}

/// A child's name without its 10-character sequence suffix (as ZooKeeper formats it, `%010d`),
/// and the sequence; `None` for a child that was not created sequential.
fn split_seq(name: &str) -> Option<(&str, i32)> {
    let at = name.len().checked_sub(10)?;
    if at == 0 || !name.is_char_boundary(at) {
        return None;
    }
    let (head, seq) = name.split_at(at);
    let digits = seq.strip_prefix('-').unwrap_or(seq);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((head, seq.parse().ok()?))
}

/// The mode a dlock name's part before `lock-` says.
fn mode_named(rest: &str) -> Option<Mode> {
    match rest.rsplit_once('-').map_or(rest, |(_, last)| last) {
        "read" => Some(Mode::Shared),
        last => match last.strip_prefix("limit")?.parse() {
            Ok(n) if n > 0 => Some(Mode::Limit(n)),
            _ => None,
        },
    }
}

/// What a child's name says it is (`None`: not a sequential node, so not a contender).
pub(super) fn kind_of(name: &str) -> Option<Kind> {
    let (head, _) = split_seq(name)?;
    if let Some(rest) = head.strip_suffix("lock-")
        && (rest.is_empty() || rest.ends_with('-'))
    {
        let rest = rest.strip_suffix('-').unwrap_or(rest);
        return Some(Kind::Lock(mode_named(rest).unwrap_or(Mode::Exclusive)));
    }
    let recipe = if head.ends_with("__lock__") {
        Recipe::KazooLock
    } else if head.ends_with("__rlock__") {
        Recipe::KazooReadLock
    } else if head.ends_with("__WRIT__") || head.ends_with("__READ__") {
        Recipe::CuratorReadWrite
    } else {
        Recipe::Unknown
    };
    Some(Kind::Foreign(recipe))
}

/// Whether a dlock node of mode `theirs` and a request for `want` can share a queue:
/// semaphores only with the same N, exclusive and shared locks with each other.
pub(super) fn compatible(want: Mode, theirs: Mode) -> bool {
    match (want, theirs) {
        (Mode::Limit(a), Mode::Limit(b)) => a == b,
        (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
        _ => true,
    }
}

/// What the entry at `pos` of a queue waits for: `None` if it holds; `Some(Some(i))`: the
/// entry at `i` (the predecessor of an exclusive node or a foreign one, the nearest earlier
/// non-shared node of a shared one); `Some(None)`: any change of the queue (a semaphore slot
/// frees when any holder goes).
pub(super) fn blocked_by(queue: &[Entry], pos: usize) -> Option<Option<usize>> {
    match queue[pos].kind {
        Kind::Lock(Mode::Exclusive) | Kind::Foreign(_) => (pos > 0).then(|| Some(pos - 1)),
        Kind::Lock(Mode::Shared) => queue[..pos]
            .iter()
            .rposition(|e| e.kind != Kind::Lock(Mode::Shared))
            .map(Some),
        Kind::Lock(Mode::Limit(n)) => {
            let others = queue[..pos].iter().any(|e| e.kind != queue[pos].kind);
            (others || pos >= n as usize).then_some(None)
        }
    }
}

/// How many entries at the front of a queue hold.
pub(super) fn holding(queue: &[Entry]) -> usize {
    (0..queue.len())
        .take_while(|&i| blocked_by(queue, i).is_none())
        .count()
}

/// A random (version 4) UUID, as Curator's protected names use.
pub(super) fn uuid_v4() -> anyhow::Result<String> {
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

/// A key's children: its contenders, lowest sequence (the first holder) first, and the
/// children that are not sequential nodes at all (another recipe's, such as a Curator
/// semaphore's `leases` and `locks` or a kazoo semaphore's lease nodes).
pub(super) fn lock_queue(children: Vec<String>) -> (Vec<Entry>, Vec<String>) {
    let mut queue = Vec::new();
    let mut others = Vec::new();
    for name in children {
        match (kind_of(&name), split_seq(&name)) {
            (Some(kind), Some((_, seq))) => queue.push(Entry { name, seq, kind }),
            _ => others.push(name),
        }
    }
    queue.sort_by_key(|e| e.seq);
    others.sort();
    (queue, others)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(names: &[&str]) -> Vec<Entry> {
        let (q, others) = lock_queue(names.iter().map(|n| n.to_string()).collect());
        assert!(others.is_empty());
        q
    }

    #[test]
    fn queue_order_is_by_sequence_whatever_the_recipe() {
        let (q, others) = lock_queue(vec![
            "_c_b-lock-0000000010".into(),
            "0f3a__lock__0000000002".into(),
            "leases".into(),
            "_c_c-read-lock-0000000009".into(),
            "_c_d-__WRIT__0000000011".into(),
            "x-limit2-lock-".into(),
            "é000000000".into(),
        ]);
        let names: Vec<&str> = q.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "0f3a__lock__0000000002",
                "_c_c-read-lock-0000000009",
                "_c_b-lock-0000000010",
                "_c_d-__WRIT__0000000011",
            ]
        );
        assert_eq!(others, ["leases", "x-limit2-lock-", "é000000000"]);
    }

    #[test]
    fn names_say_the_mode_or_the_recipe() {
        let lock = |m| Some(Kind::Lock(m));
        let foreign = |r| Some(Kind::Foreign(r));
        assert_eq!(kind_of("_c_x-lock-0000000007"), lock(Mode::Exclusive));
        assert_eq!(
            kind_of("lock-0000000007"),
            lock(Mode::Exclusive),
            "Curator, unprotected"
        );
        assert_eq!(kind_of("_c_x-read-lock-0000000007"), lock(Mode::Shared));
        assert_eq!(
            kind_of("_c_x-limit12-lock-0000000007"),
            lock(Mode::Limit(12))
        );
        assert_eq!(
            kind_of("_c_x-read-0000000007"),
            foreign(Recipe::Unknown),
            "not a name dlock makes: waited for as an exclusive holder"
        );
        assert_eq!(
            kind_of("_c_x-limit0-lock-0000000007"),
            lock(Mode::Exclusive)
        );
        assert_eq!(
            kind_of("ab12__lock__0000000007"),
            foreign(Recipe::KazooLock)
        );
        assert_eq!(
            kind_of("ab12__rlock__0000000007"),
            foreign(Recipe::KazooReadLock)
        );
        assert_eq!(
            kind_of("_c_x-__READ__0000000007"),
            foreign(Recipe::CuratorReadWrite)
        );
        assert_eq!(
            kind_of("_c_x-__WRIT__-000000007"),
            foreign(Recipe::CuratorReadWrite)
        );
        assert_eq!(kind_of("lease-0000000007"), foreign(Recipe::Unknown));
        assert_eq!(kind_of("_c_x-lockX0000000007"), foreign(Recipe::Unknown));
        assert_eq!(kind_of("leases"), None);
        assert_eq!(kind_of("0000000007"), None);
        assert_eq!(kind_of("ab+000000007"), None);
        // Every name dlock makes ends in "lock-<seq>", as Curator's mutex sorts by.
        for m in [Mode::Exclusive, Mode::Shared, Mode::Limit(5)] {
            let name = format!("_c_u{}0000000001", node_kind(m));
            assert!(name.ends_with("lock-0000000001"));
            assert_eq!(kind_of(&name), lock(m));
        }
    }

    #[test]
    fn who_holds_in_each_mode() {
        let rw = queue(&[
            "_c_a-read-lock-0000000001",
            "_c_b-read-lock-0000000002",
            "_c_c-lock-0000000003",
            "_c_d-read-lock-0000000004",
        ]);
        assert_eq!(blocked_by(&rw, 0), None);
        assert_eq!(blocked_by(&rw, 1), None);
        assert_eq!(holding(&rw), 2);
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
        let sem = queue(&[
            "_c_a-limit2-lock-0000000001",
            "_c_b-limit2-lock-0000000002",
            "_c_c-limit2-lock-0000000003",
        ]);
        assert_eq!(blocked_by(&sem, 1), None);
        assert_eq!(blocked_by(&sem, 2), Some(None));
        assert!(!compatible(Mode::Limit(2), Mode::Limit(3)));
        assert!(!compatible(Mode::Exclusive, Mode::Limit(3)));
        assert!(compatible(Mode::Shared, Mode::Exclusive));
    }

    #[test]
    fn foreign_contenders_are_waited_for_as_exclusive_holders() {
        let q = queue(&[
            "ab__rlock__0000000001",
            "_c_a-read-lock-0000000002",
            "_c_b-limit2-lock-0000000003",
        ]);
        assert_eq!(holding(&q), 1);
        assert_eq!(
            blocked_by(&q, 1),
            Some(Some(0)),
            "a reader waits for kazoo's reader"
        );
        assert_eq!(blocked_by(&q, 2), Some(None));
        let q = queue(&["_c_a-read-lock-0000000001", "ab__lock__0000000002"]);
        assert_eq!(
            blocked_by(&q, 1),
            Some(Some(0)),
            "a foreign node waits like an exclusive one"
        );
    }

    #[test]
    fn uuids_look_like_curators() {
        let u = uuid_v4().unwrap();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, uuid_v4().unwrap());
    }

    proptest::proptest! {
        /// Any children (another recipe's, a hostile client's) make some queue, never a panic,
        /// and every contender in it is waited for or holds.
        #[test]
        fn any_children_make_a_queue(
            names in proptest::collection::vec("\\PC{0,30}|[_a-z-]{0,12}-?[0-9]{10}", 0..12),
        ) {
            let (queue, _) = lock_queue(names);
            for i in 0..queue.len() {
                let _ = blocked_by(&queue, i);
            }
            proptest::prop_assert!(holding(&queue) <= queue.len());
        }

        /// The names dlock creates say their mode and sequence back. (Past 2^31 - 1 nodes under
        /// one key ZooKeeper's counter wraps to negative numbers, which sort first: a limit of
        /// the recipe, Curator's too, not of this parser.)
        #[test]
        fn dlock_names_round_trip(n in 0u32..1000, m in 0u8..3, seq in 0..=i32::MAX) {
            let mode = match m {
                0 => Mode::Exclusive,
                1 => Mode::Shared,
                _ => Mode::Limit(n.max(2)),
            };
            let name = format!("_c_0f0e0d0c-0b0a-4908-8706-050403020100{}{seq:010}", node_kind(mode));
            proptest::prop_assert_eq!(kind_of(&name), Some(Kind::Lock(mode)));
            proptest::prop_assert_eq!(split_seq(&name).map(|(_, s)| s), Some(seq));
        }
    }
}
