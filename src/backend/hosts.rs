//! Host lists in URLs — `host[:port][,host[:port]...]` — the one syntax of every backend that
//! takes several servers: ZooKeeper's ensemble, etcd's members, Redis Cluster seeds and
//! Sentinels (the three splitters they had disagreed on ports, `@` and spaces). A host is a name, an IPv4 address or an IPv6 address in brackets; the port is
//! 1–65535, the backend's default when left out.

use std::fmt;

/// One server of a host list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostPort {
    /// The name or address, IPv6 without its brackets.
    pub host: String,
    pub port: u16,
}

impl fmt::Display for HostPort {
    /// `host:port`, `[v6]:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// The servers of `list` (a URL's authority after any `user:pass@`), or why it is not one: an
/// empty entry, a bad port, an IPv6 address without brackets, or a character no host name has
/// (space, control, `@ / ? # [ ] %`).
pub(crate) fn parse(list: &str, default_port: u16) -> Result<Vec<HostPort>, String> {
    list.split(',')
        .map(|part| one(part, default_port))
        .collect()
}

fn one(part: &str, default_port: u16) -> Result<HostPort, String> {
    let shown = || quoted(part, 80);
    let (host, port) = match part.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("'{}': no ']' after an IPv6 address", shown()))?;
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("'{}' is not an IPv6 address in brackets", shown()));
            }
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(format!("'{}': expected ':port' after ']'", shown())),
                },
            }
        }
        None => match part.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err(format!(
                    "'{}': an IPv6 address must be in brackets ([::1]:port)",
                    shown()
                ));
            }
            Some((host, port)) => (host, Some(port)),
            None => (part, None),
        },
    };
    if host.is_empty() {
        return Err(match part {
            "" => "an empty entry in the host list".to_string(),
            _ => format!("'{}' has no host", shown()),
        });
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "@/?#[]%".contains(c))
    {
        return Err(format!("'{}' is not a host name", shown()));
    }
    let port = match port {
        None => default_port,
        Some(p) => Some(p)
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("bad port '{}' (1-65535)", quoted(p, 20)))?,
    };
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
}

/// A piece of a URL for an error message: any password of the URLs given hidden first (a URL
/// split in the wrong place puts a password where a host or port should be), then cleaned and
/// cut. (Cut first, the scrubber would no longer recognize a piece of it.)
fn quoted(piece: &str, max: usize) -> String {
    crate::report::clean(&crate::report::without_secrets(piece), max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn host_lists() {
        assert_eq!(
            parse("a:1,b,[::1]:3,[fe80::1],10.0.0.1:65535", 9),
            Ok(vec![
                hp("a", 1),
                hp("b", 9),
                hp("::1", 3),
                hp("fe80::1", 9),
                hp("10.0.0.1", 65535)
            ])
        );
        assert_eq!(parse("[::1]:3", 9).unwrap()[0].to_string(), "[::1]:3");
        for bad in [
            "",
            "a,",
            ",a",
            "a,,b",
            ":1",
            "a:",
            "a:0",
            "a:x",
            "a:65536",
            "a:+1",
            "a: 1",
            "::1",
            "a:1:2",
            "[::1",
            "[::1]x",
            "[]:1",
            "[x]:1",
            "[:::]",
            "[1::2::3]",
            "a b",
            "u@a",
            "a/b",
            "a?b",
            "a#b",
            "a%b",
            "a\n",
            "[::1]:",
            "a:-1",
        ] {
            assert!(parse(bad, 9).is_err(), "{bad:?} was taken");
        }
    }

    proptest! {
        /// Any text is a host list or an error, never a panic; the error quotes at most a short
        /// cleaned piece of it.
        #[test]
        fn any_host_list_parses_or_is_refused(list in "\\PC*|.*", port: u16) {
            if let Err(why) = parse(&list, port) {
                prop_assert!(!why.chars().any(char::is_control));
                prop_assert!(why.chars().count() < 200);
            }
        }

        /// What is printed parses back to the same servers.
        #[test]
        fn host_lists_round_trip(
            hosts in proptest::collection::vec(
                (
                    prop_oneof![
                        "[a-z0-9][a-z0-9.-]{0,20}",
                        any::<u128>().prop_map(|a| std::net::Ipv6Addr::from(a).to_string()),
                    ],
                    1u16..,
                ),
                1..5,
            ),
        ) {
            let list: Vec<HostPort> = hosts.iter().map(|(h, p)| hp(h, *p)).collect();
            let text: Vec<String> = list.iter().map(ToString::to_string).collect();
            prop_assert_eq!(parse(&text.join(","), 1), Ok(list));
        }
    }
}
