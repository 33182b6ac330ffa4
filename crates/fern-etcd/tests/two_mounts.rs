//! Randomized two-mount model test (issue 14, docs/distributed.md §7): random operations,
//! each on one of two fern-fs mounts of one etcd prefix (two `EtcdStore` connections, two
//! `Fs`, two sessions), checked against **one** model — as if one file system served both.
//! Every result (value or errno) must match, open handles must keep reading what the model
//! says even after the other mount unlinked or renamed over their file, and at the end both
//! mounts list the model's tree, and once every handle is closed no orphan and no
//! registration is left. The second property runs the same on two write-back stores that
//! take the delegation whenever they may (docs/design.md §7.3): buffered operations, flushes
//! on revocation and cool-downs under the same one model.
//!
//! Why two `Fs` in one process rather than two FUSE mounts: the kernels' entry and attribute
//! TTLs (1 s on etcd mounts) make what a real mount answers right after another mount's change
//! depend on timing, so a model check of interleaved operations would be either flaky or
//! slowed to a TTL per step. fern-fs under FUSE is the same code as here; the kernel-cache
//! rules are tested with real mounts in crates/fernfs/tests/etcd_mount.rs. Cases:
//! FERN_PROPTEST_CASES (default 32, each < 50 operations).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod fs_common;
use fs_common::held_config;

use fern_etcd::local::{shared_for_tests, unique_prefix};
use fern_etcd::EtcdStore;
use fern_fs::path::{File, OpenOptions, PathFs};
use fern_fs::{Cred, Fs, FsError, MkfsOptions, OpenFlags, RENAME_NOREPLACE};
use fern_kv::{Direction, KeyRange, KvStore, TakePolicy, WriteBack, WriteBackConfig};
use proptest::prelude::*;

type Errno = i32;
const ROOT: usize = 0;

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<String, usize>),
}

/// The one file system both mounts should show: nodes by id; `links` counts names.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<usize, (Kind, u32)>,
    next: usize,
    /// Open handles: (mount, node).
    open: Vec<(usize, usize)>,
}

impl Model {
    fn new() -> Self {
        let mut m = Model {
            next: 1,
            ..Model::default()
        };
        m.nodes.insert(ROOT, (Kind::Dir(BTreeMap::new()), 1));
        m
    }

    fn dir(&self, id: usize) -> Option<&BTreeMap<String, usize>> {
        match &self.nodes[&id].0 {
            Kind::Dir(e) => Some(e),
            Kind::File(_) => None,
        }
    }

    fn dir_mut(&mut self, id: usize) -> &mut BTreeMap<String, usize> {
        match &mut self.nodes.get_mut(&id).expect("node").0 {
            Kind::Dir(e) => e,
            Kind::File(_) => panic!("not a directory"),
        }
    }

    fn parent(&self, path: &[String]) -> Result<(usize, String), Errno> {
        let (last, init) = path.split_last().expect("non-empty path");
        let mut cur = ROOT;
        for c in init {
            let e = self.dir(cur).ok_or(libc::ENOTDIR)?;
            cur = *e.get(c).ok_or(libc::ENOENT)?;
        }
        self.dir(cur).ok_or(libc::ENOTDIR)?;
        Ok((cur, last.clone()))
    }

    fn lookup(&self, path: &[String]) -> Result<usize, Errno> {
        let (d, n) = self.parent(path)?;
        self.dir(d)
            .expect("dir")
            .get(&n)
            .copied()
            .ok_or(libc::ENOENT)
    }

    fn add(&mut self, dir: usize, name: String, kind: Kind) -> usize {
        let id = self.next;
        self.next += 1;
        self.nodes.insert(id, (kind, 1));
        self.dir_mut(dir).insert(name, id);
        id
    }

    /// One name of `id` is gone; a file stays while a handle holds it.
    fn unref(&mut self, id: usize) {
        let n = self.nodes.get_mut(&id).expect("node");
        n.1 -= 1;
        if n.1 == 0 && !self.open.iter().any(|(_, o)| *o == id) {
            self.nodes.remove(&id);
        }
    }

