//! The mounted file system: construction (mkfs, mount with orphan cleanup) and the helpers
//! every operation shares (name validation, finding and reading an inode's stat, freeing an
//! inode's keys). It owns the `Fs` struct; the operations live in their own modules
//! (`namespace`, `rename`, `data`, `inode_ops`, `dir`, `xattr`). It must never bypass
//! the `KvStore` trait.
//!
//! Single writer: one `Fs` is the only writer of its store. In-memory state (stat locations,
//! name cache, open counts) is exact only under that rule; namespace changes still run as
//! optimistic transactions. On a shared store (`KvStore::session` is `Some`, asked once at
//! mount) the single-writer caches are built switched off, new inodes keep their stat in the
//! inode tree (its key never moves, whatever another mount renames or links), and open files
//! are registered with the store (`shared.rs`); docs/distributed.md §7.

use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use fern_kv::{KvRead, KvStore, RetryPolicy, TreeId, WriteBatch, WriteOptions};
use parking_lot::Mutex;

use crate::alloc::IdAllocator;
use crate::attr::{Attr, FileType, Stat, Timespec};
use crate::cache::{DirEntries, InodeTableFigures, Inodes, Loc, NameCache, Releasable};
use crate::error::{FsError, FsResult};
use crate::ids::{Fh, InodeId};
use crate::locks::Stripes;
use crate::record::{Dentry, Inode};
use crate::schema::{self, Superblock, Trees};
use crate::upsert::{StatDelta, FN_STAT};

/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
/// Longest symlink target.
pub const PATH_MAX: usize = 4095;
/// Largest file size: block numbers stay far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 50;

/// Parameters of a new file system.
#[derive(Clone, Copy, Debug)]
pub struct MkfsOptions {
    /// Data block size: a power of two in 512..=65536. Default 4096.
    pub block_size: u32,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
    /// Permission bits of the root directory.
    pub root_perm: u32,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        Self {
            block_size: 4096,
            root_uid: 0,
            root_gid: 0,
            root_perm: 0o755,
        }
    }
}

/// An open file or directory handle's state.
#[derive(Clone, Debug)]
pub(crate) struct Handle {
    pub ino: InodeId,
    pub append: bool,
    pub write: bool,
    /// Opened by a caller without root privilege: its writes clear set-id bits. False for
    /// [`Fs::open`] without credentials (a trusted caller).
    pub kill_suid: bool,
    /// For directory handles: the listing's position (names returned, entries read ahead).
    pub dir_names: Option<crate::dir::DirHandle>,
}

/// Most data blocks an unlinked file's rows are deleted by one point delete each instead of a
/// range delete (`Fs::free_inode`). A range delete stays in every buffer on its way down and
/// each point read there checks it: after 20,000 one-file range deletes, point reads of other
/// keys of the tree took 2.0–3.4 µs instead of 1.0–1.1 (fern-tree `examples/range_probe.rs`).
pub(crate) const POINT_DELETE_BLOCKS: u64 = 8;

/// Which rows of an inode besides its data and its entry may exist when it is freed
/// ([`Fs::free_inode`]). A delete of a row that cannot exist is not free: each tree a batch
/// touches costs the engine a root update, and a range delete slows every point read below it
/// until flushed (an unlink of a small file wrote to five trees, three of them for nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InodeRows {
    /// Extended attributes (`fs.xattr`): false only for an inode this mount knows has none
    /// (`Inodes::xattr_free`).
    pub xattrs: bool,
    /// An inode record and an orphan record (`fs.inode`, `fs.orphan`): false only for a file
    /// freed through its inline entry — its one home (fsck S1), and named, so no orphan (S7).
    pub records: bool,
}

impl InodeRows {
    /// Every kind of row may exist (an orphan, or an inode this mount knows nothing about).
    pub(crate) const ALL: InodeRows = InodeRows {
        xattrs: true,
        records: true,
    };
}

