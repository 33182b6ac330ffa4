//! File-system crash test: a seeded random workload through fern-fs on a [`CrashDevice`]
//! (create, small / multi-block / sparse writes, truncate, rename, link, unlink of closed and
//! open files, mkdir, rmdir, symlink, fsync, syncfs), then a power cut
//! ([`CrashDevice::crash_image`]), a fresh store and mount on the crash image (recovery must
//! succeed), and checks against a model of what was made durable:
//!
//! * C1 every file fsynced and not written or truncated since has exactly its fsynced content
//!   (and is still in the namespace unless one of its names changed since);
//! * C2 after a sync (syncfs, or fsync, which fern-fs documents as making the whole store
//!   durable) with no operation after it, the namespace equals the model exactly;
//! * C3 the recovered state is the state after one of the operations since the last sync
//!   (every operation is atomic and operations are durable in order);
//! * C4 namespace invariants: every entry resolves to a live inode of its type, `..` is the
//!   directory the entry was found in, directory link count = 2 + subdirectories, file link
//!   count = entries naming it, symlink size = target length, file size = bytes read, no
//!   orphan record left after mount, no inode record or data block of an unreachable inode,
//!   no data block past end of file;
//! * C5 the recovered file system is writable: a new file gets a fresh inode.
//!
//! `FERN_FS_CRASH_SEEDS=N` runs seeds 0..N (default 4000 in release, 200 in debug); `FERN_FS_CRASH_SEED=S` runs seed S
//! alone. A failure prints its seed, which reproduces it exactly.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use fern_fs::path::{File, OpenOptions, PathFs};
use fern_fs::schema::{self, Trees};
use fern_fs::{Cred, FileType, Fs, InodeId, MkfsOptions};
use fern_kv::{Direction, KeyRange};
use fern_kv_tree::TreeStore;
use fern_tree::device::CrashDevice;
use fern_tree::Options;

/// About 20 s in release (the crate's test profile); debug builds run fewer.
const DEFAULT_SEEDS: u64 = 4000;
const DEFAULT_SEEDS_DEBUG: u64 = 200;
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const MAX_OPEN: usize = 4;

/// Seeds that also write whole 1 MiB slots (data extents): one in a hundred (each takes ~1 s
/// of wall time, mostly waiting, against ~10 ms for the others), so the rest keep
/// the small log that makes checkpoints happen mid-workload, and the run stays short.
fn big_writes(seed: u64) -> bool {
    seed.is_multiple_of(100)
}

fn engine(big: bool) -> Options {
    // Small nodes, cache and log: trees grow several levels, nodes are evicted and the log
    // asks for checkpoints mid-workload. No background threads: a seed replays exactly.
    Options {
        cache_bytes: 1 << 20,
        node_bytes: 4096,
        basement_bytes: 512,
        fanout: 4,
        // With large writes: room for one batch of a slot's worth of block rows (a dissolved
        // extent: up to 1 MiB) within half the log; extents still ask for checkpoints by
        // their bytes (format.md X10).
        log_bytes: if big { 4 << 20 } else { 256 << 10 },
        sync_interval: None,
        checkpoint_thread: false,
        ..Options::default()
    }
}

type Rng = fern_testkit::SplitMix64;

/// `n` bytes of one random pattern.
fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    let tag = rng.next_u64();
    (0..n as u64)
        .map(|i| (tag.wrapping_add(i.wrapping_mul(0x9E37)) >> 7) as u8)
        .collect()
}

#[derive(Clone, Debug)]
enum Ent {
    File(u64),
    Dir(u64),
    Sym(u64, Vec<u8>),
}

impl Ent {
    fn ino(&self) -> u64 {
        match self {
            Ent::File(i) | Ent::Dir(i) | Ent::Sym(i, _) => *i,
        }
    }
}

