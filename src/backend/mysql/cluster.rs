//! What a cluster does to `GET_LOCK`: on a MariaDB Galera node or a MySQL Group Replication
//! member, `GET_LOCK` is the node's own (neither replicates it), so two clients on two nodes
//! both hold "the" lock. A lock's connection asks, in the round trip that takes the lock (free
//! on a plain server: a system variable or a small `performance_schema` table), and a run on a
//! node of a cluster of more than one is refused (exit 78), unless the URL says
//! `?cluster=one-node` (every client uses this one node). `dlock doctor` asks the same.
//!
//! Not here: the lock's statements themselves (mod.rs), the other checks of `doctor`
//! (ground.rs).

use mysql::Value;

use crate::backend::ground::Finding;
use crate::exit::Usage;

/// The URL option that states that every client of the lock uses this one node.
pub(super) const OPTION: &str = "cluster";

/// Takes `cluster=check|one-node` out of the URL's query (the client crate rejects unknown
/// parameters). True for `one-node`: the user states that every dlock uses this one node, so
/// a cluster around it does not make the lock unsound. Any other value is a usage error.
pub(super) fn split_cluster_param(url: &str) -> Result<(String, bool), Usage> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), false));
    };
    let mut one_node = false;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((OPTION, "one-node")) => one_node = true,
            Some((OPTION, "check")) => one_node = false,
            Some((OPTION, other)) => {
                return Err(Usage(format!(
                    "bad cluster={other} in mysql URL: expected cluster=one-node (every client of the lock \
                     uses this one node of its cluster) or cluster=check (the default)"
                )));
            }
            None if pair == OPTION => {
                return Err(Usage(
                    "bad cluster in mysql URL: expected cluster=one-node or cluster=check".into(),
                ));
            }
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, one_node))
}

/// Which server answers, as far as the handshake tells: the question differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flavour {
    /// MariaDB: `@@wsrep_on` exists (Galera is built in); no Group Replication.
    Mariadb,
    /// MySQL (and Percona XtraDB Cluster, a MySQL with Galera): `performance_schema` tables,
    /// since `@@wsrep_on` and `@@group_replication_*` exist only where a plugin provides them.
    Mysql,
}

/// The flavour from the handshake's version: MariaDB 10 and later announce themselves to old
/// clients as `5.5.5-10.x.y-MariaDB`, which the client crate reads as 5.5.5; MySQL has no
/// version 5.5.5 in use, and no major version 10 or above (yet). A wrong guess costs a second
/// statement, never a wrong answer: the probe then fails and is retried without it.
pub(super) fn flavour(version: (u16, u16, u16)) -> Flavour {
    match version {
        (5, 5, 5) => Flavour::Mariadb,
        (major, _, _) if major >= 10 => Flavour::Mariadb,
        _ => Flavour::Mysql,
    }
}

/// Three SQL expressions for the lock's first `SELECT`: `wsrep_on` (Galera), the number of
/// live members of the Group Replication group this server belongs to (0 when it is in none),
/// and whether `performance_schema` is on (MySQL shows no members without it). None reads a
/// status counter (`SHOW STATUS` costs the server ~0.3 ms).
///
/// A member that left its group (`ERROR`) counts none: it is `super_read_only` (or stopped),
/// so dlock's table write fails and the run ends with 69, not beside the group.
pub(super) fn probe(flavour: Flavour) -> &'static str {
    match flavour {
        Flavour::Mariadb => "@@global.wsrep_on, 0, 1",
        Flavour::Mysql => {
            "(SELECT VARIABLE_VALUE FROM performance_schema.global_variables \
              WHERE VARIABLE_NAME = 'wsrep_on'), \
             (SELECT COUNT(*) FROM performance_schema.replication_group_members \
              WHERE MEMBER_STATE IN ('ONLINE', 'RECOVERING', 'UNREACHABLE')), \
             @@global.performance_schema"
        }
    }
}

