//! The kernel's FUSE wire structures that the ring transport reads and writes, defined here
//! from `include/uapi/linux/fuse.h` (protocol 7.42+) as byte offsets: the ring hands us raw
//! buffers, and reading fields at fixed little-endian offsets needs no `unsafe` casts. Owns
//! the layouts and their encoders/decoders only; what a request means is `dispatch.rs`'s.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, Generation};

// Ring commands (`enum fuse_uring_cmd`) and the request header's layout.
pub const CMD_REGISTER: u32 = 1;
pub const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in_out (128), op_in (128), ring_ent_in_out (32).
pub const IN_OUT_OFF: usize = 0;
pub const OP_IN_OFF: usize = 128;
pub const OP_IN_SIZE: usize = 128;
pub const ENT_IN_OUT_OFF: usize = 256;
pub const REQ_HEADER_SIZE: usize = 288;
/// `fuse_uring_ent_in_out`: flags u64, commit_id u64, payload_sz u32, padding, reserved.
pub const ENT_COMMIT_ID: usize = ENT_IN_OUT_OFF + 8;
pub const ENT_PAYLOAD_SZ: usize = ENT_IN_OUT_OFF + 16;

// Opcodes (`enum fuse_opcode`).
pub const LOOKUP: u32 = 1;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const SETXATTR: u32 = 21;
pub const GETXATTR: u32 = 22;
pub const LISTXATTR: u32 = 23;
pub const REMOVEXATTR: u32 = 24;
pub const FLUSH: u32 = 25;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const ACCESS: u32 = 34;
pub const CREATE: u32 = 35;
pub const DESTROY: u32 = 38;
pub const FALLOCATE: u32 = 43;
pub const READDIRPLUS: u32 = 44;
pub const RENAME2: u32 = 45;

// `fuse_setattr_in.valid` bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_CTIME: u32 = 1 << 10;
/// `fuse_getattr_in.getattr_flags`: the fh field is valid.
pub const GETATTR_FH: u32 = 1;
/// `fuse_read_in.read_flags` / `fuse_write_in.write_flags`: lock_owner is valid.
pub const READ_LOCKOWNER: u32 = 1 << 1;
pub const WRITE_LOCKOWNER: u32 = 1 << 1;
/// `fuse_release_in.release_flags`.
pub const RELEASE_FLUSH: u32 = 1;
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;

/// Reply sizes of the fixed structures.
pub const OUT_HEADER_SIZE: usize = 16;
pub const ATTR_SIZE: usize = 88;
pub const ENTRY_OUT_SIZE: usize = 40 + ATTR_SIZE;
pub const DIRENT_HEADER: usize = 24;

/// A little-endian field reader over a received buffer; reading past the end is an error
/// (a malformed request), never a panic.
pub struct Fields<'a>(pub &'a [u8]);

impl Fields<'_> {
    pub fn u32(&self, off: usize) -> Option<u32> {
        let b = self.0.get(off..off + 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }

    pub fn u64(&self, off: usize) -> Option<u64> {
        let b = self.0.get(off..off + 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

/// `struct fuse_in_header` (40 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        if b.len() < 40 {
            return None;
        }
        let f = Fields(b);
        Some(InHeader {
            opcode: f.u32(4)?,
            unique: f.u64(8)?,
            nodeid: f.u64(16)?,
            uid: f.u32(24)?,
            gid: f.u32(28)?,
            pid: f.u32(32)?,
        })
    }
}

