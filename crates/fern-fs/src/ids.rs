//! Identifier newtypes. It owns the meaning of the reserved ids; it must never allocate
//! (that is `alloc`'s job).

/// A stable inode id. Never reused while the store lives, never changed by rename; it is the
/// inode number the FUSE adapter reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId(pub u64);

impl InodeId {
    /// The root directory (FUSE's `FUSE_ROOT_ID`).
    pub const ROOT: InodeId = InodeId(1);
    /// The first id the allocator hands out.
    pub const FIRST_FREE: u64 = 2;
}

/// An open file or directory handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fh(pub u64);
