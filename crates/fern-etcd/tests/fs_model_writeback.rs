//! fern-fs's model test, unchanged, on etcd through the write-back wrapper holding the
//! delegation (docs/design.md §7.3).

mod fs_common;
use fs_common::open_held_store as open_store;

#[path = "../../fern-fs/tests/model.rs"]
mod model;
