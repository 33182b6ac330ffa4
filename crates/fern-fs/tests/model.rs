//! Model-based test: random operation sequences run against fern-fs (memory backend) and
//! against a plain in-memory reference model; every result (value or errno) and, at the end,
//! the whole tree (names, types, sizes, link counts, contents, hard-link identity, no leaked
//! keys) must agree. Cases: FERN_PROPTEST_CASES (default 96).

mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use std::collections::{BTreeMap, HashMap, HashSet};

use fern_fs::path::{File, OpenOptions};
use fern_fs::FALLOC_FL_ZERO_RANGE;
use fern_fs::{FileType, FsError, MkfsOptions, OpenFlags};
use fern_fs::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, RENAME_EXCHANGE, RENAME_NOREPLACE};
use proptest::prelude::*;

type Errno = i32;
const ROOT: usize = 0;
const DANGLING: &str = "/zz"; // never created: every symlink dangles

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<String, usize>),
    Sym,
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    nlink: u32,
}

/// The reference: nodes by id, directories map names to ids, open handles name node ids.
struct Model {
    nodes: HashMap<usize, Node>,
    next: usize,
    open: Vec<usize>,
}

impl Model {
    fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                kind: Kind::Dir(BTreeMap::new()),
                nlink: 2,
            },
        );
        Model {
            nodes,
            next: 1,
            open: Vec::new(),
        }
    }

    fn dir(&self, id: usize) -> Option<&BTreeMap<String, usize>> {
        match &self.nodes[&id].kind {
            Kind::Dir(e) => Some(e),
            _ => None,
        }
    }

    fn dir_mut(&mut self, id: usize) -> &mut BTreeMap<String, usize> {
        match &mut self.nodes.get_mut(&id).expect("node").kind {
            Kind::Dir(e) => e,
            _ => panic!("not a dir"),
        }
    }

    fn is_dir(&self, id: usize) -> bool {
        self.dir(id).is_some()
    }

    /// Resolves all but the last component, as the path API does.
    fn parent(&self, path: &[String]) -> Result<(usize, String), Errno> {
        let (last, init) = path.split_last().expect("non-empty path");
        let mut cur = ROOT;
        for c in init {
            let entries = self.dir(cur).ok_or(libc::ENOTDIR)?;
            let child = *entries.get(c).ok_or(libc::ENOENT)?;
            if matches!(self.nodes[&child].kind, Kind::Sym) {
                return Err(libc::ENOENT); // follows to the dangling target
            }
            cur = child;
        }
        if !self.is_dir(cur) {
            return Err(libc::ENOTDIR);
        }
        Ok((cur, last.clone()))
    }

    /// The non-directory `path` names, following a final symlink (EISDIR for a directory).
    fn non_dir(&self, path: &[String]) -> Result<usize, Errno> {
        let id = self.lookup(path, true)?;
        if self.is_dir(id) {
            Err(libc::EISDIR)
        } else {
            Ok(id)
        }
    }

    fn lookup(&self, path: &[String], follow: bool) -> Result<usize, Errno> {
        let (dir, name) = self.parent(path)?;
        let id = *self.dir(dir).expect("dir").get(&name).ok_or(libc::ENOENT)?;
        if follow && matches!(self.nodes[&id].kind, Kind::Sym) {
            return Err(libc::ENOENT);
        }
        Ok(id)
    }

    fn add(&mut self, dir: usize, name: String, kind: Kind) -> usize {
        let is_dir = matches!(kind, Kind::Dir(_));
        let id = self.next;
        self.next += 1;
        self.nodes.insert(
            id,
            Node {
                kind,
                nlink: if is_dir { 2 } else { 1 },
            },
        );
        self.dir_mut(dir).insert(name, id);
        if is_dir {
            self.nodes.get_mut(&dir).expect("dir").nlink += 1;
        }
        id
    }

    /// Drops one name's link to `id` (already removed from its directory).
    fn unref(&mut self, parent: usize, id: usize) {
        if self.is_dir(id) {
            self.nodes.get_mut(&parent).expect("parent").nlink -= 1;
            self.nodes.remove(&id);
            return;
        }
        let n = self.nodes.get_mut(&id).expect("node");
        n.nlink -= 1;
        if n.nlink == 0 && !self.open.contains(&id) {
            self.nodes.remove(&id);
        }
    }

    fn parents(&self) -> HashMap<usize, usize> {
        let mut p = HashMap::new();
        for (id, n) in &self.nodes {
            if let Kind::Dir(e) = &n.kind {
                for c in e.values() {
                    p.insert(*c, *id);
                }
            }
        }
        p
    }

    /// True when `anc` is `d` or an ancestor of `d`.
    fn is_ancestor(&self, anc: usize, mut d: usize) -> bool {
        let parents = self.parents();
        loop {
            if d == anc {
                return true;
            }
            match parents.get(&d) {
                Some(p) if d != ROOT => d = *p,
                _ => return false,
            }
        }
    }

    fn file(&mut self, id: usize) -> &mut Vec<u8> {
        match &mut self.nodes.get_mut(&id).expect("node").kind {
            Kind::File(d) => d,
            _ => panic!("not a file"),
        }
    }

    fn close(&mut self, h: usize) {
        let id = self.open.remove(h);
        if self.nodes[&id].nlink == 0 && !self.open.contains(&id) {
            self.nodes.remove(&id);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(Vec<String>),
    Mkdir(Vec<String>),
    Symlink(Vec<String>),
    Unlink(Vec<String>),
    Rmdir(Vec<String>),
    Rename(Vec<String>, Vec<String>, u32),
    Link(Vec<String>, Vec<String>),
    Open(Vec<String>),
    Close(usize),
    Write(usize, u32, u16, u8),
    Read(usize, u32, u16),
    Truncate(Vec<String>, u32),
    Fallocate(usize, u32, u32, u16),
    /// Large writes, truncates and punches around 1 MiB data-extent slots: (handle, offset
    /// in 256 KiB units, unaligning bytes, length in 256 KiB units or bytes, fill byte).
    BigWrite(usize, u8, u16, u16, u8),
    BigTruncate(Vec<String>, u8, u16),
    BigPunch(usize, u8, u16, u8),
    Remount,
}

const QUARTER_MIB: u64 = 256 << 10;

/// An offset of `units` quarter-MiB plus `jitter` bytes, aligned two times in three.
fn big_at(units: u8, jitter: u16) -> u64 {
    u64::from(units % 16) * QUARTER_MIB
        + if jitter.is_multiple_of(3) {
            u64::from(jitter)
        } else {
            0
        }
}

fn path() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "c"]).prop_map(String::from),
        1..=3,
    )
}

