//! What a MySQL/MariaDB server stands on, asked in the round trip that first tries a lock
//! (refusing a run on a node of a cluster, warning on a read-only server) and by `dlock doctor`
//! (the server, the cluster, `read_only`, the session's `wait_timeout` against `--ttl`).
//!
//! The cluster question itself (what to ask which flavour, how to read the answers) is in
//! cluster.rs; the lock's statements are in mod.rs.

use std::time::Duration;

use anyhow::Context;
use mysql::prelude::Queryable;
use mysql::{Conn, Value};

use super::cluster::{self, Cluster};
use super::rows::{first_row, last_row};
use super::{COMMAND_TIMEOUT, MysqlBackend, UPTIME, wait_timeout_secs};
use crate::backend::ground::{Finding, Verdict, warn_once};
use crate::exit::{Unavailable, Unsound};

/// Runs `sql(probe)`, whose row ends with the cluster probe's columns; when the server will
/// not answer the probe (see [`cluster::probe_refused`]), runs `sql(NO_PROBE)` instead and says
/// why. The row's values, as the text protocol gives them.
fn probed(
    con: &mut Conn,
    sql: impl Fn(&str) -> String,
) -> mysql::Result<(Vec<Value>, Option<String>)> {
    let probe = cluster::probe(cluster::flavour(con.server_version()));
    let row = |con: &mut Conn, sql: &str| first_row(con, sql, |r| Ok(r.unwrap()));
    match row(con, &sql(probe)) {
        Err(mysql::Error::MySqlError(e)) if cluster::probe_refused(e.code) => {
            let why = format!("the server would not say ({})", e.message);
            Ok((
                row(con, &sql(cluster::NO_PROBE))?.unwrap_or_default(),
                Some(why),
            ))
        }
        other => Ok((other?.unwrap_or_default(), None)),
    }
}

/// A value of the text protocol as an integer (`None`: NULL or not a number).
fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::Int(i) => Some(*i),
        Value::UInt(u) => i64::try_from(*u).ok(),
        _ => None,
    }
}

/// `@@global.read_only` is set (1, `ON`, or MariaDB 11's finer levels).
fn read_only(v: Option<&Value>) -> Option<bool> {
    match v? {
        Value::NULL => None,
        Value::Bytes(b) => Some(!matches!(
            String::from_utf8_lossy(b)
                .trim()
                .to_ascii_uppercase()
                .as_str(),
            "0" | "OFF"
        )),
        other => int(Some(other)).map(|i| i != 0),
    }
}

fn read_only_finding(on: Option<bool>) -> Finding {
    const CHECK: &str = "read_only";
    match on {
        Some(false) => Finding::ok(CHECK, "OFF"),
        Some(true) => Finding::warn(
            CHECK,
            "ON (a replica?): its GET_LOCK does not exclude a holder on the primary, and dlock \
             writes its table there only as a user that bypasses read_only",
            "point every dlock at the primary",
        ),
        None => Finding::unknown(CHECK, "the server did not say"),
    }
}

impl MysqlBackend {
    /// The first statement on a lock's connection, one round trip: the session's
    /// `wait_timeout` from `ttl`, then `take` (an SQL expression that tries the lock without
    /// waiting and gives an integer or NULL) with what the server stands on. On a node of a
    /// cluster of more than one — unless the URL says `?cluster=one-node` — this is
    /// [`Unsound`] (exit 78): the caller drops `con`, which releases whatever `take` took, so
    /// nothing runs. A Galera node costs one more round trip (its cluster's size is a status
    /// counter); a read-only server warns once. Returns `take`'s value.
    pub(super) fn first_take(
        &self,
        con: &mut Conn,
        ttl: Duration,
        take: &str,
    ) -> anyhow::Result<Option<i64>> {
        let secs = wait_timeout_secs(ttl);
        let (row, refused) = probed(con, |probe| {
            format!("SET SESSION wait_timeout = {secs}; SELECT {take}, @@global.read_only, {probe}")
        })
        .map_err(|e| self.fail(e))?;
        if row.len() != 2 + cluster::PROBE_COLUMNS {
            return Err(
                Unavailable(format!("{}: an unexpected answer to GET_LOCK", self.addr)).into(),
            );
        }
        let cluster = match (refused, cluster::seen(&row[2..])) {
            (Some(why), _) => Some(self.unprivileged(con, why)?),
            (None, Some(seen)) => Some(seen),
            // A Galera node, stated to be the only one used: its cluster's size changes
            // nothing, so it is not asked.
            (None, None) if self.one_node => None,
            (None, None) => Some(self.galera(con)?),
        };
        if let Some(cluster) = cluster {
            let found = cluster::finding(&cluster, self.one_node);
            if found.verdict == Verdict::Unsafe {
                return Err(Unsound(format!("{}: {}", self.addr, found.sentence())).into());
            }
        }
        let ro = read_only_finding(read_only(row.get(1)));
        if ro.verdict == Verdict::Warn {
            warn_once(&ro);
        }
        Ok(int(row.first()))
    }

    /// The cluster, when the probe was refused (`why`), from system variables every user may
    /// read: `@@global.wsrep_on` (a Galera node, whose size is asked next) and
    /// `@@global.group_replication_group_name` (a server set up for Group Replication, whose
    /// members could not be read: refused unless the URL says one node). An unknown variable
    /// (1193) means its plugin is not loaded. Two more round trips, on this path only.
    fn unprivileged(&self, con: &mut Conn, why: String) -> anyhow::Result<Cluster> {
        let ask = |con: &mut Conn, sql: &str| match first_row(con, sql, |r| Ok(r.unwrap())) {
            Ok(row) => Ok(row.unwrap_or_default().into_iter().next()),
            Err(mysql::Error::MySqlError(e)) if e.code == 1193 => Ok(None),
            Err(e) => Err(e),
        };
        let wsrep = ask(con, "SELECT @@global.wsrep_on").map_err(|e| self.fail(e))?;
        if wsrep.as_ref().and_then(cluster::is_on) == Some(true) {
            return self.galera(con);
        }
        let group =
            ask(con, "SELECT @@global.group_replication_group_name").map_err(|e| self.fail(e))?;
        Ok(match group {
            Some(Value::Bytes(b)) if !b.is_empty() => Cluster::GroupUnread(why),
            _ => Cluster::Plain,
        })
    }

