//! Listing a server's (or a Cluster's primaries') locks.

use super::Connection;
use super::names::untag;
use crate::model::Key;

/// The lock keys named by `dlock:{KEY}…` Redis keys on `con` (SCAN: the server is never
/// blocked), at most [`crate::backend::MAX_LISTED`].
pub(in crate::backend) fn scan_keys(con: &mut Connection) -> redis::RedisResult<Vec<Key>> {
    // The keys that exist only while the lock is held or waited for (the fence counter and the
    // records stay after use, and are not candidates).
    scan_named(con, &["}", "}:waiters", "}:holders", "}:wwait"])
}

/// The keys with a run history (`dlock:{KEY}:runs`) on `con`, at most
/// [`crate::backend::MAX_LISTED`].
pub(in crate::backend) fn scan_history_keys(con: &mut Connection) -> redis::RedisResult<Vec<Key>> {
    scan_named(con, &["}:runs"])
}

/// The lock keys named by `dlock:{KEY}SUFFIX` Redis keys on `con`, for the suffixes given.
fn scan_named(con: &mut Connection, suffixes: &[&str]) -> redis::RedisResult<Vec<Key>> {
    let mut keys = std::collections::BTreeSet::new();
    let mut cursor = 0u64;
    loop {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("dlock:{*")
            .arg("COUNT")
            .arg(1000)
            .query(con)?;
        for name in names {
            let Some(rest) = name.strip_prefix("dlock:{") else {
                continue;
            };
            let key = suffixes
                .iter()
                .find_map(|s| rest.strip_suffix(s))
                .and_then(untag)
                .and_then(|k| Key::new(&k).ok());
            keys.extend(key);
        }
        if next == 0 || keys.len() >= crate::backend::MAX_LISTED {
            return Ok(keys.into_iter().take(crate::backend::MAX_LISTED).collect());
        }
        cursor = next;
    }
}

/// `host:port` of each primary that serves slots, from `CLUSTER NODES` (`id host:port@bus[,name]
/// flags master-id ping pong epoch state slots…`).
pub(super) fn cluster_primaries(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            let flags = f.get(2)?;
            let serving = f.len() > 8 && f[7] == "connected";
            let primary = flags.split(',').any(|x| x == "master")
                && !flags.split(',').any(|x| x == "fail" || x == "noaddr");
            let addr = f.get(1)?.split(['@', ',']).next()?;
            (serving && primary).then(|| addr.to_string())
        })
        .collect()
}
