//! The memory oracle must pass the suite it is the oracle for.

use fern_kv::mem::MemStore;
use fern_kv::Limits;

#[test]
fn memory_backend_conforms() {
    fern_kv::conformance::run_all(MemStore::new);
}

#[test]
fn memory_backend_with_etcd_limits_conforms() {
    let etcd = Limits {
        max_ops: Some(128),
        max_bytes: Some(1536 * 1024),
        ..Limits::EMBEDDED
    };
    fern_kv::conformance::run_all(|r| MemStore::with_limits(r, etcd));
}

#[test]
fn memory_backend_without_extents_conforms() {
    let none = Limits {
        extents: None,
        ..Limits::EMBEDDED
    };
    fern_kv::conformance::run_all(|r| MemStore::with_limits(r, none));
}
