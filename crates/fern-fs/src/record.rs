//! Values of the `dentry` and `inode` trees. It owns their byte layout (a leading tag byte makes
//! every value self-describing, which the stat upsert and fsck rely on); it must never touch
//! the store.
//!
//! * Inline entry (tag 1): the entry carries the inode: `1 | id u64 | stat | payload`.
//!   Every file with one link, every directory, every symlink. `ls -l` is one range scan.
//! * Linked entry (tag 2): `2 | id u64 | mode u32`; the inode lives in the `inode` tree. Used
//!   once a file has had a second hard link (it stays there when links drop back to one).
//! * Inode record (tag 3): `3 | stat | payload`, keyed by id in the `inode` tree. Also the root
//!   (which has no entry) and orphans (unlinked while open).
//!
//! `payload` is `len u32 | bytes`: the target of a symlink, empty otherwise.

use crate::attr::{FileType, Stat, STAT_LEN};
use crate::codec::{Reader, Writer};
use crate::error::{FsError, FsResult};
use crate::ids::InodeId;

/// Tag of an inline entry.
pub const TAG_INLINE: u8 = 1;
/// Tag of a linked entry.
pub const TAG_LINKED: u8 = 2;
/// Tag of an inode record.
pub const TAG_INODE: u8 = 3;

/// An inode's stat plus its small payload (symlink target).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// Attributes.
    pub stat: Stat,
    /// Symlink target; empty for other types.
    pub payload: Vec<u8>,
}

/// A decoded directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dentry {
    /// The entry holds the inode.
    Inline {
        /// Id of the child.
        id: InodeId,
        /// The child itself.
        inode: Inode,
    },
    /// The inode is in the `inode` tree.
    Linked {
        /// Id of the child.
        id: InodeId,
        /// The child's mode (for its type, so readdir needs no second read).
        mode: u32,
    },
}

impl Dentry {
    /// The child's id.
    pub fn id(&self) -> InodeId {
        match self {
            Dentry::Inline { id, .. } | Dentry::Linked { id, .. } => *id,
        }
    }

    /// The child's type.
    pub fn kind(&self) -> FsResult<FileType> {
        let mode = match self {
            Dentry::Inline { inode, .. } => inode.stat.mode,
            Dentry::Linked { mode, .. } => *mode,
        };
        kind_of(mode)
    }

    /// Encodes the entry.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Dentry::Inline { id, inode } => {
                let mut w = Writer::with_capacity(1 + 8 + STAT_LEN + 4 + inode.payload.len());
                w.u8(TAG_INLINE).u64(id.0);
                inode.stat.write(&mut w);
                w.len_bytes(&inode.payload);
                w.finish()
            }
            Dentry::Linked { id, mode } => {
                let mut w = Writer::with_capacity(13);
                w.u8(TAG_LINKED).u64(id.0).u32(*mode);
                w.finish()
            }
        }
    }

    /// The child's id and type from an encoded entry, without decoding the rest: what a
    /// plain listing returns. Both encodings start with the tag, the id and the mode (the
    /// first field of an inline stat); the rest is checked when the entry is decoded.
    pub fn head(v: &[u8]) -> FsResult<(InodeId, FileType)> {
        let mut r = Reader::new(v, "dentry");
        match r.u8()? {
            TAG_INLINE | TAG_LINKED => {}
            t => return Err(FsError::corrupt(format!("dentry: unknown tag {t}"))),
        }
        let id = InodeId(r.u64()?);
        Ok((id, kind_of(r.u32()?)?))
    }

    /// Decodes an entry value.
    pub fn decode(v: &[u8]) -> FsResult<Dentry> {
        let mut r = Reader::new(v, "dentry");
        let d = match r.u8()? {
            TAG_INLINE => {
                let id = InodeId(r.u64()?);
                let stat = Stat::read(&mut r)?;
                let payload = r.len_bytes()?.to_vec();
                Dentry::Inline {
                    id,
                    inode: Inode { stat, payload },
                }
            }
            TAG_LINKED => Dentry::Linked {
                id: InodeId(r.u64()?),
                mode: r.u32()?,
            },
            t => return Err(FsError::corrupt(format!("dentry: unknown tag {t}"))),
        };
        r.end()?;
        Ok(d)
    }
}

/// The type an entry's mode names.
fn kind_of(mode: u32) -> FsResult<FileType> {
    FileType::from_mode(mode).ok_or_else(|| FsError::corrupt("dentry: bad file type"))
}

impl Inode {
    /// Encodes as an `inode`-tree record.
    pub fn encode_record(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(1 + STAT_LEN + 4 + self.payload.len());
        w.u8(TAG_INODE);
        self.stat.write(&mut w);
        w.len_bytes(&self.payload);
        w.finish()
    }

    /// Decodes an `inode`-tree record.
    pub fn decode_record(v: &[u8]) -> FsResult<Inode> {
        let mut r = Reader::new(v, "inode record");
        if r.u8()? != TAG_INODE {
            return Err(FsError::corrupt("inode record: wrong tag"));
        }
        let stat = Stat::read(&mut r)?;
        let payload = r.len_bytes()?.to_vec();
        r.end()?;
        Ok(Inode { stat, payload })
    }
}

/// Offset of the stat inside a value with `tag`, for the stat upsert: it rewrites the stat in
/// place without knowing anything else about the value.
pub fn stat_offset(tag: u8) -> Option<usize> {
    match tag {
        TAG_INLINE => Some(1 + 8),
        TAG_INODE => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Timespec;

    #[test]
    fn an_entrys_head_is_what_decoding_it_gives() {
        let now = Timespec { sec: 7, nsec: 9 };
        let inline = Dentry::Inline {
            id: InodeId(42),
            inode: Inode {
                stat: Stat::new(libc::S_IFLNK | 0o777, 1, 2, 1, now),
                payload: b"target".to_vec(),
            },
        };
        let linked = Dentry::Linked {
            id: InodeId(43),
            mode: libc::S_IFREG | 0o644,
        };
        for d in [inline, linked] {
            let v = d.encode();
            assert_eq!(
                Dentry::head(&v).expect("head"),
                (d.id(), d.kind().expect("kind"))
            );
        }
    }

    #[test]
    fn a_damaged_entry_head_is_an_error() {
        let good = Dentry::Linked {
            id: InodeId(5),
            mode: libc::S_IFDIR | 0o755,
        }
        .encode();
        let mut bad_tag = good.clone();
        bad_tag[0] = 9;
        let mut bad_mode = good.clone();
        bad_mode[9..13].copy_from_slice(&0u32.to_le_bytes());
        for v in [&good[..5], &bad_tag[..], &bad_mode[..], &[][..]] {
            assert!(Dentry::head(v).is_err(), "{v:?}");
        }
    }
}
