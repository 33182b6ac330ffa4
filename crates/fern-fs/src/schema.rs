//! The key layout of every tree and the superblock. It owns the mapping from file-system
//! objects to keys (all integers big-endian so byte order is sort order); it must never read
//! or write the store itself. docs/fs-design.md is the byte-level specification.

use fern_kv::{KvResult, KvStore, TreeId};

use crate::codec::{Reader, Writer};
use crate::error::{FsError, FsResult};
use crate::ids::InodeId;

/// Handles of the trees fern-fs uses, resolved once at mount.
#[derive(Clone, Copy, Debug)]
pub struct Trees {
    /// Superblock and the id allocator.
    pub meta: TreeId,
    /// (parent id, name) -> entry.
    pub dentry: TreeId,
    /// id -> inode record (hard-linked files, orphans, the root).
    pub inode: TreeId,
    /// (file id, block number) -> block bytes.
    pub data: TreeId,
    /// (id, name) -> value.
    pub xattr: TreeId,
    /// directory id -> parent directory id (rename cycle checks and "..").
    pub dirparent: TreeId,
    /// id -> empty: files unlinked while open, data still to free.
    pub orphan: TreeId,
    /// (file id, slot) -> `X` | extent reference: the data extents of 1 MiB slots
    /// (fs-design.md §9). `None` on a store without extents (etcd) or a read-only image made
    /// before them: every byte is then in block rows.
    pub extent: Option<TreeId>,
}

impl Trees {
    /// Resolves (creating where needed) every tree.
    pub fn open(kv: &dyn KvStore) -> KvResult<Trees> {
        Ok(Trees {
            meta: kv.tree("fs.meta")?,
            dentry: kv.tree("fs.dentry")?,
            inode: kv.tree("fs.inode")?,
            data: kv.tree("fs.data")?,
            xattr: kv.tree("fs.xattr")?,
            dirparent: kv.tree("fs.dirparent")?,
            orphan: kv.tree("fs.orphan")?,
            // A read-only store cannot create the tree in an image made before extents; such
            // an image has none, so block rows are all there is.
            extent: match kv.limits().extents {
                Some(max) if max as u64 >= SLOT_BYTES => kv.tree(EXTENT_TREE).ok(),
                _ => None,
            },
        })
    }
}

/// The tree of open-file registrations, used only on a shared store (docs/distributed.md §7):
/// (file id, session id) → empty, each key held by the registering mount's session. Resolved
/// only by a mount of a shared store, so local images never gain it.
pub const OPEN_TREE: &str = "fs.open";

/// The trees of the write-back delegation of a shared store (docs/design.md §7.2–7.3):
/// delegation keys and revocation requests, every key held by its session. Resolved only by
/// a mount of a shared store.
pub const DELEG_TREE: &str = "fs.deleg";
/// See [`DELEG_TREE`].
pub const REVOKE_TREE: &str = "fs.revoke";
/// The one delegated part today: the whole file system (design.md §7.3).
pub const WRITE_BACK_PART: &[u8] = b"/";

/// The registration of file `id` by the mount `mount` of session `session`: 24 bytes, the id
/// first so that one file's registrations are the range [`id_prefix_range`] of `id`. The mount
/// number tells apart two `Fs` of one store (one session) in one process: each removes only
/// its own key at its last close, so one's close never unregisters the other's open.
pub fn open_key(id: InodeId, session: u64, mount: u64) -> Vec<u8> {
    let mut w = Writer::with_capacity(24);
    w.u64(id.0).u64(session).u64(mount);
    w.finish()
}

/// Key of the superblock in `meta`.
pub const SUPER_KEY: &[u8] = b"superblock";
/// Key of the id allocator's high-water mark in `meta`.
pub const ALLOC_KEY: &[u8] = b"next_id";

/// `id` as an 8-byte big-endian key (inode, dirparent, orphan trees).
pub fn id_key(id: InodeId) -> Vec<u8> {
    id.0.to_be_bytes().to_vec()
}

/// Decodes an 8-byte id key.
pub fn parse_id_key(key: &[u8]) -> FsResult<InodeId> {
    let mut r = Reader::new(key, "id key");
    let id = r.u64()?;
    r.end()?;
    Ok(InodeId(id))
}

/// (id, name): the key of a directory entry or an xattr.
pub fn named_key(id: InodeId, name: &[u8]) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + name.len());
    w.u64(id.0).bytes(name);
    w.finish()
}

