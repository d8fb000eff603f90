//! The Lua scripts (one file each in lua/, with their KEYS, ARGV and replies described at the
//! top) and how they are invoked: each runs atomically in one round trip.

use super::SIGNAL_TTL_MS;
use redis::Script;

use super::Keys;
use crate::backend::Request;
use crate::model::Mode;

// The scripts live in lua/, one file each, with their KEYS, ARGV and replies described at the
// top. Each runs atomically in one round trip.

/// Exclusive acquire (SET NX PX, fence, owner, waiter registration).
pub(in crate::backend) const ACQUIRE: &str = concat!(
    include_str!("lua/granted.lua"),
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
/// registers a waiter for that long.
pub(in crate::backend) fn acquire_script(
    keys: &Keys,
    mode: Mode,
    token: &str,
    ttl_ms: u64,
    meta: &str,
    slice_ms: u64,
) -> redis::ScriptInvocation<'static> {
    static ACQ: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    static ACQ_SHARED: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let mut inv = match mode {
        Mode::Exclusive => {
            let mut inv = script(&ACQ, ACQUIRE).prepare_invoke();
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
    inv
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

/// An acquire script's reply: granted or not (or a mode mismatch), its value, and the server's
/// uptime in seconds when a grant could read it.
pub(in crate::backend) fn acquire_reply(
    reply: Vec<i64>,
) -> redis::RedisResult<(i64, i64, Option<u64>)> {
    match reply[..] {
        [acquired, value] => Ok((acquired, value, None)),
        [acquired, value, up] => Ok((acquired, value, u64::try_from(up).ok())),
        _ => Err((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the acquire script",
        )
            .into()),
    }
}
