//! The store factory the fern-fs test files call through their `crate::open_store` hook when
//! they are included into this crate's test targets: a fresh prefix on this test binary's
//! private etcd, with the caller's limits on top of etcd's.

use std::sync::Arc;

use fern_etcd::local::{shared_for_tests, unique_prefix, LocalEtcd};
use fern_etcd::EtcdStore;
use fern_kv::{
    Direction, ExtentRef, KeyRange, KvRead, KvResult, KvSession, KvStore, KvTxn, Limits,
    TakePolicy, TreeId, UpdateRegistry, WriteBack, WriteBackConfig, WriteBatch, WriteOptions,
};

#[allow(dead_code)]
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

/// [`open_store`] through the write-back wrapper holding the delegation from the start
/// (docs/design.md §7.3): every fern-fs test then runs on the overlay and its flushes.
#[allow(dead_code)]
pub fn open_held_store(registry: UpdateRegistry, limits: Limits) -> Box<dyn KvStore> {
    assert!(
        LocalEtcd::binary_available(),
        "the fern-fs tests on etcd need an etcd binary (apt-get install etcd-server)"
    );
    let etcd = shared_for_tests().expect("an installed etcd gives a server");
    let inner = EtcdStore::connect(&etcd.config(&unique_prefix("fs-wb")), registry.clone())
        .expect("connect to the private etcd")
        .with_limits(limits);
    let wb = WriteBack::open(Arc::new(inner), registry, held_config(TakePolicy::Always))
        .expect("write-back");
    assert!(
        wb.holds(),
        "a fresh prefix: the delegation is taken at open"
    );
    Box::new(Owned(wb))
}

/// fern-fs's delegation trees, with `policy`.
#[allow(dead_code)]
pub fn held_config(policy: TakePolicy) -> WriteBackConfig {
    WriteBackConfig {
        deleg_tree: fern_fs::DELEG_TREE.into(),
        revoke_tree: fern_fs::REVOKE_TREE.into(),
        part: fern_fs::WRITE_BACK_PART.to_vec(),
        policy,
        cool_down: fern_kv::COOL_DOWN,
    }
}

/// A write-back store owned by value (factories return stores by value or boxed).
#[allow(dead_code)]
pub struct Owned(pub Arc<WriteBack>);

impl KvRead for Owned {
    fn get(&self, tree: TreeId, key: &[u8]) -> KvResult<Option<Vec<u8>>> {
        self.0.get(tree, key)
    }
    fn scan(
        &self,
        tree: TreeId,
        range: &KeyRange,
        dir: Direction,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.scan(tree, range, dir, limit)
    }
    fn read_extent(&self, r: &ExtentRef, buf: &mut [u8]) -> KvResult<()> {
        self.0.read_extent(r, buf)
    }
}

impl KvStore for Owned {
    fn tree(&self, name: &str) -> KvResult<TreeId> {
        self.0.tree(name)
    }
    fn write(&self, batch: WriteBatch, opts: WriteOptions) -> KvResult<()> {
        self.0.write(batch, opts)
    }
    fn begin(&self) -> KvResult<Box<dyn KvTxn + '_>> {
        self.0.begin()
    }
    fn sync(&self) -> KvResult<()> {
        self.0.sync()
    }
    fn limits(&self) -> Limits {
        self.0.limits()
    }
    fn session(&self) -> KvResult<Option<&dyn KvSession>> {
        self.0.session()
    }
    fn assume_absent(&self, tree: TreeId, range: &KeyRange) {
        self.0.assume_absent(tree, range)
    }
}