/// A mounted fernfs. Shareable between threads (`Arc<Fs>`).
pub struct Fs {
    pub(crate) kv: Arc<dyn KvStore>,
    pub(crate) t: Trees,
    pub(crate) sb: Superblock,
    pub(crate) ids: IdAllocator,
    pub(crate) locks: Stripes,
    pub(crate) inodes: Inodes,
    pub(crate) names: NameCache,
    pub(crate) dirents: DirEntries,
    pub(crate) dir_table: crate::owner::DirTable,
    pub(crate) handles: Mutex<HashMap<Fh, Handle>>,
    pub(crate) next_fh: AtomicU64,
    pub(crate) policy: RetryPolicy,
    /// Mounted with [`Fs::mount_read_only`]: reads never refresh atime (as a read-only mount
    /// of any file system), so they never write.
    pub(crate) read_only: bool,
    pub(crate) atime: crate::atime::AtimeSetting,
    /// Set on a shared store: this mount's session and the registration tree (shared.rs).
    pub(crate) shared: Option<crate::shared::Shared>,
    /// Whole extents read for requests that covered part of one, or read ahead
    /// (extent_cache.rs).
    pub(crate) extent_cache: crate::extent_cache::ExtentCache,
    /// Directories read ahead for lookups on a shared store (lookahead.rs).
    pub(crate) lookahead: crate::lookahead::LookAhead,
}

impl Drop for Fs {
    fn drop(&mut self) {
        // Handles still open die with this `Fs`; on a shared store their registrations go too
        // (shared.rs), as the session's would at a crash.
        self.drop_registrations();
        // Accesses not written yet (shared stores), as an unmount's sync would.
        if let Err(e) = self.flush_atimes() {
            log::warn!("writing access times at close failed: {e}");
        }
    }
}

impl Fs {
    /// Writes a new, empty file system into `kv` (which must have been opened with
    /// [`crate::registry`]). Fails with `Exists` if `kv` already holds one.
    pub fn mkfs(kv: &dyn KvStore, opts: MkfsOptions) -> FsResult<()> {
        if !schema::valid_block_size(opts.block_size) {
            return Err(FsError::Invalid);
        }
        let t = Trees::open(kv)?;
        if kv.get(t.meta, schema::SUPER_KEY)?.is_some() {
            return Err(FsError::Exists);
        }
        let sb = Superblock {
            version: schema::FORMAT_VERSION,
            block_size: opts.block_size,
        };
        let now = Timespec::now();
        let mode = FileType::Directory.mode_bits() | (opts.root_perm & 0o7777);
        let root = Inode {
            stat: Stat::new(mode, opts.root_uid, opts.root_gid, 2, now),
            payload: vec![],
        };
        let mut b = WriteBatch::new();
        b.put(t.meta, schema::SUPER_KEY.to_vec(), sb.encode());
        b.put(
            t.meta,
            schema::ALLOC_KEY.to_vec(),
            InodeId::FIRST_FREE.to_be_bytes().to_vec(),
        );
        b.put(t.inode, schema::id_key(InodeId::ROOT), root.encode_record());
        b.put(
            t.dirparent,
            schema::id_key(InodeId::ROOT),
            InodeId::ROOT.0.to_be_bytes().to_vec(),
        );
        kv.write(b, WriteOptions::SYNC)?;
        Ok(())
    }

    /// Bounds the memory of the names this mount remembers: a quarter for the directory
    /// entries of path walks (`DirEntries`; default 65,536 entries), the rest for the name
    /// sets of the directories it made (`NameCache`; default 32 MiB). A mount inside a memory
    /// budget gives them a share of it.
    pub fn set_name_cache_bytes(&self, bytes: usize) {
        self.dirents.set_max_bytes(bytes / 4);
        self.names.set_max_bytes(bytes - bytes / 4);
    }

    /// Bounds the memory of the inode table (0: no bound, the default). The kernel decides
    /// which inodes it holds, so past the bound the table names inodes for the kernel to
    /// forget ([`Fs::inodes_to_release`]); a mount inside a memory budget gives it a share.
    pub fn set_inode_table_bytes(&self, bytes: usize) {
        self.inodes.set_max_bytes(bytes);
    }

    /// Whether the inode table is past its bound (cheap: one atomic load; the FUSE adapter
    /// asks after each reply that handed the kernel an inode).
    pub fn inodes_over_bound(&self) -> bool {
        self.inodes.over_bound()
    }

    /// Up to `n` inodes the kernel should be asked to forget to bring the inode table back
    /// inside its bound (none when it is inside; see `Inodes::release_candidates`).
    pub fn inodes_to_release(&self, n: usize) -> Vec<Releasable> {
        self.inodes.release_candidates(n)
    }

