//! Only the right clients get in (docs/distributed.md §10): TLS with client certificates
//! against a private etcd started with `--client-cert-auth` (certificates made here with
//! openssl), and etcd's user/password auth with a role limited to one file system's prefix.
//! Every refusal must come at connect time, quickly, with a message that says what to check.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fern_etcd::local::{make_test_certs, shared_for_tests, unique_prefix, LocalEtcd, ServerTls};
use fern_etcd::{EtcdConfig, EtcdStore, Password, TlsFiles};
use fern_kv::conformance::registry;
use fern_kv::{KvError, KvRead, KvStore, WriteBatch, WriteOptions};

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
    make_test_certs(&d.0).expect("certificates");
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
    etcd.enable_auth(&[("alice", "alicepw", &mine)])
        .expect("enable auth");
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

/// etcd's simple auth tokens lapse after `--auth-token-ttl` seconds without use (an idle
/// mount); the store then connects again with the same credentials and the refused request
/// is sent again, so the caller never sees `invalid auth token` (docs/distributed.md §5).
#[test]
fn an_expired_auth_token_is_renewed_by_connecting_again() {
    if shared_for_tests().is_none() {
        return;
    }
    let etcd = LocalEtcd::start_with_flags(&["--auth-token-ttl", "1"]).expect("start etcd");
    let mine = unique_prefix("ttl");
    etcd.enable_auth(&[("carol", "carolpw", &mine)])
        .expect("enable auth");
    let mut cfg = etcd.config(&mine);
    cfg.timeout = Duration::from_secs(3);
    cfg.user = Some(("carol".into(), Password("carolpw".into())));
    let s = EtcdStore::connect(&cfg, registry()).expect("carol gets in");
    put_get(&s);
    // Idle past the token's TTL (etcd checks expiry about once a second).
    std::thread::sleep(Duration::from_secs(4));
    put_get(&s);
}
