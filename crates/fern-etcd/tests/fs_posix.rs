//! fern-fs's `tests/posix.rs`, unchanged, on the etcd backend.

mod fs_common;
use fs_common::open_store;

#[path = "../../fern-fs/tests/posix.rs"]
mod posix;
