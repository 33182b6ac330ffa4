//! fern-kv's conformance suite on fern-tree: with the default node shape (every tree fits in
//! one leaf), with tiny nodes (scans, paging and range deletes cross many leaves and buffered
//! messages), on a file image, and with etcd's limits imposed.

use std::sync::Arc;

use fern_kv::Limits;
use fern_kv_tree::TreeStore;
use fern_tree::device::MemDevice;
use fern_tree::Options;

fn tiny() -> Options {
    Options {
        cache_bytes: 1 << 20,
        node_bytes: 4096,
        basement_bytes: 512,
        fanout: 4,
        ..Options::default()
    }
}

#[test]
fn conforms_default_shape() {
    fern_kv::conformance::run_all(|r| {
        TreeStore::create_on(Arc::new(MemDevice::new()), 16 << 20, r).expect("create")
    });
}

#[test]
fn conforms_tiny_nodes() {
    fern_kv::conformance::run_all(|r| {
        TreeStore::create_on_with(Arc::new(MemDevice::new()), tiny(), r).expect("create")
    });
}

#[test]
fn conforms_on_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = std::sync::atomic::AtomicUsize::new(0);
    fern_kv::conformance::run_all(|r| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        TreeStore::create(dir.path().join(format!("img{i}")), 8 << 20, r).expect("create")
    });
}

#[test]
fn conforms_with_etcd_limits() {
    let etcd = Limits {
        max_ops: Some(128),
        max_bytes: Some(1536 * 1024),
        ..Limits::EMBEDDED
    };
    fern_kv::conformance::run_all(|r| {
        TreeStore::create_on_with(Arc::new(MemDevice::new()), tiny(), r)
            .expect("create")
            .with_limits(etcd)
    });
}
