//! fern-fs's `tests/extents.rs`, unchanged, on the fern-tree backend (the engine's extents,
//! not the memory oracle's emulation: its refusals, e.g. a batch that only frees, apply).

mod fs_common;
use fs_common::open_store;

#[path = "../../fern-fs/tests/extents.rs"]
mod extents;
