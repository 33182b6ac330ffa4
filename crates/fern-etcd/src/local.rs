//! [`LocalEtcd`]: a private single-member etcd on loopback, for tests and scripts
//! (docs/distributed.md §9). It owns the server process, its ports and its data directory; it
//! must never touch an etcd it did not start (the Debian package's service included).
//!
//! The server runs under a small `sh` guard that reads the pipe this process holds: when the
//! handle is dropped, or the process exits or is killed, the pipe closes and the guard stops
//! etcd by its PID (waking it first if a test froze it) and removes the data directory. So a
//! test binary may keep one server in a `static` and still leave nothing behind. A line
//! `restart` on the same pipe makes the guard start the member again on its data directory
//! (after a test killed it), so a cluster can lose its leader round after round.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::config::EtcdConfig;

/// Waits for a started server to report healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

const GUARD: &str = r#"
dir=$1; shift
run() {
  etcd "$@" >>"$dir/etcd.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/etcd.pid"
}
run "$@"
while read -r cmd; do
  if [ "$cmd" = restart ]; then
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    run "$@"
  fi
done
kill "$pid" 2>/dev/null
kill -CONT "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$dir"
"#;

/// The server side of TLS for a private etcd: its certificate and key, and the CA whose
/// client certificates it demands (`--client-cert-auth`) when `client_ca` is set.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// PEM server certificate (valid for 127.0.0.1).
    pub cert: PathBuf,
    /// PEM server key.
    pub key: PathBuf,
    /// PEM CA of accepted client certificates; `None` serves https without client auth.
    pub client_ca: Option<PathBuf>,
}

/// A running private etcd: one member, or a cluster of several on loopback.
#[derive(Debug)]
pub struct LocalEtcd {
    members: Vec<Member>,
}

/// One member: its guard process, client endpoint and directory.
#[derive(Debug)]
struct Member {
    guard: Child,
    /// `http://` or `https://127.0.0.1:PORT`.
    endpoint: String,
    client_port: u16,
    dir: PathBuf,
}