fn op() -> impl Strategy<Value = Op> {
    let off = 0u32..12_000;
    prop_oneof![
        4 => path().prop_map(Op::Create),
        3 => path().prop_map(Op::Mkdir),
        1 => path().prop_map(Op::Symlink),
        2 => path().prop_map(Op::Unlink),
        2 => path().prop_map(Op::Rmdir),
        3 => (path(), path(), prop::sample::select(vec![0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE])).prop_map(|(a, b, f)| Op::Rename(a, b, f)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        2 => path().prop_map(Op::Open),
        2 => any::<usize>().prop_map(Op::Close),
        5 => (any::<usize>(), off.clone(), 1u16..3000, any::<u8>()).prop_map(|(h, o, l, b)| Op::Write(h, o, l, b)),
        3 => (any::<usize>(), off.clone(), 1u16..6000).prop_map(|(h, o, l)| Op::Read(h, o, l)),
        2 => (path(), off.clone()).prop_map(|(p, s)| Op::Truncate(p, s)),
        2 => (any::<usize>(), prop::sample::select(vec![0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE]), off, 1u16..9000)
            .prop_map(|(h, m, o, l)| Op::Fallocate(h, m, o, l)),
        3 => (any::<usize>(), any::<u8>(), any::<u16>(), 1u16..20, any::<u8>()).prop_map(|(h, o, j, l, b)| Op::BigWrite(h, o, j, l, b)),
        1 => (path(), any::<u8>(), any::<u16>()).prop_map(|(p, o, j)| Op::BigTruncate(p, o, j)),
        1 => (any::<usize>(), any::<u8>(), any::<u16>(), 1u8..12).prop_map(|(h, o, j, l)| Op::BigPunch(h, o, j, l)),
        1 => Just(Op::Remount),
    ]
}

fn p(path: &[String]) -> Vec<u8> {
    format!("/{}", path.join("/")).into_bytes()
}

fn errno<T>(r: Result<T, FsError>) -> Result<T, Errno> {
    r.map_err(|e| e.errno())
}

fn write_opts(create: bool) -> OpenOptions {
    let flags = OpenFlags {
        write: true,
        exclusive: create,
        ..OpenFlags::default()
    };
    OpenOptions {
        flags,
        create,
        perm: 0o644,
    }
}

struct Harness {
    bs: usize,
    env: Option<common::Env>,
    files: Vec<File>,
    model: Model,
}

impl Harness {
    fn env(&self) -> &common::Env {
        self.env.as_ref().expect("mounted")
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let m = &mut self.model;
        match op {
            Op::Create(path) => {
                let expect = m.parent(path).and_then(|(d, n)| {
                    if m.dir(d).expect("dir").contains_key(&n) {
                        Err(libc::EEXIST)
                    } else {
                        Ok((d, n))
                    }
                });
                let got = errno(
                    self.env
                        .as_ref()
                        .expect("env")
                        .p
                        .open(&p(path), write_opts(true)),
                );
                prop_assert_eq!(
                    got.is_ok(),
                    expect.is_ok(),
                    "create {:?}: {:?} vs {:?}",
                    path,
                    got.as_ref().err(),
                    expect.as_ref().err()
                );
                match (got, expect) {
                    (Ok(f), Ok((d, n))) => {
                        let id = m.add(d, n, Kind::File(Vec::new()));
                        m.open.push(id);
                        self.files.push(f);
                    }
                    (Err(g), Err(e)) => prop_assert_eq!(g, e, "create {:?}", path),
                    _ => unreachable!(),
                }
            }
            Op::Mkdir(path) | Op::Symlink(path) => {
                let expect = m.parent(path).and_then(|(d, n)| {
                    if m.dir(d).expect("dir").contains_key(&n) {
                        Err(libc::EEXIST)
                    } else {
                        Ok((d, n))
                    }
                });
                let env = self.env.as_ref().expect("env");
                let got = match op {
                    Op::Mkdir(_) => errno(env.p.mkdir(&p(path), 0o755)),
                    _ => errno(env.p.symlink(DANGLING.as_bytes(), &p(path))),
                };
                prop_assert_eq!(got.as_ref().err(), expect.as_ref().err(), "{:?}", op);
                if let Ok((d, n)) = expect {
                    let kind = if matches!(op, Op::Mkdir(_)) {
                        Kind::Dir(BTreeMap::new())
                    } else {
                        Kind::Sym
                    };
                    m.add(d, n, kind);
                }
            }
            Op::Unlink(path) | Op::Rmdir(path) => {
                let rmdir = matches!(op, Op::Rmdir(_));
                let expect = m.parent(path).and_then(|(d, n)| {
                    let id = *m.dir(d).expect("dir").get(&n).ok_or(libc::ENOENT)?;
                    match (m.dir(id), rmdir) {
                        (Some(_), false) => Err(libc::EISDIR),
                        (None, true) => Err(libc::ENOTDIR),
                        (Some(e), true) if !e.is_empty() => Err(libc::ENOTEMPTY),
                        _ => Ok((d, n, id)),
                    }
                });
                let env = self.env.as_ref().expect("env");
                let got = if rmdir {
                    errno(env.p.rmdir(&p(path)))
                } else {
                    errno(env.p.unlink(&p(path)))
                };
                prop_assert_eq!(got.err(), expect.as_ref().err().copied(), "{:?}", op);
                if let Ok((d, n, id)) = expect {
                    m.dir_mut(d).remove(&n);
                    m.unref(d, id);
                }
            }
            Op::Rename(a, b, flags) => {
                let expect = model_rename(m, a, b, *flags);
                let got = errno(
                    self.env
                        .as_ref()
                        .expect("env")
                        .p
                        .rename(&p(a), &p(b), *flags),
                );
                prop_assert_eq!(got.err(), expect.err(), "{:?}", op);
            }
            Op::Link(a, b) => {
                let expect = (|| {
                    let src = m.lookup(a, false)?;
                    let (d, n) = m.parent(b)?;
                    if m.is_dir(src) {
                        return Err(libc::EPERM);
                    }
                    if m.dir(d).expect("dir").contains_key(&n) {
                        return Err(libc::EEXIST);
                    }
                    Ok((src, d, n))
                })();
                let got = errno(self.env.as_ref().expect("env").p.link(&p(a), &p(b)));
                prop_assert_eq!(got.as_ref().err(), expect.as_ref().err(), "{:?}", op);
                if let Ok((src, d, n)) = expect {
                    m.dir_mut(d).insert(n, src);
                    m.nodes.get_mut(&src).expect("node").nlink += 1;
                }
            }
            Op::Open(path) => {
                let expect = m.non_dir(path);
                let got = errno(
                    self.env
                        .as_ref()
                        .expect("env")
                        .p
                        .open(&p(path), write_opts(false)),
                );
                prop_assert_eq!(got.as_ref().err(), expect.as_ref().err(), "{:?}", op);
                if let (Ok(f), Ok(id)) = (got, expect) {
                    m.open.push(id);
                    self.files.push(f);
                }
            }
            Op::Close(h) => {
                if !m.open.is_empty() {
                    let h = h % m.open.len();
                    m.close(h);
                    let f = self.files.remove(h);
                    self.env
                        .as_ref()
                        .expect("env")
                        .p
                        .close(f)
                        .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
                }
            }
            Op::Write(h, off, len, byte) => {
                if !m.open.is_empty() {
                    let h = h % m.open.len();
                    let data = vec![*byte; *len as usize];
                    let id = m.open[h];
                    let file = m.file(id);
                    let end = *off as usize + data.len();
                    if file.len() < end {
                        file.resize(end, 0);
                    }
                    file[*off as usize..end].copy_from_slice(&data);
                    let n = self
                        .env
                        .as_ref()
                        .expect("env")
                        .p
                        .write_at(&self.files[h], u64::from(*off), &data)
                        .map_err(|e| TestCaseError::fail(format!("write: {e}")))?;
                    prop_assert_eq!(n, data.len());
                }
            }
            Op::BigWrite(h, units, jitter, len, byte) => {
                if !m.open.is_empty() {
                    let h = h % m.open.len();
                    let off = big_at(*units, *jitter) as usize;
                    // Lengths in quarter MiB, with an odd tail one time in two.
                    let len =
                        *len as usize * QUARTER_MIB as usize / 4 + (*jitter as usize % 2) * 777;
                    let data: Vec<u8> = (0..len)
                        .map(|i| byte.wrapping_add((i / 4096) as u8))
                        .collect();
                    let id = m.open[h];
                    let file = m.file(id);
                    if file.len() < off + len {
                        file.resize(off + len, 0);
                    }
                    file[off..off + len].copy_from_slice(&data);
                    let n = self
                        .env()
                        .p
                        .write_at(&self.files[h], off as u64, &data)
                        .map_err(|e| TestCaseError::fail(format!("big write: {e}")))?;
                    prop_assert_eq!(n, len);
                    let back = self
                        .env()
                        .p
                        .read_at(&self.files[h], off as u64, len as u32)
                        .map_err(|e| TestCaseError::fail(format!("read back: {e}")))?;
                    prop_assert!(back == data, "read back a big write at {}", off);
                }
            }
            Op::BigTruncate(path, units, jitter) => {
                let size = big_at(*units, *jitter);
                let r = errno(self.env.as_ref().expect("env").p.truncate(&p(path), size));
                let expect = m
                    .lookup(path, true)
                    .and_then(|id| match &m.nodes[&id].kind {
                        Kind::File(_) => Ok(id),
                        Kind::Dir(_) => Err(libc::EISDIR),
                        _ => Err(libc::EINVAL),
                    });
                match expect {
                    Ok(id) => {
                        prop_assert!(r.is_ok(), "big truncate {:?}: {:?}", path, r);
                        m.file(id).resize(size as usize, 0);
                    }
                    Err(_) => prop_assert!(r.is_err(), "big truncate {:?} should fail", path),
                }
            }
            Op::BigPunch(h, units, jitter, len) => {
                if !m.open.is_empty() {
                    let h = h % m.open.len();
                    let off = big_at(*units, *jitter);
                    let len = u64::from(*len) * QUARTER_MIB - u64::from(*jitter % 5) * 100;
                    let file = m.file(m.open[h]);
                    let to = ((off + len) as usize).min(file.len());
                    if (off as usize) < to {
                        file[off as usize..to].fill(0);
                    }
                    self.env()
                        .p
                        .fallocate(
                            &self.files[h],
                            FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                            off,
                            len,
                        )
                        .map_err(|e| TestCaseError::fail(format!("big punch: {e}")))?;
                }
            }
            Op::Read(h, off, len) => {
                if !m.open.is_empty() {
                    let h = h % m.open.len();
                    let id = m.open[h];
                    let file = m.file(id);
                    let from = (*off as usize).min(file.len());
                    let to = (*off as usize + *len as usize).min(file.len());
                    let expect = file[from..to].to_vec();
                    let got = self
                        .env
                        .as_ref()
                        .expect("env")
                        .p
                        .read_at(&self.files[h], u64::from(*off), u32::from(*len))
                        .map_err(|e| TestCaseError::fail(format!("read: {e}")))?;
                    prop_assert!(
                        got == expect,
                        "read {} bytes at {}: content differs",
                        len,
                        off
                    );
                }
            }
            Op::Truncate(path, size) => {
                let expect = m.non_dir(path);
                let got = errno(
                    self.env
                        .as_ref()
                        .expect("env")
                        .p
                        .truncate(&p(path), u64::from(*size)),
                );
                prop_assert_eq!(got.as_ref().err(), expect.as_ref().err(), "{:?}", op);
                if let Ok(id) = expect {
                    m.file(id).resize(*size as usize, 0);
                }
            }
            Op::Fallocate(h, mode, off, len) => {
                if !m.open.is_empty() {
                    let h = h % m.open.len();
                    let id = m.open[h];
                    let file = m.file(id);
                    let end = *off as usize + *len as usize;
                    if *mode == 0 && file.len() < end {
                        file.resize(end, 0);
                    } else if *mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
                        if *mode & FALLOC_FL_KEEP_SIZE == 0 && file.len() < end {
                            file.resize(end, 0);
                        }
                        let to = end.min(file.len());
                        let from = (*off as usize).min(to);
                        file[from..to].fill(0);
                    }
                    self.env
                        .as_ref()
                        .expect("env")
                        .p
                        .fallocate(&self.files[h], *mode, u64::from(*off), u64::from(*len))
                        .map_err(|e| TestCaseError::fail(format!("fallocate: {e}")))?;
                }
            }
            Op::Remount => {
                // Handles are abandoned, as at a crash: orphans are freed by the next mount.
                while !m.open.is_empty() {
                    m.close(0);
                }
                self.files.clear();
                let env = self.env.take().expect("env");
                self.env = Some(env.remount());
            }
        }
        Ok(())
    }

    /// Compares the whole tree and checks that no key outlives its inode.
    fn check_tree(&mut self) -> Result<(), TestCaseError> {
        let mut ino_of: HashMap<usize, u64> = HashMap::new();
        let mut stack = vec![(ROOT, String::from("/"))];
        while let Some((id, path)) = stack.pop() {
            let listing = self
                .env()
                .p
                .read_dir(path.as_bytes())
                .map_err(|e| TestCaseError::fail(format!("read_dir {path}: {e}")))?;
            let entries = self.model.dir(id).expect("dir").clone();
            let names: Vec<String> = listing
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect();
            prop_assert_eq!(
                &names,
                &entries.keys().cloned().collect::<Vec<_>>(),
                "listing of {}",
                path
            );
            for (entry, (name, child)) in listing.iter().zip(entries) {
                let attr = entry.attr.expect("plus");
                let node = &self.model.nodes[&child];
                let child_path = format!("{}{}", path, name);
                if let Some(prev) = ino_of.insert(child, attr.ino.0) {
                    prop_assert_eq!(
                        prev,
                        attr.ino.0,
                        "hard links of {} share an inode",
                        child_path
                    );
                }
                prop_assert_eq!(attr.nlink, node.nlink, "nlink of {}", child_path);
                match &node.kind {
                    Kind::Dir(_) => {
                        prop_assert_eq!(attr.kind, FileType::Directory);
                        stack.push((child, format!("{child_path}/")));
                    }
                    Kind::Sym => prop_assert_eq!(attr.kind, FileType::Symlink),
                    Kind::File(data) => {
                        prop_assert_eq!(attr.kind, FileType::Regular);
                        prop_assert_eq!(attr.size, data.len() as u64, "size of {}", child_path);
                        let f = self
                            .env()
                            .p
                            .open(child_path.as_bytes(), OpenOptions::default())
                            .map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
                        let got = self
                            .env()
                            .p
                            .read_at(&f, 0, data.len() as u32 + 10)
                            .map_err(|e| TestCaseError::fail(format!("read: {e}")))?;
                        self.env()
                            .p
                            .close(f)
                            .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
                        prop_assert!(&got == data, "content of {}", child_path);
                    }
                }
            }
        }
        let distinct: HashSet<u64> = ino_of.values().copied().collect();
        prop_assert_eq!(
            distinct.len(),
            ino_of.len(),
            "distinct nodes have distinct inodes"
        );
        prop_assert_eq!(
            self.env().p.stat(b"/").map(|a| a.nlink).ok(),
            Some(self.model.nodes[&ROOT].nlink)
        );
        Ok(())
    }

    fn check_no_leaks(&mut self) -> Result<(), TestCaseError> {
        while !self.model.open.is_empty() {
            self.model.close(0);
            let f = self.files.remove(0);
            self.env()
                .p
                .close(f)
                .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
        }
        let dirs = self
            .model
            .nodes
            .values()
            .filter(|n| matches!(n.kind, Kind::Dir(_)))
            .count();
        let linked = self
            .model
            .nodes
            .values()
            .filter(|n| !matches!(n.kind, Kind::Dir(_)) && n.nlink > 1)
            .count();
        prop_assert_eq!(
            self.env().keys_in("fs.orphan"),
            0,
            "orphans left after the last close"
        );
        prop_assert_eq!(
            self.env().keys_in("fs.dirparent"),
            dirs,
            "one parent record per directory"
        );
        prop_assert!(
            self.env().keys_in("fs.inode") <= 1 + self.model.nodes.len(),
            "inode records leak"
        );
        prop_assert!(
            self.env().keys_in("fs.inode") > linked,
            "each multiply-linked inode has a record"
        );
        let blocks: usize = self
            .model
            .nodes
            .values()
            .map(|n| match &n.kind {
                Kind::File(d) => d.len().div_ceil(self.bs),
                _ => 0,
            })
            .sum();
        // Every extent is named by exactly one row, and nothing else is live (format.md X9).
        let live = fern_kv::KvStore::extents(&*self.env().store)
            .map_err(|e| TestCaseError::fail(format!("extents: {e}")))?;
        prop_assert_eq!(
            live.len(),
            self.env().keys_in("fs.extent"),
            "extents leak or rows dangle"
        );
        let report = fern_fs::check::check(&*self.env().store)
            .map_err(|e| TestCaseError::fail(format!("fsck: {e}")))?;
        prop_assert!(report.is_clean(), "fsck: {:?}", report);
        prop_assert!(
            self.env().keys_in("fs.data") <= blocks,
            "data blocks leak: {} keys for {} blocks",
            self.env().keys_in("fs.data"),
            blocks
        );
        Ok(())
    }
}

