//! fern-fs's `tests/stat_mirror.rs`, unchanged, on the fern-tree backend.

mod fs_common;
use fs_common::open_store;

#[path = "../../fern-fs/tests/stat_mirror.rs"]
mod stat_mirror;
