//! How a file system on fern-tree spends one memory budget (docs/design.md §2.5, "One memory
//! budget"): the one rule the mount and the benchmarks both size by.

/// Most of a budget set aside for what neither the engine nor fern-fs counts
/// ([`FsMemory::within`]). Measured: a daemon whose cache and fern-fs bounds took all of a 64
/// MiB cgroup was OOM-killed at 52 MiB of anonymous memory and 6.5 MiB of its binary's pages
/// (300,000 files, then chmod and utime of each); with 16 MiB set aside it was not.
pub const OUTSIDE_MAX: u64 = 16 << 20;

/// A file system's memory inside a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsMemory {
    /// The engine's node cache (`fern_tree::cache_within_memory` of what fern-fs leaves).
    pub node_cache: u64,
    /// fern-fs's name sets (`Fs::set_name_cache_bytes`).
    pub name_sets: u64,
    /// fern-fs's inode table (`Fs::set_inode_table_bytes`).
    pub inode_table: u64,
}

impl FsMemory {
    /// The plan for `budget` bytes. First what neither the engine nor fern-fs counts: a
    /// quarter of the budget, at most [`OUTSIDE_MAX`] — the FUSE transport's request buffers
    /// (a 1 MiB buffer per ring entry, eight on two CPUs, resident once a large write has
    /// touched them), the program's text and thread stacks. Of the rest, a quarter to
    /// fern-fs's own memory, which grows with the files — a quarter of that to the name sets
    /// and the rest to the inode table (~300 bytes per inode the kernel holds, where a
    /// missing one costs a LOOKUP) — and the node cache sized inside what remains.
    pub fn within(budget: u64) -> FsMemory {
        let rest = budget - (budget / 4).min(OUTSIDE_MAX);
        let fs = rest / 4;
        FsMemory {
            node_cache: fern_tree::cache_within_memory(rest - fs),
            name_sets: fs / 4,
            inode_table: fs - fs / 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_stay_inside_the_budget() {
        for mib in [16u64, 32, 48, 64, 256, 4096] {
            let b = mib << 20;
            let m = FsMemory::within(b);
            assert!(
                m.node_cache + m.name_sets + m.inode_table < b,
                "{mib} MiB: {m:?}"
            );
            assert!(m.inode_table > m.name_sets, "{m:?}");
        }
    }
}
