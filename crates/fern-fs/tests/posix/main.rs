//! POSIX edge cases, one test per rule, through the path API and the inode API. The rules are
//! grouped by family, one module each; this root holds the helpers they share. Other backends'
//! test crates include this file with `#[path]` (fern-kv-tree, fern-etcd), so every module path
//! here is relative to this directory.

#[path = "../common/mod.rs"]
mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use common::env;
use fern_fs::path::OpenOptions;
use fern_fs::FALLOC_FL_ZERO_RANGE;
use fern_fs::{FileType, Fs, FsError, OpenFlags, SetAttr, TimeSet, Timespec};
use fern_fs::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, RENAME_EXCHANGE, RENAME_NOREPLACE};

fn rw() -> OpenOptions {
    OpenOptions::create_write(0o644)
}

fn put(e: &common::Env, path: &str, data: &[u8]) {
    let f = e.p.open(path.as_bytes(), rw()).expect("open");
    e.p.write_at(&f, 0, data).expect("write");
    e.p.close(f).expect("close");
}

fn get(e: &common::Env, path: &str) -> Vec<u8> {
    let f =
        e.p.open(path.as_bytes(), OpenOptions::default())
            .expect("open");
    let v = e.p.read_at(&f, 0, 1 << 20).expect("read");
    e.p.close(f).expect("close");
    v
}

fn err<T: std::fmt::Debug>(r: Result<T, FsError>) -> i32 {
    r.expect_err("expected an error").errno()
}

fn as_user(e: &common::Env, uid: u32, gid: u32, groups: &[u32]) -> fern_fs::path::PathFs {
    let cred = fern_fs::Cred {
        uid,
        gid,
        groups: groups.to_vec(),
        umask: 0,
    };
    fern_fs::path::PathFs::new(e.fs.clone(), cred)
}

fn put_as(p: &fern_fs::path::PathFs, path: &str, perm: u32) {
    let mut o = rw();
    o.perm = perm;
    o.flags.exclusive = true;
    let f = p.open(path.as_bytes(), o).expect("create");
    p.close(f).expect("close");
}

/// An ACL value in the kernel's xattr format from (tag, perm, id) triples.
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const ACL_A: &[u8] = b"system.posix_acl_access";
const ACL_D: &[u8] = b"system.posix_acl_default";
const NONE: u32 = u32::MAX;

mod cost;
mod data;
mod lifetime;
mod names;
mod perms;
mod store;
mod times;