    fn is_ancestor(&self, anc: usize, d: usize) -> bool {
        if anc == d {
            return true;
        }
        match self.dir(anc) {
            Some(e) => e.values().any(|c| self.is_ancestor(*c, d)),
            None => false,
        }
    }

    fn rename(&mut self, a: &[String], b: &[String], flags: u32) -> Result<(), Errno> {
        let (pa, na) = self.parent(a)?;
        let (pb, nb) = self.parent(b)?;
        let src = *self.dir(pa).expect("dir").get(&na).ok_or(libc::ENOENT)?;
        let dst = self.dir(pb).expect("dir").get(&nb).copied();
        let noreplace = flags & RENAME_NOREPLACE != 0;
        if let Some(d) = dst {
            if d == src {
                return if noreplace { Err(libc::EEXIST) } else { Ok(()) };
            }
        }
        let src_dir = self.dir(src).is_some();
        if src_dir && pa != pb && self.is_ancestor(src, pb) {
            return Err(libc::EINVAL);
        }
        if let Some(d) = dst {
            if noreplace {
                return Err(libc::EEXIST);
            }
            match (src_dir, self.dir(d)) {
                (true, None) => return Err(libc::ENOTDIR),
                (false, Some(_)) => return Err(libc::EISDIR),
                (true, Some(e)) if !e.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            self.dir_mut(pb).remove(&nb);
            self.unref(d);
        }
        self.dir_mut(pa).remove(&na);
        self.dir_mut(pb).insert(nb, src);
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Exclusive create, then write `len` bytes of `byte`, then close.
    Create(usize, Vec<String>, u16, u8),
    Mkdir(usize, Vec<String>),
    Unlink(usize, Vec<String>),
    Rmdir(usize, Vec<String>),
    Rename(usize, Vec<String>, Vec<String>, u32),
    /// Open an existing file for reading and writing; the handle stays open.
    Open(usize, Vec<String>),
    Close(usize),
    /// Through handle `h` (modulo the open ones): write `len` bytes of `byte` at `off`.
    Write(usize, u16, u16, u8),
    /// Read all of handle `h`'s file.
    Read(usize),
    /// Open, read all, close, by path.
    ReadPath(usize, Vec<String>),
    List(usize, Vec<String>),
}

fn path() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b"]).prop_map(String::from),
        1..=2,
    )
}

fn op() -> impl Strategy<Value = Op> {
    let m = 0usize..2;
    prop_oneof![
        4 => (m.clone(), path(), 0u16..6000, any::<u8>()).prop_map(|(m, p, l, b)| Op::Create(m, p, l, b)),
        3 => (m.clone(), path()).prop_map(|(m, p)| Op::Mkdir(m, p)),
        3 => (m.clone(), path()).prop_map(|(m, p)| Op::Unlink(m, p)),
        2 => (m.clone(), path()).prop_map(|(m, p)| Op::Rmdir(m, p)),
        3 => (m.clone(), path(), path(), prop::sample::select(vec![0, RENAME_NOREPLACE])).prop_map(|(m, a, b, f)| Op::Rename(m, a, b, f)),
        4 => (m.clone(), path()).prop_map(|(m, p)| Op::Open(m, p)),
        2 => any::<usize>().prop_map(Op::Close),
        3 => (any::<usize>(), 0u16..8000, 1u16..3000, any::<u8>()).prop_map(|(h, o, l, b)| Op::Write(h, o, l, b)),
        4 => any::<usize>().prop_map(Op::Read),
        3 => (m.clone(), path()).prop_map(|(m, p)| Op::ReadPath(m, p)),
        2 => (m, prop::sample::select(vec![vec![], vec!["a".to_string()], vec!["b".to_string()]])).prop_map(|(m, p)| Op::List(m, p)),
    ]
}

fn p(path: &[String]) -> Vec<u8> {
    format!("/{}", path.join("/")).into_bytes()
}

