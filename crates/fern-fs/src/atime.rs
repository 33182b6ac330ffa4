//! Access times: the mount's policy (`relatime`, the default; `strictatime`; `noatime`; and
//! `nodiratime` for directories) and the one rule that decides whether a read or a listing
//! writes atime. It owns that decision and the blind upsert that records it; it must never
//! write anything else.
//!
//! Linux's relatime: a read updates atime only when the stored atime is not newer than mtime
//! or ctime (so "read since last change" stays answerable, which mail readers and tmpwatch rely
//! on), or is 24 hours old or more. That keeps reads from writing on every call (TiFS wrote
//! atime on every read). strictatime writes on every read; noatime never does.
//!
//! On a shared store an atime write is a round trip or two (etcd: the base read and a
//! compare-and-put Txn, raft-committed), and deciding it needs the stat (another round trip).
//! There accesses are recorded here instead and written lazily, as Linux's `lazytime` does
//! (docs/distributed.md §7, "Access times are written lazily"): this mount shows them at once
//! (`Fs::attr_of`), other mounts see them once flushed — within [`LAZY_FOR`] while this mount
//! serves requests or its adapter ticks ([`Fs::flush_due_atimes`]), at every sync and fsync,
//! and at unmount. A flush reads the stats of up to [`FLUSH_CHUNK`] accessed inodes in one
//! multi-get, applies the same rule to them at their access times, and writes those that
//! need it in one batch. An explicit atime (`setattr`) drops a pending access, so a flush can
//! never overwrite it; a freed inode's access writes nothing (a stat delta never recreates an
//! absent row).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use fern_kv::{WriteBatch, WriteOptions};
use parking_lot::Mutex;

use crate::attr::{Stat, Timespec};
use crate::error::FsResult;
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::upsert::StatDelta;

/// Atime is refreshed under relatime when older than this.
const RELATIME_SECS: i64 = 24 * 3600;

/// On a shared store, how long an access may wait unwritten while the mount is in use.
pub const LAZY_FOR: Duration = Duration::from_secs(1);

/// On a shared store, the accesses kept unwritten at most: one more flushes them all.
const MAX_PENDING: usize = 4096;

/// Inodes one flush step reads and writes together (etcd: one Txn of stat reads, then one
/// batch of at most this many upserts, within its 128 operations per Txn).
const FLUSH_CHUNK: usize = 60;

/// When reads update atime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// Linux's default: only when stale (see the module comment).
    #[default]
    Relatime,
    /// On every read (`strictatime`).
    Strict,
    /// Never (`noatime`).
    Never,
}

/// A mount's atime policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtimePolicy {
    /// Files (and directories, unless `nodiratime`).
    pub mode: AtimeMode,
    /// Directories never get atime updates (`nodiratime`).
    pub nodiratime: bool,
}

impl AtimePolicy {
    /// Whether an access to a node (a directory when `dir`) may ever write atime: if not, its
    /// stat need not be read for it (a listing on a shared store then saves a round trip).
    pub fn may_update(&self, dir: bool) -> bool {
        !(dir && self.nodiratime) && self.mode != AtimeMode::Never
    }

    /// Whether an access at `now` to a node with `stat` (a directory when `dir`) writes atime.
    pub fn updates(&self, stat: &Stat, now: Timespec, dir: bool) -> bool {
        if dir && self.nodiratime {
            return false;
        }
        match self.mode {
            AtimeMode::Never => false,
            AtimeMode::Strict => true,
            AtimeMode::Relatime => {
                stat.atime <= stat.mtime
                    || stat.atime <= stat.ctime
                    || now.sec - stat.atime.sec >= RELATIME_SECS
            }
        }
    }

    fn to_bits(self) -> u8 {
        let mode = match self.mode {
            AtimeMode::Relatime => 0,
            AtimeMode::Strict => 1,
            AtimeMode::Never => 2,
        };
        mode | (u8::from(self.nodiratime) << 2)
    }

    fn from_bits(b: u8) -> Self {
        AtimePolicy {
            mode: match b & 3 {
                1 => AtimeMode::Strict,
                2 => AtimeMode::Never,
                _ => AtimeMode::Relatime,
            },
            nodiratime: b & 4 != 0,
        }
    }
}