/// The expected namespace (path -> entry) and file contents (inode -> bytes, including open
/// unlinked files).
#[derive(Clone, Debug, Default)]
struct Model {
    entries: BTreeMap<String, Ent>,
    data: HashMap<u64, Vec<u8>>,
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn file_line(ino: u64, nlink: u32, data: &[u8]) -> String {
    format!(
        "file ino {ino} nlink {nlink} size {} hash {:x}",
        data.len(),
        hash(data)
    )
}

impl Model {
    fn new() -> Self {
        let mut m = Model::default();
        m.entries.insert("/".to_string(), Ent::Dir(InodeId::ROOT.0));
        m
    }
    fn paths(&self, want: fn(&Ent) -> bool) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| want(e))
            .map(|(p, _)| p.clone())
            .collect()
    }
    fn dirs(&self) -> Vec<String> {
        self.paths(|e| matches!(e, Ent::Dir(_)))
    }
    fn files(&self) -> Vec<String> {
        self.paths(|e| matches!(e, Ent::File(_)))
    }
    fn children(&self, dir: &str) -> Vec<String> {
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        self.entries
            .keys()
            .filter(|p| p.len() > prefix.len() && p.starts_with(&prefix))
            .filter(|p| !p[prefix.len()..].contains('/'))
            .cloned()
            .collect()
    }
    fn nlink(&self, ino: u64) -> u32 {
        self.entries
            .values()
            .filter(|e| matches!(e, Ent::File(i) if *i == ino))
            .count() as u32
    }
    fn names_of(&self, ino: u64) -> Vec<String> {
        self.paths(|_| true)
            .into_iter()
            .filter(|p| self.entries[p].ino() == ino && !matches!(self.entries[p], Ent::Dir(_)))
            .collect()
    }
    /// Moves `from` (and, for a directory, its subtree) to `to`, which is free or a file.
    fn rename(&mut self, from: &str, to: &str) {
        let moved: Vec<String> = self
            .entries
            .keys()
            .filter(|p| *p == from || p.starts_with(&format!("{from}/")))
            .cloned()
            .collect();
        self.entries.remove(to);
        for p in moved {
            let e = self.entries.remove(&p).expect("moved entry");
            self.entries.insert(format!("{to}{}", &p[from.len()..]), e);
        }
    }
    fn dump(&self) -> BTreeMap<String, String> {
        self.entries
            .iter()
            .map(|(p, e)| {
                let line = match e {
                    Ent::File(i) => file_line(*i, self.nlink(*i), &self.data[i]),
                    Ent::Dir(i) => {
                        let subdirs = self
                            .children(p)
                            .iter()
                            .filter(|c| matches!(self.entries[*c], Ent::Dir(_)))
                            .count();
                        format!("dir ino {i} nlink {}", 2 + subdirs)
                    }
                    Ent::Sym(i, t) => format!("symlink ino {i} -> {}", String::from_utf8_lossy(t)),
                };
                (p.clone(), line)
            })
            .collect()
    }
}

/// What a walk of a mounted file system found.
struct Seen {
    dump: BTreeMap<String, String>,
    content: HashMap<u64, Vec<u8>>,
    problems: Vec<String>,
}

fn read_all(fs: &Fs, ino: InodeId, size: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let chunk = fs
            .read(ino, out.len() as u64, 1 << 16)
            .map_err(|e| format!("read inode {}: {e}", ino.0))?;
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
        if out.len() as u64 > size + (1 << 20) {
            break;
        }
    }
    Ok(out)
}