fn model_rename(m: &mut Model, a: &[String], b: &[String], flags: u32) -> Result<(), Errno> {
    let (pa, na) = m.parent(a)?;
    let (pb, nb) = m.parent(b)?;
    let src = *m.dir(pa).expect("dir").get(&na).ok_or(libc::ENOENT)?;
    let dst = m.dir(pb).expect("dir").get(&nb).copied();
    let noreplace = flags & RENAME_NOREPLACE != 0;
    let exchange = flags & RENAME_EXCHANGE != 0;
    if let Some(d) = dst {
        if (pa == pb && na == nb) || d == src {
            return if noreplace { Err(libc::EEXIST) } else { Ok(()) };
        }
    }
    let src_dir = m.is_dir(src);
    let dst_dir = dst.is_some_and(|d| m.is_dir(d));
    if src_dir && pa != pb && m.is_ancestor(src, pb) {
        return Err(libc::EINVAL);
    }
    if exchange {
        let d = dst.ok_or(libc::ENOENT)?;
        if dst_dir && pa != pb && m.is_ancestor(d, pa) {
            return Err(libc::EINVAL);
        }
        m.dir_mut(pa).insert(na, d);
        m.dir_mut(pb).insert(nb, src);
        if pa != pb {
            let delta = i32::from(dst_dir) - i32::from(src_dir);
            m.nodes.get_mut(&pa).expect("pa").nlink = (m.nodes[&pa].nlink as i32 + delta) as u32;
            m.nodes.get_mut(&pb).expect("pb").nlink = (m.nodes[&pb].nlink as i32 - delta) as u32;
        }
        return Ok(());
    }
    if let Some(d) = dst {
        if noreplace {
            return Err(libc::EEXIST);
        }
        match (src_dir, dst_dir) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            _ => {}
        }
        if dst_dir && !m.dir(d).expect("dir").is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        m.dir_mut(pb).remove(&nb);
        m.unref(pb, d);
    }
    m.dir_mut(pa).remove(&na);
    m.dir_mut(pb).insert(nb, src);
    if src_dir && pa != pb {
        m.nodes.get_mut(&pa).expect("pa").nlink -= 1;
        m.nodes.get_mut(&pb).expect("pb").nlink += 1;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::proptest_cases(), ..ProptestConfig::default() })]

    #[test]
    fn fern_fs_matches_the_model(ops in prop::collection::vec(op(), 1..80), bs in prop::sample::select(vec![512u32, 4096])) {
        let env = common::env_with(MkfsOptions { block_size: bs, ..MkfsOptions::default() });
        let mut h = Harness { env: Some(env), files: Vec::new(), model: Model::new(), bs: bs as usize };
        for op in &ops {
            h.apply(op)?;
        }
        h.check_tree()?;
        h.check_no_leaks()?;
        let env = h.env.take().expect("env");
        h.env = Some(env.remount());
        h.check_tree()?;
    }
}
