//! The names of dlock's locks on etcd: key `KEY` is the prefix `dlock/E(KEY)/`, where `E`
//! writes `%` as `%25` and `/` as `%2F` and keeps every other byte.
//!
//! etcd reads a lock as a key range: every key starting with the prefix is in the queue. With a
//! raw `/` in `E(KEY)`, `dlock/a/` would hold `a/b`'s `dlock/a/b/<lease>`. With no `/` in any
//! `E(KEY)`, the first `/` after `dlock/` ends the name, so only one key's prefix holds a given
//! etcd key, and since `E` is one-to-one (`%` never stands for itself), distinct keys are distinct
//! locks. A key without `/` or `%` keeps its name: `etcdctl lock dlock/KEY` is its lock.

use super::http::prefix_end;
use crate::model::Key;

/// Where dlock's locks live: `dlock/E(KEY)/`.
pub(super) const ROOT: &str = "dlock/";

/// Where the run histories live ([`super::history`]): `dlock/%history/E(KEY)/` for events and
/// `dlock/%history/E(KEY)` for `--once-per`'s marker. Inside `dlock/`, so that the permission
/// dlock's users need (`readwrite dlock/`) covers them, but no lock's: `E` writes `%` only as
/// `%25` or `%2F`, so no `E(KEY)` is `%history` and no lock's range `dlock/E(KEY)/` holds
/// anything below it ([`key_of`] takes none of it for a lock).
pub(super) const HISTORY: &str = "dlock/%history/";

/// The ranges `dlock status` lists locks from: `dlock/` without [`HISTORY`].
pub(super) fn listing_ranges() -> [(Vec<u8>, Vec<u8>); 2] {
    let (root, history) = (ROOT.as_bytes(), HISTORY.as_bytes());
    [
        (root.to_vec(), history.to_vec()),
        (prefix_end(history), prefix_end(root)),
    ]
}

/// `KEY` with `%` as `%25` and `/` as `%2F`.
pub(super) fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The text [`escape`] made `name` from; `None` if no text escapes to `name` (a raw `/`, a
/// `%` not followed by `25` or `2F`).
pub(super) fn unescape(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find(['%', '/']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with("%25") {
            out.push('%');
        } else if tail.starts_with("%2F") {
            out.push('/');
        } else {
            return None;
        }
        rest = &tail[3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The prefix of a key's lock: `dlock/E(KEY)/`.
pub(crate) fn lock_prefix(key: &Key) -> Vec<u8> {
    format!("{ROOT}{}/", escape(key.as_str())).into_bytes()
}

/// The key whose lock holds the etcd key `name` (`dlock/E(KEY)/<anything without '/'>`), if it
/// is one of dlock's.
pub(super) fn key_of(name: &[u8]) -> Option<Key> {
    let rest = name.strip_prefix(ROOT.as_bytes())?;
    let slash = rest.iter().position(|&b| b == b'/')?;
    let (escaped, own) = (&rest[..slash], &rest[slash + 1..]);
    if own.is_empty() || own.contains(&b'/') {
        return None;
    }
    let key = unescape(std::str::from_utf8(escaped).ok()?)?;
    Key::new(&key).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn histories_are_no_lock() {
        assert_eq!(unescape("%history"), None);
        assert_eq!(key_of(b"dlock/%history/a/0123abcd"), None);
        assert_eq!(key_of(b"dlock/%history/a"), None);
    }

    #[test]
    fn slash_and_percent_are_escaped() {
        let k = |s: &str| Key::new(s).unwrap();
        assert_eq!(lock_prefix(&k("deploy")), b"dlock/deploy/");
        assert_eq!(lock_prefix(&k("a/b")), b"dlock/a%2Fb/");
        assert_eq!(lock_prefix(&k("a%2Fb")), b"dlock/a%252Fb/");
        assert_eq!(lock_prefix(&k("a/")), b"dlock/a%2F/");
        assert_eq!(lock_prefix(&k("a:b")), b"dlock/a:b/");
        assert_eq!(key_of(b"dlock/a%2Fb/694d"), Some(k("a/b")));
        assert_eq!(key_of(b"dlock/a%252Fb/694d"), Some(k("a%2Fb")));
        for foreign in [
            &b"dlock/a/b/694d"[..],
            b"dlock/a%41/1",
            b"dlock/a%/1",
            b"dlock/a/",
            b"dlock/a",
            b"other/a/1",
            b"dlock//1",
        ] {
            assert_eq!(
                key_of(foreign),
                None,
                "{}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    /// Keys as users write them: short, from an alphabet rich in the characters that matter.
    fn key() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a/%:2Fb5.\\-é ]{1,12}").unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn escape_round_trips(k in key()) {
            prop_assert_eq!(unescape(&escape(&k)), Some(k.clone()));
            let key = Key::new(&k).unwrap();
            let mut own = lock_prefix(&key);
            own.extend_from_slice(b"694d1c");
            prop_assert_eq!(key_of(&own), Some(key));
        }

        #[test]
        fn no_lock_holds_another_keys_entries(a in key(), b in key()) {
            prop_assume!(a != b);
            let (ka, kb) = (Key::new(&a).unwrap(), Key::new(&b).unwrap());
            let (pa, pb) = (lock_prefix(&ka), lock_prefix(&kb));
            prop_assert_ne!(&pa, &pb);
            // An entry of b's lock is never in a's range [pa, prefix_end(pa)).
            let mut entry = pb.clone();
            entry.extend_from_slice(b"694d1c");
            let end = prefix_end(&pa);
            prop_assert!(!(entry >= pa && entry < end), "{a:?} holds {b:?}'s entry");
        }

        #[test]
        fn no_lock_holds_a_history(a in key(), b in key()) {
            let ka = Key::new(&a).unwrap();
            let pa = lock_prefix(&ka);
            let end = prefix_end(&pa);
            let theirs = format!("{HISTORY}{}/0123abcd", escape(&b)).into_bytes();
            let marker = format!("{HISTORY}{}", escape(&b)).into_bytes();
            for k in [theirs, marker] {
                prop_assert!(!(k >= pa && k < end), "{a:?}'s lock holds {b:?}'s history");
                prop_assert_eq!(key_of(&k), None);
            }
        }

        #[test]
        fn unescape_never_panics(s in "\\PC{0,20}") {
            if let Some(k) = unescape(&s) {
                prop_assert_eq!(escape(&k), s);
            }
        }

        #[test]
        fn key_of_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut name = ROOT.as_bytes().to_vec();
            name.extend_from_slice(&bytes);
            let _ = key_of(&name);
            let _ = key_of(&bytes);
        }
    }
}
