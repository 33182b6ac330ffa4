//! The reply types the [`Handler`](crate::Handler) callbacks answer with. Each has the method
//! names and arguments of its `fuser` namesake, and goes one of two ways: to a fuser reply
//! (the `/dev/fuse` transport, whose requests fuser reads) or into a ring entry's payload
//! buffer (the io_uring transport). Owns reply encoding for the ring; fuser encodes its own.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};

use crate::uring::abi::Encoder;

/// The outcome of a ring request, read by the queue after the handler returned.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// 0, or a negative errno.
    pub(crate) error: i32,
    /// Length of the reply body in the payload buffer.
    pub(crate) len: usize,
    /// Whether the handler replied at all (a handler that did not is a bug: EIO).
    pub(crate) replied: bool,
}

/// Where a ring reply goes: the entry's payload buffer, at most `limit` bytes of it.
pub(crate) struct Slot<'a> {
    pub(crate) out: Encoder<'a>,
    pub(crate) limit: usize,
    pub(crate) outcome: &'a mut Outcome,
}

impl Slot<'_> {
    fn done(self) {
        self.outcome.replied = true;
        if self.out.overflow {
            // A reply larger than the kernel's buffer: the kernel would refuse it as well.
            self.outcome.error = -libc::ERANGE;
            self.outcome.len = 0;
        } else {
            self.outcome.error = 0;
            self.outcome.len = self.out.len;
        }
    }

    fn error(self, e: Errno) {
        self.outcome.replied = true;
        self.outcome.error = -e.code();
        self.outcome.len = 0;
    }
}

pub(crate) enum Via<'a, F> {
    Dev(F),
    Ring(Slot<'a>),
}

/// `struct fuse_write_out` / `fuse_getxattr_out`: a u32 and 4 bytes of padding.
fn padded_u32(o: &mut Encoder<'_>, v: u32) {
    o.u32(v);
    o.u32(0);
}

impl<'a, F> Via<'a, F> {
    /// Answers through fuser's reply (`dev`), or encodes the body into the ring entry
    /// (`ring`) and completes it.
    fn answer(self, dev: impl FnOnce(F), ring: impl FnOnce(&mut Encoder<'a>)) {
        match self {
            Via::Dev(r) => dev(r),
            Via::Ring(mut s) => {
                ring(&mut s.out);
                s.done()
            }
        }
    }
}

macro_rules! reply_type {
    ($(#[$m:meta])* $name:ident, $fuser:ty) => {
        $(#[$m])*
        pub struct $name<'a>(pub(crate) Via<'a, $fuser>);

        impl $name<'_> {
            /// Answers with an error.
            pub fn error(self, e: Errno) {
                match self.0 {
                    Via::Dev(r) => r.error(e),
                    Via::Ring(s) => s.error(e),
                }
            }
        }

        impl From<$fuser> for $name<'_> {
            fn from(r: $fuser) -> Self {
                $name(Via::Dev(r))
            }
        }
    };
}

reply_type!(
    /// A reply without a body.
    ReplyEmpty,
    fuser::ReplyEmpty
);
reply_type!(
    /// Bytes (read, readlink).
    ReplyData,
    fuser::ReplyData
);
reply_type!(
    /// One entry (lookup, mknod, mkdir, symlink, link).
    ReplyEntry,
    fuser::ReplyEntry
);
reply_type!(
    /// Attributes (getattr, setattr).
    ReplyAttr,
    fuser::ReplyAttr
);
reply_type!(
    /// An opened handle (open, opendir).
    ReplyOpen,
    fuser::ReplyOpen
);
reply_type!(
    /// Bytes written.
    ReplyWrite,
    fuser::ReplyWrite
);
reply_type!(
    /// File-system figures.
    ReplyStatfs,
    fuser::ReplyStatfs
);
reply_type!(
    /// An xattr value, list or size.
    ReplyXattr,
    fuser::ReplyXattr
);
reply_type!(
    /// An entry and an opened handle (create).
    ReplyCreate,
    fuser::ReplyCreate
);
reply_type!(
    /// A directory listing.
    ReplyDirectory,
    fuser::ReplyDirectory
);
reply_type!(
    /// A directory listing with attributes.
    ReplyDirectoryPlus,
    fuser::ReplyDirectoryPlus
);

