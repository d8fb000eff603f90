//! ZooKeeper: one standalone server or an ensemble of three.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;

/// Debian's ZooKeeper: the server jar, and the two log4j jars without which it prints nothing.
const ZK_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:\
/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";

/// One ZooKeeper server of a [`Zookeeper`] (standalone, or a member of an ensemble).
pub(crate) struct ZkMember {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

/// A running ZooKeeper: one standalone server, or an ensemble of three on loopback. Short
/// ticks (500 ms) so that session timeouts from 1 s are allowed.
pub(crate) struct Zookeeper {
    pub members: Vec<ZkMember>,
}

impl Zookeeper {
    /// A standalone server, or `None` if ZooKeeper is not installed (and not required).
    pub(crate) fn start() -> Option<Zookeeper> {
        Self::start_n(1)
    }

    /// A three-server ensemble.
    pub(crate) fn ensemble() -> Option<Zookeeper> {
        Self::start_n(3)
    }

    /// A standalone server with `extra` lines appended to its zoo.cfg (a later line of a key
    /// overrides the harness's: `maxSessionTimeout=2000`).
    pub(crate) fn start_configured(extra: &str) -> Option<Zookeeper> {
        Self::start_n_with(1, extra)
    }

    fn start_n(n: usize) -> Option<Zookeeper> {
        Self::start_n_with(n, "")
    }

    fn start_n_with(n: usize, extra: &str) -> Option<Zookeeper> {
        if !available("java") {
            return None;
        }
        let jar = std::path::Path::new("/usr/share/java/zookeeper.jar");
        if !jar.exists() {
            assert!(
                !required(),
                "zookeeper is not installed, and DLOCK_TEST_REQUIRE_BACKENDS=1"
            );
            eprintln!("SKIPPED: zookeeper is not installed (apt-get install zookeeper)");
            return None;
        }
        // Client, quorum and election port per member.
        let ports: Vec<[u16; 3]> = (0..n)
            .map(|_| [free_port(), free_port(), free_port()])
            .collect();
        let mut zk = Zookeeper {
            members: Vec::new(),
        };
        for (i, p) in ports.iter().enumerate() {
            let dir = scratch("zookeeper");
            std::fs::create_dir_all(dir.join("data")).unwrap();
            let mut cfg = format!(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\nminSessionTimeout=1000\n\
                 maxSessionTimeout=60000\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n",
                dir.join("data").display(),
                p[0]
            );
            cfg.push_str(extra);
            if n > 1 {
                std::fs::write(dir.join("data/myid"), format!("{}\n", i + 1)).unwrap();
                for (j, q) in ports.iter().enumerate() {
                    cfg.push_str(&format!("server.{}=127.0.0.1:{}:{}\n", j + 1, q[1], q[2]));
                }
            }
            std::fs::write(dir.join("zoo.cfg"), cfg).unwrap();
            zk.members.push(ZkMember {
                port: p[0],
                dir,
                child: None,
            });
        }
        for i in 0..n {
            zk.launch(i);
        }
        for i in 0..n {
            zk.wait_serving(i);
        }
        Some(zk)
    }

    /// Starts member `i` (again).
    pub(crate) fn launch(&mut self, i: usize) {
        let m = &mut self.members[i];
        let d = m.dir.display();
        // The server logs to stdout; the shell sends that to a file and execs the JVM (so the
        // death signal still reaches it). Containers empty for a second are reaped.
        let script = format!(
            "exec java -Xms32m -Xmx192m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
             -cp {ZK_CLASSPATH} -Dzookeeper.root.logger=INFO,CONSOLE \
             -Dlog4j.configuration=file:/etc/zookeeper/conf/log4j.properties \
             -Dznode.container.checkIntervalMs=1000 \
             org.apache.zookeeper.server.quorum.QuorumPeerMain {d}/zoo.cfg >> {d}/zk.log 2>&1"
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        m.child = Some(spawn_server(cmd).expect("spawn java"));
    }

    /// Waits until member `i` serves clients (`srvr` shows a Mode: it is in a quorum).
    pub(crate) fn wait_serving(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.four(i, "srvr").contains("Mode: ") {
            let m = &mut self.members[i];
            let exited = m.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(m.dir.join("zk.log")).unwrap_or_default();
                panic!("zookeeper on port {} not serving; its log:\n{log}", m.port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A four-letter-word command to member `i`, its answer ("" if none).
    pub(crate) fn four(&self, i: usize, word: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.members[i].port)) else {
            return String::new();
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        if s.write_all(word.as_bytes()).is_err() {
            return String::new();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// The member that has a client connection of session `id` ("0x..."), if any.
    pub(crate) fn member_with_session(&self, id: &str) -> Option<usize> {
        let sid = format!("sid={id}");
        (0..self.members.len()).find(|&i| self.four(i, "cons").contains(&sid))
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,...`
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// `host:port,...` for a client.
    pub(crate) fn hosts(&self) -> String {
        self.url().trim_start_matches("zk://").to_string()
    }

    fn pid(&self, i: usize) -> i32 {
        self.members[i].child.as_ref().unwrap().id() as i32
    }

    /// SIGSTOP / SIGCONT member `i`.
    pub(crate) fn pause(&self, i: usize, on: bool) {
        // SAFETY: plain kill of our own child.
        unsafe { libc::kill(self.pid(i), if on { libc::SIGSTOP } else { libc::SIGCONT }) };
    }

    /// Kills member `i` (SIGKILL: its connections drop at once).
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            // SAFETY: plain kill of our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `f` with a client of our own.
    pub(crate) fn with_client<T>(&self, f: impl AsyncFnOnce(&zookeeper_client::Client) -> T) -> T {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let client = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(5))
                .connect(&self.hosts())
                .await
                .expect("connect to zookeeper");
            f(&client).await
        })
    }

    /// The children of `path` (empty if it does not exist).
    pub(crate) fn children(&self, path: &str) -> Vec<String> {
        self.with_client(async |client| match client.list_children(path).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {path}: {e}"),
        })
    }

    /// Creates `path` and its missing ancestors as persistent, open nodes.
    pub(crate) fn mkdirs(&self, path: &str) {
        use zookeeper_client::{Acls, CreateMode};
        self.with_client(async |client| {
            let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
            client.mkdir(path, &options).await.expect("mkdir");
        })
    }
}

impl Drop for Zookeeper {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// The shared ZooKeeper of this test binary (a server started once).
pub(crate) fn shared_zookeeper() -> Option<&'static Zookeeper> {
    static SHARED: OnceLock<Option<Zookeeper>> = OnceLock::new();
    SHARED.get_or_init(Zookeeper::start).as_ref()
}
