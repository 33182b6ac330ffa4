//! fern-fs's `tests/posix/`, unchanged, on the fern-tree backend.

mod fs_common;
use fs_common::open_store;

#[path = "../../fern-fs/tests/posix/main.rs"]
mod posix;
