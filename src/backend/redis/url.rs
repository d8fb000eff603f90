//! Redis URLs: one server, a Cluster's seeds, Sentinels, and dlock's `?min-replicas=N`.

use redis::IntoConnectionInfo;

use super::sentinel::Sentinels;
use super::{Node, conn};
use crate::backend::Reach;
use crate::backend::hosts::HostPort;
use crate::config::redact;
use crate::exit::Usage;

/// `url` without its `min-replicas=N` query parameter, and N (0 without it). Any other
/// parameter must be one the Redis client reads (`protocol`; over a Unix socket also `db`,
/// `user`, `pass`): a misspelled one (`?min-replica=1`) is an error, not ignored.
pub(super) fn take_min_replicas(url: &str) -> Result<(String, u32), String> {
    let unix = url.starts_with("redis+unix:") || url.starts_with("unix:");
    let known: &[&str] = if unix {
        &["protocol", "db", "user", "pass"]
    } else {
        &["protocol"]
    };
    let (head, frag) = match url.find('#') {
        Some(i) => url.split_at(i),
        None => (url, ""),
    };
    let Some((base, query)) = head.split_once('?') else {
        return Ok((url.to_string(), 0));
    };
    let mut n = 0;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.strip_prefix("min-replicas=") {
            Some(v) => {
                n = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| format!("min-replicas={v}: a number of replicas, 1 to 100"))?;
            }
            None => {
                let name = pair.split('=').next().unwrap_or(pair);
                if !known.contains(&name) {
                    return Err(format!(
                        "unknown parameter '{}' (known: min-replicas, {})",
                        crate::report::clean(name, 40),
                        known.join(", ")
                    ));
                }
                kept.push(pair);
            }
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    Ok((format!("{base}{query}{frag}"), n))
}

/// `redis-sentinel://[user:pass@]host[:26379][,host…][/db]#primary` (`rediss-sentinel://`: TLS
/// to the sentinels and the primary): the `redis://` URL of the first sentinel, the others and
/// the primary's name; `None` for another scheme.
pub(super) fn parse_sentinel(url: &str) -> Result<Option<(String, Vec<HostPort>, String)>, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let plain = match scheme.to_ascii_lowercase().as_str() {
        "redis-sentinel" => "redis",
        "rediss-sentinel" => "rediss",
        _ => return Ok(None),
    };
    let (rest, name) = rest.rsplit_once('#').unwrap_or((rest, ""));
    let (first, others) = split_seeds(&format!("{plain}://{rest}"), 26379)?;
    Ok(Some((first, others, name.to_string())))
}

/// `redis://[auth@]h1[:p1],h2[:p2]…[/db]` (or `rediss://`): the URL of the first host, its port
/// written out, and the others (see [`hosts`](crate::backend::hosts)). Other schemes (a Unix
/// socket) take one server: the URL as it is.
pub(super) fn split_seeds(url: &str, default_port: u16) -> Result<(String, Vec<HostPort>), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_string(), Vec::new()));
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "redis" | "rediss") {
        return Ok((url.to_string(), Vec::new()));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), authority),
    };
    let mut hosts = crate::backend::hosts::parse(hosts, default_port)?.into_iter();
    let first = hosts.next().ok_or("no host")?;
    Ok((format!("{scheme}://{auth}{first}{tail}"), hosts.collect()))
}

