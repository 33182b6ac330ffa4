//! What a mount of a *shared* store does that a sole writer need not (docs/distributed.md §7):
//! open-file registrations. A shared store (`KvStore::session` is `Some`) may be written by
//! other mounts at any moment, so this mount's open counts alone cannot say whether a file
//! whose last name goes is still open somewhere. Each mount therefore registers its first
//! open of a regular file as a key of the `fs.open` tree held by its session (etcd: its
//! lease), removes it at its last close, and:
//!
//! * an unlink (or rename over the file) on any mount orphans the file instead of freeing it
//!   while any registration exists — read in the same optimistic transaction, so a
//!   registration that lands concurrently conflicts it and it reruns;
//! * the last close on a mount frees an orphan no other mount holds;
//! * mount-time cleanup (fs.rs `clean_orphans`, through `held_open`) frees only orphans with
//!   no registration left (the holders closed it or died: a dead mount's session ends and its
//!   registrations with it).
//!
//! A registration names the session *and* the `Fs` (a number unique in the process), so two
//! `Fs` of one store — one session — never remove each other's registration; and an `Fs`
//! dropped with handles still open removes its registrations (no handle can read through it
//! any more), as a crash would by ending the session, so that a later `Fs` of the same
//! store frees those orphans at its mount instead of waiting for the session to end.
//!
//! It owns the registration keys and these rules; it must never free a file another mount
//! holds open. Directories are not registered: a removed directory has no data to
//! keep, and another mount's handle of it lists nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use fern_kv::{transact_opts, Direction, KeyRange, KvRead, KvTxn, WriteOptions};

use crate::cache::Loc;
use crate::error::{FsError, FsResult};
use crate::fs::{Fs, InodeRows};
use crate::ids::InodeId;
use crate::schema;

/// This mount's identity on a shared store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shared {
    /// The session id (registrations are keyed by it).
    pub session: u64,
    /// This `Fs` among those of the process (so among those of the session).
    pub mount: u64,
    /// The `fs.open` tree.
    pub open: fern_kv::TreeId,
}

impl Shared {
    /// The identity of a new `Fs` of `session`.
    pub(crate) fn new(session: u64, open: fern_kv::TreeId) -> Self {
        static NEXT_MOUNT: AtomicU64 = AtomicU64::new(1);
        Shared {
            session,
            mount: NEXT_MOUNT.fetch_add(1, Ordering::Relaxed),
            open,
        }
    }

    fn key(&self, ino: InodeId) -> Vec<u8> {
        schema::open_key(ino, self.session, self.mount)
    }
}

/// Attempts of [`Fs::free_if_unheld`]: failing costs nothing but a later free, so it does not
/// wait out a long contention.
const FREE_ATTEMPTS: u32 = 4;

impl Fs {
    /// Whether other mounts may write this store (then no single-writer cache is trusted).
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// On a shared store, checks in transaction `r` that directory `dir` (at `loc`) still
    /// exists before a name is put in it: another mount may have removed it while this
    /// mount's kernel still caches it, and a name put in a removed directory would be lost.
    /// The read also makes a concurrent rmdir conflict the transaction. Nothing to do on a
    /// sole writer (its own rmdir marks the directory, which `live_dir` checks).
    pub(crate) fn dir_alive(&self, r: &dyn KvRead, dir: InodeId, loc: &Loc) -> FsResult<()> {
        if !self.is_shared() {
            return Ok(());
        }
        match self.read_inode_at(r, dir, loc) {
            Ok(inode) if inode.stat.nlink > 0 => Ok(()),
            Ok(_) | Err(FsError::Stale | FsError::NotFound) => Err(FsError::NotFound),
            Err(e) => Err(e),
        }
    }

    /// Registers this mount's first open of file `ino` (the caller holds `ino`'s lock), then
    /// checks the file still exists: an unlink that committed before the registration may have
    /// freed it, and one that commits after sees the registration. On failure nothing stays
    /// registered.
    pub(crate) fn register_open(&self, ino: InodeId) -> FsResult<()> {
        let Some(sh) = self.shared else {
            return Ok(());
        };
        let key = sh.key(ino);
        // An ordinary write: the store holds every put into `fs.open` by the session
        // (`hold_tree`, asked at mount), and a write through the mount's own store is ordered
        // with the mount's other writes. A put beside the store — straight to the session —
        // could land before a buffered delete of the same key that a write-back store sends
        // later, and so vanish while the file is open (two_mounts.rs found it).
        let mut b = fern_kv::WriteBatch::new();
        b.put(sh.open, key.clone(), Vec::new());
        self.kv.write(b, WriteOptions::NO_SYNC)?;
        if let Err(e) = self.read_inode(ino) {
            let mut b = fern_kv::WriteBatch::new();
            b.delete(sh.open, key);
            // Best effort: a registration left behind only delays freeing until this mount's
            // session ends.
            let _ = self.kv.write(b, WriteOptions::NO_SYNC);
            return Err(e);
        }
        Ok(())
    }