/// The policy of one mount, changeable while mounted (the adapter sets it from `-o`), and on a
/// shared store the accesses not written yet.
#[derive(Default)]
pub(crate) struct AtimeSetting {
    policy: AtomicU8,
    /// Whether `lazy` may hold anything (read without its lock on every `attr_of`).
    any_pending: AtomicBool,
    lazy: Mutex<Lazy>,
}

/// Accesses recorded on a shared store and not written yet.
#[derive(Default)]
struct Lazy {
    pending: HashMap<InodeId, Accesses>,
    /// When the oldest of them was recorded.
    oldest: Option<Instant>,
}

impl Lazy {
    /// [`AtimeSetting::due`] under the lock.
    fn due(&mut self, all: bool) -> Vec<InodeId> {
        let due = self.oldest.is_some_and(|t| t.elapsed() >= LAZY_FOR);
        if !(all || due) || self.pending.is_empty() {
            return Vec::new();
        }
        self.oldest = None;
        self.pending.keys().copied().collect()
    }
}

/// The unwritten accesses of one inode: the first and the last are all the rule needs.
#[derive(Clone, Copy, Debug)]
struct Accesses {
    first: Timespec,
    last: Timespec,
    dir: bool,
}

impl Accesses {
    /// `stat` as the policy leaves it after these accesses: the first one applied to the
    /// stored stat, then the last one to the result. Under relatime that is exact whatever
    /// accesses came between: the last one writes only if the node changed after the first
    /// (or a day passed), and then it is the latest that counts.
    fn apply(&self, policy: AtimePolicy, mut stat: Stat) -> Stat {
        for at in [self.first, self.last] {
            if policy.updates(&stat, at, self.dir) {
                stat.atime = at;
            }
        }
        stat
    }
}

impl AtimeSetting {
    /// The pending accesses of `ino`, if any.
    fn pending(&self, ino: InodeId) -> Option<Accesses> {
        if !self.any_pending.load(Ordering::Acquire) {
            return None;
        }
        self.lazy.lock().pending.get(&ino).copied()
    }

    /// The inodes of every pending access when `all` or when the oldest is due (their
    /// accesses are taken one chunk at a time under the chunk's locks: [`Self::remove`]).
    fn due(&self, all: bool) -> Vec<InodeId> {
        self.lazy.lock().due(all)
    }

    /// Puts back accesses whose write failed, unless newer ones came meanwhile (then the
    /// first of both is kept with the newer last).
    fn restore(&self, chunk: Vec<(InodeId, Accesses)>) {
        let mut l = self.lazy.lock();
        for (ino, a) in chunk {
            l.pending
                .entry(ino)
                .and_modify(|n| n.first = a.first)
                .or_insert(a);
        }
        l.oldest.get_or_insert_with(Instant::now);
        self.any_pending.store(true, Ordering::Release);
    }

    /// Removes and returns the pending accesses of `ids` (the caller holds their locks, so no
    /// explicit atime set comes between this and their write).
    fn remove(&self, ids: &[InodeId]) -> Vec<(InodeId, Accesses)> {
        let mut l = self.lazy.lock();
        let out = ids
            .iter()
            .filter_map(|i| l.pending.remove(i).map(|a| (*i, a)))
            .collect();
        if l.pending.is_empty() {
            self.any_pending.store(false, Ordering::Release);
        }
        out
    }
}

impl Fs {
    /// Sets when reads and listings update atime (mount options `relatime`, `strictatime`,
    /// `noatime`, `nodiratime`).
    pub fn set_atime_policy(&self, p: AtimePolicy) {
        self.atime.policy.store(p.to_bits(), Ordering::Relaxed);
    }

    /// The current atime policy.
    pub fn atime_policy(&self) -> AtimePolicy {
        AtimePolicy::from_bits(self.atime.policy.load(Ordering::Relaxed))
    }

