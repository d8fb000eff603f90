//! The Lua scripts (one file each in lua/, with their KEYS, ARGV and replies described at the
//! top) and how they are invoked: each runs atomically in one round trip.

use super::SIGNAL_TTL_MS;
use redis::{Script, Value};

use super::ground::Seen;

use super::Keys;
use crate::backend::Request;
use crate::model::Mode;

// The scripts live in lua/, one file each, with their KEYS, ARGV and replies described at the
// top. Each runs atomically in one round trip.

/// Exclusive acquire (SET NX PX, fence, owner, waiter registration).
pub(in crate::backend) const ACQUIRE: &str = concat!(
    include_str!("lua/granted.lua"),
    include_str!("lua/no_start.lua"),
    include_str!("lua/acquire.lua")
);
/// Exclusive acquire that records the run's start when it takes the lock (one script, one
/// round trip: [`crate::backend::Request::start`]).
const ACQUIRE_START: &str = concat!(
    include_str!("lua/granted.lua"),
    include_str!("lua/start.lua"),
    include_str!("lua/acquire.lua")
);
/// Shared lock or semaphore slot acquire.
pub(super) const ACQUIRE_SHARED: &str = concat!(
    include_str!("lua/granted.lua"),
    include_str!("lua/acquire_shared.lua")
);
/// Extends a shared holder's lease: 1, or 0 when lost.
pub(super) const RENEW_SHARED: &str = include_str!("lua/renew_shared.lua");
/// Removes a shared holder and wakes one waiter.
pub(super) const RELEASE_SHARED: &str = include_str!("lua/release_shared.lua");
/// The shared holders, for `status`.
pub(super) const STATUS_SHARED: &str = include_str!("lua/status_shared.lua");
/// Extends the lock if the token is still ours: 1, or 0 when lost.
pub(in crate::backend) const RENEW: &str = include_str!("lua/renew.lua");
/// Deletes the lock if the token is ours (any holder's for an empty token) and wakes one waiter.
pub(super) const RELEASE: &str = include_str!("lua/release.lua");
/// Everything `status` shows, read atomically with the server's clock.
pub(in crate::backend) const STATUS: &str = include_str!("lua/status.lua");
/// A safe `break`: every holder's token becomes its tombstone, with the lease it had left.
const BREAK: &str = include_str!("lua/break.lua");
/// What a renewal script replies when a `break` told the holder to stop.
pub(in crate::backend) const BROKEN: i64 = -2;
/// The prefix a `break` puts before a holder's token.
pub(in crate::backend) const BROKEN_PREFIX: &str = "broken:";

/// A safe `break` of every holder of `keys`: replies with the longest lease left, in ms (0 when
/// nothing was held).
pub(in crate::backend) fn break_script(keys: &Keys) -> redis::ScriptInvocation<'static> {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = script(&SCRIPT, BREAK).prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.owner)
        .key(&keys.holders)
        .key(&keys.hmeta);
    inv
}

pub(in crate::backend) fn release_script(
    keys: &Keys,
    token: &str,
) -> redis::ScriptInvocation<'static> {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = SCRIPT.get_or_init(|| Script::new(RELEASE)).prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.owner)
        .key(&keys.signal)
        .arg(token)
        .arg(SIGNAL_TTL_MS);
    inv
}

/// The release of what `token` holds in `mode`: the lock key, or a shared/slot entry.
pub(super) fn release_for(
    keys: &Keys,
    token: &str,
    mode: Mode,
) -> redis::ScriptInvocation<'static> {
    if mode == Mode::Exclusive {
        release_script(keys, token)
    } else {
        release_shared_script(keys, token, mode)
    }
}

pub(super) fn release_shared_script(
    keys: &Keys,
    token: &str,
    mode: Mode,
) -> redis::ScriptInvocation<'static> {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = script(&SCRIPT, RELEASE_SHARED).prepare_invoke();
    inv.key(&keys.holders)
        .key(&keys.hmeta)
        .key(&keys.signal)
        .arg(token)
        .arg(SIGNAL_TTL_MS)
        .arg(mode.limit().unwrap_or(0));
    inv
}

pub(in crate::backend) fn script(
    cell: &'static std::sync::OnceLock<Script>,
    src: &str,
) -> &'static Script {
    cell.get_or_init(|| Script::new(src))
}