    /// Adds to the batch creating regular file `ino` this mount's registration of its first
    /// open (the caller opens it right after, with `registered`): the store holds the key by
    /// the session (`KvSession::hold_tree`, asked at mount), so it is the same key
    /// [`Fs::register_open`] puts, made atomic with the file's name — 2 round trips fewer
    /// per create on etcd. Nothing on a sole-writer store.
    pub(crate) fn register_with_create(&self, b: &mut fern_kv::WriteBatch, ino: InodeId) {
        if let Some(sh) = self.shared {
            b.put(sh.open, sh.key(ino), Vec::new());
        }
    }

    /// This mount's last close of file `ino` (the caller holds `ino`'s lock): removes its
    /// registration and, if the file is an orphan no other session holds, frees it in the same
    /// transaction. Returns whether it was freed.
    pub(crate) fn unregister_open(&self, ino: InodeId) -> FsResult<bool> {
        let Some(sh) = self.shared else {
            return Ok(false);
        };
        let key = sh.key(ino);
        transact_opts(&*self.kv, &self.policy, |txn| {
            txn.batch().delete(sh.open, key.clone());
            let freed = self.free_orphan_unless_held(txn, ino, Some(&key))?;
            Ok::<_, FsError>((freed, freeing_if(freed)))
        })
    }

    /// Frees orphan `ino` if no session holds it open, in one transaction that reads its
    /// registrations; returns whether it did. Called right after a transaction that removed the
    /// file's last name (namespace.rs `drop_link`: it orphans a file without reading its
    /// registrations once reading them kept conflicting). Best effort, with few
    /// attempts: when another mount's opens and closes keep conflicting it, that mount holds
    /// the file, and its last close frees the orphan (`unregister_open`), or a later mount's
    /// cleanup does. Never frees on a sole-writer store (nothing is orphaned there but files
    /// this mount holds open).
    pub(crate) fn free_if_unheld(&self, ino: InodeId) -> bool {
        if self.shared.is_none() {
            return false;
        }
        let policy = fern_kv::RetryPolicy {
            max_attempts: FREE_ATTEMPTS,
            ..self.policy
        };
        let freed = transact_opts(&*self.kv, &policy, |txn| {
            let freed = self.free_orphan_unless_held(txn, ino, None)?;
            Ok::<_, FsError>((freed, freeing_if(freed)))
        });
        // An error leaves the orphan to its holders' last close or to a later mount.
        freed.unwrap_or(false)
    }

    /// In `txn`: frees file `ino` if it is an orphan that no session other than the one whose
    /// key is `except` holds open; says whether it did. The one rule of every path that frees
    /// an orphan (last close, after an unchecked removal, mount-time cleanup).
    pub(crate) fn free_orphan_unless_held(
        &self,
        txn: &mut dyn KvTxn,
        ino: InodeId,
        except: Option<&[u8]>,
    ) -> FsResult<bool> {
        let orphan = txn.get(self.t.orphan, &schema::id_key(ino))?.is_some();
        if !orphan || self.held_open(&*txn, ino, except)? {
            return Ok(false);
        }
        self.free_file(txn.batch(), ino, None, InodeRows::ALL)?;
        Ok(true)
    }

    /// Whether some session other than the one whose key is `except` holds file `ino` open,
    /// read through `r` (a transaction, so that a registration landing meanwhile conflicts
    /// it). Always false on a sole-writer store.
    pub(crate) fn held_open(
        &self,
        r: &dyn KvRead,
        ino: InodeId,
        except: Option<&[u8]>,
    ) -> FsResult<bool> {
        let Some(sh) = self.shared else {
            return Ok(false);
        };
        let regs = r.scan(
            sh.open,
            &KeyRange::prefix(&schema::id_key(ino)),
            Direction::Forward,
            2,
        )?;
        Ok(regs.iter().any(|(k, _)| Some(k.as_slice()) != except))
    }

    /// When this `Fs` goes away with handles still open: removes their registrations, best
    /// effort (left behind, they only delay freeing until the session ends). Read-only
    /// mounts register nothing.
    pub(crate) fn drop_registrations(&self) {
        let Some(sh) = self.shared else {
            return;
        };
        let mut inos: Vec<InodeId> = self.handles.lock().values().map(|h| h.ino).collect();
        inos.sort_unstable_by_key(|i| i.0);
        inos.dedup();
        let per_batch = self.kv.limits().max_ops.unwrap_or(usize::MAX).max(1);
        for chunk in inos.chunks(per_batch) {
            let mut b = fern_kv::WriteBatch::new();
            for ino in chunk {
                b.delete(sh.open, sh.key(*ino));
            }
            let _ = self.kv.write(b, WriteOptions::NO_SYNC);
        }
    }
}

/// The write options of a transaction that freed an orphan (`freed`: it may use the store's
/// reserve, format.md B12) or only changed registrations.
pub(crate) fn freeing_if(freed: bool) -> WriteOptions {
    if freed {
        WriteOptions::NO_SYNC.freeing(0)
    } else {
        WriteOptions::NO_SYNC
    }
}
