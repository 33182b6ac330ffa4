//! The store factory the fern-fs test files call through their `crate::open_store` hook when
//! they are included into this crate's test targets: a fern-tree environment on a memory
//! device, with small nodes so that file-system trees span many leaves and buffers.
//!
//! Basements are 16 KiB, over twice the largest file-system value (a 4 KiB block plus its
//! header): smaller ones hit a fern-tree basement-split bug with rows over half a basement
//! (see `engine_splits_a_basement_ending_in_a_big_row` in persistence.rs).

use std::sync::Arc;

use fern_kv::{KvStore, Limits, UpdateRegistry};
use fern_kv_tree::TreeStore;
use fern_tree::device::MemDevice;
use fern_tree::Options;

pub fn open_store(registry: UpdateRegistry, limits: Limits) -> Box<dyn KvStore> {
    let opts = Options {
        cache_bytes: 4 << 20,
        node_bytes: 64 << 10,
        basement_bytes: 16 << 10,
        fanout: 6,
        ..Options::default()
    };
    Box::new(
        TreeStore::create_on_with(Arc::new(MemDevice::new()), opts, registry)
            .expect("create fern-tree store")
            .with_limits(limits),
    )
}
