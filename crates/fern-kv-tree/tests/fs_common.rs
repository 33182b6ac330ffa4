//! The store factory the fern-fs test files call through their `crate::open_store` hook when
//! they are included into this crate's test targets: a fern-tree environment on a memory
//! device, with small nodes so that file-system trees span many leaves and buffers.

use std::sync::Arc;

use fern_kv::{KvStore, Limits, UpdateRegistry};
use fern_kv_tree::TreeStore;
use fern_tree::device::MemDevice;
use fern_tree::Options;

pub fn open_store(registry: UpdateRegistry, limits: Limits) -> Box<dyn KvStore> {
    let opts = Options {
        cache_bytes: 2 << 20,
        node_bytes: 8192,
        basement_bytes: 1024,
        fanout: 6,
        ..Options::default()
    };
    Box::new(
        TreeStore::create_on_with(Arc::new(MemDevice::new()), opts, registry)
            .expect("create fern-tree store")
            .with_limits(limits),
    )
}
