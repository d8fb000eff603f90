//! A MariaDB Galera cluster (Debian's galera-4): nodes on loopback, each with its own
//! replication (gcomm) and incremental-transfer ports.
//!
//! Every node starts from a copy of the same freshly installed data, so none needs a state
//! transfer: the first node bootstraps the cluster (`--wsrep-new-cluster`), and each next one
//! starts with a `grastate.dat` that already names the cluster's state (its UUID and the last
//! committed write), which makes it join at once (no rsync, no SST listener: `sst_method=skip`
//! keeps it so). The `dlock` user is created once all have joined, and replicates.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;

/// Debian's galera-4 provider.
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// The longest a cluster may take to form (a node to bootstrap, every other to be Synced);
/// ~1.5 s for two nodes here when idle.
const FORM: Duration = Duration::from_secs(60);

/// A running Galera cluster; its nodes are killed on drop.
pub(crate) struct Galera {
    pub nodes: Vec<Mariadb>,
}

impl Galera {
    /// A cluster of `n` nodes, or `None` if mariadbd or galera-4 is missing (and not
    /// required). Port clashes retry with new ports, three times in all.
    pub(crate) fn start(n: usize) -> Option<Galera> {
        if !available("mariadbd") {
            return None;
        }
        if !Path::new(PROVIDER).is_file() {
            assert!(
                !required(),
                "{PROVIDER} (galera-4) is not installed, and DLOCK_TEST_REQUIRE_BACKENDS=1"
            );
            eprintln!("SKIPPED: {PROVIDER} (galera-4) is not installed");
            return None;
        }
        let mut why = String::new();
        for _ in 0..3 {
            match Self::try_start(n) {
                Ok(g) => return Some(g),
                Err(e) => why = e,
            }
        }
        panic!("a {n}-node Galera cluster did not start, 3 times; last:\n{why}");
    }

    fn try_start(n: usize) -> Result<Galera, String> {
        let gcomm: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let peers: Vec<String> = gcomm.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut nodes: Vec<Mariadb> = Vec::new();
        for (i, g) in gcomm.iter().enumerate() {
            let mut m = Mariadb::prepared(&[]);
            m.extra = vec![
                "--wsrep-on=ON".into(),
                format!("--wsrep-provider={PROVIDER}"),
                format!("--wsrep-cluster-address=gcomm://{}", peers.join(",")),
                "--binlog-format=ROW".into(),
                "--innodb-autoinc-lock-mode=2".into(),
                format!("--wsrep-node-address=127.0.0.1:{g}"),
                format!("--wsrep-node-name=n{i}"),
                "--wsrep-sst-method=skip".into(),
                format!(
                    "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{g};\
                     ist.recv_addr=127.0.0.1:{}",
                    free_port()
                ),
            ];
            if i == 0 {
                m.extra.push("--wsrep-new-cluster".into());
            } else {
                // The cluster's state as the first node has it: nothing to transfer.
                let state = nodes[0].sql(
                    "SELECT CONCAT(MAX(IF(VARIABLE_NAME = 'WSREP_CLUSTER_STATE_UUID', \
                     VARIABLE_VALUE, NULL)), ' ', MAX(IF(VARIABLE_NAME = 'WSREP_LAST_COMMITTED', \
                     VARIABLE_VALUE, NULL))) FROM information_schema.GLOBAL_STATUS",
                );
                let (uuid, seqno) = state.split_once(' ').unwrap_or(("", ""));
                std::fs::write(
                    m.dir.join("data/grastate.dat"),
                    format!(
                        "# GALERA saved state\nversion: 2.1\nuuid: {uuid}\nseqno: {seqno}\n\
                         safe_to_bootstrap: 0\n"
                    ),
                )
                .unwrap();
            }
            let launched = m.launch();
            let log = m.log();
            nodes.push(m);
            if !launched {
                return Err(format!("node {i} exited at start; its log:\n{log}"));
            }
            Self::wait_synced(&nodes[i], i + 1, &nodes)?;
        }
        // All have joined: the user and database replicate to every node.
        nodes[0].add_user();
        let galera = Galera { nodes };
        for (i, m) in galera.nodes.iter().enumerate() {
            let deadline = Instant::now() + FORM;
            while m.sql("SELECT COUNT(*) FROM mysql.user WHERE user = 'dlock'") != "1" {
                if Instant::now() > deadline {
                    return Err(format!("user dlock not on node {i}; its log:\n{}", m.log()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(galera)
    }

    /// Waits until `node` is Synced in a cluster of `size`; else every node's log.
    fn wait_synced(node: &Mariadb, size: usize, all: &[Mariadb]) -> Result<(), String> {
        let deadline = Instant::now() + FORM;
        let want = format!("Synced {size}");
        loop {
            let out = node
                .client()
                .arg("-e")
                .arg(
                    "SELECT CONCAT(MAX(IF(VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT', \
                     VARIABLE_VALUE, NULL)), ' ', MAX(IF(VARIABLE_NAME = 'WSREP_CLUSTER_SIZE', \
                     VARIABLE_VALUE, NULL))) FROM information_schema.GLOBAL_STATUS",
                )
                .output()
                .unwrap();
            let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if got == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = all
                    .iter()
                    .enumerate()
                    .map(|(i, m)| format!("--- node {i} (port {}):\n{}", m.port, m.log()))
                    .collect();
                return Err(format!(
                    "node on port {} not '{want}' after {FORM:?} (says '{got}'); logs:\n{}",
                    node.port,
                    logs.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The two-node Galera cluster of this test binary, started once.
pub(crate) fn shared_galera() -> Option<&'static Galera> {
    static SHARED: OnceLock<Option<Galera>> = OnceLock::new();
    SHARED.get_or_init(|| Galera::start(2)).as_ref()
}
