//! The names of a lock's Redis keys: one hash tag per lock, so that a Cluster keeps them in
//! one slot.

use crate::model::Key;

/// The names of one lock's keys.
#[derive(Clone)]
pub(in crate::backend) struct Keys {
    pub(in crate::backend) lock: String,
    pub(in crate::backend) fence: String,
    pub(in crate::backend) owner: String,
    pub(in crate::backend) signal: String,
    pub(in crate::backend) waiters: String,
    /// Shared holders and semaphore slot holders: token -> lease end (server ms).
    pub(in crate::backend) holders: String,
    /// Their metadata and fencing tokens, and `~mode` (0 shared, else the semaphore's n).
    pub(in crate::backend) hmeta: String,
    /// Waiting exclusive runs: token -> registration end; new shared holders wait for them.
    pub(in crate::backend) wwait: String,
    /// The run history: a list of events, newest first (redis/history.rs).
    pub(in crate::backend) runs: String,
    /// The newest start event, for `--once-per`.
    pub(in crate::backend) lastrun: String,
}

impl Keys {
    /// All keys start with `dlock:{TAG}`, so they hash to one Cluster slot, and the suffixes
    /// end in distinct characters, so no key of one lock is a key of another. TAG is KEY when
    /// it has no `}` and no `%` (then the lock is `dlock:{KEY}`, the name applications use);
    /// otherwise KEY with `%` written `%25` and `}` written `%7D` (see [`tag`]).
    pub(in crate::backend) fn new(key: &Key) -> Keys {
        let lock = format!("dlock:{{{}}}", tag(key.as_str()));
        Keys {
            fence: format!("{lock}:fence"),
            owner: format!("{lock}:owner"),
            signal: format!("{lock}:signal"),
            waiters: format!("{lock}:waiters"),
            holders: format!("{lock}:holders"),
            hmeta: format!("{lock}:hmeta"),
            wwait: format!("{lock}:wwait"),
            runs: format!("{lock}:runs"),
            lastrun: format!("{lock}:lastrun"),
            lock,
        }
    }

    /// `DEL` of every key of the lock (for [`Backend::purge`]).
    pub(in crate::backend) fn del_all(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&self.lock)
            .arg(&self.fence)
            .arg(&self.owner)
            .arg(&self.signal)
            .arg(&self.waiters)
            .arg(&self.holders)
            .arg(&self.hmeta)
            .arg(&self.wwait)
            .arg(&self.runs)
            .arg(&self.lastrun);
        cmd
    }
}

/// The hash tag of a key: the key itself unless it holds `}` (which would end the tag early:
/// `}x` would leave an empty tag, and Redis would hash each of the lock's keys whole, to
/// different slots) or `%`; then %-escaped. Escaped tags always hold a `%` and plain ones never
/// do, so no two keys share a tag; the tag is never empty (a key is not).
pub(in crate::backend) fn tag(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.contains(['}', '%']) {
        return key.into();
    }
    key.replace('%', "%25").replace('}', "%7D").into()
}

/// The key of a hash tag (see [`tag`]); `None` for a tag no key has.
pub(in crate::backend) fn untag(tag: &str) -> Option<String> {
    if !tag.contains('%') {
        return Some(tag.to_string());
    }
    let mut key = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(at) = rest.find('%') {
        key.push_str(&rest[..at]);
        let c = match rest.get(at + 1..at + 3)? {
            "25" => '%',
            "7D" => '}',
            _ => return None,
        };
        key.push(c);
        rest = &rest[at + 3..];
    }
    key.push_str(rest);
    Some(key)
}

/// A fresh random 128-bit token, as hex.
pub(in crate::backend) fn token() -> anyhow::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a lock token: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_a_nonempty_tag_of_its_own() {
        for key in [
            "job", "}x", "{}", "a}b{c", "%", "a%7Db", "%}", "%257D", "{", "x{y",
        ] {
            let t = tag(key);
            assert!(!t.is_empty() && !t.contains('}'), "{key}: {t}");
            assert_eq!(untag(&t).as_deref(), Some(key), "{key}");
        }
        assert_eq!(tag("job"), "job");
        assert_eq!(tag("}x"), "%7Dx");
        assert_eq!(tag("a%7Db"), "a%257Db");
        assert_ne!(tag("}"), tag("%7D"));
        assert_eq!(untag("%zz"), None);
    }
}