/// How many columns [`probe`] gives.
pub(super) const PROBE_COLUMNS: usize = 3;

/// The same columns when the server would not answer the probe: nothing known.
pub(super) const NO_PROBE: &str = "NULL, NULL, NULL";

/// Whether a failed probe means "could not check" (and the statement is retried without it):
/// an unknown variable (a MariaDB built without Galera, a wrong flavour guess), an unknown
/// table (MySQL before 5.7), or a table the user may not read. Each of these is raised before
/// the statement runs, so no `GET_LOCK` in it was executed.
pub(super) fn probe_refused(code: u16) -> bool {
    matches!(code, 1193 | 1146 | 1142 | 1143 | 1109)
}

/// The statement that asks a Galera node for its cluster's size (only sent where `wsrep_on`).
pub(super) const CLUSTER_SIZE: &str = "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'";

/// What the server said of the cluster it is in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Cluster {
    /// Neither Galera nor Group Replication.
    Plain,
    /// A Galera node (`wsrep_on`), in a cluster of `size` nodes (itself included).
    Galera { size: u64 },
    /// A member of a running Group Replication group of `members` live members.
    Group { members: u64 },
    /// A server set up for Group Replication (`group_replication_group_name` is set) whose
    /// members could not be read (why).
    GroupUnread(String),
    /// The server would not say (why).
    Unknown(String),
}

/// A value as text, bounded; NULL is `None`.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::NULL => None,
        Value::Bytes(b) => Some(String::from_utf8_lossy(&b[..b.len().min(64)]).into_owned()),
        Value::Int(i) => Some(i.to_string()),
        Value::UInt(u) => Some(u.to_string()),
        other => Some(other.as_sql(true).chars().take(64).collect()),
    }
}

/// A switch (`wsrep_on`, `performance_schema`) as either flavour gives it (1, `ON`); `None`
/// when absent (NULL).
pub(super) fn is_on(v: &Value) -> Option<bool> {
    let t = text(v)?;
    Some(matches!(
        t.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "TRUE"
    ))
}

/// A count as the server gives it (an integer, or its digits as text); `None` for anything
/// else.
pub(super) fn count(v: &Value) -> Option<u64> {
    text(v)?.trim().parse().ok()
}

/// `wsrep_cluster_size` from the rows of [`CLUSTER_SIZE`] (name, value).
pub(super) fn cluster_size(rows: &[(Vec<u8>, Vec<u8>)]) -> Option<u64> {
    rows.iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(b"wsrep_cluster_size"))
        .and_then(|(_, value)| std::str::from_utf8(value).ok()?.trim().parse().ok())
}

/// The probe's values ([`probe`]), judged: a group, plain, or not known; `None` for a Galera
/// node, whose cluster's size is asked next ([`CLUSTER_SIZE`]).
pub(super) fn seen(probe: &[Value]) -> Option<Cluster> {
    let [wsrep, members, performance_schema] = probe else {
        return Some(Cluster::Unknown("an unexpected answer".into()));
    };
    if is_on(wsrep) == Some(true) {
        return None;
    }
    Some(match count(members) {
        Some(n) if n > 1 => Cluster::Group { members: n },
        _ if is_on(performance_schema) == Some(false) => Cluster::Unknown(
            "performance_schema is OFF, so replication_group_members shows no member".into(),
        ),
        _ => Cluster::Plain,
    })
}

