//! The store factory the fern-fs test files call through their `crate::open_store` hook when
//! they are included into this crate's test targets: a fresh prefix on this test binary's
//! private etcd, with the caller's limits on top of etcd's.

use fern_etcd::local::{shared_for_tests, unique_prefix, LocalEtcd};
use fern_etcd::EtcdStore;
use fern_kv::{KvStore, Limits, UpdateRegistry};

pub fn open_store(registry: UpdateRegistry, limits: Limits) -> Box<dyn KvStore> {
    // These tests cannot skip one by one: without etcd they fail, saying why (checked before
    // shared_for_tests, which would also record a skip for a test that then fails).
    assert!(
        LocalEtcd::binary_available(),
        "the fern-fs tests on etcd need an etcd binary (apt-get install etcd-server)"
    );
    let etcd = shared_for_tests().expect("an installed etcd gives a server");
    Box::new(
        EtcdStore::connect(&etcd.config(&unique_prefix("fs")), registry)
            .expect("connect to the private etcd")
            .with_limits(limits),
    )
}
