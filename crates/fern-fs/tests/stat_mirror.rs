//! The stat mirror against the store: random mixes of lookup, create, write, read (strict
//! atime, so reads write too), setattr of every kind (chmod, chown, utimes, truncate), link,
//! unlink, rename (plain, noreplace, exchange), close and forget through `Fs`'s inode API — as
//! the kernel drives it — and after every step each attribute this mount answers (getattr, the
//! replies of lookup and setattr) must equal what a fresh read-only mount reads from the store
//! (docs/fs-design.md §4, "stat mirror"); an open file that lost its last name must show
//! no links. Cases: FERN_PROPTEST_CASES (default 96).

mod common;
#[allow(unused_imports)] // unused when another backend's test crate includes this file
use common::mem_store as open_store;

use std::collections::BTreeMap;

use fern_fs::{
    AtimeMode, AtimePolicy, Attr, Cred, Fh, Fs, InodeId, OpenFlags, SetAttr, TimeSet, Timespec,
    RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use proptest::prelude::*;

const NAMES: [&[u8]; 3] = [b"a", b"b", b"c"];

#[derive(Clone, Debug)]
enum Op {
    Lookup(u8, u8),
    Create(u8, u8),
    Write(usize, u16, u16),
    Read(usize, u16),
    Setattr(u8, u8, u8),
    Link(u8, u8, u8, u8),
    Unlink(u8, u8),
    Rename(u8, u8, u8, u8, u32),
    Close(usize),
    Forget(u8, u8),
    Getattr(u8, u8),
}

fn dir() -> impl Strategy<Value = u8> {
    0u8..2
}
fn name() -> impl Strategy<Value = u8> {
    0u8..3
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (dir(), name()).prop_map(|(d, n)| Op::Lookup(d, n)),
        3 => (dir(), name()).prop_map(|(d, n)| Op::Create(d, n)),
        3 => (any::<usize>(), 0u16..9000, 1u16..5000).prop_map(|(h, o, l)| Op::Write(h, o, l)),
        2 => (any::<usize>(), 0u16..9000).prop_map(|(h, o)| Op::Read(h, o)),
        5 => (dir(), name(), 0u8..6).prop_map(|(d, n, k)| Op::Setattr(d, n, k)),
        2 => (dir(), name(), dir(), name()).prop_map(|(a, b, c, d)| Op::Link(a, b, c, d)),
        2 => (dir(), name()).prop_map(|(d, n)| Op::Unlink(d, n)),
        3 => (dir(), name(), dir(), name(), prop::sample::select(vec![0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
            .prop_map(|(a, b, c, d, f)| Op::Rename(a, b, c, d, f)),
        1 => any::<usize>().prop_map(Op::Close),
        1 => (dir(), name()).prop_map(|(d, n)| Op::Forget(d, n)),
        2 => (dir(), name()).prop_map(|(d, n)| Op::Getattr(d, n)),
    ]
}

struct Harness {
    env: common::Env,
    dirs: [InodeId; 2],
    /// Inodes this mount holds lookups on, with their count.
    pinned: BTreeMap<InodeId, u64>,
    open: Vec<(Fh, InodeId)>,
    tick: i64,
}

impl Harness {
    fn new() -> Harness {
        let env = common::env();
        env.fs.set_atime_policy(AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: false,
        });
        let sub = env
            .fs
            .mkdir(&Cred::root(), InodeId::ROOT, b"d", 0o755)
            .expect("mkdir")
            .ino;
        let mut pinned = BTreeMap::new();
        pinned.insert(sub, 1);
        Harness {
            env,
            dirs: [InodeId::ROOT, sub],
            pinned,
            open: Vec::new(),
            tick: 0,
        }
    }

    fn fs(&self) -> &Fs {
        &self.env.fs
    }

    /// What a mount with nothing in memory reads for `name` in directory `d`.
    fn fresh(&self, d: u8, name: &[u8]) -> Option<Attr> {
        let ro = Fs::mount_read_only(self.env.store.clone()).expect("fresh mount");
        if d == 1 {
            ro.lookup(InodeId::ROOT, b"d").expect("fresh d");
        }
        ro.lookup(self.dirs[d as usize], name).ok()
    }

    fn fresh_of(&self, ino: InodeId) -> Option<Attr> {
        let ro = Fs::mount_read_only(self.env.store.clone()).expect("fresh mount");
        if ino == InodeId::ROOT {
            return ro.getattr(ino).ok();
        }
        let d = ro.lookup(InodeId::ROOT, b"d").expect("fresh d");
        if d.ino == ino {
            return Some(d);
        }
        for dir in self.dirs {
            for n in NAMES {
                if let Ok(a) = ro.lookup(dir, n) {
                    if a.ino == ino {
                        return Some(a);
                    }
                }
            }
        }
        None
    }

    fn pin(&mut self, a: &Attr) {
        *self.pinned.entry(a.ino).or_default() += 1;
    }

    fn ino_of(&self, d: u8, n: u8) -> Option<InodeId> {
        let a = self.fresh(d, NAMES[n as usize])?;
        self.pinned.contains_key(&a.ino).then_some(a.ino)
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let cred = Cred::root();
        match *op {
            Op::Lookup(d, n) => {
                if let Ok(a) = self.fs().lookup(self.dirs[d as usize], NAMES[n as usize]) {
                    self.pin(&a);
                    prop_assert_eq!(Some(a), self.fresh(d, NAMES[n as usize]), "lookup reply");
                }
            }
            Op::Create(d, n) => {
                let flags = OpenFlags {
                    write: true,
                    ..OpenFlags::default()
                };
                let r = self.fs().create(
                    &cred,
                    self.dirs[d as usize],
                    NAMES[n as usize],
                    0o644,
                    flags,
                );
                if let Ok((a, fh)) = r {
                    self.pin(&a);
                    self.open.push((fh, a.ino));
                }
            }
            Op::Write(h, off, len) => {
                if !self.open.is_empty() {
                    let (fh, _) = self.open[h % self.open.len()];
                    let data = vec![7u8; len as usize];
                    self.fs().write(fh, u64::from(off), &data).expect("write");
                }
            }
            Op::Read(h, off) => {
                if !self.open.is_empty() {
                    let (_, ino) = self.open[h % self.open.len()];
                    // An unlinked and closed elsewhere inode may be gone: only the answer matters.
                    let _ = self.fs().read(ino, u64::from(off), 3000);
                }
            }
            Op::Setattr(d, n, kind) => {
                let Some(ino) = self.ino_of(d, n) else {
                    return Ok(());
                };
                self.tick += 1;
                let t = TimeSet::At(Timespec {
                    sec: self.tick,
                    nsec: 5,
                });
                let sa = match kind {
                    0 => SetAttr {
                        mode: Some(0o600 + u32::from(n)),
                        ..SetAttr::default()
                    },
                    1 => SetAttr {
                        uid: Some(1000 + self.tick as u32),
                        gid: Some(7),
                        ..SetAttr::default()
                    },
                    2 => SetAttr {
                        atime: Some(t),
                        mtime: Some(t),
                        ..SetAttr::default()
                    },
                    3 => SetAttr {
                        atime: Some(TimeSet::Now),
                        mtime: Some(TimeSet::Now),
                        ..SetAttr::default()
                    },
                    _ => SetAttr {
                        size: Some(u64::from(kind) * 1500),
                        ..SetAttr::default()
                    },
                };
                if kind == 5 {
                    // The blind variant (chmod(2), utimensat(2) through fern-fuse).
                    let _ = self.fs().set_attributes_as(&cred, ino, &sa);
                } else if let Ok(a) = self.fs().setattr(ino, &sa) {
                    prop_assert_eq!(Some(a), self.fresh(d, NAMES[n as usize]), "setattr reply");
                }
            }
            Op::Link(d, n, d2, n2) => {
                if let Some(ino) = self.ino_of(d, n) {
                    if let Ok(a) = self
                        .fs()
                        .link(ino, self.dirs[d2 as usize], NAMES[n2 as usize])
                    {
                        self.pin(&a);
                    }
                }
            }
            Op::Unlink(d, n) => {
                let _ = self.fs().unlink(self.dirs[d as usize], NAMES[n as usize]);
            }
            Op::Rename(d, n, d2, n2, flags) => {
                let (p, q) = (self.dirs[d as usize], self.dirs[d2 as usize]);
                let _ = self
                    .fs()
                    .rename(p, NAMES[n as usize], q, NAMES[n2 as usize], flags);
            }
            Op::Close(h) => {
                if !self.open.is_empty() {
                    let (fh, _) = self.open.remove(h % self.open.len());
                    self.fs().release(fh).expect("release");
                }
            }
            Op::Forget(d, n) => {
                if let Some(ino) = self.ino_of(d, n) {
                    if ino != self.dirs[1] {
                        let count = self.pinned.remove(&ino).unwrap_or(0);
                        self.fs().forget(ino, count);
                    }
                }
            }
            Op::Getattr(d, n) => {
                if let Some(ino) = self.ino_of(d, n) {
                    prop_assert_eq!(
                        self.fs().getattr(ino).ok(),
                        self.fresh(d, NAMES[n as usize]),
                        "getattr"
                    );
                }
            }
        }
        self.check_all()
    }

    /// Every pinned inode that still has a name, and both directories, as the store says.
    fn check_all(&self) -> Result<(), TestCaseError> {
        for &ino in self.pinned.keys().chain([InodeId::ROOT].iter()) {
            if let Some(want) = self.fresh_of(ino) {
                prop_assert_eq!(
                    self.fs().getattr(ino).ok(),
                    Some(want),
                    "getattr of {:?}",
                    ino
                );
            }
        }
        // An open file without a name is an orphan: no fresh mount can name it, but its count
        // must have dropped to zero.
        for &(_, ino) in &self.open {
            if self.fresh_of(ino).is_none() {
                let nlink = self.fs().getattr(ino).map(|a| a.nlink).ok();
                prop_assert_eq!(nlink, Some(0), "orphan {:?}", ino);
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::proptest_cases(), ..ProptestConfig::default() })]

    #[test]
    fn every_stat_answered_from_memory_is_the_stored_one(ops in prop::collection::vec(op(), 1..60)) {
        let mut h = Harness::new();
        for op in &ops {
            h.apply(op)?;
        }
    }
}
