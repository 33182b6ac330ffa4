//! What the kernel says about this process and machine, read the same way for every engine:
//! bytes written to storage (/proc/self/io), peak RSS (VmHWM), space a directory occupies,
//! the page cache drop before cold reads, and the machine description of a report.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Storage counters of this process (all its threads), from /proc/self/io.
///
/// `write_bytes` is charged when a page is dirtied (or a direct write issued), to the process
/// that dirtied it, so the bytes an engine's background threads write are counted, and a final
/// `sync` changes nothing in the count: it only makes the comparison obviously fair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Bytes this process caused to be sent to the storage layer.
    pub write_bytes: u64,
    /// Dirty bytes that were truncated or deleted before being written.
    pub cancelled_write_bytes: u64,
    /// Bytes passed to write(2)-family calls, whether or not they reach the device: the
    /// engine's own write volume, before the page cache absorbs rewrites of dirty pages
    /// (writes through a shared memory map are not counted here).
    pub wchar: u64,
    /// Bytes this process caused to be read from the storage layer (page-cache misses,
    /// read-ahead and page faults of a memory map included): what a cold read cost the device.
    pub read_bytes: u64,
    /// read(2)-family calls (a memory map's faults are not counted here).
    pub syscr: u64,
}

/// Reads /proc/self/io.
pub fn io_counters() -> io::Result<IoCounters> {
    io_counters_at(Path::new("/proc/self/io"))
}

/// Reads /proc/PID/io: the counters of another process (a FUSE daemon; needs root or the
/// same user).
pub fn io_counters_of(pid: u32) -> io::Result<IoCounters> {
    io_counters_at(&Path::new("/proc").join(pid.to_string()).join("io"))
}

/// Bytes written to block device `dev` (`/dev/loop3` or `loop3`) since it appeared: the
/// "sectors written" field of /sys/block/NAME/stat, in 512-byte units whatever the device's
/// block size (Documentation/block/stat.rst).
pub fn block_device_bytes_written(dev: &str) -> io::Result<u64> {
    let name = dev.rsplit('/').next().unwrap_or(dev);
    let text = fs::read_to_string(Path::new("/sys/block").join(name).join("stat"))?;
    text.split_whitespace()
        .nth(6)
        .and_then(|v| v.parse::<u64>().ok())
        .map(|sectors| sectors * 512)
        .ok_or_else(|| {
            io::Error::other(format!(
                "/sys/block/{name}/stat has no sectors-written field"
            ))
        })
}

fn io_counters_at(path: &Path) -> io::Result<IoCounters> {
    let text = fs::read_to_string(path)?;
    let mut c = IoCounters::default();
    for line in text.lines() {
        let Some((name, v)) = line.split_once(':') else {
            continue;
        };
        let v: u64 = v.trim().parse().unwrap_or(0);
        match name {
            "write_bytes" => c.write_bytes = v,
            "cancelled_write_bytes" => c.cancelled_write_bytes = v,
            "wchar" => c.wchar = v,
            "read_bytes" => c.read_bytes = v,
            "syscr" => c.syscr = v,
            _ => {}
        }
    }
    Ok(c)
}

fn status_field_kib(field: &str) -> Option<u64> {
    let text = fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Peak resident set size of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    status_field_kib("VmHWM").map(|k| k * 1024)
}

/// Whether this process runs with effective uid 0 (from /proc/self/status).
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Uid:").map(|r| r.to_string()))
        })
        .and_then(|r| r.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// Space a directory tree occupies: (allocated bytes = blocks × 512, apparent bytes).
/// Allocated bytes count punched holes and sparse tails as free, as `du` does.
pub fn dir_usage(path: &Path) -> io::Result<(u64, u64)> {
    let meta = fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Ok((meta.blocks() * 512, meta.len()));
    }
    let (mut alloc, mut apparent) = (0, 0);
    for entry in fs::read_dir(path)? {
        let (a, b) = dir_usage(&entry?.path())?;
        alloc += a;
        apparent += b;
    }
    Ok((alloc, apparent))
}

/// Writes every dirty page of the machine back (sync(2)).
pub fn sync_all() {
    rustix::fs::sync();
}

/// Drops the OS page cache (`sync; echo 3 > /proc/sys/vm/drop_caches`) when running as root.
/// Returns whether the cache was dropped.
pub fn drop_page_cache() -> bool {
    if !is_root() {
        return false;
    }
    sync_all();
    fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// The machine a report was measured on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    /// Online CPUs.
    pub nproc: usize,
    /// Total memory, bytes.
    pub mem_bytes: u64,
    /// Kernel release (uname -r).
    pub kernel: String,
    /// CPU model name.
    pub cpu: String,
}

impl Machine {
    /// Describes this machine.
    pub fn detect() -> Machine {
        let nproc = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let mem_bytes = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| {
                    l.strip_prefix("MemTotal:")?
                        .split_whitespace()
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
            })
            .unwrap_or(0)
            * 1024;
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == "model name").then(|| v.trim().to_string())
                })
            })
            .unwrap_or_default();
        Machine {
            nproc,
            mem_bytes,
            kernel,
            cpu,
        }
    }

    /// One line for a report.
    pub fn summary(&self) -> String {
        format!(
            "{} vCPU ({}), {:.1} GiB memory, Linux {}",
            self.nproc,
            if self.cpu.is_empty() { "?" } else { &self.cpu },
            self.mem_bytes as f64 / (1u64 << 30) as f64,
            self.kernel
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_counters_are_readable() {
        assert!(io_counters().is_ok());
        assert!(peak_rss_bytes().unwrap_or(0) > 0);
        let m = Machine::detect();
        assert!(m.nproc >= 1 && m.mem_bytes > 0);
    }

    #[test]
    fn block_devices_report_bytes_written() {
        let first = fs::read_dir("/sys/block")
            .unwrap()
            .next()
            .expect("a block device")
            .unwrap()
            .file_name();
        let name = first.to_string_lossy();
        block_device_bytes_written(&format!("/dev/{name}")).unwrap();
        let e = block_device_bytes_written("no-such-device").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn dir_usage_counts_files() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a"), vec![1u8; 10_000]).unwrap();
        fs::create_dir(d.path().join("sub")).unwrap();
        fs::write(d.path().join("sub/b"), vec![2u8; 5_000]).unwrap();
        let (alloc, apparent) = dir_usage(d.path()).unwrap();
        assert_eq!(apparent, 15_000);
        assert!(alloc >= 15_000);
    }
}