/// One acquire attempt for `mode` (ACQUIRE or ACQUIRE_SHARED with their keys); `slice_ms` > 0
/// registers a waiter for that long. With `start` (an exclusive lock's run's start event without
/// its token, and whether to splice the fence in as its token: not on a Redlock master), the
/// script records it when it takes the lock (ACQUIRE_START) and its grant carries the entry
/// ([`granted_entry`]).
pub(in crate::backend) fn acquire_starting(
    keys: &Keys,
    mode: Mode,
    token: &str,
    ttl_ms: u64,
    meta: &str,
    slice_ms: u64,
    start: Option<(&[u8], bool)>,
) -> redis::ScriptInvocation<'static> {
    static ACQ: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    static ACQ_START: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    static ACQ_SHARED: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let start = start.filter(|_| mode == Mode::Exclusive);
    let mut inv = match mode {
        Mode::Exclusive => {
            let mut inv = match start {
                Some(_) => script(&ACQ_START, ACQUIRE_START).prepare_invoke(),
                None => script(&ACQ, ACQUIRE).prepare_invoke(),
            };
            inv.key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.owner)
                .key(&keys.waiters)
                .key(&keys.holders)
                .key(&keys.wwait)
                .key(&keys.hmeta);
            inv
        }
        Mode::Shared | Mode::Limit(_) => {
            let mut inv = script(&ACQ_SHARED, ACQUIRE_SHARED).prepare_invoke();
            inv.key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.hmeta)
                .key(&keys.waiters)
                .key(&keys.holders)
                .key(&keys.wwait)
                .key(&keys.signal)
                .key(&keys.owner);
            inv
        }
    };
    inv.arg(token).arg(ttl_ms).arg(meta).arg(slice_ms);
    if mode != Mode::Exclusive {
        inv.arg(mode.limit().unwrap_or(0)).arg(SIGNAL_TTL_MS);
    }
    inv.arg(crate::history::retention::retention_ms());
    if let Some((body, token)) = start {
        inv.key(&keys.runs)
            .key(&keys.lastrun)
            .arg(body)
            .arg(crate::history::MAX_EVENTS)
            .arg(super::history::keep_ms(None))
            .arg(if token { "1" } else { "0" });
    }
    inv
}

/// The start entry a grant of ACQUIRE_START carries (see lua/start.lua), if any.
pub(in crate::backend) fn granted_entry(reply: &Value) -> Option<Vec<u8>> {
    match reply {
        Value::Array(items) if matches!(items.first(), Some(Value::Int(1))) => match items.get(5) {
            Some(Value::BulkString(b)) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The error for ACQUIRE's `{-1, m}` reply.
pub(in crate::backend) fn mismatch(req: &Request<'_>, theirs: i64) -> anyhow::Error {
    let theirs = match theirs {
        -1 => "exclusive".to_string(),
        0 => "shared".to_string(),
        n => format!("--limit {n}"),
    };
    crate::backend::mode_mismatch(req.key, req.mode, &theirs)
}

/// An acquire script's reply: granted or not (or a mode mismatch), its value, and what a
/// grant read of the server (lua/granted.lua).
pub(in crate::backend) fn acquire_reply(reply: Value) -> redis::RedisResult<(i64, i64, Seen)> {
    let bad = || -> redis::RedisError {
        (
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the acquire script",
        )
            .into()
    };
    let items = match reply {
        Value::Array(items) => items,
        Value::ServerError(e) => return Err(e.into()),
        _ => return Err(bad()),
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    // What the server sends is untrusted: a short word, or nothing.
    let word = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) if b.len() <= 64 => Some(String::from_utf8_lossy(b).into()),
        _ => None,
    };
    let (Some(acquired), Some(value)) = (int(items.first()), int(items.get(1))) else {
        return Err(bad());
    };
    let seen = Seen {
        up: int(items.get(2)).and_then(|n| u64::try_from(n).ok()),
        policy: word(items.get(3)),
        role: word(items.get(4)),
    };
    Ok((acquired, value, seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_grant_reply_carries_what_info_said() {
        let full = Value::Array(vec![
            Value::Int(1),
            Value::Int(7),
            Value::Int(42),
            bulk("allkeys-lru"),
            bulk("master"),
        ]);
        let (a, v, seen) = acquire_reply(full).unwrap();
        assert_eq!((a, v, seen.up), (1, 7, Some(42)));
        assert_eq!(seen.policy.as_deref(), Some("allkeys-lru"));
        assert!(!seen.is_replica());
        // INFO denied: nils.
        let denied = Value::Array(vec![Value::Int(1), Value::Int(7), Value::Nil, Value::Nil]);
        assert_eq!(acquire_reply(denied).unwrap().2, Seen::default());
        let busy = Value::Array(vec![Value::Int(0), Value::Int(1500)]);
        assert_eq!(acquire_reply(busy).unwrap().1, 1500);
        for bad in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![bulk("1"), Value::Int(1)]),
        ] {
            assert!(acquire_reply(bad).is_err());
        }
        let huge = Value::Array(vec![
            Value::Int(1),
            Value::Int(1),
            Value::Int(-5),
            bulk(&"x".repeat(65)),
        ]);
        let seen = acquire_reply(huge).unwrap().2;
        assert_eq!((seen.up, seen.policy), (None, None));
    }
}