/// How a listing ends, the same for readdir and readdirplus.
macro_rules! listing_end {
    ($($name:ident),*) => {$(
        impl $name<'_> {
            /// Sends what was added.
            pub fn ok(self) {
                self.0.answer(|r| r.ok(), |_| {})
            }

            /// Sends what was added, or the error.
            pub fn end<T>(self, r: Result<T, Errno>) {
                match r {
                    Ok(_) => self.ok(),
                    Err(e) => self.error(e),
                }
            }
        }
    )*};
}

listing_end!(ReplyDirectory, ReplyDirectoryPlus);

impl ReplyEmpty<'_> {
    /// Success.
    pub fn ok(self) {
        self.0.answer(|r| r.ok(), |_| {})
    }
}

impl ReplyData<'_> {
    /// The bytes.
    pub fn data(self, data: &[u8]) {
        self.0.answer(|r| r.data(data), |o| o.bytes(data))
    }
}

impl ReplyEntry<'_> {
    /// The entry, cached for `ttl`.
    pub fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        self.0.answer(
            |r| r.entry(ttl, attr, generation),
            |o| o.entry(attr.ino.0, ttl, attr, generation),
        )
    }
}

impl ReplyEntry<'_> {
    /// No such name, and the kernel may trust that for `ttl`: an entry of inode 0, which it
    /// keeps as a negative dentry (a plain ENOENT is forgotten at once).
    pub fn negative(self, ttl: &Duration) {
        let t = std::time::UNIX_EPOCH;
        let none = FileAttr {
            ino: INodeNo(0),
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileType::RegularFile,
            perm: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 0,
            flags: 0,
        };
        self.entry(ttl, &none, Generation(0))
    }
}

impl ReplyAttr<'_> {
    /// The attributes, cached for `ttl`.
    pub fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.0
            .answer(|r| r.attr(ttl, attr), |o| o.attr_out(ttl, attr))
    }
}

impl ReplyOpen<'_> {
    /// The handle and its open flags.
    pub fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.0
            .answer(|r| r.opened(fh, flags), |o| o.open_out(fh.0, flags.bits()))
    }
}

impl ReplyWrite<'_> {
    /// `size` bytes were written.
    pub fn written(self, size: u32) {
        self.0.answer(|r| r.written(size), |o| padded_u32(o, size))
    }
}

impl ReplyStatfs<'_> {
    /// `struct statfs` figures.
    #[allow(clippy::too_many_arguments)]
    pub fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        self.0.answer(
            |r| r.statfs(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize),
            |o| {
                for v in [blocks, bfree, bavail, files, ffree] {
                    o.u64(v);
                }
                for v in [bsize, namelen, frsize, 0] {
                    o.u32(v);
                }
                o.zeros(24);
            },
        )
    }
}

impl ReplyData<'_> {
    /// At most `max` bytes that `fill` writes where the reply is sent from, returning how many
    /// it wrote: over the ring that is the entry's payload buffer, so the bytes are not copied
    /// again (a read's data: fern-fs `read_to`); over /dev/fuse it is `spare`, a caller's
    /// buffer kept between requests (grown to `max`), which fuser then sends.
    pub fn fill(
        self,
        max: usize,
        spare: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, Errno>,
    ) {
        match self.0 {
            Via::Dev(r) => {
                if spare.len() < max {
                    spare.resize(max, 0);
                }
                match fill(&mut spare[..max]) {
                    Ok(n) => r.data(&spare[..n.min(max)]),
                    Err(e) => r.error(e),
                }
            }
            Via::Ring(mut s) => {
                let start = s.out.len;
                if start + max > s.limit.min(s.out.buf.len()) {
                    // More than the kernel's buffer takes: it would refuse the reply as well.
                    s.out.overflow = true;
                    return s.done();
                }
                match fill(&mut s.out.buf[start..start + max]) {
                    Ok(n) => {
                        s.out.len = start + n.min(max);
                        s.done()
                    }
                    Err(e) => s.error(e),
                }
            }
        }
    }
}

