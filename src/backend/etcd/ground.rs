//! `dlock doctor` for etcd: the member that answers (version, the cluster's members, alarms),
//! whether auth is on and whether this user may do what a lock needs (read and write under
//! `dlock/`, asked by a transaction that cannot succeed, so nothing is written), and the lease
//! the server grants for `--ttl` (etcd extends a lease shorter than its minimum TTL, 1.5
//! election timeouts rounded up to a second, without a word).

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use super::EtcdBackend;
use super::http::{Client, Error, b64, prefix_end};
use super::names::ROOT;
use super::reply::{Grant, decode};
use crate::backend::ground::Finding;
use crate::report::clean;

/// `/v3/maintenance/status`, the fields read.
#[derive(Debug, Default, Deserialize)]
struct StatusReply {
    #[serde(default)]
    version: String,
    #[serde(default)]
    errors: Vec<String>,
    #[serde(default, rename = "isLearner")]
    is_learner: bool,
}

/// `/v3/cluster/member/list`, the fields read.
#[derive(Debug, Default, Deserialize)]
struct Members {
    #[serde(default)]
    members: Vec<Member>,
}

#[derive(Debug, Default, Deserialize)]
struct Member {
    #[serde(default, rename = "isLearner")]
    is_learner: bool,
}

/// `/v3/auth/status` (etcd 3.5 and later).
#[derive(Debug, Default, Deserialize)]
struct AuthStatus {
    #[serde(default)]
    enabled: bool,
}

/// The lease line: `asked` whole seconds (`--ttl` rounded up) against what the server granted.
pub(super) fn lease_finding(asked: i64, granted: i64) -> Finding {
    const CHECK: &str = "lease";
    if granted < asked {
        Finding::unsafe_(
            CHECK,
            format!(
                "the server grants a lease of {granted}s when asked for {asked}s: a lock would end before its holder's command is stopped"
            ),
            "use an etcd server that grants the TTL asked for",
        )
    } else if granted > asked {
        Finding::ok(
            CHECK,
            format!(
                "the server extends a lease of {asked}s (--ttl) to {granted}s (its minimum lease TTL): the lock of a holder that vanished stays taken for {granted}s"
            ),
        )
    } else {
        Finding::ok(
            CHECK,
            format!("{granted}s as asked (--ttl rounded up to seconds)"),
        )
    }
}

impl EtcdBackend {
    /// The checks: the server, auth and permissions, the lease.
    pub(super) fn checks(&self, ttl: Duration) -> anyhow::Result<Vec<Finding>> {
        let mut c = self.client();
        let mut findings = Vec::new();
        // The status is the first request: if no member answers, the server cannot be asked.
        let status = c
            .call("/v3/maintenance/status", &json!({}))
            .map_err(|e| self.fail(e));
        let status = match status {
            Ok(v) => decode::<StatusReply>(&v, "status").map_err(|e| self.bad_reply(e))?,
            Err(e) if !self.reach.was_reached() => return Err(e),
            Err(e) => {
                findings.push(Finding::unknown("server", e));
                StatusReply::default()
            }
        };
        let members = match c.call("/v3/cluster/member/list", &json!({})) {
            Ok(v) => decode::<Members>(&v, "member list")
                .map(|m| {
                    let learners = m.members.iter().filter(|m| m.is_learner).count();
                    match learners {
                        0 => format!("{} members", m.members.len()),
                        l => format!("{} members ({l} learners)", m.members.len()),
                    }
                })
                .unwrap_or_else(|e| e),
            Err(e) => format!("members unknown: {e}"),
        };
        if findings.is_empty() {
            let learner = if status.is_learner { ", a learner" } else { "" };
            findings.push(Finding::ok(
                "server",
                format!(
                    "etcd {} at {}{learner}, {members}",
                    clean(&status.version, 64),
                    self.addr
                ),
            ));
        }
        if !status.errors.is_empty() {
            let errors: Vec<String> = status
                .errors
                .iter()
                .take(8)
                .map(|e| clean(e, 120))
                .collect();
            findings.push(Finding::warn(
                "alarms",
                errors.join("; "),
                "clear the alarm (etcdctl alarm list / alarm disarm, after freeing space for NOSPACE): the cluster may refuse writes",
            ));
        }
        findings.push(self.auth_finding(&mut c));
        findings.push(self.lease_check(&mut c, ttl));
        Ok(findings)
    }