/// `struct fuse_out_header`: len, error (negative errno or 0), unique.
pub fn out_header(len: u32, error: i32, unique: u64) -> [u8; OUT_HEADER_SIZE] {
    let mut h = [0u8; OUT_HEADER_SIZE];
    h[0..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// Appends fields to a reply buffer of fixed capacity. An overflow is remembered and turns
/// the reply into an error (`ok()` is false) instead of writing past the buffer.
pub struct Encoder<'a> {
    pub buf: &'a mut [u8],
    pub len: usize,
    pub overflow: bool,
}

impl<'a> Encoder<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Encoder {
            buf,
            len: 0,
            overflow: false,
        }
    }

    pub fn bytes(&mut self, b: &[u8]) {
        match self.buf.get_mut(self.len..self.len + b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                self.len += b.len();
            }
            None => self.overflow = true,
        }
    }

    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    pub fn zeros(&mut self, n: usize) {
        match self.buf.get_mut(self.len..self.len + n) {
            Some(dst) => {
                dst.fill(0);
                self.len += n;
            }
            None => self.overflow = true,
        }
    }

    /// `struct fuse_attr` (88 bytes).
    pub fn attr(&mut self, a: &FileAttr) {
        let (at, atn) = time(a.atime);
        let (mt, mtn) = time(a.mtime);
        let (ct, ctn) = time(a.ctime);
        self.u64(a.ino.0);
        self.u64(a.size);
        self.u64(a.blocks);
        self.u64(at as u64);
        self.u64(mt as u64);
        self.u64(ct as u64);
        self.u32(atn);
        self.u32(mtn);
        self.u32(ctn);
        self.u32(mode(a.kind, a.perm));
        self.u32(a.nlink);
        self.u32(a.uid);
        self.u32(a.gid);
        self.u32(a.rdev);
        self.u32(a.blksize);
        self.u32(a.flags);
    }

    /// `struct fuse_entry_out` (128 bytes); `nodeid` is the inode the kernel will know.
    pub fn entry(&mut self, nodeid: u64, ttl: &Duration, a: &FileAttr, generation: Generation) {
        self.u64(nodeid);
        self.u64(generation.0);
        self.u64(ttl.as_secs());
        self.u64(ttl.as_secs());
        self.u32(ttl.subsec_nanos());
        self.u32(ttl.subsec_nanos());
        self.attr(a);
    }

    /// `struct fuse_attr_out` (104 bytes).
    pub fn attr_out(&mut self, ttl: &Duration, a: &FileAttr) {
        self.u64(ttl.as_secs());
        self.u32(ttl.subsec_nanos());
        self.u32(0);
        self.attr(a);
    }

    /// `struct fuse_open_out` (16 bytes): fh, open_flags, backing_id 0.
    pub fn open_out(&mut self, fh: u64, flags: u32) {
        self.u64(fh);
        self.u32(flags);
        self.u32(0);
    }

    /// `struct fuse_dirent` with its name, padded to 8 bytes; false (and nothing written)
    /// if it does not fit in `limit` bytes in all.
    pub fn dirent(
        &mut self,
        limit: usize,
        ino: u64,
        off: u64,
        kind: FileType,
        name: &[u8],
    ) -> bool {
        let size = DIRENT_HEADER + name.len();
        let padded = size.next_multiple_of(8);
        if self.len + padded > limit.min(self.buf.len()) {
            return false;
        }
        self.u64(ino);
        self.u64(off);
        self.u32(name.len() as u32);
        self.u32(mode(kind, 0) >> 12);
        self.bytes(name);
        self.zeros(padded - size);
        true
    }
}

/// The `st_mode` of a kind and permission bits.
pub fn mode(kind: FileType, perm: u16) -> u32 {
    let t = match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    };
    t | u32::from(perm)
}

/// Seconds (negative before 1970) and nanoseconds, as `fuse_attr` carries a time.
pub fn time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    }
}

/// The time a request carries (seconds since the epoch, possibly negative, and nanoseconds).
pub fn system_time(secs: u64, nsecs: u32) -> SystemTime {
    let secs = secs as i64;
    let nanos = Duration::from_nanos(u64::from(nsecs.min(999_999_999)));
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

/// The 80-byte command of a ring SQE: `struct fuse_uring_cmd_req {flags, commit_id, qid}`.
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_the_epoch_round_trip() {
        for (s, n) in [(0i64, 0u32), (5, 7), (-1, 0), (-2, 999_999_999)] {
            let t = system_time(s as u64, n);
            assert_eq!(time(t), (s, n));
        }
    }

    #[test]
    fn a_short_request_header_is_an_error_not_a_panic() {
        assert_eq!(InHeader::parse(&[0u8; 39]), None);
        let mut b = [0u8; 40];
        b[4] = 1;
        b[8] = 9;
        let h = InHeader::parse(&b).unwrap();
        assert_eq!((h.opcode, h.unique), (1, 9));
    }

    #[test]
    fn an_encoder_never_writes_past_its_buffer() {
        let mut b = [0u8; 10];
        let mut e = Encoder::new(&mut b);
        e.u64(1);
        e.u64(2);
        assert!(e.overflow);
        assert_eq!(e.len, 8);
        let mut big = [0u8; 64];
        let mut e = Encoder::new(&mut big);
        assert!(e.dirent(64, 1, 1, FileType::Directory, b"abc"));
        assert_eq!(e.len, 32);
        assert!(!e.dirent(
            64,
            1,
            2,
            FileType::Directory,
            b"a-long-name-that-does-not-fit"
        ));
        assert_eq!(e.len, 32);
    }
}
