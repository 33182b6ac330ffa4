//! Where a store connects: endpoints, the file system's prefix and the deadline of every call.
//! It owns the `etcd://` URL form; it must never hold credentials in a form that reaches logs
//! (no credentials are accepted yet — docs/distributed.md §7).

use std::time::Duration;

/// A malformed `etcd://` URL: the URL and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadUrl(pub String);

impl std::fmt::Display for BadUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadUrl {}

/// How to reach one file system in one etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client endpoints, `http://HOST:PORT`.
    pub endpoints: Vec<String>,
    /// The file system's prefix (docs/distributed.md §1); any bytes but NUL.
    pub prefix: Vec<u8>,
    /// Deadline of every etcd call, and of connecting.
    pub timeout: Duration,
}

/// Deadline of one etcd call when none is given (docs/distributed.md §5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The URL scheme of an etcd-backed file system.
pub const SCHEME: &str = "etcd://";

impl EtcdConfig {
    /// A configuration with the default deadline.
    pub fn new(endpoints: Vec<String>, prefix: impl Into<Vec<u8>>) -> Self {
        Self {
            endpoints,
            prefix: prefix.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// True when `s` names an etcd file system (starts with `etcd://`).
    pub fn is_url(s: &str) -> bool {
        s.starts_with(SCHEME)
    }

    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`. The prefix is everything after the
    /// first `/` (it may itself contain `/`) and must not be empty.
    pub fn from_url(url: &str) -> Result<Self, BadUrl> {
        let bad = |why: &str| {
            BadUrl(format!(
                "bad etcd URL {url:?}: {why} (expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX)"
            ))
        };
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it must start with etcd://"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /PREFIX after the endpoints"))?;
        if prefix.is_empty() {
            return Err(bad("the prefix is empty"));
        }
        if prefix.contains('\0') {
            return Err(bad("the prefix contains NUL"));
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad("an endpoint is not HOST:PORT"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("an endpoint is not HOST:PORT"));
            }
            endpoints.push(format!("http://{h}"));
        }
        Ok(Self::new(endpoints, prefix.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379,10.0.0.2:2380/fs/one").expect("url");
        assert_eq!(
            c.endpoints,
            vec!["http://127.0.0.1:2379", "http://10.0.0.2:2380"]
        );
        assert_eq!(c.prefix, b"fs/one");
        for bad in [
            "etcd://h:1",
            "etcd://h:1/",
            "etcd://h/p",
            "etcd://:1/p",
            "etcd://h:x/p",
            "http://h:1/p",
            "etcd://h:1,/p",
        ] {
            assert!(EtcdConfig::from_url(bad).is_err(), "{bad} must be refused");
        }
    }
}