    /// Whether auth is on, and whether this user may read and write the locks' keys: a
    /// transaction whose comparison is never true (no key has a negative create revision), so
    /// that only its permissions are checked (etcd checks both branches) and nothing is written.
    fn auth_finding(&self, c: &mut Client) -> Finding {
        const CHECK: &str = "auth";
        let enabled = c
            .call("/v3/auth/status", &json!({}))
            .ok()
            .and_then(|v| decode::<AuthStatus>(&v, "auth status").ok())
            .map(|a| a.enabled)
            // Before 3.5 there is no auth status, but a server with auth on refuses a client
            // without a user ("user name is empty"): if the transaction below passes, it is off.
            .or(self.ends.auth.is_none().then_some(false));
        let root = ROOT.as_bytes();
        let end = prefix_end(root);
        let range = json!({"request_range": {"key": b64(root), "range_end": b64(&end), "limit": "1", "keys_only": true}});
        let txn = json!({
            "compare": [{"key": b64(root), "range_end": b64(&end), "target": "CREATE", "result": "LESS", "create_revision": "0"}],
            // Deleting the whole prefix needs write permission on all of it.
            "success": [{"request_delete_range": {"key": b64(root), "range_end": b64(&end)}}],
            "failure": [range],
        });
        let user = self.ends.auth.as_ref().map(|(u, _)| clean(u, 64));
        let who = user
            .as_deref()
            .map_or("without a user".to_string(), |u| format!("user {u}"));
        match c.call("/v3/kv/txn", &txn) {
            Ok(_) => Finding::ok(
                CHECK,
                match enabled {
                    Some(true) => format!("on; {who} may read and write {ROOT}"),
                    Some(false) => {
                        format!("off: any client may take, break or reset the locks under {ROOT}")
                    }
                    None => format!(
                        "{who} may read and write {ROOT} (whether auth is on, etcd says only from 3.5)"
                    ),
                },
            ),
            Err(Error::Server { message, .. }) => Finding::warn(
                CHECK,
                format!(
                    "{who} may not read and write all of {ROOT}: {}",
                    clean(&message, 120)
                ),
                format!(
                    "grant the user's role readwrite on the prefix (etcdctl role grant-permission ROLE --prefix readwrite {ROOT}), or give credentials that have it"
                ),
            ),
            Err(e) => Finding::unknown(CHECK, e),
        }
    }

    /// Grants a lease for `ttl` as a run would (whole seconds, rounded up), compares, revokes.
    fn lease_check(&self, c: &mut Client, ttl: Duration) -> Finding {
        let asked = i64::try_from(crate::backend::ttl_secs_up(ttl)).unwrap_or(i64::MAX);
        let grant = match c.call("/v3/lease/grant", &json!({ "TTL": asked.to_string() })) {
            Ok(v) => v,
            Err(e) => return Finding::unknown("lease", e),
        };
        let grant: Grant = match decode(&grant, "lease grant") {
            Ok(g) => g,
            Err(e) => return Finding::unknown("lease", e),
        };
        if !Self::revoke(c, grant.id) {
            let mut abandoned = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
            abandoned.push(grant.id);
        }
        lease_finding(asked, grant.ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ground::Verdict;

    #[test]
    fn the_granted_lease_is_judged() {
        assert_eq!(lease_finding(5, 5).verdict, Verdict::Ok);
        let extended = lease_finding(1, 2);
        assert_eq!(extended.verdict, Verdict::Ok);
        assert!(
            extended.found.contains("minimum lease TTL"),
            "{}",
            extended.found
        );
        assert_eq!(lease_finding(5, 3).verdict, Verdict::Unsafe);
    }

    #[test]
    fn replies_without_fields_read_as_defaults() {
        let s: StatusReply = decode(&json!({"version": "3.5.9"}), "status").unwrap();
        assert!(s.errors.is_empty() && !s.is_learner);
        let m: Members = decode(&json!({}), "member list").unwrap();
        assert!(m.members.is_empty());
    }
}