impl LocalEtcd {
    /// True when an `etcd` binary is on `PATH`.
    pub fn binary_available() -> bool {
        Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts a single-member server on free loopback ports with a fresh data directory
    /// (under `/dev/shm` when it exists) and waits until it is healthy.
    pub fn start() -> std::io::Result<Self> {
        Self::start_cluster(1)
    }

    /// Starts a cluster of `members` members (3 for the fault tests), each on its own ports
    /// and data directory, and waits until every member is healthy.
    pub fn start_cluster(members: usize) -> std::io::Result<Self> {
        // A port the kernel handed out may be taken again before etcd binds it: retry.
        Self::start_retrying(members, None, &[])
    }

    /// Starts a single member with extra etcd flags (e.g. `--auth-token-ttl=1`).
    pub fn start_with_flags(flags: &[&str]) -> std::io::Result<Self> {
        Self::start_retrying(1, None, flags)
    }

    /// Starts a single member serving clients over https with `tls`.
    pub fn start_tls(tls: &ServerTls) -> std::io::Result<Self> {
        Self::start_retrying(1, Some(tls), &[])
    }

    fn start_retrying(
        members: usize,
        tls: Option<&ServerTls>,
        flags: &[&str],
    ) -> std::io::Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(members.max(1), tls, flags) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("etcd did not start")))
    }

    fn try_start(n: usize, tls: Option<&ServerTls>, flags: &[&str]) -> std::io::Result<Self> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let run = format!(
            "fern-etcd-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let initial = initial.join(",");
        let mut cluster = Self {
            members: Vec::new(),
        };
        for (i, (client, peer)) in ports.into_iter().enumerate() {
            let dir = base.join(format!("{run}-m{i}"));
            std::fs::create_dir_all(&dir)?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            let endpoint = format!("{scheme}://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut tls_args: Vec<std::ffi::OsString> = Vec::new();
            if let Some(t) = tls {
                tls_args.extend(["--cert-file".into(), t.cert.clone().into_os_string()]);
                tls_args.extend(["--key-file".into(), t.key.clone().into_os_string()]);
                if let Some(ca) = &t.client_ca {
                    tls_args.push("--client-cert-auth".into());
                    tls_args.extend(["--trusted-ca-file".into(), ca.clone().into_os_string()]);
                }
            }
            let guard = Command::new("sh")
                .arg("-c")
                .arg(GUARD)
                .arg("fern-etcd-guard")
                .arg(&dir)
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.join("data"))
                .args(["--listen-client-urls", &endpoint])
                .args(["--advertise-client-urls", &endpoint])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--auto-compaction-mode", "revision"])
                .args(["--auto-compaction-retention", "1000"])
                .args(&tls_args)
                .args(flags)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            cluster.members.push(Member {
                guard,
                endpoint,
                client_port: client,
                dir,
            });
        }
        for m in &cluster.members {
            m.wait_healthy()?;
        }
        Ok(cluster)
    }

    /// Freezes every member (SIGSTOP): they keep their connections but answer nothing, as a
    /// partitioned or overloaded cluster does. [`LocalEtcd::resume`] thaws them.
    /// Returns once every thread of every member is stopped: `kill` only queues the signal, and
    /// a thread still running on the other CPU could answer one more request (a frozen-server
    /// test once read a value through a "frozen" member).
    pub fn pause(&self) -> std::io::Result<()> {
        self.members.iter().try_for_each(|m| m.signal("STOP"))?;
        self.members.iter().try_for_each(Member::wait_stopped)
    }

    /// Thaws paused members (SIGCONT).
    pub fn resume(&self) -> std::io::Result<()> {
        self.members.iter().try_for_each(|m| m.signal("CONT"))
    }

    /// Kills member `i` with SIGKILL (a crash: no shutdown, no goodbye to its peers).
    pub fn kill_member(&self, i: usize) -> std::io::Result<()> {
        self.members
            .get(i)
            .ok_or_else(|| std::io::Error::other(format!("no member {i}")))?
            .signal("KILL")
    }

    /// Starts member `i` again on its own data directory (after [`LocalEtcd::kill_member`];
    /// a running member is killed first) and waits until it is healthy: it rejoins the
    /// cluster with the data it had.
    pub fn restart_member(&mut self, i: usize) -> std::io::Result<()> {
        let m = self
            .members
            .get_mut(i)
            .ok_or_else(|| std::io::Error::other(format!("no member {i}")))?;
        let old = std::fs::read_to_string(m.dir.join("etcd.pid")).unwrap_or_default();
        m.guard
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("guard pipe closed"))?
            .write_all(b"restart\n")?;
        let start = Instant::now();
        // The guard writes the new PID once the old process is reaped and the new one started.
        while std::fs::read_to_string(m.dir.join("etcd.pid")).unwrap_or_default() == old {
            if start.elapsed() > READY_TIMEOUT {
                return Err(std::io::Error::other("the guard did not restart etcd"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        m.wait_healthy()
    }

    /// The index of the member that is the leader now, asked of each live member in turn
    /// (`None` while no member knows a leader).
    pub fn leader(&self) -> Option<usize> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            for ep in self.endpoints() {
                let opts = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_millis(500))
                    .with_timeout(Duration::from_secs(1));
                let Ok(mut c) = etcd_client::Client::connect([ep.as_str()], Some(opts)).await
                else {
                    continue;
                };
                let Ok(st) = c.status().await else { continue };
                if st.leader() == 0 {
                    continue;
                }
                // The leader's index: whichever member reports its own id equal to the leader.
                let Ok(members) = c.member_list().await else {
                    continue;
                };
                let leader = members.members().iter().find(|m| m.id() == st.leader())?;
                let url = leader.client_urls().first()?.clone();
                return self.members.iter().position(|m| m.endpoint == url);
            }
            None
        })
    }

    /// Turns on etcd's user/password auth: `root` (password `root`, which etcd requires
    /// before enabling auth) and, for each `(user, password, prefix)`, a user whose role may
    /// read and write exactly the keys of the file system under `prefix`
    /// (docs/distributed.md §1: `prefix ‖ 0x00` up to `prefix ‖ 0x01`).
    pub fn enable_auth(&self, users: &[(&str, &str, &str)]) -> std::io::Result<()> {
        let err = |e: etcd_client::Error| std::io::Error::other(format!("etcd auth setup: {e}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let mut c = etcd_client::Client::connect([self.endpoint()], None)
                .await
                .map_err(err)?;
            c.user_add("root", "root", None).await.map_err(err)?;
            c.user_grant_role("root", "root").await.map_err(err)?;
            for (user, password, prefix) in users {
                let role = format!("fs-{user}");
                c.user_add(*user, *password, None).await.map_err(err)?;
                c.role_add(role.as_str()).await.map_err(err)?;
                let lo = [prefix.as_bytes(), b"\0"].concat();
                let hi = [prefix.as_bytes(), b"\x01"].concat();
                let perm = etcd_client::Permission::read_write(lo).with_range_end(hi);
                c.role_grant_permission(role.as_str(), perm)
                    .await
                    .map_err(err)?;
                c.user_grant_role(*user, role.as_str()).await.map_err(err)?;
            }
            c.auth_enable().await.map_err(err)?;
            Ok(())
        })
    }

    /// The client endpoint of the first member, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.members[0].endpoint
    }

    /// Every member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// The configuration of a file system under `prefix` on this server (every member).
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig::new(self.endpoints(), prefix.as_bytes())
    }

    /// The `etcd://` URL of a file system under `prefix` on this server (every member).
    pub fn url(&self, prefix: &str) -> String {
        let hosts: Vec<&str> = self
            .members
            .iter()
            .map(|m| m.endpoint.split_once("://").map_or("", |(_, h)| h))
            .collect();
        format!("{}{}/{prefix}", crate::config::SCHEME, hosts.join(","))
    }
}

