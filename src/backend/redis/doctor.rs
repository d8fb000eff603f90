//! `dlock doctor` for Redis: the server (version, address, role, uptime), a proxy in the way,
//! commands a lock needs that the server refuses, the role, `maxmemory-policy`, persistence
//! and the restart hold-back. One server, each primary of a Cluster, the
//! primary the sentinels name, or each Redlock master. Takes no lock; writes nothing.

use std::time::Duration;

use redis::{ConnectionLike, Value};

use super::ground::policy_finding;
use super::{COMMAND_TIMEOUT, Connection, Node, cluster_primaries, conn};
use crate::backend::ground::{Finding, hold_back};

/// The key the probes name (a `BLPOP` that times out, an `EVALSHA` that finds no script):
/// nothing is ever written to it.
const PROBE_KEY: &str = "dlock:{dlock-doctor}:probe";

/// The commands dlock needs beyond plain key commands, and a harmless way to ask each.
fn probes() -> Vec<(&'static str, redis::Cmd)> {
    let sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"; // SHA1 of `return 1`
    let mut blpop = redis::cmd("BLPOP");
    blpop.arg(PROBE_KEY).arg(0.01);
    let mut client = redis::cmd("CLIENT");
    client.arg("ID");
    let mut script = redis::cmd("SCRIPT");
    script.arg("EXISTS").arg(sha);
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(sha).arg(1).arg(PROBE_KEY);
    let mut info = redis::cmd("INFO");
    info.arg("server");
    vec![
        ("CLIENT", client),
        ("BLPOP", blpop),
        ("SCRIPT", script),
        ("EVALSHA", evalsha),
        ("INFO", info),
    ]
}

/// What the server said when asked one thing.
enum Asked {
    Text(String),
    /// An error reply (denied by an ACL, renamed, unknown): its code and its whole text,
    /// escaped.
    Refused(String, String),
    /// The connection closed on it.
    Closed,
}

/// Sends `cmd` on `con`; `Err` for a failure that is not the server's answer or a close.
fn ask(node: &Node, con: &mut Connection, cmd: &redis::Cmd) -> anyhow::Result<Asked> {
    match con.request_plain(cmd) {
        Ok(Value::BulkString(b)) => Ok(Asked::Text(String::from_utf8_lossy(&b).into())),
        Ok(Value::VerbatimString { text, .. }) => Ok(Asked::Text(text)),
        Ok(Value::ServerError(e)) => Ok(Asked::Refused(
            crate::report::clean(e.code(), 40),
            server_error(&e),
        )),
        // An answer of another kind (a number, an array): no text to read, and nothing of the
        // server's is shown as a Rust value.
        Ok(_) => Ok(Asked::Text(String::new())),
        Err(e) if super::ground::is_closed(&e) => Ok(Asked::Closed),
        Err(e) => Err(node.error(node.addr.clone(), e)),
    }
}

/// An error reply as the server wrote it ("NOPERM this user has no permissions …"), escaped.
fn server_error(e: &redis::ServerError) -> String {
    let text = match e.details() {
        Some(d) => format!("{} {d}", e.code()),
        None => e.code().to_string(),
    };
    crate::report::clean(&text, 200)
}

/// `name:value` of an `INFO` text, escaped and bounded.
pub(super) fn field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| crate::report::clean(v.trim(), 100))
}

/// What the checks of one server learnt that a caller needs.
#[derive(Default)]
struct Server {
    run_id: Option<String>,
    cluster: bool,
}

/// One Redis (or what the URL leads to): one Cluster's primaries, or the sentinels' primary.
pub(super) fn single(node: &Node, ttl: Duration) -> anyhow::Result<Vec<Finding>> {
    let (mut findings, server, addr) = check(node, ttl)?;
    if !server.cluster {
        return Ok(findings);
    }
    // Every primary holds locks: each is checked (the one asked first too, by address).
    let mut con = node.connect(COMMAND_TIMEOUT)?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut con)
        .map_err(|e| node.error(format!("{}: CLUSTER NODES", node.addr), e))?;
    for primary in cluster_primaries(&nodes) {
        let Some(at) = conn::addr_like(node.info.addr(), &primary) else {
            continue;
        };
        if at.to_string() == addr {
            continue;
        }
        findings.extend(check(&node.at(&at), ttl)?.0);
    }
    Ok(findings)
}