/// Walks the whole namespace from the root, checking the invariants (C4) on the way, and
/// scans the orphan, inode and data trees for records of unreachable inodes other than `open`
/// (files unlinked while open, on a live mount).
fn walk(fs: &Fs, open: &HashSet<u64>) -> Seen {
    let mut dump = BTreeMap::new();
    let mut content = HashMap::new();
    let mut problems = Vec::new();
    // Non-directories: entries naming it, link count, a path.
    let mut links: HashMap<u64, (u32, u32, String)> = HashMap::new();
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut reachable: HashSet<u64> = HashSet::from([InodeId::ROOT.0]);
    let mut queue = VecDeque::from([(InodeId::ROOT, "/".to_string())]);
    while let Some((dir, path)) = queue.pop_front() {
        let mut subdirs = 0u32;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = match fs.list(dir, after.as_deref(), 64, false) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(format!("{path}: listing failed: {e}"));
                    break;
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                let child = join(&path, &String::from_utf8_lossy(&e.name));
                let attr = match fs.lookup(dir, &e.name) {
                    Ok(a) => a,
                    Err(err) => {
                        problems.push(format!("{child}: entry does not resolve: {err}"));
                        continue;
                    }
                };
                if attr.ino != e.ino || attr.kind != e.kind {
                    problems.push(format!(
                        "{child}: entry says inode {} {:?}, inode is {} {:?}",
                        e.ino.0, e.kind, attr.ino.0, attr.kind
                    ));
                }
                reachable.insert(attr.ino.0);
                match attr.kind {
                    FileType::Directory => {
                        subdirs += 1;
                        match fs.parent_of(attr.ino) {
                            Ok(p) if p == dir => {}
                            Ok(p) => problems.push(format!(
                                "{child}: `..` is inode {}, found in inode {}",
                                p.0, dir.0
                            )),
                            Err(err) => problems.push(format!("{child}: no `..`: {err}")),
                        }
                        if queue.iter().any(|(d, _)| *d == attr.ino)
                            || dump.values().any(|l: &String| {
                                l.starts_with(&format!("dir ino {} ", attr.ino.0))
                            })
                        {
                            problems.push(format!("{child}: directory reached twice"));
                        } else {
                            queue.push_back((attr.ino, child));
                        }
                    }
                    kind => {
                        let line = if kind == FileType::Symlink {
                            match fs.readlink(attr.ino) {
                                Ok(t) => {
                                    if t.len() as u64 != attr.size {
                                        problems.push(format!(
                                            "{child}: target of {} bytes, size {}",
                                            t.len(),
                                            attr.size
                                        ));
                                    }
                                    format!(
                                        "symlink ino {} -> {}",
                                        attr.ino.0,
                                        String::from_utf8_lossy(&t)
                                    )
                                }
                                Err(err) => {
                                    problems.push(format!("{child}: readlink: {err}"));
                                    continue;
                                }
                            }
                        } else {
                            match read_all(fs, attr.ino, attr.size) {
                                Ok(d) => {
                                    if d.len() as u64 != attr.size {
                                        problems.push(format!(
                                            "{child}: size {}, {} bytes read",
                                            attr.size,
                                            d.len()
                                        ));
                                    }
                                    let l = file_line(attr.ino.0, attr.nlink, &d);
                                    sizes.insert(attr.ino.0, attr.size);
                                    content.insert(attr.ino.0, d);
                                    l
                                }
                                Err(err) => {
                                    problems.push(format!("{child}: {err}"));
                                    continue;
                                }
                            }
                        };
                        dump.insert(child.clone(), line);
                        let l = links.entry(attr.ino.0).or_insert((0, attr.nlink, child));
                        l.0 += 1;
                        fs.forget(attr.ino, 1);
                    }
                }
            }
        }
        match fs.getattr(dir) {
            Ok(a) => {
                if a.nlink != 2 + subdirs {
                    problems.push(format!(
                        "{path}: link count {}, expected 2 + {subdirs} subdirectories",
                        a.nlink
                    ));
                }
                dump.insert(path.clone(), format!("dir ino {} nlink {}", dir.0, a.nlink));
            }
            Err(err) => problems.push(format!("{path}: getattr: {err}")),
        }
    }
    for (ino, (found, nlink, path)) in &links {
        if found != nlink {
            problems.push(format!(
                "{path} (inode {ino}): link count {nlink}, {found} entries name it"
            ));
        }
    }
    // Records of unreachable inodes.
    let kv = fs.store();
    let t = Trees::open(&**kv).expect("trees");
    let all = |tree| {
        kv.scan(tree, &KeyRange::all(), Direction::Forward, usize::MAX)
            .expect("scan")
    };
    for (k, _) in all(t.orphan) {
        if open.contains(&schema::parse_id_key(&k).expect("orphan key").0) {
            continue;
        }
        problems.push(format!("orphan record left after mount: {k:?}"));
    }
    for (k, _) in all(t.inode) {
        let id = schema::parse_id_key(&k).expect("inode key");
        if !reachable.contains(&id.0) && !open.contains(&id.0) {
            problems.push(format!("inode record of unreachable inode {}", id.0));
        }
    }
    let bs = fs.block_size() as u64;
    for (k, _) in all(t.data) {
        let id = u64::from_be_bytes(k[..8].try_into().expect("data key"));
        let block = schema::parse_block_key(InodeId(id), &k).expect("data key");
        match sizes.get(&id) {
            None if open.contains(&id) => {}
            None => problems.push(format!(
                "data block {block} of unreachable inode {id} (or not a file)"
            )),
            Some(&size) if block * bs >= size => problems.push(format!(
                "data block {block} of inode {id} past its end of file ({size} bytes)"
            )),
            Some(_) => {}
        }
    }
    Seen {
        dump,
        content,
        problems,
    }
}

