//! `fernfs-lib`: fern-fs's path library API (`fern_fs::path::PathFs`) on a fern-kv-tree
//! image file, no FUSE, no kernel in the data path: the comparison the TokuFS paper made.
//!
//! `sync` is the store's sync (everything written becomes durable); `cold` closes the store
//! (a clean unmount: checkpoint, close), drops the OS page cache and opens and mounts the image
//! again, so reads start from an empty node cache and an empty page cache.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fern_fs::path::{File, OpenOptions, PathFs};
use fern_fs::{Cred, FileType, Fs, MkfsOptions, OpenFlags, SetAttr, TimeSet, Timespec};
use fern_kv::KvStore;
use fern_kv_tree::TreeStore;
use parking_lot::Mutex;

use super::target::{op_err, Entry, FileId, FsTarget, StatLite};
use crate::procinfo;
use crate::Result;

const SYSTEM: &str = "fernfs-lib";

struct Mounted {
    store: Arc<TreeStore>,
    pfs: PathFs,
}

/// fernfs through its library API on the image file `image`.
pub struct LibTarget {
    image: PathBuf,
    cache_bytes: u64,
    m: Option<Mounted>,
    files: Mutex<HashMap<u64, File>>,
    next: AtomicU64,
}

fn abs(path: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(path.len() + 1);
    p.push(b'/');
    p.extend_from_slice(path.as_bytes());
    p
}

impl LibTarget {
    /// Makes a new file system (mkfs, default 4 KiB blocks) in the image file `image` (absent
    /// or empty) and mounts it with a node cache of `cache_bytes`.
    pub fn create(image: &Path, cache_bytes: u64) -> Result<LibTarget> {
        let store = TreeStore::create(image, cache_bytes as usize, fern_fs::registry())
            .map_err(|e| op_err(SYSTEM, "create image", &image.display().to_string(), e))?;
        Fs::mkfs(&store, MkfsOptions::default())
            .map_err(|e| op_err(SYSTEM, "mkfs", &image.display().to_string(), e))?;
        let store = Arc::new(store);
        let pfs = Self::mount_store(&store, image)?;
        Ok(LibTarget {
            image: image.to_path_buf(),
            cache_bytes,
            m: Some(Mounted { store, pfs }),
            files: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        })
    }

    fn mount_store(store: &Arc<TreeStore>, image: &Path) -> Result<PathFs> {
        let kv: Arc<dyn KvStore> = store.clone();
        let fs =
            Fs::mount(kv).map_err(|e| op_err(SYSTEM, "mount", &image.display().to_string(), e))?;
        Ok(PathFs::new(Arc::new(fs), Cred::root()))
    }

    fn pfs(&self) -> Result<&PathFs> {
        self.m.as_ref().map(|m| &m.pfs).ok_or_else(|| {
            op_err(
                SYSTEM,
                "use",
                &self.image.display().to_string(),
                "not mounted (an earlier remount failed)",
            )
        })
    }

    fn with_file<T>(
        &self,
        f: FileId,
        op: &str,
        body: impl FnOnce(&PathFs, &File) -> fern_fs::FsResult<T>,
    ) -> Result<T> {
        let pfs = self.pfs()?;
        let files = self.files.lock();
        let file = files
            .get(&f.0)
            .ok_or_else(|| op_err(SYSTEM, op, &format!("fd {}", f.0), "not open"))?;
        body(pfs, file).map_err(|e| op_err(SYSTEM, op, &format!("fd {}", f.0), e))
    }

    /// Closes the store cleanly (checkpoint + close).
    fn unmount(&mut self) -> Result<()> {
        let Some(Mounted { store, pfs }) = self.m.take() else {
            return Ok(());
        };
        let leftover: Vec<File> = self.files.lock().drain().map(|(_, f)| f).collect();
        for f in leftover {
            let _ = pfs.close(f);
        }
        drop(pfs);
        let name = self.image.display().to_string();
        match Arc::try_unwrap(store) {
            Ok(store) => store
                .close()
                .map_err(|e| op_err(SYSTEM, "close image", &name, e)),
            Err(store) => store
                .sync()
                .map_err(|e| op_err(SYSTEM, "sync image", &name, e)),
        }
    }
}