    /// Records an access to `ino` (whose stat was just read) if the policy says so: one blind
    /// stat upsert, or nothing.
    pub(crate) fn touch_atime(&self, ino: InodeId, stat: &Stat) -> FsResult<()> {
        if self.read_only {
            // A read-only mount (fsck, stat, export) never writes, atime included.
            return Ok(());
        }
        let now = Timespec::now();
        let dir = stat.kind()? == crate::attr::FileType::Directory;
        if self.is_shared() {
            // As this mount shows the stat: an access already pending may have freshened it.
            if self
                .atime_policy()
                .updates(&self.with_pending_atime(ino, *stat), now, dir)
            {
                self.note_access(ino, dir);
            }
            return Ok(());
        }
        if !self.atime_policy().updates(stat, now, dir) {
            return Ok(());
        }
        let _g = self.locks.lock(&[ino]);
        let Ok((loc, _)) = self.loc(ino) else {
            return Ok(());
        };
        let mut b = WriteBatch::new();
        let d = StatDelta {
            atime: Some(now),
            ..StatDelta::default()
        };
        let before = self.upsert_stat(&mut b, ino, &loc, &d)?;
        match self.kv.write(b, WriteOptions::NO_SYNC) {
            Ok(()) => {
                self.stat_applied(ino, before, &d);
                Ok(())
            }
            // A read must not fail because its atime could not be recorded: a full store
            // refuses new data (format.md B12), and an atime is not worth its reserve.
            Err(fern_kv::KvError::Io(e)) if e.kind() == std::io::ErrorKind::StorageFull => Ok(()),
            r => Ok(r?),
        }
    }
}

impl Fs {
    /// On a shared store, records an access to `ino` (a directory when `dir`) now, to be
    /// written lazily under the policy (module comment); nothing if the policy never writes
    /// atime for it. The caller holds no lock: a due flush runs here.
    pub(crate) fn note_access(&self, ino: InodeId, dir: bool) {
        if self.read_only || !self.atime_policy().may_update(dir) {
            return;
        }
        let now = Timespec::now();
        // One lock per access: the record and the question whether a flush is due.
        let due = {
            let mut l = self.atime.lazy.lock();
            l.pending
                .entry(ino)
                .and_modify(|a| a.last = now)
                .or_insert(Accesses {
                    first: now,
                    last: now,
                    dir,
                });
            l.oldest.get_or_insert_with(Instant::now);
            self.atime.any_pending.store(true, Ordering::Release);
            let full = l.pending.len() >= MAX_PENDING;
            l.due(full)
        };
        if due.is_empty() {
            return;
        }
        if let Err(e) = self.write_atimes(due) {
            // The access itself succeeded; its atime is not worth failing it for.
            log::warn!("writing access times failed: {e}");
        }
    }

    /// Forgets a pending access of `ino`: its atime was just set explicitly.
    pub(crate) fn drop_pending_atime(&self, ino: InodeId) {
        if self.atime.any_pending.load(Ordering::Acquire) {
            self.atime.lazy.lock().pending.remove(&ino);
        }
    }

    /// `stat` with `ino`'s pending access applied, as the store will hold it once written.
    pub(crate) fn with_pending_atime(&self, ino: InodeId, stat: Stat) -> Stat {
        match self.atime.pending(ino) {
            Some(a) => a.apply(self.atime_policy(), stat),
            None => stat,
        }
    }

    /// Writes the accesses recorded more than [`LAZY_FOR`] ago (with all the others). For an
    /// adapter's clock: other mounts then see them within about that long.
    pub fn flush_due_atimes(&self) -> FsResult<()> {
        self.write_atimes(self.atime.due(false))
    }

    /// Whether accesses are written lazily ([`Fs::flush_due_atimes`] then has work): on a
    /// shared store.
    pub fn writes_atime_lazily(&self) -> bool {
        self.is_shared() && !self.read_only
    }

    /// Writes every recorded access (sync, fsync, unmount).
    pub(crate) fn flush_atimes(&self) -> FsResult<()> {
        self.write_atimes(self.atime.due(true))
    }