/// Each Redlock master; an error only when fewer than `quorum` could be asked.
pub(in crate::backend) fn redlock(
    nodes: &[Node],
    quorum: usize,
    ttl: Duration,
) -> anyhow::Result<Vec<Finding>> {
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    let mut findings = vec![Finding::ok(
        "server",
        format!(
            "Redlock over {} masters ({}), quorum {quorum}",
            nodes.len(),
            addrs.join(", ")
        ),
    )];
    let mut asked = 0;
    let mut failed = None;
    let mut ids: Vec<(String, String)> = Vec::new();
    for node in nodes {
        match check(node, ttl) {
            Ok((f, server, _)) => {
                asked += 1;
                findings.extend(f);
                if let Some(id) = server.run_id {
                    ids.push((node.addr.clone(), id));
                }
            }
            Err(e) => {
                findings.push(Finding::warn(
                    "server",
                    format!("{}: cannot be asked: {e:#}", node.addr),
                    "Redlock goes on while a quorum answers; bring this master back",
                ));
                failed.get_or_insert(e);
            }
        }
    }
    if asked < quorum {
        let e = failed.unwrap_or_else(|| anyhow::anyhow!("no master answered"));
        return Err(e.context(format!(
            "only {asked} of {} Redlock masters could be asked, {quorum} needed",
            nodes.len()
        )));
    }
    for (i, (a, id)) in ids.iter().enumerate() {
        if let Some((b, _)) = ids[i + 1..].iter().find(|(_, other)| other == id) {
            findings.push(Finding::unsafe_(
                "redlock",
                format!("{a} and {b} are one server (the same run_id): it counts twice"),
                "give Redlock independent masters",
            ));
        }
    }
    Ok(findings)
}

/// The checks of the server `node` leads to; also what a caller needs of it, and the address
/// that answered.
fn check(node: &Node, ttl: Duration) -> anyhow::Result<(Vec<Finding>, Server, String)> {
    let mut con = node.connect(COMMAND_TIMEOUT)?;
    let addr = con.addr().to_string();
    match con.request_plain(&redis::cmd("PING")) {
        Ok(Value::ServerError(e)) => {
            return Err(
                crate::exit::Unavailable(format!("{addr}: PING: {}", server_error(&e))).into(),
            );
        }
        Ok(_) => {}
        Err(e) => return Err(node.error(format!("{addr}: PING"), e)),
    }
    node.reach.connected();
    let mut server = Server::default();
    let mut findings = Vec::new();
    let info =
        |con: &mut Connection, section: &str| ask(node, con, redis::cmd("INFO").arg(section));
    let about = match info(&mut con, "server")? {
        Asked::Text(text) => {
            server.run_id = field(&text, "run_id");
            server.cluster = field(&text, "redis_mode").as_deref() == Some("cluster");
            Some(text)
        }
        Asked::Refused(..) | Asked::Closed => None,
    };
    let info_closed = !con.is_open();
    if !con.is_open() {
        con = node.connect(COMMAND_TIMEOUT)?;
    }
    let role = match info(&mut con, "replication")? {
        Asked::Text(text) => Some(text),
        _ => None,
    };
    let version = about.as_deref().and_then(|t| field(t, "redis_version"));
    let up: Option<u64> = about
        .as_deref()
        .and_then(|t| field(t, "uptime_in_seconds"))
        .and_then(|u| u.parse().ok());
    let mut line = match (&version, info_closed) {
        (Some(v), _) => format!("{addr}: Redis {v}"),
        (None, true) => format!("{addr}: answers PING, closes the connection on INFO"),
        (None, false) => format!("{addr}: Redis (INFO is not allowed: no version)"),
    };
    if let Some(r) = role.as_deref().and_then(|t| field(t, "role")) {
        line.push_str(&format!(
            ", {}",
            if r == "master" { "primary" } else { "replica" }
        ));
    }
    if let Some(up) = up {
        line.push_str(&format!(", up {up} s"));
    }
    findings.push(Finding::ok("server", line));

    // What stands between: every command a lock needs, each asked once.
    let mut closed = Vec::new();
    let mut refused = Vec::new();
    for (name, cmd) in probes() {
        if !con.is_open() {
            con = node.connect(COMMAND_TIMEOUT)?;
        }
        match ask(node, &mut con, &cmd)? {
            Asked::Closed => closed.push(name),
            // INFO's refusal is said by the checks that need it (role, policy, persistence).
            Asked::Refused(code, e) if !answered(&code) && name != "INFO" => {
                refused.push(format!("{name}: {e}"))
            }
            _ => {}
        }
    }
    if !closed.is_empty() {
        findings.push(Finding::unsafe_(
            "proxy",
            format!(
                "{addr} closes the connection on {}: a proxy stands between, twemproxy \
                 (nutcracker) or one like it; dlock cannot wait for a lock or load its scripts \
                 through it",
                closed.join(", ")
            ),
            "point dlock at Redis itself (a server, Sentinel or Cluster URL), not at the proxy",
        ));
        // Whatever answers beyond it cannot be asked through it.
        return Ok((findings, server, addr));
    }
    findings.push(Finding::ok(
        "proxy",
        format!(
            "{addr}: none seen (the server itself answered CLIENT, BLPOP, SCRIPT, EVALSHA, INFO)"
        ),
    ));
    if !refused.is_empty() {
        findings.push(Finding::warn(
            "commands",
            format!(
                "{addr} refuses {}: a run that must wait (BLPOP, CLIENT) or load its scripts \
                 (SCRIPT) fails",
                refused.join("; ")
            ),
            "allow these commands to dlock's user (ACL), or undo their rename-command",
        ));
    }

    findings.push(match role.as_deref() {
        Some(text) => role_finding(&addr, text),
        None => Finding::unknown("role", format!("{addr}: INFO replication is not allowed")),
    });
    findings.push(policy(node, &mut con, &addr)?);
    findings.extend(persistence(node, &mut con, &addr, up, ttl)?);
    Ok((findings, server, addr))
}