/// The name part of a (id, name) key.
pub fn name_of(key: &[u8]) -> FsResult<&[u8]> {
    key.get(8..)
        .ok_or_else(|| FsError::corrupt("named key shorter than its id"))
}

/// The range of all (id, *) keys: `[id, id + 1)` as 8-byte prefixes.
pub fn id_prefix_range(id: InodeId) -> (Vec<u8>, Vec<u8>) {
    (
        id.0.to_be_bytes().to_vec(),
        id.0.wrapping_add(1).to_be_bytes().to_vec(),
    )
}

/// (file id, block number): the key of a data block.
pub fn block_key(id: InodeId, block: u64) -> Vec<u8> {
    let mut w = Writer::with_capacity(16);
    w.u64(id.0).u64(block);
    w.finish()
}

/// The block number of a data key belonging to `id`.
pub fn parse_block_key(id: InodeId, key: &[u8]) -> FsResult<u64> {
    let mut r = Reader::new(key, "data key");
    if r.u64()? != id.0 {
        return Err(FsError::corrupt(
            "data key of another file inside a file's range",
        ));
    }
    let block = r.u64()?;
    r.end()?;
    Ok(block)
}

/// All data keys of `id` from block `first` on: `[(id, first), (id + 1, 0))`.
pub fn blocks_from(id: InodeId, first: u64) -> (Vec<u8>, Vec<u8>) {
    (block_key(id, first), id_prefix_range(id).1)
}

/// The tree of data extents.
pub const EXTENT_TREE: &str = "fs.extent";

/// Bytes of a data-extent slot: slot `s` of a file holds bytes `[s * SLOT_BYTES, (s + 1) *
/// SLOT_BYTES)`, whole blocks for every valid block size.
pub const SLOT_BYTES: u64 = 1 << 20;

/// Tag byte before the reference in an `fs.extent` row.
pub const EXTENT_TAG: u8 = b'X';

/// (file id, slot): the key of a data extent row (same shape as a block key).
pub fn extent_key(id: InodeId, slot: u64) -> Vec<u8> {
    block_key(id, slot)
}

/// The reference of an `fs.extent` row value (`X` | 16-byte reference).
pub fn parse_extent_row(v: &[u8]) -> FsResult<fern_kv::ExtentRef> {
    match v.split_first() {
        Some((&EXTENT_TAG, r)) if r.len() == fern_kv::EXTENT_REF_LEN => {
            fern_kv::ExtentRef::from_value_tail(r)
                .ok_or_else(|| FsError::corrupt("extent row: short reference"))
        }
        _ => Err(FsError::corrupt(format!(
            "extent row of {} bytes without its tag",
            v.len()
        ))),
    }
}

/// Format version written by this code. Version 2 added overlay rows in `fs.data`
/// (overlay.rs); a version-1 image has none and is read as it is, and a read-write mount
/// upgrades it to 2 before its first write, so a binary that knows only version 1 refuses an
/// image that may hold overlays instead of reporting them as corrupt blocks.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this code mounts.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"FERNFS\0\x01";

/// The file system's fixed parameters, written once by mkfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version.
    pub version: u32,
    /// Logical data block size: a power of two from 512 to 65536.
    pub block_size: u32,
}

impl Superblock {
    /// Encodes: magic (8) | version u32 | block_size u32.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(16);
        w.bytes(MAGIC).u32(self.version).u32(self.block_size);
        w.finish()
    }

    /// Decodes and validates.
    pub fn decode(v: &[u8]) -> FsResult<Superblock> {
        let mut r = Reader::new(v, "superblock");
        if r.bytes(8)? != MAGIC {
            return Err(FsError::NotFormatted("bad superblock magic".into()));
        }
        let sb = Superblock {
            version: r.u32()?,
            block_size: r.u32()?,
        };
        r.end()?;
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&sb.version) {
            return Err(FsError::NotFormatted(format!(
                "format version {}",
                sb.version
            )));
        }
        if !valid_block_size(sb.block_size) {
            return Err(FsError::corrupt(format!(
                "superblock: block size {}",
                sb.block_size
            )));
        }
        Ok(sb)
    }
}

/// Block sizes mkfs accepts.
pub fn valid_block_size(bs: u32) -> bool {
    bs.is_power_of_two() && (512..=65536).contains(&bs)
}