    /// The (parent, name) entry the inode table holds for `id`, if it is stored in one: what
    /// a kernel that cannot prune by inode is asked to drop instead.
    pub fn inode_entry(&self, id: InodeId) -> Option<(InodeId, Vec<u8>)> {
        self.inodes
            .with(id, |k| match &k.loc {
                Loc::Entry { parent, name } => Some((*parent, name.clone())),
                _ => None,
            })
            .flatten()
    }

    /// The inode table's size, bound and releases.
    pub fn inode_table_figures(&self) -> InodeTableFigures {
        self.inodes.figures()
    }

    /// Mounts the file system in `kv`, freeing the data of files that were unlinked while open
    /// when the previous mount stopped (nothing can hold them open any more). On a shared
    /// store, only those no live mount has registered as open (shared.rs).
    pub fn mount(kv: Arc<dyn KvStore>) -> FsResult<Fs> {
        let mut fs = Self::mount_read_only(kv)?;
        fs.read_only = false;
        if fs.sb.version < schema::FORMAT_VERSION {
            // Before any write of this mount (schema.rs, FORMAT_VERSION): the log keeps
            // batches in order, so no overlay row can outlive a crash that loses this.
            fs.sb.version = schema::FORMAT_VERSION;
            let mut b = WriteBatch::new();
            b.put(fs.t.meta, schema::SUPER_KEY.to_vec(), fs.sb.encode());
            fs.kv.write(b, WriteOptions::NO_SYNC)?;
        }
        // Best effort (an orphan left here is freed by its holders' last close or a later
        // mount): a conflict that outlasts the retries — another mount's registrations
        // churning on a shared store, or a read invalidated under a leader change — must not
        // fail the mount itself.
        match fs.clean_orphans() {
            Err(FsError::Kv(e)) if e.is_conflict() => {
                log::warn!("orphans not freed at mount (a later mount frees them): {e}");
            }
            r => r?,
        }
        Ok(fs)
    }

    /// Mounts the file system in `kv` without writing anything: files unlinked while open stay
    /// pending for the next read-write mount. For checkers and exporters on a store opened
    /// read-only (every write then fails with the store's error).
    pub fn mount_read_only(kv: Arc<dyn KvStore>) -> FsResult<Fs> {
        let t = Trees::open(&*kv)?;
        let sb = match kv.get(t.meta, schema::SUPER_KEY)? {
            Some(v) => Superblock::decode(&v)?,
            None => return Err(FsError::NotFormatted("no superblock".into())),
        };
        // Asked once: whether other mounts write this store decides which caches exist.
        let shared = match kv.session()? {
            Some(s) => {
                let open = kv.tree(schema::OPEN_TREE)?;
                // Registrations may then ride in ordinary batches (a create's, shared.rs).
                s.hold_tree(open)?;
                Some(crate::shared::Shared::new(s.id(), open))
            }
            None => None,
        };
        let on = shared.is_some();
        let fs = Fs {
            kv,
            t,
            sb,
            ids: IdAllocator::new(),
            locks: Stripes::new(),
            inodes: Inodes::new(on),
            names: NameCache::new(on),
            dirents: DirEntries::new(on),
            dir_table: Default::default(),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            policy: RetryPolicy::default(),
            read_only: true,
            atime: Default::default(),
            shared,
            extent_cache: Default::default(),
            lookahead: Default::default(),
        };
        fs.inodes
            .pin(InodeId::ROOT, Loc::Inode, FileType::Directory);
        Ok(fs)
    }

    /// The data block size chosen at mkfs.
    pub fn block_size(&self) -> u32 {
        self.sb.block_size
    }

    /// The store under this file system.
    pub fn store(&self) -> &Arc<dyn KvStore> {
        &self.kv
    }