/// Whether an error reply is really an answer: a cluster's redirection, a missing script, a
/// replica's refusal to write (the role check says that).
fn answered(code: &str) -> bool {
    [
        "MOVED",
        "ASK",
        "NOSCRIPT",
        "TRYAGAIN",
        "CROSSSLOT",
        "READONLY",
    ]
    .contains(&code)
}

/// The role from `INFO replication`: a primary is ok, a replica unsafe.
fn role_finding(addr: &str, text: &str) -> Finding {
    match field(text, "role").as_deref() {
        Some("master") => {
            let n = field(text, "connected_slaves").unwrap_or_else(|| "0".into());
            Finding::ok("role", format!("{addr}: primary (replicas connected: {n})"))
        }
        Some("slave") => {
            let of = match (field(text, "master_host"), field(text, "master_port")) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                _ => "its primary".into(),
            };
            Finding::unsafe_(
                "role",
                format!("{addr}: a replica of {of}: a lock there is not the primary's"),
                format!("point dlock at the primary ({of}) or at the sentinels"),
            )
        }
        other => Finding::unknown(
            "role",
            format!(
                "{addr}: INFO says role '{}'",
                crate::report::clean(other.unwrap_or("(none)"), 40)
            ),
        ),
    }
}

/// `maxmemory-policy`: from `INFO memory` (what a run reads), else `CONFIG GET`, else unknown.
fn policy(node: &Node, con: &mut Connection, addr: &str) -> anyhow::Result<Finding> {
    let info = match ask(node, con, redis::cmd("INFO").arg("memory"))? {
        Asked::Text(text) => {
            if let Some(p) = field(&text, "maxmemory_policy") {
                let max = field(&text, "maxmemory").and_then(|m| m.parse().ok());
                return Ok(policy_finding(addr, &p, max));
            }
            "INFO memory does not show it".to_string()
        }
        Asked::Refused(_, e) => format!("INFO: {e}"),
        Asked::Closed => {
            return Ok(Finding::unknown(
                "maxmemory-policy",
                "the connection closed",
            ));
        }
    };
    match config_get(node, con, "maxmemory-policy")? {
        Ok(p) => Ok(policy_finding(addr, &p, None)),
        Err(e) => Ok(Finding::unknown(
            "maxmemory-policy",
            format!("{addr}: {info}; CONFIG GET: {e}"),
        )),
    }
}

