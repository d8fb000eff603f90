//! `dlock doctor` for ZooKeeper: each server's version and mode (its `srvr` four-letter word, the
//! one a server allows by default), the session timeout the server negotiates for `--ttl` (the
//! lease: servers clamp it to their `[minSessionTimeout, maxSessionTimeout]`), and a `sync`, the
//! request a holder renews with, which only the leader's quorum answers.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::ZkBackend;
use super::session::{close, op};
use crate::backend::ground::Finding;
use crate::report::clean;

/// How long one server has to answer `srvr`.
const SRVR_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of a `srvr` answer read (a few hundred bytes).
const MAX_SRVR: u64 = 4096;

/// What `srvr` said of one server.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Srvr {
    version: Option<String>,
    mode: Option<String>,
}

/// Reads a `srvr` answer: "Zookeeper version: 3.8.4-...\n...Mode: follower\n"; `None` if it is
/// not one (the word not allowed: "srvr is not executed because it is not in the whitelist.").
pub(super) fn parse_srvr(text: &str) -> Option<Srvr> {
    let mut s = Srvr::default();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Zookeeper version: ") {
            // "3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c, built on ...": the number.
            let v = v.split([',', '-']).next().unwrap_or(v).trim();
            s.version = Some(clean(v, 64));
        } else if let Some(m) = line.strip_prefix("Mode: ") {
            s.mode = Some(clean(m.trim(), 64));
        }
    }
    (s.version.is_some() || s.mode.is_some()).then_some(s)
}

/// Asks `host` (host:port) `srvr`; its answer, or why there is none.
fn srvr(host: &str) -> Result<Srvr, String> {
    let addr = host
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&addr, SRVR_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(SRVR_TIMEOUT)).ok();
    s.set_write_timeout(Some(SRVR_TIMEOUT)).ok();
    s.write_all(b"srvr").map_err(|e| e.to_string())?;
    // Read until the server closes, MAX_SRVR bytes, or SRVR_TIMEOUT in all (a server that
    // trickles a byte per read timeout cannot hold doctor longer).
    let deadline = std::time::Instant::now() + SRVR_TIMEOUT;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while (buf.len() as u64) < MAX_SRVR {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n.min((MAX_SRVR as usize) - buf.len())]),
        }
    }
    parse_srvr(&String::from_utf8_lossy(&buf))
        .ok_or_else(|| "srvr is not allowed (4lw.commands.whitelist)".into())
}

/// The session timeout line: `asked` (`--ttl`) against what the server `granted`.
pub(super) fn session_finding(asked: Duration, granted: Duration) -> Finding {
    const CHECK: &str = "session timeout";
    let (a, g) = (
        humantime::format_duration(asked),
        humantime::format_duration(granted),
    );
    if granted < asked {
        Finding::warn(
            CHECK,
            format!(
                "the server cut the session timeout asked for (--ttl {a}) to {g} (its maxSessionTimeout): the lease is {g}, so a holder cut off from the ensemble for {g} loses the lock and its command is stopped"
            ),
            format!(
                "raise maxSessionTimeout in zoo.cfg to at least {} ms, or run with --ttl {g}",
                asked.as_millis()
            ),
        )
    } else if granted > asked {
        Finding::ok(
            CHECK,
            format!(
                "the server raised the session timeout asked for (--ttl {a}) to {g} (its minSessionTimeout): the lease is {g}, so the lock of a holder that vanished stays taken for {g}"
            ),
        )
    } else {
        Finding::ok(CHECK, format!("{g}, as asked (--ttl): the lease"))
    }
}

impl ZkBackend {
    /// The checks: the servers, the negotiated session timeout, a `sync`.
    pub(super) fn checks(&self, ttl: Duration) -> anyhow::Result<Vec<Finding>> {
        let rt = self.runtime()?;
        let (granted, synced) = rt.block_on(async {
            let client = self.connect(ttl).await?;
            let granted = client.session_timeout();
            let synced = op(client.sync("/")).await;
            close(client, None).await;
            anyhow::Ok((granted, synced))
        })?;
        let mut servers = Vec::new();
        let mut read_only = Vec::new();
        for host in self.hosts.split(',') {
            let shown = clean(host, 256);
            match srvr(host) {
                Ok(s) => {
                    let version = s.version.as_deref().unwrap_or("version unknown");
                    let mode = s.mode.as_deref().unwrap_or("mode unknown");
                    if mode == "read-only" {
                        read_only.push(shown.clone());
                    }
                    servers.push(format!("{shown} ZooKeeper {version}, {mode}"));
                }
                Err(why) => servers.push(format!("{shown} ({})", clean(&why, 120))),
            }
        }
        let mut findings = vec![Finding::ok("server", servers.join("; "))];
        if !read_only.is_empty() {
            findings.push(Finding::warn(
                "read-only",
                format!(
                    "{} in read-only mode (cut off from its quorum): dlock cannot lock through it",
                    read_only.join(", ")
                ),
                "bring the server back into its quorum, or list the other servers in the URL",
            ));
        }
        findings.push(session_finding(ttl, granted));
        findings.push(match synced {
            Ok(()) => Finding::ok(
                "quorum",
                "sync answered: the leader's quorum vouches for sessions (holders renew this way)",
            ),
            Err(e) => Finding::warn(
                "quorum",
                format!("sync failed: {e}: a holder's renewals would fail here"),
                "check that the ensemble has a quorum (a majority of its servers up and connected)",
            ),
        });
        Ok(findings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ground::Verdict;

    #[test]
    fn srvr_answers_are_read() {
        let text = "Zookeeper version: 3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c, built on 2024-02-12 22:16 UTC\nLatency min/avg/max: 0/0.0/0\nMode: follower\nNode count: 5\n";
        assert_eq!(
            parse_srvr(text),
            Some(Srvr {
                version: Some("3.8.4".into()),
                mode: Some("follower".into())
            })
        );
        assert_eq!(
            parse_srvr("srvr is not executed because it is not in the whitelist.\n"),
            None
        );
        let evil = parse_srvr("Mode: \x1b[2Jleader").unwrap();
        assert!(!evil.mode.unwrap().contains('\x1b'));
    }

    #[test]
    fn the_negotiated_session_timeout_is_judged() {
        let s = Duration::from_secs;
        let cut = session_finding(s(30), s(20));
        assert_eq!(cut.verdict, Verdict::Warn);
        assert!(cut.found.contains("maxSessionTimeout"), "{}", cut.found);
        assert!(cut.fix.unwrap().contains("30000 ms"));
        let raised = session_finding(s(1), s(4));
        assert_eq!(raised.verdict, Verdict::Ok);
        assert!(raised.found.contains("minSessionTimeout"));
        assert_eq!(session_finding(s(5), s(5)).verdict, Verdict::Ok);
    }
}