impl FsTarget for LibTarget {
    fn system(&self) -> &'static str {
        SYSTEM
    }

    fn describe(&self) -> String {
        format!(
            "fernfs-lib: fern-fs PathFs on a fern-kv-tree image file, {} MiB node cache, 4 KiB blocks",
            self.cache_bytes >> 20
        )
    }

    fn mkdir(&self, path: &str) -> Result<()> {
        self.pfs()?
            .mkdir(&abs(path), 0o755)
            .map(|_| ())
            .map_err(|e| op_err(SYSTEM, "mkdir", path, e))
    }

    fn write_new(&self, path: &str, data: &[u8]) -> Result<()> {
        let pfs = self.pfs()?;
        let opts = OpenOptions::create_new(0o644);
        let f = pfs
            .open(&abs(path), opts)
            .map_err(|e| op_err(SYSTEM, "create", path, e))?;
        let written = if data.is_empty() {
            Ok(0)
        } else {
            pfs.write_at(&f, 0, data)
        };
        let closed = pfs.close(f);
        let n = written.map_err(|e| op_err(SYSTEM, "write", path, e))?;
        closed.map_err(|e| op_err(SYSTEM, "close", path, e))?;
        if n != data.len() {
            return Err(op_err(
                SYSTEM,
                "write",
                path,
                format!("short write {n} of {}", data.len()),
            ));
        }
        Ok(())
    }

    fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let pfs = self.pfs()?;
        let f = pfs
            .open(&abs(path), OpenOptions::default())
            .map_err(|e| op_err(SYSTEM, "open", path, e))?;
        let mut out = Vec::new();
        let res = loop {
            match pfs.read_at(&f, out.len() as u64, 1 << 20) {
                Ok(chunk) if chunk.is_empty() => break Ok(()),
                Ok(chunk) => out.extend_from_slice(&chunk),
                Err(e) => break Err(e),
            }
        };
        let closed = pfs.close(f);
        res.map_err(|e| op_err(SYSTEM, "read", path, e))?;
        closed.map_err(|e| op_err(SYSTEM, "close", path, e))?;
        Ok(out)
    }

    fn list(&self, path: &str) -> Result<Vec<Entry>> {
        let entries = self
            .pfs()?
            .read_dir(&abs(path))
            .map_err(|e| op_err(SYSTEM, "readdir", path, e))?;
        Ok(entries
            .into_iter()
            .map(|e| Entry {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                is_dir: e.kind == FileType::Directory,
            })
            .collect())
    }

    fn lstat(&self, path: &str) -> Result<StatLite> {
        let a = self
            .pfs()?
            .lstat(&abs(path))
            .map_err(|e| op_err(SYSTEM, "lstat", path, e))?;
        Ok(StatLite {
            size: a.size,
            mode: a.kind.mode_bits() | a.perm,
            is_dir: a.kind == FileType::Directory,
            mtime_s: a.mtime.sec,
        })
    }

    fn chmod(&self, path: &str, perm: u32) -> Result<()> {
        self.pfs()?
            .chmod(&abs(path), perm)
            .map(|_| ())
            .map_err(|e| op_err(SYSTEM, "chmod", path, e))
    }

    fn set_times(&self, path: &str, secs: i64) -> Result<()> {
        let t = TimeSet::At(Timespec { sec: secs, nsec: 0 });
        self.pfs()?
            .setattr(
                &abs(path),
                &SetAttr {
                    atime: Some(t),
                    mtime: Some(t),
                    ..SetAttr::default()
                },
            )
            .map(|_| ())
            .map_err(|e| op_err(SYSTEM, "utimens", path, e))
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.pfs()?
            .rename(&abs(from), &abs(to), 0)
            .map_err(|e| op_err(SYSTEM, "rename", &format!("{from} -> {to}"), e))
    }

    fn unlink(&self, path: &str) -> Result<()> {
        self.pfs()?
            .unlink(&abs(path))
            .map_err(|e| op_err(SYSTEM, "unlink", path, e))
    }

    fn rmdir(&self, path: &str) -> Result<()> {
        self.pfs()?
            .rmdir(&abs(path))
            .map_err(|e| op_err(SYSTEM, "rmdir", path, e))
    }

    fn open(&self, path: &str, create: bool) -> Result<FileId> {
        let opts = OpenOptions {
            flags: OpenFlags {
                write: true,
                ..OpenFlags::default()
            },
            create,
            perm: 0o644,
        };
        let f = self
            .pfs()?
            .open(&abs(path), opts)
            .map_err(|e| op_err(SYSTEM, "open", path, e))?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(id, f);
        Ok(FileId(id))
    }

    fn pwrite(&self, f: FileId, offset: u64, data: &[u8]) -> Result<()> {
        let n = self.with_file(f, "pwrite", |p, file| p.write_at(file, offset, data))?;
        if n != data.len() {
            return Err(op_err(
                SYSTEM,
                "pwrite",
                &format!("fd {}", f.0),
                format!("short write {n} of {}", data.len()),
            ));
        }
        Ok(())
    }

    fn pread(&self, f: FileId, offset: u64, len: usize) -> Result<Vec<u8>> {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.with_file(f, "pread", |p, file| p.read_at(file, offset, len))
    }

    fn fsync(&self, f: FileId) -> Result<()> {
        self.with_file(f, "fsync", |p, file| p.fsync(file))
    }

    fn close(&self, f: FileId) -> Result<()> {
        let pfs = self.pfs()?;
        let file = self
            .files
            .lock()
            .remove(&f.0)
            .ok_or_else(|| op_err(SYSTEM, "close", &format!("fd {}", f.0), "not open"))?;
        pfs.close(file)
            .map_err(|e| op_err(SYSTEM, "close", &format!("fd {}", f.0), e))
    }

    fn sync(&self) -> Result<()> {
        self.pfs()?
            .fs()
            .syncfs()
            .map_err(|e| op_err(SYSTEM, "syncfs", &self.image.display().to_string(), e))
    }

    fn space_used(&self) -> Result<Option<u64>> {
        Ok(Some(image_blocks(&self.image)?))
    }

    /// This process is the engine (a task runs in a process of its own): what it dirtied or
    /// wrote, less what was dropped before it was written.
    fn device_bytes_written(&self) -> Result<Option<u64>> {
        let c = procinfo::io_counters()?;
        Ok(Some(c.write_bytes.saturating_sub(c.cancelled_write_bytes)))
    }

    fn cold(&mut self, drop_caches: bool) -> Result<bool> {
        self.unmount()?;
        let dropped = drop_caches && procinfo::drop_page_cache();
        let name = self.image.display().to_string();
        let store = TreeStore::open(&self.image, self.cache_bytes as usize, fern_fs::registry())
            .map_err(|e| op_err(SYSTEM, "open image", &name, e))?;
        let store = Arc::new(store);
        let pfs = Self::mount_store(&store, &self.image)?;
        self.m = Some(Mounted { store, pfs });
        Ok(dropped)
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let r = self.unmount();
        let _ = std::fs::remove_file(&self.image);
        r
    }
}

/// Allocated bytes (st_blocks × 512) of an image file and of any file beside it whose name
/// starts with the image's name (a store's side files), as `du` counts them.
pub fn image_blocks(image: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let name = image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = image.parent().unwrap_or(Path::new("."));
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(&name) {
            let m = e.metadata()?;
            if m.is_file() {
                total += m.blocks() * 512;
            }
        }
    }
    Ok(total)
}

impl Drop for LibTarget {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}