fn rw(create: bool) -> OpenOptions {
    OpenOptions::write_only(create, 0o644)
}

fn diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (k, v) in a {
        match b.get(k) {
            Some(w) if w == v => {}
            Some(w) => out.push_str(&format!("  {k}: expected [{v}], found [{w}]\n")),
            None => out.push_str(&format!("  {k}: expected [{v}], missing\n")),
        }
    }
    for (k, w) in b {
        if !a.contains_key(k) {
            out.push_str(&format!("  {k}: unexpected [{w}]\n"));
        }
    }
    out
}

/// What fsync made durable about one file.
struct Fsynced {
    content: Vec<u8>,
    /// A name of the file was added, removed or moved since the fsync.
    renamed: bool,
}

struct Run {
    rng: Rng,
    /// Whether writes may cover whole 1 MiB slots ([`big_writes`]).
    big: bool,
    p: PathFs,
    m: Model,
    open: Vec<(File, u64)>,
    fsynced: HashMap<u64, Fsynced>,
    /// Model states since the last sync, oldest first: the recovered state must be one of them.
    since_sync: Vec<BTreeMap<String, String>>,
    log: Vec<String>,
}

impl Run {
    fn fresh_name(&mut self) -> Option<String> {
        let dirs = self.m.dirs();
        let dir = self.rng.pick(&dirs)?.clone();
        let name = NAMES[self.rng.below(NAMES.len() as u64) as usize];
        let path = join(&dir, name);
        (!self.m.entries.contains_key(&path)).then_some(path)
    }

    fn changed_content(&mut self, ino: u64) {
        self.fsynced.remove(&ino);
    }

    fn changed_names(&mut self, ino: u64) {
        if let Some(f) = self.fsynced.get_mut(&ino) {
            f.renamed = true;
        }
    }

    fn write(&mut self, target: Option<usize>, path: Option<String>) {
        let bs = self.p.fs().block_size() as u64;
        let slot = schema::SLOT_BYTES;
        let (off, len) = match self.rng.below(10) {
            0..=2 => (self.rng.below(200), 1 + self.rng.below(300)),
            3..=5 => (self.rng.below(bs), bs + self.rng.below(3 * bs)),
            // Large: a whole 1 MiB slot becomes a data extent (fs-design.md §9), so a crash
            // can cut between an extent's write and its record. One slot: one batch, so the
            // write is atomic as C3 needs (a longer write is several batches, and a crash
            // may keep a prefix of it, as POSIX allows). The small writes above then land on
            // extents (overlay rows) and truncates cut them (dissolved).
            9 if self.big => (slot * self.rng.below(3), slot),
            _ => (
                bs * (2 + self.rng.below(10)) + self.rng.below(bs),
                1 + self.rng.below(100),
            ),
        };
        let data = bytes(&mut self.rng, len as usize);
        let ino = match (target, path) {
            (Some(i), _) => {
                let (f, ino) = &self.open[i];
                self.log
                    .push(format!("write handle of {ino} at {off} len {len}"));
                let n = self.p.write_at(f, off, &data).expect("write");
                assert_eq!(n, data.len(), "short write");
                *ino
            }
            (None, Some(path)) => {
                self.log.push(format!("write {path} at {off} len {len}"));
                let f = self.p.open(path.as_bytes(), rw(true)).expect("open");
                let n = self.p.write_at(&f, off, &data).expect("write");
                assert_eq!(n, data.len(), "short write");
                let ino = f.ino().0;
                self.p.close(f).expect("close");
                ino
            }
            _ => unreachable!(),
        };
        let d = self.m.data.entry(ino).or_default();
        let end = (off + len) as usize;
        if d.len() < end {
            d.resize(end, 0);
        }
        d[off as usize..end].copy_from_slice(&data);
        self.changed_content(ino);
    }