    /// A Galera node's cluster: its size, from the status counter.
    fn galera(&self, con: &mut Conn) -> anyhow::Result<Cluster> {
        let row =
            last_row::<(Vec<u8>, Vec<u8>)>(con, cluster::CLUSTER_SIZE).map_err(|e| self.fail(e))?;
        Ok(match cluster::cluster_size(row.as_slice()) {
            Some(size) => Cluster::Galera { size },
            None => Cluster::Unknown("wsrep_on, but no wsrep_cluster_size".into()),
        })
    }

    /// `dlock doctor` on MySQL/MariaDB: the server (version, address, uptime), the cluster,
    /// `read_only`, and whether the session's `wait_timeout` follows `--ttl` (a dead client
    /// host's lock lasts until the server drops its idle connection).
    pub(super) fn doctor_checks(&self, ttl: Duration) -> anyhow::Result<Vec<Finding>> {
        let mut con = self.connect(COMMAND_TIMEOUT)?;
        let secs = wait_timeout_secs(ttl);
        let (row, refused) = probed(&mut con, |probe| {
            format!(
                "SET SESSION wait_timeout = {secs}; SELECT VERSION(), @@version_comment, \
                 {UPTIME}, @@session.wait_timeout, @@global.read_only, {probe}"
            )
        })
        .map_err(|e| self.fail(e))
        .context("cannot ask the server")?;
        if row.len() != 5 + cluster::PROBE_COLUMNS {
            anyhow::bail!("{}: an unexpected answer", self.addr);
        }
        let word = |v: &Value| match v {
            Value::Bytes(b) => String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned(),
            _ => String::new(),
        };
        let uptime = int(row.get(2))
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| {
                format!(
                    ", up {}",
                    humantime::format_duration(Duration::from_secs(s))
                )
            })
            .unwrap_or_default();
        let mut findings = vec![Finding::ok(
            "server",
            format!(
                "{} ({}) at {}{uptime}",
                word(&row[0]),
                word(&row[1]),
                self.addr
            ),
        )];
        let cluster = match (refused, cluster::seen(&row[5..])) {
            (Some(why), _) => self.unprivileged(&mut con, why)?,
            (None, Some(seen)) => seen,
            (None, None) => self.galera(&mut con)?,
        };
        findings.push(cluster::finding(&cluster, self.one_node));
        findings.push(read_only_finding(read_only(row.get(4))));
        findings.push(wait_timeout_finding(int(row.get(3)), secs));
        // The connection closes here; nothing of it stays on the server.
        let _ = con.query_drop("DO 0");
        Ok(findings)
    }
}

/// The session's `wait_timeout` as the server kept it, against the `secs` dlock set from
/// `--ttl`: the server drops an idle connection (and frees its lock) after it, so a dead
/// client host's lock lasts that long; the keeper's renewals (every ttl/3) keep a live one.
fn wait_timeout_finding(kept: Option<i64>, secs: u64) -> Finding {
    const CHECK: &str = "wait_timeout";
    match kept {
        Some(k) if u64::try_from(k) == Ok(secs) => Finding::ok(
            CHECK,
            format!(
                "the session's wait_timeout follows --ttl ({secs} s): a dead client host's lock \
                 is freed within it"
            ),
        ),
        Some(k) => Finding::warn(
            CHECK,
            format!(
                "the server keeps the session's wait_timeout at {k} s where --ttl asks {secs} s"
            ),
            "use a --ttl the server accepts (1 s to 365 days)",
        ),
        None => Finding::unknown(CHECK, "the server did not say"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_reads_every_spelling() {
        let b = |s: &str| Value::Bytes(s.as_bytes().to_vec());
        assert_eq!(read_only(Some(&b("0"))), Some(false));
        assert_eq!(read_only(Some(&b("OFF"))), Some(false));
        assert_eq!(read_only(Some(&b("1"))), Some(true));
        assert_eq!(read_only(Some(&b("NO_LOCK_NO_ADMIN"))), Some(true));
        assert_eq!(read_only(Some(&Value::NULL)), None);
        assert_eq!(read_only(None), None);
        assert_eq!(read_only_finding(Some(true)).verdict, Verdict::Warn);
    }

    #[test]
    fn the_wait_timeout_must_be_the_one_dlock_set() {
        assert_eq!(wait_timeout_finding(Some(3), 3).verdict, Verdict::Ok);
        assert_eq!(
            wait_timeout_finding(Some(31_536_000), 40_000_000).verdict,
            Verdict::Warn
        );
        assert_eq!(wait_timeout_finding(Some(-1), 3).verdict, Verdict::Warn);
        assert_eq!(wait_timeout_finding(None, 3).verdict, Verdict::Unknown);
    }

    #[test]
    fn integers_come_as_text_or_numbers() {
        assert_eq!(int(Some(&Value::Bytes(b"42".to_vec()))), Some(42));
        assert_eq!(int(Some(&Value::Bytes(b"4x".to_vec()))), None);
        assert_eq!(int(Some(&Value::UInt(u64::MAX))), None);
        assert_eq!(int(Some(&Value::NULL)), None);
        assert_eq!(int(None), None);
    }
}
