//! A target with planted faults, for the tests that check the workloads catch wrong answers.

use super::*;

/// A target with planted faults: the content of every file named "f3" reads wrong, and
/// listings leave out every entry named "f5". The workloads must count both. With
/// `size_lies`, every 7th lstat of a regular file also reports one byte more (fs_mark names
/// its files at random, so the name-keyed faults would miss them).
pub(crate) struct Faulty<T> {
    pub(crate) inner: T,
    pub(crate) size_lies: Option<std::sync::atomic::AtomicU64>,
}

impl<T: FsTarget> Faulty<T> {
    pub(crate) fn new(inner: T) -> Self {
        Faulty {
            inner,
            size_lies: None,
        }
    }
}

impl<T: FsTarget + 'static> FsTarget for Faulty<T> {
    fn system(&self) -> &'static str {
        "fernfs-lib"
    }
    fn describe(&self) -> String {
        "faulty".into()
    }
    fn mkdir(&self, p: &str) -> fern_bench::Result<()> {
        self.inner.mkdir(p)
    }
    fn write_new(&self, p: &str, d: &[u8]) -> fern_bench::Result<()> {
        self.inner.write_new(p, d)
    }
    fn read_file(&self, p: &str) -> fern_bench::Result<Vec<u8>> {
        let mut d = self.inner.read_file(p)?;
        if p.ends_with("/f3") {
            d[0] ^= 1;
        }
        Ok(d)
    }
    fn list(&self, p: &str) -> fern_bench::Result<Vec<fern_bench::fs::target::Entry>> {
        let mut v = self.inner.list(p)?;
        v.retain(|e| e.name != "f5");
        Ok(v)
    }
    fn lstat(&self, p: &str) -> fern_bench::Result<fern_bench::fs::target::StatLite> {
        let mut st = self.inner.lstat(p)?;
        if let Some(n) = &self.size_lies {
            if !st.is_dir && n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 7 == 6 {
                st.size += 1;
            }
        }
        Ok(st)
    }
    fn keeps_data(&self) -> bool {
        self.inner.keeps_data()
    }
    fn mount_path(&self) -> Option<std::path::PathBuf> {
        self.inner.mount_path()
    }
    fn chmod(&self, p: &str, m: u32) -> fern_bench::Result<()> {
        self.inner.chmod(p, m)
    }
    fn set_times(&self, p: &str, s: i64) -> fern_bench::Result<()> {
        self.inner.set_times(p, s)
    }
    fn rename(&self, a: &str, b: &str) -> fern_bench::Result<()> {
        self.inner.rename(a, b)
    }
    fn unlink(&self, p: &str) -> fern_bench::Result<()> {
        self.inner.unlink(p)
    }
    fn rmdir(&self, p: &str) -> fern_bench::Result<()> {
        self.inner.rmdir(p)
    }
    fn open(&self, p: &str, c: bool) -> fern_bench::Result<fern_bench::fs::target::FileId> {
        self.inner.open(p, c)
    }
    fn pwrite(
        &self,
        f: fern_bench::fs::target::FileId,
        o: u64,
        d: &[u8],
    ) -> fern_bench::Result<()> {
        self.inner.pwrite(f, o, d)
    }
    fn pread(
        &self,
        f: fern_bench::fs::target::FileId,
        o: u64,
        l: usize,
    ) -> fern_bench::Result<Vec<u8>> {
        self.inner.pread(f, o, l)
    }
    fn fsync(&self, f: fern_bench::fs::target::FileId) -> fern_bench::Result<()> {
        self.inner.fsync(f)
    }
    fn close(&self, f: fern_bench::fs::target::FileId) -> fern_bench::Result<()> {
        self.inner.close(f)
    }
    fn sync(&self) -> fern_bench::Result<()> {
        self.inner.sync()
    }
    fn space_used(&self) -> fern_bench::Result<Option<u64>> {
        self.inner.space_used()
    }
    fn cold(&mut self, d: bool) -> fern_bench::Result<bool> {
        self.inner.cold(d)
    }
    fn finish(self: Box<Self>) -> fern_bench::Result<()> {
        Box::new(self.inner).finish()
    }
}