/// The "cluster" check: unsafe on a node of a cluster of more than one, unless `one_node`.
pub(super) fn finding(cluster: &Cluster, one_node: bool) -> Finding {
    const CHECK: &str = "cluster";
    let opt = "?cluster=one-node";
    let (what, n) = match cluster {
        Cluster::Plain => {
            return Finding::ok(CHECK, "not a Galera node, not in a replication group");
        }
        Cluster::Unknown(why) => return Finding::unknown(CHECK, why),
        Cluster::GroupUnread(why) if !one_node => {
            return Finding::unsafe_(
                CHECK,
                format!(
                    "set up for MySQL Group Replication (group_replication_group_name is set), \
                     and its members could not be read ({why}): GET_LOCK is per node, so two \
                     holders on two members would both win"
                ),
                format!(
                    "grant dlock's user SELECT on performance_schema.replication_group_members, \
                     point every dlock at one member and say so with {opt}, or use another \
                     backend"
                ),
            );
        }
        Cluster::GroupUnread(_) => {
            return Finding::ok(
                CHECK,
                format!(
                    "set up for MySQL Group Replication; GET_LOCK is per node, sound because the \
                     URL states that every dlock uses this one node ({opt})"
                ),
            );
        }
        Cluster::Galera { size } if *size <= 1 => {
            return Finding::ok(
                CHECK,
                format!(
                    "a Galera node alone in its cluster (wsrep_cluster_size {size}); a run \
                     refuses once another node joins"
                ),
            );
        }
        Cluster::Group { members } => ("a MySQL Group Replication group", *members),
        Cluster::Galera { size } => ("a Galera cluster", *size),
    };
    if one_node {
        return Finding::ok(
            CHECK,
            format!(
                "a node of {what} of {n} nodes; GET_LOCK is per node, sound because the URL \
                 states that every dlock uses this one node ({opt})"
            ),
        );
    }
    Finding::unsafe_(
        CHECK,
        format!(
            "a node of {what} of {n} nodes: GET_LOCK is per node, so two holders on two nodes \
             would both win"
        ),
        format!(
            "point every dlock at one node and say so with {opt} in the URL, or use another \
             backend"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ground::Verdict;

    #[test]
    fn the_option_is_taken_out_of_the_url_and_checked() {
        let (url, one) = split_cluster_param("mysql://u@h/db?cluster=one-node").unwrap();
        assert_eq!((url.as_str(), one), ("mysql://u@h/db", true));
        let (url, one) =
            split_cluster_param("mysql://u@h/db?ssl-mode=REQUIRED&cluster=check").unwrap();
        assert_eq!(
            (url.as_str(), one),
            ("mysql://u@h/db?ssl-mode=REQUIRED", false)
        );
        let (url, one) = split_cluster_param("mysql://u@h/db").unwrap();
        assert_eq!((url.as_str(), one), ("mysql://u@h/db", false));
        for bad in ["cluster=yes", "cluster=", "cluster", "cluster=ONE-NODE"] {
            let e = split_cluster_param(&format!("mysql://u@h/db?{bad}")).unwrap_err();
            assert!(e.0.contains("cluster=one-node"), "{bad}: {}", e.0);
        }
    }

    #[test]
    fn the_flavour_follows_the_handshakes_version() {
        assert_eq!(flavour((5, 5, 5)), Flavour::Mariadb);
        assert_eq!(flavour((11, 4, 2)), Flavour::Mariadb);
        assert_eq!(flavour((8, 0, 36)), Flavour::Mysql);
        assert_eq!(flavour((5, 7, 44)), Flavour::Mysql);
        assert_eq!(flavour((9, 1, 0)), Flavour::Mysql);
    }

    #[test]
    fn wsrep_on_reads_as_either_flavour_gives_it() {
        assert_eq!(is_on(&Value::Int(1)), Some(true));
        assert_eq!(is_on(&Value::Int(0)), Some(false));
        assert_eq!(is_on(&Value::Bytes(b"ON".to_vec())), Some(true));
        assert_eq!(is_on(&Value::Bytes(b"OFF".to_vec())), Some(false));
        assert_eq!(is_on(&Value::NULL), None);
        assert_eq!(is_on(&Value::Bytes(vec![0xff; 10_000])), Some(false));
    }

    #[test]
    fn group_replication_counts_live_members_only_when_more_than_one() {
        let b = |s: &str| Value::Bytes(s.as_bytes().to_vec());
        let on = b("1");
        // Over the text protocol every value is bytes; integers are accepted too.
        assert_eq!(
            seen(&[Value::NULL, b("0"), on.clone()]),
            Some(Cluster::Plain)
        );
        assert_eq!(
            seen(&[b("0"), Value::Int(0), on.clone()]),
            Some(Cluster::Plain)
        );
        assert_eq!(
            seen(&[Value::NULL, b("1"), on.clone()]),
            Some(Cluster::Plain)
        );
        assert_eq!(
            seen(&[b("OFF"), b("3"), on.clone()]),
            Some(Cluster::Group { members: 3 })
        );
        assert_eq!(
            seen(&[Value::NULL, Value::UInt(2), on.clone()]),
            Some(Cluster::Group { members: 2 })
        );
        // Garbage is no group (and no panic).
        assert_eq!(
            seen(&[Value::NULL, b("-5x"), on.clone()]),
            Some(Cluster::Plain)
        );
        assert_eq!(
            seen(&[Value::NULL, b("99999999999999999999999"), on.clone()]),
            Some(Cluster::Plain)
        );
        // Without performance_schema MySQL shows no member: not known.
        assert!(matches!(
            seen(&[Value::NULL, b("0"), b("0")]),
            Some(Cluster::Unknown(_))
        ));
        // Nothing asked (NO_PROBE): plain as far as anyone knows; the caller says why.
        assert_eq!(
            seen(&[Value::NULL, Value::NULL, Value::NULL]),
            Some(Cluster::Plain)
        );
        assert!(matches!(seen(&[b("1")]), Some(Cluster::Unknown(_))));
        // wsrep_on: the cluster's size is asked next.
        assert_eq!(seen(&[Value::Int(1), b("0"), on.clone()]), None);
        assert_eq!(seen(&[b("ON"), b("0"), on]), None);
    }

    #[test]
    fn the_cluster_size_is_read_from_show_status() {
        let row = |n: &str, v: &str| (n.as_bytes().to_vec(), v.as_bytes().to_vec());
        assert_eq!(cluster_size(&[row("wsrep_cluster_size", "3")]), Some(3));
        assert_eq!(cluster_size(&[row("WSREP_CLUSTER_SIZE", " 2 ")]), Some(2));
        assert_eq!(cluster_size(&[row("wsrep_cluster_size", "x")]), None);
        assert_eq!(cluster_size(&[]), None);
    }

    #[test]
    fn a_group_whose_members_cannot_be_read_is_unsafe_unless_the_url_says_one_node() {
        let c = Cluster::GroupUnread("denied".into());
        let f = finding(&c, false);
        assert_eq!(f.verdict, Verdict::Unsafe);
        assert!(f.found.contains("(denied)"), "{}", f.found);
        assert!(f.fix.unwrap().contains("replication_group_members"));
        assert_eq!(finding(&c, true).verdict, Verdict::Ok);
    }

    #[test]
    fn a_cluster_of_more_than_one_is_unsafe_unless_the_url_says_one_node() {
        let two = Cluster::Galera { size: 2 };
        let f = finding(&two, false);
        assert_eq!(f.verdict, Verdict::Unsafe);
        assert!(f.sentence().contains("Galera"), "{}", f.sentence());
        assert!(
            f.sentence().contains("?cluster=one-node"),
            "{}",
            f.sentence()
        );
        assert_eq!(finding(&two, true).verdict, Verdict::Ok);
        let group = finding(&Cluster::Group { members: 3 }, false);
        assert_eq!(group.verdict, Verdict::Unsafe);
        assert!(group.found.contains("Group Replication"), "{}", group.found);
        assert_eq!(
            finding(&Cluster::Galera { size: 1 }, false).verdict,
            Verdict::Ok
        );
        assert_eq!(finding(&Cluster::Plain, false).verdict, Verdict::Ok);
        assert_eq!(
            finding(&Cluster::Unknown("denied".into()), false).verdict,
            Verdict::Unknown
        );
    }
}