    /// Mount-time cleanup: frees every orphan (a file unlinked while open when its last mount
    /// stopped) that no session holds open — on a sole writer, every orphan, since
    /// `held_open` is then false without a read. One transaction per page of orphans, sized so
    /// its deletes (4 per orphan) and its reads (2 per orphan) fit the store's limits: resumable,
    /// each step idempotent, and a registration landing meanwhile on a shared store conflicts
    /// it. Orphans still held are left to their holders' last close or to a later mount.
    fn clean_orphans(&self) -> FsResult<()> {
        let per_page = self
            .kv
            .limits()
            .max_ops
            .map_or(64, |m| (m / 4).clamp(1, 64));
        let mut range = fern_kv::KeyRange::all();
        loop {
            let page =
                self.kv
                    .scan(self.t.orphan, &range, fern_kv::Direction::Forward, per_page)?;
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            range.lo = std::ops::Bound::Excluded(last.clone());
            let ids = page
                .iter()
                .map(|(k, _)| schema::parse_id_key(k))
                .collect::<FsResult<Vec<_>>>()?;
            fern_kv::transact_opts(&*self.kv, &self.policy, |txn| {
                let mut freed = false;
                for &ino in &ids {
                    freed |= self.free_orphan_unless_held(txn, ino, None)?;
                }
                Ok::<_, FsError>(((), crate::shared::freeing_if(freed)))
            })?;
        }
    }

    /// Appends the deletion of every key of inode `id`: data, and those of xattrs, inode
    /// record and orphan record that `rows` says may exist. The data goes by one delete per
    /// block when `size` (exact, when given) leaves at most [`POINT_DELETE_BLOCKS`] of them —
    /// D1: no row lies at or past the size — else by one range delete; the xattrs by a range
    /// delete.
    pub(crate) fn free_inode(
        &self,
        b: &mut WriteBatch,
        id: InodeId,
        size: Option<u64>,
        rows: InodeRows,
    ) {
        let bs = u64::from(self.block_size());
        match size.map(|s| s.div_ceil(bs)) {
            Some(blocks) if blocks <= POINT_DELETE_BLOCKS => {
                for n in 0..blocks {
                    b.delete(self.t.data, schema::block_key(id, n));
                }
            }
            _ => {
                let (lo, hi) = schema::blocks_from(id, 0);
                b.delete_range(self.t.data, lo, hi);
            }
        }
        if rows.xattrs {
            let (lo, hi) = schema::id_prefix_range(id);
            b.delete_range(self.t.xattr, lo, hi);
        }
        if rows.records {
            b.delete(self.t.inode, schema::id_key(id));
            b.delete(self.t.orphan, schema::id_key(id));
        }
    }

    /// The stat location of an inode this mount knows.
    pub(crate) fn loc(&self, ino: InodeId) -> FsResult<(Loc, FileType)> {
        match self.inodes.with(ino, |k| {
            (!matches!(k.loc, Loc::Gone)).then(|| (k.loc.clone(), k.kind))
        }) {
            Some(Some(found)) => Ok(found),
            // On a shared store the kernel may still name an inode freed here by a last close
            // after another mount removed its name: ESTALE makes the kernel look the name up
            // again (LOOKUP_REVAL) instead of reporting it missing.
            Some(None) if self.is_shared() => Err(FsError::Stale),
            Some(None) => Err(FsError::NotFound),
            None => Err(FsError::Stale),
        }
    }

    /// Reads inode `ino` at `loc` through `r` (the store or a transaction).
    pub(crate) fn read_inode_at(&self, r: &dyn KvRead, ino: InodeId, loc: &Loc) -> FsResult<Inode> {
        match loc {
            Loc::Entry { parent, name } => {
                let v = r.get(self.t.dentry, &schema::named_key(*parent, name))?;
                match v.map(|v| Dentry::decode(&v)).transpose()? {
                    Some(Dentry::Inline { id, inode }) if id == ino => Ok(inode),
                    Some(Dentry::Linked { id, .. }) if id == ino => self.read_record(r, ino),
                    // The table is kept exact under the inode's lock, so this is a bug or a
                    // second writer; refuse rather than return another file's attributes.
                    _ => Err(FsError::Stale),
                }
            }
            Loc::Inode => self.read_record(r, ino),
            Loc::Gone => Err(FsError::NotFound),
        }
    }

    pub(crate) fn read_record(&self, r: &dyn KvRead, ino: InodeId) -> FsResult<Inode> {
        match r.get(self.t.inode, &schema::id_key(ino))? {
            Some(v) => Inode::decode_record(&v),
            None => {
                // Another mount removed it: the kernel retries with a fresh lookup (ESTALE,
                // LOOKUP_REVAL), which must not be answered from rows read ahead before the
                // removal (lookahead.rs).
                self.lookahead.forget_all();
                Err(FsError::Stale)
            }
        }
    }