impl ReplyXattr<'_> {
    /// The size the caller must allocate (a request with size 0).
    pub fn size(self, size: u32) {
        self.0.answer(|r| r.size(size), |o| padded_u32(o, size))
    }

    /// The value or name list.
    pub fn data(self, data: &[u8]) {
        self.0.answer(|r| r.data(data), |o| o.bytes(data))
    }
}

impl ReplyCreate<'_> {
    /// The new entry and its open handle.
    pub fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        self.0.answer(
            |r| r.created(ttl, attr, generation, fh, flags),
            |o| {
                o.entry(attr.ino.0, ttl, attr, generation);
                o.open_out(fh.0, flags.bits());
            },
        )
    }
}

impl ReplyDirectory<'_> {
    /// Adds `.` (offset 1) and `..` (offset 2) where a listing resuming after `offset` has
    /// not yet passed them; fern-fuse's listings number their own entries from 3. `parent`
    /// is asked only when `..` is due. `Ok(true)`: the kernel's buffer is full.
    pub fn add_dots(
        &mut self,
        offset: u64,
        dir: INodeNo,
        parent: impl FnOnce() -> Result<INodeNo, Errno>,
    ) -> Result<bool, Errno> {
        if offset < 1 && self.add(dir, 1, FileType::Directory, ".") {
            return Ok(true);
        }
        Ok(offset < 2 && self.add(parent()?, 2, FileType::Directory, ".."))
    }

    /// Adds an entry; true when the kernel's buffer is full (the entry was not added).
    pub fn add<T: AsRef<OsStr>>(
        &mut self,
        ino: INodeNo,
        offset: u64,
        kind: FileType,
        name: T,
    ) -> bool {
        match &mut self.0 {
            Via::Dev(r) => r.add(ino, offset, kind, name),
            Via::Ring(s) => {
                let limit = s.limit;
                !s.out
                    .dirent(limit, ino.0, offset, kind, name.as_ref().as_bytes())
            }
        }
    }
}

impl ReplyDirectoryPlus<'_> {
    /// As [`ReplyDirectory::add_dots`], with the attributes `attr(offset)` gives for `.`
    /// (offset 1) and `..` (offset 2); the kernel counts no lookup for either.
    pub fn add_dots(
        &mut self,
        offset: u64,
        ttl: &Duration,
        mut attr: impl FnMut(u64) -> Result<FileAttr, Errno>,
    ) -> Result<bool, Errno> {
        for (off, name) in [(1u64, "."), (2, "..")] {
            if offset < off {
                let a = attr(off)?;
                if self.add(a.ino, off, name, ttl, &a, Generation(0)) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Adds an entry with its attributes; true when the kernel's buffer is full (the entry
    /// was not added).
    pub fn add<T: AsRef<OsStr>>(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: T,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        match &mut self.0 {
            Via::Dev(r) => r.add(ino, offset, name, ttl, attr, generation),
            Via::Ring(s) => {
                let name = name.as_ref().as_bytes();
                let need = crate::uring::abi::ENTRY_OUT_SIZE
                    + (crate::uring::abi::DIRENT_HEADER + name.len()).next_multiple_of(8);
                if s.out.len + need > s.limit.min(s.out.buf.len()) {
                    return true;
                }
                s.out.entry(ino.0, ttl, attr, generation);
                let limit = s.limit;
                !s.out.dirent(limit, ino.0, offset, attr.kind, name)
            }
        }
    }
}
