//! fern-fs's `tests/model.rs`, unchanged, on the etcd backend.

mod fs_common;
use fs_common::open_store;

#[path = "../../fern-fs/tests/model.rs"]
mod model;
