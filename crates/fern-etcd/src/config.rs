//! Where a store connects and as whom: endpoints, the file system's prefix, the deadline of
//! every call, TLS files and etcd user/password (docs/distributed.md §10). It owns the
//! `etcd://` URL form and the client configuration file; it must never hold a password in a
//! form that reaches logs (its `Debug` hides it) and never take one from the URL.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A malformed `etcd://` URL or client configuration: what is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadUrl(pub String);

impl std::fmt::Display for BadUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadUrl {}

/// An etcd password: printed as `<hidden>` by `Debug`, so a configuration can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

/// TLS to every endpoint: the CA that signed the servers' certificates, and the client's own
/// certificate and key for a cluster started with `--client-cert-auth`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA certificate(s) trusted for the servers.
    pub ca: PathBuf,
    /// PEM client certificate and key; both or neither.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// How to reach one file system in one etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client endpoints, `http://HOST:PORT` (`https://` when `tls` is set).
    pub endpoints: Vec<String>,
    /// The file system's prefix (docs/distributed.md §1); any bytes but NUL.
    pub prefix: Vec<u8>,
    /// Deadline of every etcd call, and of connecting.
    pub timeout: Duration,
    /// etcd user and password (etcd's auth), when the cluster has auth enabled.
    pub user: Option<(String, Password)>,
    /// TLS, when the cluster serves clients over https.
    pub tls: Option<TlsFiles>,
}

/// Deadline of one etcd call when none is given (docs/distributed.md §5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The URL scheme of an etcd-backed file system.
pub const SCHEME: &str = "etcd://";

/// Names the client configuration file (docs/distributed.md §10).
pub const CONFIG_VAR: &str = "FERN_ETCD_CONFIG";
/// Holds the password of the URL's user.
pub const PASSWORD_VAR: &str = "FERN_ETCD_PASSWORD";
/// Names a file holding the password of the URL's user.
pub const PASSWORD_FILE_VAR: &str = "FERN_ETCD_PASSWORD_FILE";

/// The settings of a client configuration file, before they meet a URL.
#[derive(Debug, Default)]
struct FileSettings {
    user: Option<String>,
    password: Option<Password>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    timeout: Option<Duration>,
}

impl EtcdConfig {
    /// A configuration with the default deadline, no auth and no TLS.
    pub fn new(endpoints: Vec<String>, prefix: impl Into<Vec<u8>>) -> Self {
        Self {
            endpoints,
            prefix: prefix.into(),
            timeout: DEFAULT_TIMEOUT,
            user: None,
            tls: None,
        }
    }

    /// True when `s` names an etcd file system (starts with `etcd://`).
    pub fn is_url(s: &str) -> bool {
        s.starts_with(SCHEME)
    }

    /// The configuration of `url` as a command uses it: the URL, then the configuration file
    /// named by `FERN_ETCD_CONFIG` (if set), then the password from `FERN_ETCD_PASSWORD` or
    /// the file named by `FERN_ETCD_PASSWORD_FILE` (these win over the file's).
    pub fn resolve(url: &str) -> Result<Self, BadUrl> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut s = match env(CONFIG_VAR) {
            Some(path) => read_config_file(Path::new(&path))?,
            None => FileSettings::default(),
        };
        if let Some(p) = env(PASSWORD_VAR) {
            s.password = Some(Password(p));
        } else if let Some(path) = env(PASSWORD_FILE_VAR) {
            s.password = Some(read_password_file(Path::new(&path))?);
        }
        Self::from_url_with(url, s)
    }

    /// Parses `etcd://[USER@]HOST:PORT[,HOST:PORT...]/PREFIX` alone (no file, no
    /// environment: a URL with a user then lacks its password and is refused). The prefix is
    /// everything after the first `/` (it may itself contain `/`) and must not be empty.
    pub fn from_url(url: &str) -> Result<Self, BadUrl> {
        Self::from_url_with(url, FileSettings::default())
    }

    fn from_url_with(url: &str, s: FileSettings) -> Result<Self, BadUrl> {
        let bad = |why: &str| {
            BadUrl(format!(
                "bad etcd URL {url:?}: {why} (expected etcd://[USER@]HOST:PORT[,HOST:PORT...]/PREFIX)"
            ))
        };
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it must start with etcd://"))?;
        let (authority, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /PREFIX after the endpoints"))?;
        if prefix.is_empty() {
            return Err(bad("the prefix is empty"));
        }
        if prefix.contains('\0') {
            return Err(bad("the prefix contains NUL"));
        }
        let (url_user, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        if let Some(u) = url_user {
            if u.contains(':') {
                // Never echo what follows the ':' — it is a password.
                return Err(BadUrl(format!(
                    "bad etcd URL: a password must not be given in the URL (it would show in \
                     ps and shell history); give the user as etcd://USER@…, the password in \
                     ${PASSWORD_VAR}, ${PASSWORD_FILE_VAR} or the file named by ${CONFIG_VAR}"
                )));
            }
            if u.is_empty() {
                return Err(bad("the user before @ is empty"));
            }
        }
        let scheme = if s.ca.is_some() { "https" } else { "http" };
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad("an endpoint is not HOST:PORT"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("an endpoint is not HOST:PORT"));
            }
            endpoints.push(format!("{scheme}://{h}"));
        }
        let mut cfg = Self::new(endpoints, prefix.as_bytes());
        if let Some(t) = s.timeout {
            cfg.timeout = t;
        }
        match (url_user.map(str::to_string).or(s.user), s.password) {
            (Some(u), Some(p)) => cfg.user = Some((u, p)),
            (Some(u), None) => {
                return Err(BadUrl(format!(
                    "etcd user {u:?} has no password: set ${PASSWORD_VAR} or \
                     ${PASSWORD_FILE_VAR}, or `password_file` in the file named by ${CONFIG_VAR}"
                )))
            }
            (None, Some(_)) => {
                return Err(BadUrl(
                    "an etcd password is given but no user (etcd://USER@… or `user` in the \
                     configuration file)"
                        .into(),
                ))
            }
            (None, None) => {}
        }
        cfg.tls = match (s.ca, s.cert, s.key) {
            (None, None, None) => None,
            (Some(ca), None, None) => Some(TlsFiles { ca, client: None }),
            (Some(ca), Some(c), Some(k)) => Some(TlsFiles {
                ca,
                client: Some((c, k)),
            }),
            (None, _, _) => {
                return Err(BadUrl(
                    "a client certificate needs `ca` too (the CA of the servers' certificates)"
                        .into(),
                ))
            }
            _ => {
                return Err(BadUrl(
                    "`cert` and `key` of the client go together: give both or neither".into(),
                ))
            }
        };
        Ok(cfg)
    }
}

