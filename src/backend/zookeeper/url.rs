//! `zk://` URLs: servers, chroot and digest credentials.

use crate::backend::percent_decode;
use crate::config::redact;
use crate::exit::Usage;

/// The port of a server given without one.
const DEFAULT_PORT: u16 = 2181;

/// The parts of a `zk://` URL.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ZkUrl {
    pub(super) hosts: Vec<String>,
    pub(super) chroot: String,
    pub(super) digest: Option<String>,
}

/// `zk://[user:password@]host[:port][,host[:port]...][/chroot]` (or `zookeeper://`).
pub(super) fn parse_url(url: &str) -> Result<ZkUrl, Usage> {
    let bad = |why: &str| Usage(format!("bad zookeeper URL '{}': {why}", redact(url)));
    let rest = match url.split_once("://") {
        Some((scheme, rest))
            if matches!(scheme.to_ascii_lowercase().as_str(), "zk" | "zookeeper") =>
        {
            rest
        }
        _ => return Err(bad("expected zk://host:port[,host:port...][/chroot]")),
    };
    if rest.contains(['?', '#']) {
        return Err(bad("no query or fragment is understood"));
    }
    let (authority, chroot) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let digest = match userinfo {
        None => None,
        Some(u) => {
            let (user, pass) = u
                .split_once(':')
                .ok_or_else(|| bad("credentials must be user:password"))?;
            let decode = |s: &str| {
                percent_decode(s)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| bad("invalid %-escape in the credentials"))
            };
            let user = decode(user)?;
            if user.is_empty() || user.contains(':') {
                return Err(bad("the user name must be non-empty and without ':'"));
            }
            Some(format!("{user}:{}", decode(pass)?))
        }
    };
    let hosts = crate::backend::hosts::parse(hostlist, DEFAULT_PORT)
        .map_err(|why| bad(&why))?
        .iter()
        .map(ToString::to_string)
        .collect();
    if chroot.contains('@') {
        // `zk://u:PW/x@h`: a password with a raw '/' would become a chroot and a host.
        return Err(bad(
            "'@' after the hosts: %-escape '/' in credentials (a chroot cannot hold '@')",
        ));
    }
    let chroot = chroot.trim_end_matches('/');
    for segment in chroot.split('/').skip(1) {
        if segment.is_empty()
            || segment == "."
            || segment == ".."
            || segment.contains(char::is_control)
        {
            return Err(bad("the chroot must be a plain absolute path"));
        }
    }
    Ok(ZkUrl {
        hosts,
        chroot: chroot.to_string(),
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("zk://a:1,b,[::1]:3/app/locks/").unwrap();
        assert_eq!(u.hosts, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(u.chroot, "/app/locks");
        assert_eq!(u.digest, None);
        let u = parse_url("zookeeper://bob:p%40ss:w@h").unwrap();
        assert_eq!(u.digest.as_deref(), Some("bob:p@ss:w"));
        assert_eq!(u.chroot, "");
        for bad in [
            "zk://",
            "zk://a:0",
            "zk://a:x",
            "zk://a,,b",
            "zk://a/x/../y",
            "zk://u/pw@h",
            "zk://a//b",
            "zk://a?x=1",
            "redis://a",
            "zk://:pw@a",
        ] {
            let e = parse_url(bad).unwrap_err().0;
            assert!(e.starts_with("bad zookeeper URL"), "{bad}: {e}");
        }
        assert!(
            !parse_url("zk://u:secret@")
                .unwrap_err()
                .0
                .contains("secret")
        );
    }
}
