//! fern-fs's `tests/posix/`, unchanged, on etcd through the write-back wrapper holding the
//! delegation (docs/design.md §7.3): every operation answered by the overlay and buffered.

mod fs_common;
use fs_common::open_held_store as open_store;

#[path = "../../fern-fs/tests/posix/main.rs"]
mod posix;
