//! The non-mount subcommands on `etcd://` URLs (docs/distributed.md §10): `mkfs`, `import`,
//! `export`, `stat` and `fsck` on private etcd servers, two file systems under different
//! prefixes of one cluster that never see each other, and the security settings as a user
//! gives them — `etcd://USER@…` with the password from the environment or a configuration
//! file, TLS files from the configuration file — with a clear refusal, at mkfs time, for a
//! wrong password, a password in the URL, a missing or foreign client certificate.

use std::path::Path;
use std::process::{Command, Output};

use fern_etcd::local::{make_test_certs, shared_for_tests, unique_prefix, LocalEtcd, ServerTls};

fn fernfs(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fernfs"))
        .args(args)
        .env_remove("FERN_ETCD_CONFIG")
        .env_remove("FERN_ETCD_PASSWORD")
        .env_remove("FERN_ETCD_PASSWORD_FILE")
        .envs(env.iter().copied())
        .output()
        .expect("run fernfs")
}

fn ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = fernfs(args, env);
    assert!(
        out.status.success(),
        "fernfs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command that must fail; returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = fernfs(args, env);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "fernfs {args:?} must fail; stderr: {err}"
    );
    eprintln!("fernfs {} refused as expected: {}", args[0], err.trim());
    err
}

fn write(p: &Path, s: &str) {
    std::fs::write(p, s).expect("write host file");
}

