//! Lock node names and the queue they form: which mode a node's name says (Curator's `-lock-`,
//! dlock's `-read-` and `-limitN-`), the order (by sequence number), and whom a node waits for.

use anyhow::Context;

use crate::backend::Mode;

/// The part of a lock node's name between the uuid and the sequence: Curator's `-lock-` for an
/// exclusive lock, `-read-` for a shared one, `-limitN-` for a slot of a semaphore of N.
pub(super) fn node_kind(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "-lock-".into(),
        Mode::Shared => "-read-".into(),
        Mode::Limit(n) => format!("-limit{n}-"),
    }
}

/// The mode a lock node's name says (`None`: not a lock node of ours).
pub(super) fn kind_of(name: &str) -> Option<Mode> {
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
pub(super) fn compatible(want: Mode, theirs: Mode) -> bool {
    match (want, theirs) {
        (Mode::Limit(a), Mode::Limit(b)) => a == b,
        (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
        _ => true,
    }
}

/// What the node at `pos` of a queue waits for: `None` if it holds; `Some(Some(i))`: the node at
/// `i` (the predecessor of an exclusive node, the nearest earlier exclusive node of a shared
/// one); `Some(None)`: any change of the queue (a semaphore slot frees when any holder goes).
pub(super) fn blocked_by(queue: &[String], pos: usize) -> Option<Option<usize>> {
    match kind_of(&queue[pos])? {
        Mode::Exclusive => (pos > 0).then(|| Some(pos - 1)),
        Mode::Shared => queue[..pos]
            .iter()
            .rposition(|n| kind_of(n) == Some(Mode::Exclusive))
            .map(Some),
        Mode::Limit(n) => (pos >= n as usize).then_some(None),
    }
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

/// The lock nodes among a key's children, lowest sequence (the holder) first. Other children
/// (not made by a lock recipe) are ignored, as Curator does.
pub(super) fn lock_queue(children: Vec<String>) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