/// Reads a client configuration file: `key = value` lines, `#` comments. Keys: `user`,
/// `password`, `password_file`, `ca`, `cert`, `key`, `timeout_ms`. Relative paths are
/// relative to the file's directory.
fn read_config_file(path: &Path) -> Result<FileSettings, BadUrl> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        BadUrl(format!(
            "etcd client configuration {} (${CONFIG_VAR}): {e}",
            path.display()
        ))
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let file = |v: &str| base.join(v);
    let mut s = FileSettings::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| {
            BadUrl(format!(
                "etcd client configuration {} line {}: {why}",
                path.display(),
                n + 1
            ))
        };
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| bad("expected KEY = VALUE"))?;
        let (k, v) = (k.trim(), v.trim());
        if v.is_empty() {
            return Err(bad("empty value"));
        }
        match k {
            "user" => s.user = Some(v.to_string()),
            "password" => s.password = Some(Password(v.to_string())),
            "password_file" => s.password = Some(read_password_file(&file(v))?),
            "ca" => s.ca = Some(file(v)),
            "cert" => s.cert = Some(file(v)),
            "key" => s.key = Some(file(v)),
            "timeout_ms" => {
                let ms: u64 =
                    v.parse().ok().filter(|&ms| ms > 0).ok_or_else(|| {
                        bad("timeout_ms must be a positive number of milliseconds")
                    })?;
                s.timeout = Some(Duration::from_millis(ms));
            }
            _ => return Err(bad(&format!("unknown key {k:?}"))),
        }
    }
    Ok(s)
}

/// A password file: its first line (so a trailing newline is not part of the password).
fn read_password_file(path: &Path) -> Result<Password, BadUrl> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BadUrl(format!("etcd password file {}: {e}", path.display())))?;
    let first = text.lines().next().unwrap_or("");
    if first.is_empty() {
        return Err(BadUrl(format!(
            "etcd password file {} is empty",
            path.display()
        )));
    }
    Ok(Password(first.to_string()))
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
            "etcd://@h:1/p",
        ] {
            assert!(EtcdConfig::from_url(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn a_password_in_the_url_is_refused_without_echoing_it() {
        let e = EtcdConfig::from_url("etcd://alice:s3cret@h:1/p").expect_err("refused");
        assert!(e.0.contains("password must not be given in the URL"), "{e}");
        assert!(!e.0.contains("s3cret"), "the password leaked into {e}");
    }

    #[test]
    fn user_needs_a_password_and_debug_hides_it() {
        let e = EtcdConfig::from_url("etcd://alice@h:1/p").expect_err("no password");
        assert!(e.0.contains("has no password"), "{e}");
        let s = FileSettings {
            password: Some(Password("s3cret".into())),
            ..FileSettings::default()
        };
        let c = EtcdConfig::from_url_with("etcd://alice@h:1/p", s).expect("url");
        assert_eq!(c.user.as_ref().map(|u| u.0.as_str()), Some("alice"));
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn config_file_gives_tls_user_and_timeout() {
        let dir = std::env::temp_dir().join(format!("fern-etcd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("pw"), "hunter2\n").expect("pw");
        let cfg = dir.join("etcd.conf");
        std::fs::write(
            &cfg,
            "# test\nuser = bob\npassword_file = pw\nca = ca.pem\ncert = c.pem\nkey = c.key\ntimeout_ms = 1500\n",
        )
        .expect("cfg");
        let s = read_config_file(&cfg).expect("parse");
        let c = EtcdConfig::from_url_with("etcd://h:1/p", s).expect("config");
        assert_eq!(c.endpoints, vec!["https://h:1"]);
        assert_eq!(c.timeout, Duration::from_millis(1500));
        let (u, p) = c.user.expect("user");
        assert_eq!((u.as_str(), p.0.as_str()), ("bob", "hunter2"));
        let tls = c.tls.expect("tls");
        assert_eq!(tls.ca, dir.join("ca.pem"));
        assert_eq!(tls.client, Some((dir.join("c.pem"), dir.join("c.key"))));
        for (text, why) in [
            ("cert = c.pem\nkey = c.key\n", "needs `ca`"),
            ("ca = a\ncert = c.pem\n", "go together"),
            ("colour = blue\n", "unknown key"),
            ("timeout_ms = 0\n", "positive"),
            ("user\n", "KEY = VALUE"),
        ] {
            std::fs::write(&cfg, text).expect("cfg");
            let e = read_config_file(&cfg)
                .and_then(|s| EtcdConfig::from_url_with("etcd://h:1/p", s))
                .expect_err(text);
            assert!(e.0.contains(why), "{text:?}: {e}");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