fn errno<T>(r: Result<T, FsError>) -> Result<T, Errno> {
    r.map_err(|e| e.errno())
}

fn rw() -> OpenOptions {
    OpenOptions {
        flags: OpenFlags {
            write: true,
            ..OpenFlags::default()
        },
        create: false,
        perm: 0,
    }
}

struct Harness {
    stores: [Arc<dyn KvStore>; 2],
    mounts: [PathFs; 2],
    files: Vec<File>,
    model: Model,
}

/// Compares a result with the model's and applies `then` to the model when both succeeded.
macro_rules! expect_same {
    ($what:expr, $got:expr, $want:expr) => {{
        let (got, want) = ($got, $want);
        prop_assert_eq!(
            got.as_ref().err(),
            want.as_ref().err(),
            "{:?}: fern-fs and the model disagree",
            $what
        );
        (got, want)
    }};
}

impl Harness {
    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let m = &mut self.model;
        match op {
            Op::Create(i, path, len, byte) => {
                let want = m.parent(path).and_then(|(d, n)| {
                    if m.dir(d).expect("dir").contains_key(&n) {
                        Err(libc::EEXIST)
                    } else {
                        Ok((d, n))
                    }
                });
                let got = errno(self.mounts[*i].open(&p(path), OpenOptions::create_new(0o644)));
                let (got, want) = expect_same!(op, got, want);
                if let (Ok(f), Ok((d, n))) = (got, want) {
                    let data = vec![*byte; usize::from(*len)];
                    self.mounts[*i].write_at(&f, 0, &data).expect("write");
                    self.mounts[*i].close(f).expect("close");
                    m.add(d, n, Kind::File(data));
                }
            }
            Op::Mkdir(i, path) => {
                let want = m.parent(path).and_then(|(d, n)| {
                    if m.dir(d).expect("dir").contains_key(&n) {
                        Err(libc::EEXIST)
                    } else {
                        Ok((d, n))
                    }
                });
                let got = errno(self.mounts[*i].mkdir(&p(path), 0o755));
                let (_, want) = expect_same!(op, got, want);
                if let Ok((d, n)) = want {
                    m.add(d, n, Kind::Dir(BTreeMap::new()));
                }
            }
            Op::Unlink(i, path) => {
                let want = m.lookup(path).and_then(|id| match m.dir(id) {
                    Some(_) => Err(libc::EISDIR),
                    None => Ok(id),
                });
                let got = errno(self.mounts[*i].unlink(&p(path)));
                let (_, want) = expect_same!(op, got, want);
                if let Ok(id) = want {
                    let (d, n) = m.parent(path).expect("parent");
                    m.dir_mut(d).remove(&n);
                    m.unref(id);
                }
            }
            Op::Rmdir(i, path) => {
                let want = m.lookup(path).and_then(|id| match m.dir(id) {
                    None => Err(libc::ENOTDIR),
                    Some(e) if !e.is_empty() => Err(libc::ENOTEMPTY),
                    Some(_) => Ok(id),
                });
                let got = errno(self.mounts[*i].rmdir(&p(path)));
                let (_, want) = expect_same!(op, got, want);
                if let Ok(id) = want {
                    let (d, n) = m.parent(path).expect("parent");
                    m.dir_mut(d).remove(&n);
                    m.nodes.remove(&id);
                }
            }
            Op::Rename(i, a, b, flags) => {
                let got = errno(self.mounts[*i].rename(&p(a), &p(b), *flags));
                let want = m.rename(a, b, *flags);
                let _ = expect_same!(op, got, want);
            }
            Op::Open(i, path) => {
                let want = m.lookup(path).and_then(|id| match m.dir(id) {
                    Some(_) => Err(libc::EISDIR),
                    None => Ok(id),
                });
                let got = errno(self.mounts[*i].open(&p(path), rw()));
                let (got, want) = expect_same!(op, got, want);
                if let (Ok(f), Ok(id)) = (got, want) {
                    self.files.push(f);
                    m.open.push((*i, id));
                }
            }
            Op::Close(h) => {
                if self.files.is_empty() {
                    return Ok(());
                }
                let h = h % self.files.len();
                let f = self.files.remove(h);
                let (i, id) = m.open.remove(h);
                self.mounts[i].close(f).expect("close");
                if m.nodes[&id].1 == 0 && !m.open.iter().any(|(_, o)| *o == id) {
                    m.nodes.remove(&id);
                }
            }
            Op::Write(h, off, len, byte) => {
                if self.files.is_empty() {
                    return Ok(());
                }
                let h = h % self.files.len();
                let (i, id) = m.open[h];
                let data = vec![*byte; usize::from(*len)];
                self.mounts[i]
                    .write_at(&self.files[h], u64::from(*off), &data)
                    .expect("write through an open handle");
                let Kind::File(content) = &mut m.nodes.get_mut(&id).expect("node").0 else {
                    panic!("handle of a directory");
                };
                let (off, end) = (usize::from(*off), usize::from(*off) + data.len());
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[off..end].copy_from_slice(&data);
            }
            Op::Read(h) => {
                if self.files.is_empty() {
                    return Ok(());
                }
                let h = h % self.files.len();
                let (i, id) = m.open[h];
                let got = self.mounts[i]
                    .read_at(&self.files[h], 0, 1 << 20)
                    .expect("read through an open handle");
                let Kind::File(content) = &m.nodes[&id].0 else {
                    panic!("handle of a directory");
                };
                prop_assert_eq!(&got, content, "{:?} (node {})", op, id);
            }
            Op::ReadPath(i, path) => {
                let want = m.lookup(path).and_then(|id| match &m.nodes[&id].0 {
                    Kind::Dir(_) => Err(libc::EISDIR),
                    Kind::File(c) => Ok(c.clone()),
                });
                let got = errno(
                    self.mounts[*i]
                        .open(&p(path), OpenOptions::default())
                        .and_then(|f| {
                            let r = self.mounts[*i].read_at(&f, 0, 1 << 20);
                            self.mounts[*i].close(f)?;
                            r
                        }),
                );
                let (got, want) = expect_same!(op, got, want);
                if let (Ok(g), Ok(w)) = (got, want) {
                    prop_assert_eq!(g, w, "{:?}", op);
                }
            }
            Op::List(i, path) => {
                let want = if path.is_empty() {
                    Ok(ROOT)
                } else {
                    m.lookup(path)
                }
                .and_then(|id| m.dir(id).cloned().ok_or(libc::ENOTDIR));
                let got = errno(self.mounts[*i].read_dir(&p(path)));
                let (got, want) = expect_same!(op, got, want);
                if let (Ok(g), Ok(w)) = (got, want) {
                    let names: Vec<String> = g
                        .iter()
                        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                        .collect();
                    prop_assert_eq!(names, w.keys().cloned().collect::<Vec<_>>(), "{:?}", op);
                }
            }
        }
        Ok(())
    }

    /// Both mounts list the model's whole tree, with every file's content.
    fn check_tree(&self) -> Result<(), TestCaseError> {
        for mount in &self.mounts {
            let mut stack = vec![(ROOT, String::new())];
            while let Some((id, path)) = stack.pop() {
                let dirp = if path.is_empty() { "/" } else { path.as_str() };
                let listed = mount
                    .read_dir(dirp.as_bytes())
                    .map_err(|e| TestCaseError::fail(format!("list {dirp}: {e}")))?;
                let entries = self.model.dir(id).expect("dir");
                let names: Vec<String> = listed
                    .iter()
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .collect();
                prop_assert_eq!(&names, &entries.keys().cloned().collect::<Vec<_>>());
                for (name, child) in entries {
                    let cp = format!("{path}/{name}");
                    match &self.model.nodes[child].0 {
                        Kind::Dir(_) => stack.push((*child, cp)),
                        Kind::File(c) => {
                            let f = mount
                                .open(cp.as_bytes(), OpenOptions::default())
                                .map_err(|e| TestCaseError::fail(format!("open {cp}: {e}")))?;
                            let got = mount.read_at(&f, 0, 1 << 20).expect("read");
                            mount.close(f).expect("close");
                            prop_assert_eq!(&got, c, "{}", cp);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("FERN_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

fn mount(store: &Arc<dyn KvStore>) -> PathFs {
    PathFs::new(
        Arc::new(Fs::mount(store.clone()).expect("mount")),
        Cred::root(),
    )
}

/// One case: `ops` on two mounts of a fresh prefix, each mount's store the etcd connection
/// itself or, with `write_back`, that connection through a `WriteBack` that takes the
/// delegation whenever it may (docs/design.md §7.3): then the mounts trade the delegation at
/// nearly every switch, and every result must still be the one model's.
fn run_case(ops: &[Op], write_back: bool) -> Result<(), TestCaseError> {
    let Some(etcd) = shared_for_tests() else {
        return Ok(());
    };
    let cfg = etcd.config(&unique_prefix(if write_back { "two-wb" } else { "two" }));
    let connect = || Arc::new(EtcdStore::connect(&cfg, fern_fs::registry()).expect("connect"));
    let first = connect();
    Fs::mkfs(&*first, MkfsOptions::default()).expect("mkfs");
    let shared = |raw: Arc<EtcdStore>| -> Arc<dyn KvStore> {
        if write_back {
            // No cool-down: a mount takes the part back at its next operation after the
            // other's revoked it, so nearly every switch of mount trades the delegation.
            let cfg = WriteBackConfig {
                cool_down: Duration::ZERO,
                ..held_config(TakePolicy::Always)
            };
            WriteBack::open(raw, fern_fs::registry(), cfg).expect("write-back")
        } else {
            raw
        }
    };
    let stores = [shared(first), shared(connect())];
    let mounts = [mount(&stores[0]), mount(&stores[1])];
    let mut h = Harness {
        stores,
        mounts,
        files: Vec::new(),
        model: Model::new(),
    };
    for op in ops {
        h.apply(op)?;
    }
    h.check_tree()?;
    // Every handle closed: nothing unlinked stays behind, and no registration.
    while let Some(f) = h.files.pop() {
        let (i, _) = h.model.open.pop().expect("handle");
        h.mounts[i].close(f).expect("close");
    }
    for s in &h.stores {
        s.sync().expect("sync");
    }
    let store = &h.stores[0];
    for tree in ["fs.orphan", "fs.open"] {
        let t = store.tree(tree).expect("tree");
        let left = store
            .scan(t, &KeyRange::all(), Direction::Forward, 10)
            .expect("scan");
        prop_assert!(left.is_empty(), "{} keeps {:?}", tree, left);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn two_mounts_match_one_model(ops in prop::collection::vec(op(), 1..50)) {
        run_case(&ops, false)?;
    }

    #[test]
    fn two_write_back_mounts_match_one_model(ops in prop::collection::vec(op(), 1..50)) {
        run_case(&ops, true)?;
    }
}

/// Found by `two_write_back_mounts_match_one_model` (CI, 2026-11-29): the holder creates and
/// closes a file (its registration put and deleted in the overlay), opens it again, and the
/// other mount unlinks it. The reopen's registration went straight to etcd, the revocation's
/// flush then sent the close's buffered delete of that same key after it, the unlink saw no
/// registration and freed the file, and the holder's handle answered `ESTALE`. Registrations
/// are now ordinary writes through the mount's store (docs/design.md §7.3, W2).
#[test]
fn an_open_on_the_holder_survives_the_flush_of_an_earlier_close() {
    let b = || vec!["b".to_string()];
    let ops = [
        Op::Create(0, b(), 0, 0),
        Op::Open(0, b()),
        Op::Unlink(1, b()),
        Op::Write(0, 0, 1, 7),
        Op::Read(0),
    ];
    for _ in 0..3 {
        run_case(&ops, true).expect("one model");
    }
}