    /// Reads inode `ino` wherever its stat is.
    pub(crate) fn read_inode(&self, ino: InodeId) -> FsResult<Inode> {
        let (loc, _) = self.loc(ino)?;
        self.read_inode_at(&*self.kv, ino, &loc)
    }

    /// The (tree, key) holding the stat of an inode at `loc`.
    pub(crate) fn stat_key(&self, ino: InodeId, loc: &Loc) -> FsResult<(TreeId, Vec<u8>)> {
        match loc {
            Loc::Entry { parent, name } => Ok((self.t.dentry, schema::named_key(*parent, name))),
            Loc::Inode => Ok((self.t.inode, schema::id_key(ino))),
            Loc::Gone => Err(FsError::NotFound),
        }
    }

    /// Appends a blind stat update of `ino` at `loc`. Returns the stat the mirror held until
    /// now (`None`: not mirrored): once the batch has committed, the caller, still holding
    /// `ino`'s lock, passes it to [`Fs::stat_applied`].
    pub(crate) fn upsert_stat(
        &self,
        b: &mut WriteBatch,
        ino: InodeId,
        loc: &Loc,
        d: &StatDelta,
    ) -> FsResult<Option<Stat>> {
        let (tree, key) = self.stat_key(ino, loc)?;
        b.upsert(tree, key, FN_STAT, d.encode());
        // The caller holds `ino`'s lock: the mirror stays empty until the write has committed
        // and the lock's holder (or a later one) sets it from the store's value.
        Ok(self.inodes.drop_stat(ino))
    }

    /// The stat of `ino` for a caller holding its lock: the mirror, or one read of the store
    /// that then fills it (exact: no stat write of `ino` is in flight while the lock is held).
    pub(crate) fn stat_locked(&self, ino: InodeId) -> FsResult<Stat> {
        let (loc, _) = self.loc(ino)?;
        if let Some(s) = self.inodes.stat(ino) {
            return Ok(s);
        }
        let s = self.read_inode_at(&*self.kv, ino, &loc)?.stat;
        self.inodes.set_stat(ino, s);
        Ok(s)
    }

    /// After a committed blind stat update `d` of `ino` (the caller still holding its lock):
    /// the mirror becomes `before` (what [`Fs::upsert_stat`] returned) with `d` applied, which
    /// is what the store now holds. `None` when nothing was mirrored.
    pub(crate) fn stat_applied(
        &self,
        ino: InodeId,
        before: Option<Stat>,
        d: &StatDelta,
    ) -> Option<Stat> {
        let mut s = before?;
        d.apply(&mut s);
        self.inodes.set_stat(ino, s);
        Some(s)
    }

    /// Mirrors `stat`, read from the store without `ino`'s lock after
    /// [`crate::locks::Stripes::releases`] returned `since`, if that proves it current: `ino`'s
    /// stripe is free now (or is that of `held`, a lock the caller holds since before `since`),
    /// and no lock set was released since
    /// `since` — every stat write holds `ino`'s lock until after its commit, so a write that
    /// committed after the read began would have released it in between.
    pub(crate) fn seed_stat(&self, ino: InodeId, held: Option<InodeId>, stat: Stat, since: u64) {
        if self.is_shared() {
            return;
        }
        self.locks.with_free(ino, held, || {
            if self.locks.releases() == since {
                self.inodes.update(ino, |k| {
                    k.stat.get_or_insert(stat);
                });
            }
        });
    }

    /// Public attributes of `inode` with id `ino`.
    pub(crate) fn attr_of(&self, ino: InodeId, inode: &Inode) -> FsResult<Attr> {
        self.attr_of_stat(ino, inode.stat)
    }

    /// Public attributes of `ino` whose stored stat is `stat`: on a shared store with this
    /// mount's access not written yet applied (atime.rs).
    pub(crate) fn attr_of_stat(&self, ino: InodeId, stat: Stat) -> FsResult<Attr> {
        self.with_pending_atime(ino, stat)
            .to_attr(ino, self.sb.block_size)
    }
}

/// Checks a single path component.
pub(crate) fn validate_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}