    /// Writes the pending accesses of `ids` that the policy asks for given the stats stored
    /// now.
    fn write_atimes(&self, ids: Vec<InodeId>) -> FsResult<()> {
        let policy = self.atime_policy();
        for ids in ids.chunks(FLUSH_CHUNK) {
            // Held across the read and the write: no stat change of these inodes by this
            // mount comes between (another mount's may: a delta applies atime only), and no
            // explicit atime set, which drops the pending access under the same lock.
            let _g = self.locks.lock(ids);
            let chunk = self.atime.remove(ids);
            if chunk.is_empty() {
                continue;
            }
            if let Err(e) = self.write_chunk(policy, &chunk) {
                // Kept for the next flush (still under the chunk's locks, so no explicit set
                // came between): a clock's flush that failed is tried again.
                self.atime.restore(chunk);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Writes the accesses of `chunk` (whose locks the caller holds) that the policy asks for
    /// given the stats stored now: one multi-get, one batch.
    fn write_chunk(&self, policy: AtimePolicy, chunk: &[(InodeId, Accesses)]) -> FsResult<()> {
        let ids: Vec<InodeId> = chunk.iter().map(|(i, _)| *i).collect();
        let keys: Vec<_> = ids
            .iter()
            .map(|i| (self.t.inode, crate::schema::id_key(*i)))
            .collect();
        let rows = self.kv.get_many(&keys)?;
        let mut b = WriteBatch::new();
        let mut applied = Vec::new();
        for (&(ino, accesses), row) in chunk.iter().zip(rows) {
            // Gone (freed): nothing to write.
            let Some(row) = row else { continue };
            let stored = crate::record::Inode::decode_record(&row)?.stat;
            let after = accesses.apply(policy, stored);
            if after.atime == stored.atime {
                continue;
            }
            let d = StatDelta {
                atime: Some(after.atime),
                ..StatDelta::default()
            };
            let before = self.upsert_stat(&mut b, ino, &crate::cache::Loc::Inode, &d)?;
            applied.push((ino, before, d));
        }
        if b.is_empty() {
            return Ok(());
        }
        match self.kv.write(b, WriteOptions::NO_SYNC) {
            Ok(()) => {
                for (ino, before, d) in applied {
                    self.stat_applied(ino, before, &d);
                }
            }
            // As in `touch_atime`: a full store keeps its reserve for data.
            Err(fern_kv::KvError::Io(e)) if e.kind() == std::io::ErrorKind::StorageFull => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(atime: i64, mtime: i64) -> Stat {
        let mut s = Stat::new(
            0o100644,
            0,
            0,
            1,
            Timespec {
                sec: mtime,
                nsec: 0,
            },
        );
        s.atime = Timespec {
            sec: atime,
            nsec: 0,
        };
        s
    }

    #[test]
    fn relatime_strict_noatime_and_nodiratime() {
        let now = Timespec {
            sec: 100_000,
            nsec: 0,
        };
        let fresh = stat(99_000, 50_000); // read after the last change, an hour ago
        let stale = stat(40_000, 50_000); // not read since the last change
        let old = stat(100_000 - RELATIME_SECS, 0); // read a day ago
        let rel = AtimePolicy::default();
        assert!(!rel.updates(&fresh, now, false));
        assert!(rel.updates(&stale, now, false));
        assert!(rel.updates(&old, now, false));
        let strict = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: false,
        };
        assert!(strict.updates(&fresh, now, false));
        let never = AtimePolicy {
            mode: AtimeMode::Never,
            nodiratime: false,
        };
        assert!(!never.updates(&stale, now, false));
        let nodir = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: true,
        };
        assert!(!nodir.updates(&stale, now, true));
        assert!(nodir.updates(&stale, now, false));
        for p in [rel, strict, never, nodir] {
            assert_eq!(AtimePolicy::from_bits(p.to_bits()), p);
            // `may_update` is false exactly where no stat could make `updates` true.
            for dir in [false, true] {
                let any = [&fresh, &stale, &old]
                    .iter()
                    .any(|s| p.updates(s, now, dir));
                assert_eq!(p.may_update(dir), any, "{p:?} dir={dir}");
            }
        }
    }

    /// Lazily written accesses: the first applies to the stored stat, the last to that, so
    /// relatime keeps the first unless the node changed after it.
    #[test]
    fn pending_accesses_apply_first_then_last() {
        let at = |sec| Timespec { sec, nsec: 0 };
        let a = Accesses {
            first: at(60_000),
            last: at(61_000),
            dir: true,
        };
        let rel = AtimePolicy::default();
        // Stale, unchanged since the first access: the first counts.
        assert_eq!(a.apply(rel, stat(40_000, 50_000)).atime, at(60_000));
        // Changed between the accesses: the last counts.
        assert_eq!(a.apply(rel, stat(40_000, 60_500)).atime, at(61_000));
        // Fresh already: neither writes.
        assert_eq!(a.apply(rel, stat(55_000, 50_000)).atime, at(55_000));
        let strict = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: false,
        };
        assert_eq!(a.apply(strict, stat(55_000, 50_000)).atime, at(61_000));
        let nodir = AtimePolicy {
            mode: AtimeMode::Strict,
            nodiratime: true,
        };
        assert_eq!(a.apply(nodir, stat(40_000, 50_000)).atime, at(40_000));
    }
}
