//! The mysql backend on a real MariaDB Galera cluster (servers/galera.rs): `GET_LOCK` is each
//! node's own, so a run on a node of a cluster of more than one is refused (78) unless the URL
//! states `?cluster=one-node`; `dlock doctor` names Galera.

use std::time::Duration;

use crate::servers::{Galera, shared_galera, shared_mariadb};
use crate::util::*;

/// `mysql://dlock:dlock@127.0.0.1:PORT/dlock` on node `i`, with `query` appended.
fn url(g: &Galera, i: usize, query: &str) -> String {
    format!("{}{query}", g.nodes[i].url())
}

/// The refusal names Galera, the cluster's size and the way out.
#[track_caller]
fn assert_refused(out: &std::process::Output) {
    assert_eq!(out.status.code(), Some(78), "{}", describe(out));
    let line = one_error_line(out);
    for word in [
        "Galera",
        "2 nodes",
        "GET_LOCK is per node",
        "?cluster=one-node",
    ] {
        assert!(line.contains(word), "no '{word}' in: {line}");
    }
}

#[test]
fn a_run_on_a_node_of_a_two_node_galera_cluster_is_refused() {
    let Some(g) = shared_galera() else { return };
    let dir = scratch("galera-refused");
    let marker = dir.join("ran");
    for (i, mode) in [
        (0, &[][..]),
        (1, &["--shared"][..]),
        (1, &["--limit", "2"][..]),
    ] {
        let b = TestBackend::mysql(&url(g, i, ""));
        let script = format!("touch {}", marker.display());
        let out = output(&mut b.run(&unique_key("refused"), mode, &sh(&script)));
        assert_refused(&out);
        assert!(!marker.exists(), "the command ran on node {i} {mode:?}");
    }
}

#[test]
fn cluster_one_node_in_the_url_lets_a_run_on_a_galera_node_go() {
    let Some(g) = shared_galera() else { return };
    let b = TestBackend::mysql(&url(g, 0, "?cluster=one-node"));
    let key = unique_key("one-node");
    let out = run_ok(&mut b.run(&key, &[], &["echo", "ran"]));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    // The lock is still a lock on that node: a second holder there waits its turn.
    let dir = scratch("galera-one-node");
    let holder = b.holding(&key, &[], &dir.join("held"));
    run_code(&mut b.run(&key, &["--no-wait"], &["true"]), 75);
    drop(holder);
}

/// Two holders of one key on two nodes: GET_LOCK would grant both (each node's own), so with
/// the default both are refused before their commands run — never both at once.
#[test]
fn two_holders_on_two_nodes_never_run_at_once() {
    let Some(g) = shared_galera() else { return };
    let dir = scratch("galera-two");
    let key = unique_key("two-nodes");
    let procs: Vec<Proc> = (0..2)
        .map(|i| {
            let b = TestBackend::mysql(&url(g, i, ""));
            let script = format!(
                "touch {d}/in{i}; sleep 1; ls {d} > {d}/seen{i}; rm {d}/in{i}",
                d = dir.display()
            );
            Proc::spawn(&mut b.run(&key, &[], &sh(&script)))
        })
        .collect();
    for p in procs {
        let (out, _) = p.wait(Duration::from_secs(20));
        assert_refused(&out);
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "a command ran: {left:?}");
}

#[test]
fn doctor_names_galera_on_a_cluster_node_and_passes_a_plain_server() {
    let Some(g) = shared_galera() else { return };
    let out = run_code(dlock().args(["doctor", "mysql", "-u", &url(g, 1, "")]), 78);
    let text = String::from_utf8_lossy(&out.stdout);
    let unsafe_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("unsafe")).collect();
    assert_eq!(unsafe_lines.len(), 1, "{}", describe(&out));
    assert!(
        unsafe_lines[0].contains("cluster: a node of a Galera cluster of 2 nodes"),
        "{text}"
    );
    assert!(text.starts_with("ok      server: "), "{text}");
    // Stated one node: sound.
    run_ok(dlock().args(["doctor", "mysql", "-u", &url(g, 1, "?cluster=one-node")]));
    let Some(m) = shared_mariadb() else { return };
    let out = run_ok(dlock().args(["doctor", "mysql", "-u", &m.url(), "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        ["server", "cluster", "read_only", "wait_timeout"],
        "{v}"
    );
    assert!(
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["verdict"] == "ok"),
        "{v}"
    );
}

/// A Galera node alone (cluster size 1) is sound: every run asks again, and refuses once
/// another node joins.
#[test]
fn a_galera_node_alone_in_its_cluster_is_not_refused() {
    let Some(g) = Galera::start(1) else { return };
    let b = TestBackend::mysql(&url(&g, 0, ""));
    run_ok(&mut b.run(&unique_key("alone"), &[], &["true"]));
    let out = run_ok(dlock().args(["doctor", "mysql", "-u", &url(&g, 0, "")]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("alone in its cluster"), "{text}");
}

#[test]
fn an_unknown_cluster_option_is_a_usage_error() {
    for bad in ["?cluster=yes", "?cluster", "?cluster=check&cluster=many"] {
        let b = TestBackend::mysql(&format!("mysql://dlock:x@127.0.0.1:9/dlock{bad}"));
        let out = run_code(&mut b.run("k", &[], &["true"]), 2);
        assert!(
            one_error_line(&out).contains("cluster=one-node"),
            "{}",
            describe(&out)
        );
    }
}
