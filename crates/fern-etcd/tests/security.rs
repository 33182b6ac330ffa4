//! Only the right clients get in (docs/distributed.md §10): TLS with client certificates
//! against a private etcd started with `--client-cert-auth` (certificates made here with
//! openssl), and etcd's user/password auth with a role limited to one file system's prefix.
//! Every refusal must come at connect time, quickly, with a message that says what to check.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fern_etcd::local::{shared_for_tests, unique_prefix, LocalEtcd, ServerTls};
use fern_etcd::{EtcdConfig, EtcdStore, Password, TlsFiles};
use fern_kv::conformance::registry;
use fern_kv::{KvError, KvRead, KvStore, WriteBatch, WriteOptions};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `name` (name.pem, name.key) in `dir`.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

/// A certificate `name` (name.pem, name.key) signed by CA `ca`, for 127.0.0.1.
fn make_cert(dir: &Path, ca: &str, name: &str) {
    openssl(
        dir,
        &[
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
        ],
    );
    std::fs::write(
        dir.join(format!("{name}.ext")),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
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
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(what: &str) -> Scratch {
    let d = std::env::temp_dir().join(unique_prefix(what));
    std::fs::create_dir_all(&d).expect("scratch dir");
    Scratch(d)
}

/// Connects with `cfg`, expecting a refusal within a few seconds whose message holds `want`.
fn refused(cfg: &EtcdConfig, want: &str) {
    let start = Instant::now();
    let e = EtcdStore::connect(cfg, registry()).expect_err("this client must be refused");
    let msg = e.to_string();
    assert!(matches!(e, KvError::Unavailable(_)), "{e:?}");
    eprintln!("refused as expected: {msg}");
    assert!(msg.contains(want), "expected {want:?} in: {msg}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the refusal took {:?}: {msg}",
        start.elapsed()
    );
}

fn put_get(s: &EtcdStore) {
    let t = s.tree("t").expect("tree");
    let mut b = WriteBatch::new();
    b.put(t, b"k".to_vec(), b"v".to_vec());
    s.write(b, WriteOptions::SYNC).expect("write");
    assert_eq!(s.get(t, b"k").expect("read").as_deref(), Some(&b"v"[..]));
}

#[test]
fn client_certificates_are_demanded_and_checked() {
    if shared_for_tests().is_none() {
        return;
    }
    let d = scratch("tls");
    let p = |f: &str| d.0.join(f);
    make_ca(&d.0, "ca");
    make_ca(&d.0, "rogue");
    make_cert(&d.0, "ca", "server");
    make_cert(&d.0, "ca", "client");
    make_cert(&d.0, "rogue", "intruder");
    let etcd = LocalEtcd::start_tls(&ServerTls {
        cert: p("server.pem"),
        key: p("server.key"),
        client_ca: Some(p("ca.pem")),
    })
    .expect("start etcd with --client-cert-auth");
    let with = |client: Option<(&str, &str)>, ca: &str| {
        let mut cfg = etcd.config(&unique_prefix("tls"));
        cfg.timeout = Duration::from_secs(3);
        cfg.tls = Some(TlsFiles {
            ca: p(ca),
            client: client.map(|(c, k)| (p(c), p(k))),
        });
        cfg
    };
    // The right certificate gets in and works.
    let s = EtcdStore::connect(
        &with(Some(("client.pem", "client.key")), "ca.pem"),
        registry(),
    )
    .expect("a client with a certificate of the trusted CA gets in");
    put_get(&s);
    // No client certificate, one from another CA, a server the client does not trust, and
    // plain http to a TLS server: each refused at connect time.
    refused(&with(None, "ca.pem"), "etcd at");
    refused(
        &with(Some(("intruder.pem", "intruder.key")), "ca.pem"),
        "etcd at",
    );
    refused(
        &with(Some(("client.pem", "client.key")), "rogue.pem"),
        "TLS failed",
    );
    let mut plain = with(None, "ca.pem");
    plain.tls = None;
    plain.endpoints = vec![etcd.endpoint().replace("https://", "http://")];
    refused(&plain, "serves https");
    // A missing file is named.
    refused(
        &with(Some(("nope.pem", "client.key")), "ca.pem"),
        "nope.pem",
    );
}

#[test]
fn user_and_password_auth_confines_a_user_to_its_prefix() {
    if shared_for_tests().is_none() {
        return;
    }
    let etcd = LocalEtcd::start().expect("start etcd");
    let (mine, theirs) = (unique_prefix("alice"), unique_prefix("bob"));
    // Root first (etcd refuses to enable auth without it), then alice with readwrite on her
    // file system's keys only: the prefix ‖ NUL … prefix ‖ 0x01 (docs/distributed.md §1).
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .expect("admin client");
        c.user_add("root", "rootpw", None).await.expect("root");
        c.user_grant_role("root", "root").await.expect("root role");
        c.user_add("alice", "alicepw", None).await.expect("alice");
        c.role_add("fs").await.expect("role");
        let lo = [mine.as_bytes(), b"\0"].concat();
        let hi = [mine.as_bytes(), b"\x01"].concat();
        c.role_grant_permission(
            "fs",
            etcd_client::Permission::read_write(lo).with_range_end(hi),
        )
        .await
        .expect("grant");
        c.user_grant_role("alice", "fs").await.expect("alice role");
        c.auth_enable().await.expect("auth enable");
    });
    let as_user = |prefix: &str, user: Option<(&str, &str)>| {
        let mut cfg = etcd.config(prefix);
        cfg.timeout = Duration::from_secs(3);
        cfg.user = user.map(|(u, p)| (u.to_string(), Password(p.to_string())));
        cfg
    };
    let s = EtcdStore::connect(&as_user(&mine, Some(("alice", "alicepw"))), registry())
        .expect("alice with her password gets in");
    put_get(&s);
    refused(
        &as_user(&mine, Some(("alice", "wrong"))),
        "check the user in the URL and its password",
    );
    refused(&as_user(&mine, Some(("mallory", "x"))), "refused access");
    refused(&as_user(&mine, None), "refused access");
    // Alice on another file system's prefix: refused at the connection probe.
    refused(
        &as_user(&theirs, Some(("alice", "alicepw"))),
        "readwrite on the file system's prefix",
    );
}