    /// Records the model state after one file-system operation.
    fn mark(&mut self) {
        let d = self.m.dump();
        if self.since_sync.last() != Some(&d) {
            self.since_sync.push(d);
        }
    }

    /// Everything so far is durable.
    fn sync_point(&mut self) {
        self.since_sync.clear();
        self.mark();
    }

    /// One random operation. Returns false if it was not applicable.
    fn step(&mut self) -> bool {
        match self.rng.below(100) {
            // create a file and write to it
            0..=14 => {
                let Some(path) = self.fresh_name() else {
                    return false;
                };
                self.log.push(format!("create {path}"));
                let f = self.p.open(path.as_bytes(), rw(true)).expect("create");
                let ino = f.ino().0;
                self.p.close(f).expect("close");
                self.m.entries.insert(path.clone(), Ent::File(ino));
                self.m.data.insert(ino, Vec::new());
                self.mark();
                if self.rng.below(4) != 0 {
                    self.write(None, Some(path));
                }
            }
            // write through a path or an open handle
            15..=32 => {
                if !self.open.is_empty() && self.rng.below(2) == 0 {
                    let i = self.rng.below(self.open.len() as u64) as usize;
                    self.write(Some(i), None);
                } else {
                    let files = self.m.files();
                    let Some(path) = self.rng.pick(&files).cloned() else {
                        return false;
                    };
                    self.write(None, Some(path));
                }
            }
            // truncate
            33..=39 => {
                let bs = self.p.fs().block_size() as u64;
                let size;
                let ino;
                if !self.open.is_empty() && self.rng.below(3) == 0 {
                    let i = self.rng.below(self.open.len() as u64) as usize;
                    ino = self.open[i].1;
                    let len = self.m.data[&ino].len() as u64;
                    size = self.rng.below(len + 2 * bs);
                    self.log
                        .push(format!("ftruncate handle of {ino} to {size}"));
                    self.p.ftruncate(&self.open[i].0, size).expect("ftruncate");
                } else {
                    let files = self.m.files();
                    let Some(path) = self.rng.pick(&files).cloned() else {
                        return false;
                    };
                    ino = self.m.entries[&path].ino();
                    let len = self.m.data[&ino].len() as u64;
                    size = self.rng.below(len + 2 * bs);
                    self.log.push(format!("truncate {path} to {size}"));
                    self.p.truncate(path.as_bytes(), size).expect("truncate");
                }
                self.m
                    .data
                    .get_mut(&ino)
                    .expect("data")
                    .resize(size as usize, 0);
                self.changed_content(ino);
            }
            // rename (to a free name, or a file over a file)
            40..=49 => {
                let all: Vec<String> = self
                    .m
                    .paths(|_| true)
                    .into_iter()
                    .filter(|p| p != "/")
                    .collect();
                let Some(from) = self.rng.pick(&all).cloned() else {
                    return false;
                };
                let dirs = self.m.dirs();
                let dir = self.rng.pick(&dirs).expect("root").clone();
                let to = join(&dir, NAMES[self.rng.below(NAMES.len() as u64) as usize]);
                let src = self.m.entries[&from].clone();
                if to == from || to.starts_with(&format!("{from}/")) {
                    return false;
                }
                match (&src, self.m.entries.get(&to)) {
                    (_, None) => {}
                    (Ent::File(a), Some(Ent::File(b))) if a != b => {}
                    _ => return false,
                }
                self.log.push(format!("rename {from} -> {to}"));
                self.p
                    .rename(from.as_bytes(), to.as_bytes(), 0)
                    .expect("rename");
                if let Some(old) = self.m.entries.get(&to).map(Ent::ino) {
                    self.changed_names(old);
                    self.m.rename(&from, &to);
                    self.drop_if_gone(old);
                } else {
                    self.m.rename(&from, &to);
                }
                self.changed_names(src.ino());
            }
            // link
            50..=55 => {
                let files = self.m.files();
                let Some(from) = self.rng.pick(&files).cloned() else {
                    return false;
                };
                let Some(to) = self.fresh_name() else {
                    return false;
                };
                self.log.push(format!("link {from} -> {to}"));
                self.p.link(from.as_bytes(), to.as_bytes()).expect("link");
                let ino = self.m.entries[&from].ino();
                self.m.entries.insert(to, Ent::File(ino));
                self.changed_names(ino);
            }
            // unlink a file or symlink
            56..=62 => {
                let all = self.m.paths(|e| !matches!(e, Ent::Dir(_)));
                let Some(path) = self.rng.pick(&all).cloned() else {
                    return false;
                };
                self.unlink(&path);
            }
            // unlink every name of an open file
            63..=65 => {
                let Some((_, ino)) = self.rng.pick(&self.open).map(|(f, i)| (f.ino(), *i)) else {
                    return false;
                };
                let names = self.m.names_of(ino);
                if names.is_empty() {
                    return false;
                }
                for n in names {
                    self.unlink(&n);
                }
            }
            // mkdir
            66..=72 => {
                let Some(path) = self.fresh_name() else {
                    return false;
                };
                self.log.push(format!("mkdir {path}"));
                let a = self.p.mkdir(path.as_bytes(), 0o755).expect("mkdir");
                self.m.entries.insert(path, Ent::Dir(a.ino.0));
            }
            // rmdir an empty directory
            73..=76 => {
                let empty: Vec<String> = self
                    .m
                    .dirs()
                    .into_iter()
                    .filter(|d| d != "/" && self.m.children(d).is_empty())
                    .collect();
                let Some(path) = self.rng.pick(&empty).cloned() else {
                    return false;
                };
                self.log.push(format!("rmdir {path}"));
                self.p.rmdir(path.as_bytes()).expect("rmdir");
                self.m.entries.remove(&path);
            }
            // symlink
            77..=80 => {
                let Some(path) = self.fresh_name() else {
                    return false;
                };
                let target = format!("/t/{:x}", self.rng.next_u64() >> (self.rng.below(60)));
                self.log.push(format!("symlink {path} -> {target}"));
                let a = self
                    .p
                    .symlink(target.as_bytes(), path.as_bytes())
                    .expect("symlink");
                self.m
                    .entries
                    .insert(path, Ent::Sym(a.ino.0, target.into_bytes()));
            }
            // open a file and keep it open
            81..=84 => {
                let files = self.m.files();
                let Some(path) = self.rng.pick(&files).cloned() else {
                    return false;
                };
                if self.open.len() >= MAX_OPEN {
                    return false;
                }
                self.log.push(format!("open {path}"));
                let f = self.p.open(path.as_bytes(), rw(false)).expect("open");
                let ino = f.ino().0;
                self.open.push((f, ino));
            }
            // close a handle
            85..=88 => {
                if self.open.is_empty() {
                    return false;
                }
                let i = self.rng.below(self.open.len() as u64) as usize;
                let (f, ino) = self.open.remove(i);
                self.log.push(format!("close handle of {ino}"));
                self.p.close(f).expect("close");
                self.drop_if_gone(ino);
            }
            // fsync a file (through a handle or by path)
            89..=95 => {
                let ino;
                if !self.open.is_empty() && self.rng.below(2) == 0 {
                    let i = self.rng.below(self.open.len() as u64) as usize;
                    ino = self.open[i].1;
                    self.log.push(format!("fsync handle of {ino}"));
                    self.p.fsync(&self.open[i].0).expect("fsync");
                } else {
                    let files = self.m.files();
                    let Some(path) = self.rng.pick(&files).cloned() else {
                        return false;
                    };
                    self.log.push(format!("fsync {path}"));
                    let f = self.p.open(path.as_bytes(), rw(false)).expect("open");
                    self.p.fsync(&f).expect("fsync");
                    ino = f.ino().0;
                    self.p.close(f).expect("close");
                }
                let content = self.m.data[&ino].clone();
                // A file with no name when it is fsynced need not be found after the crash.
                let renamed = self.m.nlink(ino) == 0;
                self.fsynced.insert(ino, Fsynced { content, renamed });
                // fern-fs documents fsync as making the whole store durable.
                self.sync_point();
            }
            // syncfs
            _ => {
                self.log.push("syncfs".to_string());
                self.p.fs().syncfs().expect("syncfs");
                self.sync_point();
            }
        }
        true
    }

