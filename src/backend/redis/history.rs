//! Run history on Redis (docs/history.md): a list `dlock:{TAG}:runs` of `MS BODY` events,
//! newest first, trimmed to [`MAX_EVENTS`] by every write, and `dlock:{TAG}:lastrun`, the newest
//! start, for `--once-per`. `MS` is the server's clock (`TIME` in the script). Both keys share
//! the lock's hash tag (one Cluster slot) and expire the retention ([`crate::history::retention`]) after their last write. Every
//! script is one round trip; the end goes out with the release (`release_end`).

use std::time::Duration;

use redis::Script;

use super::scripts::script;
use super::{Connection, Keys, SIGNAL_TTL_MS};
use crate::history::{Begun, MAX_EVENT_BYTES, MAX_EVENTS, Stored};

/// Adds a start (or skips: `--once-per`).
const RUN_START: &str = include_str!("lua/run_start.lua");
/// Adds an end, then releases the lock as release.lua does.
const RELEASE_END: &str = concat!(
    include_str!("lua/run_end.lua"),
    include_str!("lua/release.lua")
);
/// Adds an end.
const RUN_END: &str = concat!(include_str!("lua/run_end.lua"), "return 1\n");
/// The newest events, each cut.
const RUNS: &str = include_str!("lua/runs.lua");
/// Takes a start back.
const RUN_UNDO: &str = include_str!("lua/run_undo.lua");
/// The newest start and its age.
const RUN_LAST: &str = include_str!("lua/run_last.lua");

/// Bytes read of one event: the server's `MS ` and an event at its largest, and one more (a
/// longer one reads as over the cap).
const READ_CAP: usize = MAX_EVENT_BYTES + 32;

pub(super) fn keep_ms(once_per: Option<Duration>) -> u64 {
    // How long a key's history outlives its last write: a key unused for this long loses it.
    let keep = crate::history::retention::retention();
    let keep = once_per.map_or(keep, |d| d.max(keep));
    u64::try_from(keep.as_millis()).unwrap_or(u64::MAX)
}

/// `run_start.lua`: the start, or the newest start when `once_per` says skip.
pub(in crate::backend) fn begin(
    con: &mut Connection,
    keys: &Keys,
    body: &[u8],
    once_per: Option<Duration>,
) -> redis::RedisResult<Begun> {
    begin_entry(con, keys, body, once_per).map(|(b, _)| b)
}

/// [`begin`], and the entry it added (for [`undo`]).
pub(in crate::backend) fn begin_entry(
    con: &mut Connection,
    keys: &Keys,
    body: &[u8],
    once_per: Option<Duration>,
) -> redis::RedisResult<(Begun, Option<Vec<u8>>)> {
    static S: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let within = once_per.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    });
    let reply: Vec<redis::Value> = script(&S, RUN_START)
        .key(&keys.runs)
        .key(&keys.lastrun)
        .arg(body)
        .arg(within)
        .arg(MAX_EVENTS)
        .arg(keep_ms(once_per))
        .arg(READ_CAP)
        .invoke(con)?;
    let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).ok();
    match reply.as_slice() {
        [first, entry] if int(first) == Some(1) => {
            Ok((Begun::Started, redis::from_redis_value(entry.clone()).ok()))
        }
        [first, last, ago] if int(first) == Some(0) => {
            let last: Vec<u8> = redis::from_redis_value(last.clone())?;
            let ago = int(ago).and_then(|a| u64::try_from(a).ok()).unwrap_or(0);
            let mut last = last;
            last.truncate(READ_CAP);
            Ok((
                Begun::Skip {
                    last: Stored::from_line(&last),
                    ago: Duration::from_millis(ago),
                },
                None,
            ))
        }
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the history script",
        ))),
    }
}

/// `run_last.lua`: the newest start and how long ago it was, if any.
pub(in crate::backend) fn last_start(
    con: &mut Connection,
    keys: &Keys,
    within: Duration,
) -> redis::RedisResult<Option<(Stored, Duration)>> {
    static S: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let reply: Vec<redis::Value> = script(&S, RUN_LAST)
        .key(&keys.lastrun)
        .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX))
        .arg(READ_CAP)
        .invoke(con)?;
    let [last, ago] = reply.as_slice() else {
        return Ok(None);
    };
    let mut last: Vec<u8> = redis::from_redis_value(last.clone())?;
    last.truncate(READ_CAP);
    let ago: i64 = redis::from_redis_value(ago.clone())?;
    let ago = Duration::from_millis(u64::try_from(ago).unwrap_or(0));
    Ok(Some((Stored::from_line(&last), ago)))
}

/// `run_undo.lua`: takes back the start `entry` that [`begin_entry`] added.
pub(in crate::backend) fn undo(
    con: &mut Connection,
    keys: &Keys,
    entry: &[u8],
) -> redis::RedisResult<()> {
    static S: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let _: i64 = script(&S, RUN_UNDO)
        .key(&keys.runs)
        .key(&keys.lastrun)
        .arg(entry)
        .invoke(con)?;
    Ok(())
}

/// After an acquire whose reply was lost: takes back ([`undo`]) the start of run `id` that the
/// acquire script may have recorded with the lock. Nobody else writes a start while the lock is
/// ours, so it is among the newest entries if it is anywhere.
pub(in crate::backend) fn undo_run(
    con: &mut Connection,
    keys: &Keys,
    id: &str,
) -> redis::RedisResult<()> {
    let newest: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(&keys.runs)
        .arg(0)
        .arg(3)
        .query(con)?;
    for entry in newest {
        let read = Stored::from_line(&entry[..entry.len().min(READ_CAP)]);
        if crate::history::RunEvent::read(&read).is_some_and(|e| e.ev == "start" && e.run == id) {
            return undo(con, keys, &entry);
        }
    }
    Ok(())
}

/// `release_end`: the end, then the release (release.lua's reply: 1 released, 0 not ours).
pub(in crate::backend) fn release_end(
    con: &mut Connection,
    keys: &Keys,
    token: &str,
    end: &[u8],
) -> redis::RedisResult<i64> {
    static S: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    script(&S, RELEASE_END)
        .key(&keys.lock)
        .key(&keys.owner)
        .key(&keys.signal)
        .key(&keys.runs)
        .arg(token)
        .arg(SIGNAL_TTL_MS)
        .arg(end)
        .arg(MAX_EVENTS)
        .arg(keep_ms(None))
        .invoke(con)
}

/// `run_end`: the end alone.
pub(in crate::backend) fn end(
    con: &mut Connection,
    keys: &Keys,
    end: &[u8],
) -> redis::RedisResult<()> {
    static S: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let _: i64 = script(&S, RUN_END)
        .key(&keys.lock)
        .key(&keys.owner)
        .key(&keys.signal)
        .key(&keys.runs)
        .arg("")
        .arg(SIGNAL_TTL_MS)
        .arg(end)
        .arg(MAX_EVENTS)
        .arg(keep_ms(None))
        .invoke(con)?;
    Ok(())
}

/// The newest events, newest first, each cut to [`READ_CAP`] bytes by the script.
pub(in crate::backend) fn read(
    con: &mut Connection,
    keys: &Keys,
) -> redis::RedisResult<Vec<Stored>> {
    static S: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    let entries: Vec<Vec<u8>> = script(&S, RUNS)
        .key(&keys.runs)
        .arg(MAX_EVENTS)
        .arg(READ_CAP)
        .invoke(con)?;
    Ok(entries
        .iter()
        .take(MAX_EVENTS)
        .map(|e| Stored::from_line(&e[..e.len().min(READ_CAP)]))
        .collect())
}