impl Member {
    fn wait_healthy(&self) -> std::io::Result<()> {
        let start = Instant::now();
        while start.elapsed() < READY_TIMEOUT {
            // Plain http answers /health; https needs a TLS client, so its log is read.
            let ready = if self.endpoint.starts_with("https") {
                std::fs::read_to_string(self.dir.join("etcd.log"))
                    .is_ok_and(|l| l.contains("serving client requests on"))
            } else {
                health(self.client_port)
            };
            if ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
        Err(std::io::Error::other(format!(
            "etcd on {} not healthy after {READY_TIMEOUT:?}; log tail:\n{tail}",
            self.endpoint
        )))
    }

    /// Waits (up to 5 s) until every thread of the member's process is stopped (state `T` in
    /// /proc/PID/task/*/stat).
    fn wait_stopped(&self) -> std::io::Result<()> {
        let pid = std::fs::read_to_string(self.dir.join("etcd.pid"))?;
        let tasks = format!("/proc/{}/task", pid.trim());
        let start = Instant::now();
        loop {
            let all_stopped = std::fs::read_dir(&tasks)?.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                    // "pid (comm) S ...": the state follows the last ')'.
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.trim_start().chars().next())
                        .is_some_and(|c| c == 'T' || c == 't')
                })
            });
            if all_stopped {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(5) {
                return Err(std::io::Error::other(format!(
                    "etcd {} did not stop within 5 s of SIGSTOP",
                    pid.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn signal(&self, sig: &str) -> std::io::Result<()> {
        let pid = std::fs::read_to_string(self.dir.join("etcd.pid"))?;
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.trim())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{sig} {} failed",
                pid.trim()
            )))
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Closing the pipe tells the guard to stop etcd and remove the data directory.
        drop(self.guard.stdin.take());
        let _ = self.guard.wait();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// True when etcd's `/health` answers `"health":"true"`.
fn health(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// The test rule for etcd (docs/distributed.md §9): a server for this test binary, or `None`
/// when no `etcd` binary is installed — recorded as a skip of the calling test (fern-testkit:
/// `FERN_SKIP_LOG`, so `scripts/test` counts it apart from passes), or a failure under
/// `FERN_REQUIRE_ETCD=1`. An installed etcd that does not start fails the test.
pub fn shared_for_tests() -> Option<&'static LocalEtcd> {
    static SERVER: std::sync::OnceLock<Option<LocalEtcd>> = std::sync::OnceLock::new();
    let server = SERVER.get_or_init(|| {
        if !LocalEtcd::binary_available() {
            return None;
        }
        match LocalEtcd::start() {
            Ok(s) => Some(s),
            Err(e) => panic!("could not start a private etcd: {e}"),
        }
    });
    // Decided per call, not once: every test that gets no server is a skip of its own.
    if server.is_none()
        && fern_testkit::skipped(
            fern_testkit::Need::Etcd,
            Err("no etcd binary on PATH (apt-get install etcd-server)"),
        )
    {
        return None;
    }
    server.as_ref()
}

/// Ends lease `id` through a client of its own: what etcd does to a session cut off for
/// longer than its time to live (tests of fencing: `tests/delegation.rs`, `tests/writeback.rs`).
pub fn revoke_lease(cfg: &crate::EtcdConfig, id: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = etcd_client::Client::connect(&cfg.endpoints, None)
            .await
            .expect("client");
        c.lease_revoke(id as i64).await.expect("lease revoke");
    });
}

/// A fresh prefix for one store of a test (unique within the process and across processes).
pub fn unique_prefix(what: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{what}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// Makes, with openssl, the certificates of a TLS test in `dir`: a CA `ca` and a CA `rogue`
/// (`NAME.pem`, `NAME.key`), a server certificate `server` and a client certificate `client`
/// signed by `ca`, and a client certificate `intruder` signed by `rogue`; each certificate is
/// valid for 127.0.0.1 and localhost, as server and client, for two days.
pub fn make_test_certs(dir: &std::path::Path) -> std::io::Result<()> {
    let openssl = |args: &[&str]| -> std::io::Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    };
    for ca in ["ca", "rogue"] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
        ])?;
    }
    std::fs::write(
        dir.join("cert.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )?;
    for (ca, name) in [("ca", "server"), ("ca", "client"), ("rogue", "intruder")] {
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "cert.ext",
            "-out",
            &format!("{name}.pem"),
        ])?;
    }
    Ok(())
}