    fn unlink(&mut self, path: &str) {
        self.log.push(format!("unlink {path}"));
        self.p.unlink(path.as_bytes()).expect("unlink");
        let ino = self.m.entries.remove(path).expect("entry").ino();
        self.changed_names(ino);
        self.drop_if_gone(ino);
        self.mark();
    }

    /// Forgets the content of a file with no name and no open handle.
    fn drop_if_gone(&mut self, ino: u64) {
        if self.m.nlink(ino) == 0 && !self.open.iter().any(|(_, i)| *i == ino) {
            self.m.data.remove(&ino);
        }
    }
}

/// How a seed's crash turned out: (states since the last sync, index of the recovered one).
type Outcome = (usize, usize);

fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut rng = Rng::from_state(seed);
    let block_size = [512u32, 1024, 4096][rng.below(3) as usize];
    let ops = 10 + rng.below(70) as usize;
    let dev = Arc::new(CrashDevice::new());
    let store = Arc::new(
        TreeStore::create_on_with(dev.clone(), engine(big_writes(seed)), fern_fs::registry())
            .expect("create"),
    );
    Fs::mkfs(
        &*store,
        MkfsOptions {
            block_size,
            ..MkfsOptions::default()
        },
    )
    .expect("mkfs");
    let fs = Arc::new(Fs::mount(store.clone()).expect("mount"));
    let mut run = Run {
        rng,
        big: big_writes(seed),
        p: PathFs::new(fs.clone(), Cred::root()),
        m: Model::new(),
        open: Vec::new(),
        fsynced: HashMap::new(),
        since_sync: Vec::new(),
        log: vec![format!("mkfs block size {block_size}, {ops} operations")],
    };
    run.mark();
    let mut done = 0;
    while done < ops {
        if run.step() {
            done += 1;
            run.mark();
        }
    }
    let log = run.log.join("\n  ");
    // The live file system agrees with the model before the crash (validates the model).
    let open_unlinked: HashSet<u64> = run
        .open
        .iter()
        .map(|(_, i)| *i)
        .filter(|i| run.m.nlink(*i) == 0)
        .collect();
    let live = walk(&fs, &open_unlinked);
    let expected = run.m.dump();
    if !live.problems.is_empty() || live.dump != expected {
        return Err(format!(
            "before the crash: problems {:?}\n diff model vs live:\n{}\n operations:\n  {log}",
            live.problems,
            diff(&expected, &live.dump)
        ));
    }

    // Power cut; the open handles die with the mount.
    let image = dev.crash_image(seed.wrapping_mul(31).wrapping_add(7));
    let dev2 = Arc::new(CrashDevice::from_bytes(image));
    let store2 = Arc::new(
        TreeStore::open_on_with(dev2.clone(), engine(big_writes(seed)), fern_fs::registry())
            .map_err(|e| format!("open after crash failed: {e}\n operations:\n  {log}"))?,
    );
    let fs2 = Fs::mount(store2.clone())
        .map_err(|e| format!("mount after crash failed: {e}\n operations:\n  {log}"))?;
    let seen = walk(&fs2, &HashSet::new());
    let mut errors = Vec::new();
    // fsck after recovery: extents named once, none leaked (S8), counts (D2).
    match fern_fs::check::check(&*store2) {
        Ok(r) if r.is_clean() => {}
        Ok(r) => errors.push(format!("fsck after the crash: {:?}", r.findings)),
        Err(e) => errors.push(format!("fsck after the crash failed: {e}")),
    }
    // C4
    for p in &seen.problems {
        errors.push(format!("C4 invariant: {p}"));
    }
    // C1
    let where_is: HashMap<u64, String> = seen
        .dump
        .iter()
        .filter_map(|(p, l)| {
            let ino = l
                .strip_prefix("file ino ")?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            Some((ino, p.clone()))
        })
        .collect();
    for (ino, f) in &run.fsynced {
        match (seen.content.get(ino), f.renamed) {
            (Some(c), _) if *c == f.content => {}
            (Some(c), _) => errors.push(format!(
                "C1 fsynced file {ino} ({}): {} bytes (hash {:x}) instead of its fsynced {} bytes (hash {:x})",
                where_is[ino],
                c.len(),
                hash(c),
                f.content.len(),
                hash(&f.content)
            )),
            (None, true) => {}
            (None, false) => errors.push(format!(
                "C1 fsynced file {ino} is gone though none of its names changed"
            )),
        }
    }
    // C2
    if run.since_sync.len() == 1 && seen.dump != run.since_sync[0] {
        errors.push(format!(
            "C2 crash right after a sync: namespace differs from the model:\n{}",
            diff(&run.since_sync[0], &seen.dump)
        ));
    }
    // C3
    if !run.since_sync.contains(&seen.dump) {
        let (i, nearest) = run
            .since_sync
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| diff(s, &seen.dump).lines().count())
            .expect("a state");
        errors.push(format!(
            "C3 recovered state is none of the {} states since the last sync; diff against the nearest (after {} operations since the sync):\n{}",
            run.since_sync.len(),
            i,
            diff(nearest, &seen.dump)
        ));
        if std::env::var("FERN_FS_CRASH_VERBOSE").is_ok() {
            for (i, s) in run.since_sync.iter().enumerate() {
                errors.push(format!("  state {i}:\n{}", diff(s, &seen.dump)));
            }
        }
    }
    // C5: the recovered file system takes new files with fresh inodes.
    if errors.is_empty() {
        let p2 = PathFs::new(Arc::new(fs2), Cred::root());
        let f = p2
            .open(b"/after-crash", rw(true))
            .expect("create after crash");
        if seen.content.contains_key(&f.ino().0)
            || seen
                .dump
                .values()
                .any(|l| l.contains(&format!("ino {} ", f.ino().0)))
        {
            errors.push(format!(
                "C5 new file got inode {}, already in use",
                f.ino().0
            ));
        }
        p2.write_at(&f, 0, b"after").expect("write after crash");
        p2.fsync(&f).expect("fsync after crash");
        p2.close(f).expect("close");
        let again = walk(p2.fs(), &HashSet::new());
        for p in &again.problems {
            errors.push(format!("C5 after a write on the recovered fs: {p}"));
        }
    }
    if errors.is_empty() {
        let at = run
            .since_sync
            .iter()
            .position(|s| *s == seen.dump)
            .expect("C3 held");
        Ok((run.since_sync.len(), at))
    } else {
        Err(format!("{}\n operations:\n  {log}", errors.join("\n")))
    }
}

