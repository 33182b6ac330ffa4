//! The null file system's namespace: inodes with attributes and directory entries, kept in
//! memory and saved to a state file between mounts (the part of the disk). Its operations
//! (add, remove, rename, lookups) answer with the errors a file system must give; the FUSE
//! handlers in `null_fuse.rs` only translate.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};
use serde::{Deserialize, Serialize};

use crate::{BenchError, Result};

pub(super) const ROOT: u64 = 1;

/// One inode: attributes only.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Node {
    pub(super) dir: bool,
    pub(super) symlink: Option<Vec<u8>>,
    pub(super) perm: u16,
    pub(super) size: u64,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) nlink: u32,
    /// (seconds, nanoseconds) since the epoch.
    pub(super) atime: (u64, u32),
    pub(super) mtime: (u64, u32),
    pub(super) ctime: (u64, u32),
    pub(super) parent: u64,
    /// Directory entries (directories only), sorted so readdir offsets are stable.
    #[serde(skip)]
    pub(super) children: BTreeMap<Vec<u8>, u64>,
}

/// The namespace, as saved between mounts: every inode and every (parent, name, inode).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Saved {
    pub(super) next: u64,
    pub(super) nodes: Vec<(u64, Node)>,
    pub(super) entries: Vec<(u64, Vec<u8>, u64)>,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) next: u64,
    pub(super) nodes: HashMap<u64, Node>,
}

pub(super) fn now() -> (u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

pub(super) fn to_time(t: (u64, u32)) -> SystemTime {
    UNIX_EPOCH + Duration::new(t.0, t.1)
}

pub(super) fn from_time(t: SystemTime) -> (u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

impl State {
    pub(super) fn new() -> State {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::new(true, 0o755, ROOT, 0, 0));
        State {
            next: ROOT + 1,
            nodes,
        }
    }

    pub(super) fn load(path: &Path) -> Result<State> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::new()),
            Err(e) => return Err(e.into()),
        };
        let saved: Saved = serde_json::from_slice(&text)?;
        let mut nodes: HashMap<u64, Node> = saved.nodes.into_iter().collect();
        for (parent, name, ino) in saved.entries {
            let p = nodes.get_mut(&parent).ok_or_else(|| {
                BenchError::Usage(format!("null-fuse state {}: bad entry", path.display()))
            })?;
            p.children.insert(name, ino);
        }
        if !nodes.contains_key(&ROOT) {
            return Err(BenchError::Usage(format!(
                "null-fuse state {}: no root",
                path.display()
            )));
        }
        Ok(State {
            next: saved.next.max(ROOT + 1),
            nodes,
        })
    }

    pub(super) fn save(&self, path: &Path) -> Result<()> {
        let mut saved = Saved {
            next: self.next,
            ..Saved::default()
        };
        for (&ino, n) in &self.nodes {
            for (name, &child) in &n.children {
                saved.entries.push((ino, name.clone(), child));
            }
            saved.nodes.push((ino, n.clone()));
        }
        std::fs::write(path, serde_json::to_vec(&saved)?)?;
        Ok(())
    }

    pub(super) fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        let kind = if n.dir {
            FileType::Directory
        } else if n.symlink.is_some() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: 0,
            atime: to_time(n.atime),
            mtime: to_time(n.mtime),
            ctime: to_time(n.ctime),
            crtime: to_time(n.ctime),
            kind,
            perm: n.perm,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    pub(super) fn child(&self, parent: u64, name: &[u8]) -> std::result::Result<u64, Errno> {
        let p = self.nodes.get(&parent).ok_or(Errno::ENOENT)?;
        if !p.dir {
            return Err(Errno::ENOTDIR);
        }
        p.children.get(name).copied().ok_or(Errno::ENOENT)
    }

    pub(super) fn add(
        &mut self,
        parent: u64,
        name: &[u8],
        node: Node,
    ) -> std::result::Result<FileAttr, Errno> {
        let ino = self.next;
        let p = self.nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        if !p.dir {
            return Err(Errno::ENOTDIR);
        }
        if p.children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        p.children.insert(name.to_vec(), ino);
        let t = now();
        p.mtime = t;
        p.ctime = t;
        if node.dir {
            p.nlink += 1;
        }
        self.next += 1;
        self.nodes.insert(ino, node);
        self.attr(ino).ok_or(Errno::EIO)
    }

    pub(super) fn remove(
        &mut self,
        parent: u64,
        name: &[u8],
        dir: bool,
    ) -> std::result::Result<(), Errno> {
        let ino = self.child(parent, name)?;
        let n = self.nodes.get(&ino).ok_or(Errno::EIO)?;
        match (dir, n.dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if !n.children.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.nodes.remove(&ino);
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.remove(name);
            let t = now();
            p.mtime = t;
            p.ctime = t;
            if dir {
                p.nlink = p.nlink.saturating_sub(1);
            }
        }
        Ok(())
    }
}

impl Node {
    /// This directory's entries after readdir offset `offset` as (offset, inode, name): `.` and
    /// `..` are offsets 1 and 2, then entry k (in name order) has offset k + 3, as fern-fuse
    /// numbers them.
    pub(super) fn entries_after(&self, offset: u64) -> impl Iterator<Item = (u64, u64, &OsStr)> {
        let skip = offset.saturating_sub(2) as usize;
        self.children
            .iter()
            .enumerate()
            .skip(skip)
            .map(|(k, (name, &ino))| (k as u64 + 3, ino, OsStr::from_bytes(name)))
    }

    pub(super) fn new(dir: bool, perm: u16, parent: u64, uid: u32, gid: u32) -> Node {
        let t = now();
        Node {
            dir,
            symlink: None,
            perm,
            size: 0,
            uid,
            gid,
            nlink: if dir { 2 } else { 1 },
            atime: t,
            mtime: t,
            ctime: t,
            parent,
            children: BTreeMap::new(),
        }
    }
}