impl Node {
    pub(in crate::backend) fn parse(full: &str) -> Result<Node, Usage> {
        let bad = |e: redis::RedisError| {
            // redis-rs says "Missing hostname - InvalidClientConfig": its words, not its type.
            let text = e.to_string();
            let what = text.split(" - ").next().unwrap_or(&text).to_lowercase();
            Usage(format!(
                "bad redis URL '{}': {what} (expected redis://[user:password@]host[:port][/db], \
                 rediss://… for TLS, redis+unix:///path/to.sock, or \
                 redis-sentinel://host:26379#primary)",
                redact(full)
            ))
        };
        let (url, min_replicas) = take_min_replicas(full)
            .map_err(|why| Usage(format!("bad redis URL '{}': {why}", redact(full))))?;
        let url = url.as_str();
        let why = |why: String| Usage(format!("bad redis URL '{}': {why}", redact(url)));
        let sentinel = parse_sentinel(url).map_err(why)?;
        let (first, others) = match &sentinel {
            Some((first, others, name)) => {
                if name.is_empty() {
                    return Err(Usage(format!(
                        "bad redis URL '{}': a Sentinel URL names its primary after '#' \
                         (redis-sentinel://host:26379#mymaster)",
                        redact(url)
                    )));
                }
                (first.clone(), others.clone())
            }
            None => split_seeds(url, 6379).map_err(why)?,
        };
        let info = first.as_str().into_connection_info().map_err(bad)?;
        let mut seeds = others
            .iter()
            .map(|h| conn::addr_like(info.addr(), &h.to_string()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| why("several hosts, and the first is not TCP".into()))?;
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            return Err(Usage(format!(
                "bad redis URL '{}': dlock does not skip certificate checks (#insecure); trust \
                 the server's CA with SSL_CERT_FILE instead",
                redact(url)
            )));
        }
        let mut addr = std::iter::once(info.addr())
            .chain(&seeds)
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let sentinel = sentinel.map(|(_, _, name)| {
            let shown = crate::report::clean(&crate::report::without_secrets(&name), 200);
            addr = format!("sentinel {addr} #{shown}");
            Sentinels {
                shown,
                addrs: std::iter::once(info.addr().clone())
                    .chain(std::mem::take(&mut seeds))
                    .collect(),
                name,
            }
        });
        Ok(Node {
            info,
            seeds,
            addr,
            reach: Reach::default(),
            sentinel,
            min_replicas,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_are_seeds() {
        let (first, others) = split_seeds("redis://u:p@a:1,b:2,c/3", 6379).unwrap();
        assert_eq!(first, "redis://u:p@a:1/3");
        let others: Vec<String> = others.iter().map(ToString::to_string).collect();
        assert_eq!(others, ["b:2", "c:6379"]);
        assert_eq!(
            split_seeds("rediss://a", 6379),
            Ok(("rediss://a:6379".into(), vec![]))
        );
        assert_eq!(
            split_seeds("unix:///a,b", 6379),
            Ok(("unix:///a,b".into(), vec![]))
        );
        for bad in [
            "redis://a,,b",
            "redis://a:0",
            "redis://a b",
            "redis://::1,b",
        ] {
            assert!(Node::parse(bad).is_err(), "{bad}");
        }
        let n = Node::parse("redis://:pw@127.0.0.1:7000,127.0.0.1:7001,localhost").unwrap();
        assert_eq!(n.addr, "127.0.0.1:7000,127.0.0.1:7001,localhost:6379");
        assert!(Node::parse("redis://a:1,b:x").is_err());
    }

    #[test]
    fn min_replicas_is_dlocks_parameter() {
        assert_eq!(
            take_min_replicas("redis://h/1?min-replicas=2#x"),
            Ok(("redis://h/1#x".to_string(), 2))
        );
        assert_eq!(
            take_min_replicas("redis://h?protocol=resp3&min-replicas=1"),
            Ok(("redis://h?protocol=resp3".to_string(), 1))
        );
        assert_eq!(take_min_replicas("redis://h"), Ok(("redis://h".into(), 0)));
        assert!(take_min_replicas("redis://h?min-replicas=0").is_err());
        assert!(take_min_replicas("redis://h?min-replicas=x").is_err());
        let typo = take_min_replicas("redis://h?min-replica=1").unwrap_err();
        assert!(typo.contains("unknown parameter 'min-replica'"), "{typo}");
        assert!(take_min_replicas("redis://h?db=1").is_err());
        assert!(take_min_replicas("redis+unix:///s.sock?db=1&min-replicas=1").is_ok());
        assert_eq!(
            Node::parse("redis://h?min-replicas=3")
                .unwrap()
                .min_replicas,
            3
        );
    }

    #[test]
    fn sentinel_urls() {
        let n = Node::parse("redis-sentinel://:pw@s1,s2:26380/2#prim").unwrap();
        assert_eq!(n.addr, "sentinel s1:26379,s2:26380 #prim");
        let s = n.sentinel.as_ref().unwrap();
        assert_eq!((s.addrs.len(), s.name.as_str()), (2, "prim"));
        assert!(n.seeds.is_empty());
        assert_eq!(n.info.redis_settings().db(), 2);
        assert_eq!(n.info.redis_settings().password(), Some("pw"));
        assert!(
            Node::parse("redis-sentinel://s1:26379").is_err(),
            "no primary name"
        );
        let t = Node::parse("rediss-sentinel://s1:1#p").unwrap();
        assert!(matches!(
            t.info.addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ));
    }
}
