//! Access times: the mount's policy (`relatime`, the default; `strictatime`; `noatime`; and
//! `nodiratime` for directories) and the one rule that decides whether a read or a listing
//! writes atime. It owns that decision and the blind upsert that records it; it must never
//! write anything else.
//!
//! Linux's relatime: a read updates atime only when the stored atime is not newer than mtime
//! or ctime (so "read since last change" stays answerable, which mail readers and tmpwatch rely
//! on), or is 24 hours old or more. That keeps reads from writing on every call (TiFS wrote
//! atime on every read). strictatime writes on every read; noatime never does.

use std::sync::atomic::{AtomicU8, Ordering};

use fern_kv::{WriteBatch, WriteOptions};

use crate::attr::{Stat, Timespec};
use crate::error::FsResult;
use crate::fs::Fs;
use crate::ids::InodeId;
use crate::upsert::StatDelta;

/// Atime is refreshed under relatime when older than this.
const RELATIME_SECS: i64 = 24 * 3600;

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

/// The policy of one mount, changeable while mounted (the adapter sets it from `-o`).
#[derive(Default)]
pub(crate) struct AtimeSetting(AtomicU8);

impl Fs {
    /// Sets when reads and listings update atime (mount options `relatime`, `strictatime`,
    /// `noatime`, `nodiratime`).
    pub fn set_atime_policy(&self, p: AtimePolicy) {
        self.atime.0.store(p.to_bits(), Ordering::Relaxed);
    }

    /// The current atime policy.
    pub fn atime_policy(&self) -> AtimePolicy {
        AtimePolicy::from_bits(self.atime.0.load(Ordering::Relaxed))
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
}