/// `CONFIG GET name`: the value, or why not (denied, renamed).
fn config_get(
    node: &Node,
    con: &mut Connection,
    name: &str,
) -> anyhow::Result<Result<String, String>> {
    if !con.is_open() {
        *con = node.connect(COMMAND_TIMEOUT)?;
    }
    let reply = con.request_plain(redis::cmd("CONFIG").arg("GET").arg(name));
    Ok(match reply {
        Ok(Value::Array(items)) => match items.get(1) {
            Some(Value::BulkString(b)) => {
                Ok(crate::report::clean(&String::from_utf8_lossy(b), 200))
            }
            _ => Err("no such setting".into()),
        },
        Ok(Value::Map(items)) => match items.first() {
            Some((_, Value::BulkString(b))) => {
                Ok(crate::report::clean(&String::from_utf8_lossy(b), 200))
            }
            _ => Err("no such setting".into()),
        },
        Ok(Value::ServerError(e)) => Err(server_error(&e)),
        Ok(_) => Err("an unexpected reply".into()),
        Err(e) if super::ground::is_closed(&e) => Err("the connection closed".into()),
        Err(e) => return Err(node.error(addr_of(con), e)),
    })
}

fn addr_of(con: &Connection) -> String {
    con.addr().to_string()
}

/// What a restart costs: the locks it forgets (persistence), and the hold-back that covers it
/// (`restart`), which needs the uptime from `INFO`.
fn persistence(
    node: &Node,
    con: &mut Connection,
    addr: &str,
    up: Option<u64>,
    ttl: Duration,
) -> anyhow::Result<[Finding; 2]> {
    let aof = match ask(node, con, redis::cmd("INFO").arg("persistence"))? {
        Asked::Text(text) => field(&text, "aof_enabled").map(|a| a == "1"),
        _ => None,
    };
    let save = config_get(node, con, "save")?;
    let kept = match (aof, &save) {
        (Some(true), _) => "AOF on".to_string(),
        (Some(false), Ok(s)) if s.is_empty() => "none (no AOF, no RDB snapshots)".into(),
        (Some(false), Ok(s)) => format!("RDB snapshots (save {s}), no AOF"),
        (Some(false), Err(_)) => "no AOF; RDB snapshots unknown (CONFIG GET not allowed)".into(),
        (None, _) => "unknown (INFO persistence not allowed)".into(),
    };
    let persistence = Finding::ok(
        "persistence",
        format!(
            "{addr}: {kept}: a restart forgets the locks not on disk; the hold-back after a \
             restart covers that"
        ),
    );
    let restart = match up {
        Some(up) => {
            let mut f = hold_back(up, ttl);
            f.found = format!("{addr}: {}", f.found);
            f
        }
        None => Finding::warn(
            "restart",
            format!(
                "{addr}: INFO is not allowed, so dlock cannot see a restart: a lock the \
                 restarted server forgot can be granted while its holder from before still runs"
            ),
            "allow INFO to dlock's user (ACL +info)",
        ),
    };
    Ok([persistence, restart])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_found_escaped_and_bounded() {
        let text = "# Server\r\nredis_version:7.0.15\r\nrole:slave\r\nmaster_host:10.0.0.1\r\n\
                    master_port:6379\r\nevil:\x1b[2J\r\n";
        assert_eq!(field(text, "redis_version").as_deref(), Some("7.0.15"));
        assert_eq!(field(text, "redis"), None);
        assert_eq!(field(text, "evil").as_deref(), Some("\\x1b[2J"));
        let f = role_finding("h:1", text);
        assert_eq!(f.verdict, crate::backend::ground::Verdict::Unsafe);
        assert!(f.found.contains("replica of 10.0.0.1:6379"), "{}", f.found);
        let p = role_finding("h:1", "role:master\r\nconnected_slaves:2\r\n");
        assert_eq!(p.verdict, crate::backend::ground::Verdict::Ok);
        let long = format!("x:{}", "y".repeat(1000));
        assert!(field(&long, "x").unwrap().chars().count() <= 101);
    }
}
