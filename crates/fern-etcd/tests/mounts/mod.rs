//! Set-up shared by the tests of two mounts of one file system on the private etcd.

use std::sync::Arc;

use fern_etcd::local::{shared_for_tests, unique_prefix};
use fern_etcd::{EtcdConfig, EtcdStore};
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, Fs, MkfsOptions};

/// A first mount (A) of a new file system under a prefix of its own that made `/d` with `n`
/// files holding `data`, and the configuration to mount it again; `None` without etcd.
pub fn first_mount(what: &str, n: usize, data: &[u8]) -> Option<(PathFs, EtcdConfig)> {
    let etcd = shared_for_tests()?;
    let cfg = etcd.config(&unique_prefix(what));
    let a_store = Arc::new(EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"));
    Fs::mkfs(&*a_store, MkfsOptions::default()).expect("mkfs");
    let a = PathFs::new(Arc::new(Fs::mount(a_store).expect("mount A")), Cred::root());
    a.mkdir(b"/d", 0o755).expect("mkdir");
    for i in 0..n {
        let f = a
            .open(
                format!("/d/f{i}").as_bytes(),
                OpenOptions::create_write(0o644),
            )
            .expect("create");
        if !data.is_empty() {
            a.write_at(&f, 0, data).expect("write");
        }
        a.close(f).expect("close");
    }
    Some((a, cfg))
}

/// A second mount (B) of the file system of `cfg`, and its store (for round trip counts).
pub fn mount(cfg: &EtcdConfig) -> (Arc<Fs>, Arc<EtcdStore>) {
    let store = Arc::new(EtcdStore::connect(cfg, fern_fs::registry()).expect("connect"));
    (Arc::new(Fs::mount(store.clone()).expect("mount B")), store)
}