#[test]
fn file_system_survives_power_cuts() {
    let seeds: Vec<u64> = match std::env::var("FERN_FS_CRASH_SEED") {
        Ok(s) => vec![s.parse().expect("FERN_FS_CRASH_SEED")],
        Err(_) => {
            let n = std::env::var("FERN_FS_CRASH_SEEDS")
                .map(|s| s.parse().expect("FERN_FS_CRASH_SEEDS"))
                .unwrap_or(if cfg!(debug_assertions) {
                    DEFAULT_SEEDS_DEBUG
                } else {
                    DEFAULT_SEEDS
                });
            (0..n).collect()
        }
    };
    println!("fs_crash: {} seeds", seeds.len());
    let mut failed = Vec::new();
    // Crashes right after a sync; recovering the last state of several; an earlier one.
    let (mut synced, mut latest, mut earlier) = (0, 0, 0);
    for &seed in &seeds {
        let r = catch_unwind(AssertUnwindSafe(|| run_seed(seed)));
        let msg = match r {
            Ok(Ok((n, at))) => {
                if seeds.len() == 1 {
                    println!("seed {seed}: recovered state {at} of {n} since the last sync");
                }
                if n == 1 {
                    synced += 1;
                } else if at + 1 == n {
                    latest += 1;
                } else {
                    earlier += 1;
                }
                continue;
            }
            Ok(Err(m)) => m,
            Err(p) => p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        };
        eprintln!("fs_crash seed {seed} FAILED (FERN_FS_CRASH_SEED={seed} reproduces):\n{msg}\n");
        failed.push(seed);
        if failed.len() >= 5 {
            break;
        }
    }
    println!(
        "fs_crash: {synced} crashes right after a sync, {latest} recovered everything, \
         {earlier} recovered an earlier state"
    );
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}
