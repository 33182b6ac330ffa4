//! fern-fs's `tests/concurrency.rs`, unchanged, on the etcd backend.

mod fs_common;
use fs_common::open_store;

#[path = "../../fern-fs/tests/concurrency.rs"]
mod concurrency;