#[test]
fn two_prefixes_of_one_cluster_never_see_each_other_through_the_cli() {
    let Some(etcd) = shared_for_tests() else {
        return;
    };
    // The second prefix extends the first: the NUL after each prefix keeps them apart (§1).
    let p1 = unique_prefix("cli");
    let (one, two) = (etcd.url(&p1), etcd.url(&format!("{p1}x")));
    ok(&["mkfs", &one], &[]);
    ok(&["mkfs", &two], &[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    write(&src.join("a.txt"), "alpha\n");
    write(&src.join("d/b.txt"), &"beta\n".repeat(2000));
    ok(&["import", src.to_str().expect("utf8"), &one], &[]);
    ok(
        &[
            "import",
            src.join("d").to_str().expect("utf8"),
            &format!("{two}:/only"),
        ],
        &[],
    );

    let out1 = tmp.path().join("out1");
    ok(&["export", &one, out1.to_str().expect("utf8")], &[]);
    assert_eq!(
        std::fs::read_to_string(out1.join("a.txt")).expect("a"),
        "alpha\n"
    );
    assert_eq!(
        std::fs::read_to_string(out1.join("d/b.txt")).expect("b"),
        "beta\n".repeat(2000)
    );
    assert!(!out1.join("only").exists(), "{one} shows {two}'s directory");
    let out2 = tmp.path().join("out2");
    ok(
        &[
            "export",
            &format!("{two}:/only"),
            out2.to_str().expect("utf8"),
        ],
        &[],
    );
    assert!(out2.join("b.txt").exists());
    assert!(!out2.join("a.txt").exists(), "{two} shows {one}'s file");

    let stat1: serde_json::Value =
        serde_json::from_str(&ok(&["stat", &one, "--json"], &[])).expect("json");
    let stat2: serde_json::Value =
        serde_json::from_str(&ok(&["stat", &two, "--json"], &[])).expect("json");
    assert_eq!(stat1["files"], 2, "{stat1}");
    assert_eq!(stat1["directories"], 2, "{stat1}");
    assert_eq!(stat1["logical_bytes"], 6 + 10000, "{stat1}");
    assert_eq!(stat2["files"], 1, "{stat2}");
    assert!(ok(&["stat", &one], &[]).contains("regular files:      2"));
    ok(&["fsck", &one], &[]);
    ok(&["fsck", &two], &[]);
    // An unformatted prefix is named as such, not taken for an empty file system.
    let none = etcd.url(&unique_prefix("cli-none"));
    let err = refused(&["stat", &none], &[]);
    assert!(err.contains("cannot mount the file system"), "{err}");
}

#[test]
fn passwords_come_from_the_environment_or_a_file_never_the_url() {
    if shared_for_tests().is_none() {
        return;
    }
    let etcd = LocalEtcd::start().expect("start etcd");
    let prefix = unique_prefix("auth");
    etcd.enable_auth(&[("alice", "alicepw", &prefix)])
        .expect("enable auth");
    let url = etcd.url(&prefix).replace("etcd://", "etcd://alice@");
    let tmp = tempfile::tempdir().expect("tempdir");
    let pw = tmp.path().join("pw");
    write(&pw, "alicepw\n");
    let pw = pw.to_str().expect("utf8");

    let err = refused(&["mkfs", &url], &[("FERN_ETCD_PASSWORD", "wrong")]);
    assert!(
        err.contains("check the user in the URL and its password"),
        "{err}"
    );
    let err = refused(&["mkfs", &url], &[]);
    assert!(err.contains("has no password"), "{err}");
    let in_url = url.replace("alice@", "alice:alicepw@");
    let err = refused(&["mkfs", &in_url], &[]);
    assert!(err.contains("must not be given in the URL"), "{err}");
    assert!(!err.contains("alicepw"), "the password was echoed: {err}");
    let err = refused(&["mkfs", &etcd.url(&prefix)], &[]);
    assert!(err.contains("auth enabled"), "{err}");
    // alice may not touch another prefix.
    let other = etcd
        .url(&unique_prefix("auth"))
        .replace("etcd://", "etcd://alice@");
    let err = refused(&["mkfs", &other], &[("FERN_ETCD_PASSWORD_FILE", pw)]);
    assert!(
        err.contains("readwrite on the file system's prefix"),
        "{err}"
    );

    ok(&["mkfs", &url], &[("FERN_ETCD_PASSWORD_FILE", pw)]);
    let cfg = tmp.path().join("etcd.conf");
    write(&cfg, "user = alice\npassword_file = pw\n");
    let cfg = cfg.to_str().expect("utf8");
    ok(&["fsck", &etcd.url(&prefix)], &[("FERN_ETCD_CONFIG", cfg)]);
    ok(&["stat", &url], &[("FERN_ETCD_PASSWORD", "alicepw")]);
}

#[test]
fn tls_files_come_from_the_configuration_file() {
    if shared_for_tests().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    make_test_certs(d).expect("certificates");
    let etcd = LocalEtcd::start_tls(&ServerTls {
        cert: d.join("server.pem"),
        key: d.join("server.key"),
        client_ca: Some(d.join("ca.pem")),
    })
    .expect("start etcd with --client-cert-auth");
    let url = etcd.url(&unique_prefix("tls"));
    let conf = |name: &str, text: &str| {
        let p = d.join(name);
        write(&p, &format!("{text}timeout_ms = 3000\n"));
        p.to_str().expect("utf8").to_string()
    };
    let good = conf(
        "good.conf",
        "ca = ca.pem\ncert = client.pem\nkey = client.key\n",
    );
    let foreign = conf(
        "foreign.conf",
        "ca = ca.pem\ncert = intruder.pem\nkey = intruder.key\n",
    );
    let none = conf("none.conf", "ca = ca.pem\n");

    let err = refused(&["mkfs", &url], &[("FERN_ETCD_CONFIG", &foreign)]);
    assert!(err.contains("TLS failed"), "{err}");
    let err = refused(&["mkfs", &url], &[("FERN_ETCD_CONFIG", &none)]);
    assert!(err.contains("TLS failed"), "{err}");
    let err = refused(&["mkfs", &url], &[]);
    assert!(err.contains("serves https"), "{err}");
    ok(&["mkfs", &url], &[("FERN_ETCD_CONFIG", &good)]);
    ok(&["fsck", &url], &[("FERN_ETCD_CONFIG", &good)]);
}
