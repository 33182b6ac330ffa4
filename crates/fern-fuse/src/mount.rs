//! The kernel mount of a session: attaching a `/dev/fuse` connection at a directory as type
//! `fuse.fernfs`, and detaching exactly that mount — never another one at the same path.
//!
//! Why we mount ourselves instead of letting `fuser::Session::new` do it: fuser mounts with
//! type `fuse` (the subtype only reaches the kernel through fusermount3), and when its
//! session ends it unmounts *by path* unless a poll of the device already shows the
//! connection aborted. Its loop ends at the DESTROY request, before the kernel aborts the
//! connection, so after a plain `umount` it unmounted whatever was beneath the fernfs mount
//! (a tmpfs, or another fernfs) — issue 12.2. Here the session is built with
//! `Session::from_fd`, so fuser never unmounts anything; every unmount goes through
//! [`KernelMount::unmount`], which acts only while the topmost mount at the path is the one
//! this process created (same mount id and device in /proc/self/mountinfo).
//!
//! It owns mount(2)/fusermount3 plumbing and the mount-table reading; it must never serve
//! requests or touch the store.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::options::{kernel_option, KernelOption, MountOptions};

/// The file-system type fernfs mounts appear with (`findmnt -t fuse.fernfs`).
pub const FS_TYPE: &str = "fuse.fernfs";

/// One line of a mount table (`/proc/PID/mountinfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Unique while the mount exists (reused only after it is gone).
    pub id: u64,
    /// The mount this one is attached to.
    pub parent: u64,
    /// Device of the superblock: for FUSE, an anonymous device unique to the connection.
    pub dev: (u32, u32),
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// `fuse.fernfs`, `tmpfs`, ...
    pub fs_type: String,
    /// The mount's source (fernfs: the image path).
    pub source: String,
}

/// The mount table of `pid` (`None`: this process), in the kernel's order.
pub fn mount_table(pid: Option<i32>) -> io::Result<Vec<MountEntry>> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/mountinfo"),
        None => "/proc/self/mountinfo".into(),
    };
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(parse_mountinfo_line)
        .collect())
}

/// `36 35 98:0 /root /mnt/point rw,noatime master:1 - ext4 /dev/sda1 rw`.
fn parse_mountinfo_line(l: &str) -> Option<MountEntry> {
    let (left, right) = l.split_once(" - ")?;
    let mut f = left.split(' ');
    let id = f.next()?.parse().ok()?;
    let parent = f.next()?.parse().ok()?;
    let (maj, min) = f.next()?.split_once(':')?;
    let _root = f.next()?;
    let mount_point = PathBuf::from(OsStr::from_bytes(&unescape(f.next()?)));
    let mut r = right.split(' ');
    let fs_type = String::from_utf8_lossy(&unescape(r.next()?)).into_owned();
    let source = String::from_utf8_lossy(&unescape(r.next()?)).into_owned();
    Some(MountEntry {
        id,
        parent,
        dev: (maj.parse().ok()?, min.parse().ok()?),
        mount_point,
        fs_type,
        source,
    })
}

/// The mount table escapes space, tab, newline and backslash as `\ooo`.
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The topmost mount at `mp` (the one path lookups reach): among the mounts at `mp`, the one
/// no other mount at `mp` is stacked on. Stacked mounts have the one beneath as parent.
pub fn top_mount<'a>(table: &'a [MountEntry], mp: &Path) -> Option<&'a MountEntry> {
    let at: Vec<&MountEntry> = table.iter().filter(|e| e.mount_point == mp).collect();
    at.iter()
        .rev()
        .find(|e| !at.iter().any(|o| o.parent == e.id && o.id != e.id))
        .copied()
}

/// What [`KernelMount::unmount`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Our mount was on top; it is unmounted (or detached, if lazily).
    Done,
    /// Our mount is no longer in the table (someone unmounted it): nothing was touched.
    Gone,
    /// Something else is mounted over ours: nothing was touched (unmounting by path would
    /// hit that other mount).
    Covered,
}

/// A mount this process created, identified by mount id and device.
#[derive(Debug)]
pub struct KernelMount {
    mountpoint: PathBuf,
    id: u64,
    dev: (u32, u32),
}

impl KernelMount {
    /// Mounts a new FUSE connection at `mountpoint` with `opts`; returns the `/dev/fuse`
    /// descriptor (the kernel's INIT request is waiting on it) and the mount's identity.
    /// As root the mount is made with mount(2); otherwise through the set-uid
    /// `fusermount3`, which hands the descriptor back over a socket.
    pub fn mount(mountpoint: &Path, opts: &MountOptions) -> io::Result<(OwnedFd, KernelMount)> {
        let mp = mountpoint.canonicalize()?;
        let before: HashSet<u64> = mount_table(None)?
            .into_iter()
            .filter(|e| e.mount_point == mp)
            .map(|e| e.id)
            .collect();
        let fd = if nix::unistd::geteuid().is_root() {
            mount_direct(&mp, opts)?
        } else {
            crate::fusermount::mount(&mp, &fusermount_options(opts))?
        };
        // Ours is the mount at `mp` that was not there before and has our type; nothing else
        // can have appeared at that path in between except by a concurrent mount of another
        // fernfs there, which the image lock of that other image does not prevent but which
        // would then be the topmost one (we take the newest).
        let table = mount_table(None)?;
        let ours = table
            .iter()
            .rev()
            .find(|e| e.mount_point == mp && e.fs_type == FS_TYPE && !before.contains(&e.id))
            .ok_or_else(|| {
                io::Error::other(format!(
                    "mounted {}, but the mount is not in /proc/self/mountinfo",
                    mp.display()
                ))
            })?;
        Ok((
            fd,
            KernelMount {
                mountpoint: mp,
                id: ours.id,
                dev: ours.dev,
            },
        ))
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Sets the kernel's read-ahead for this mount to `bytes` (rounded down to KiB; 0 leaves
    /// it) through its backing device's `read_ahead_kb`. Writing there needs root: without it,
    /// or on a kernel without the file, the mount keeps the kernel's read-ahead and the reason
    /// goes to the log (a slower sequential read is no reason to refuse a mount).
    pub fn set_read_ahead(&self, bytes: u32) {
        if bytes < 1024 {
            return;
        }
        let (major, minor) = self.dev;
        let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
        match std::fs::write(&path, format!("{}\n", bytes / 1024)) {
            Ok(()) => log::debug!(
                "read-ahead of {}: {} KiB",
                self.mountpoint.display(),
                bytes / 1024
            ),
            Err(e) => log::info!(
                "read-ahead of {} left at the kernel's: writing {path}: {e}",
                self.mountpoint.display()
            ),
        }
    }

    fn is(&self, e: &MountEntry) -> bool {
        e.id == self.id && e.dev == self.dev
    }

    /// Unmounts our mount if — and only if — it is the topmost mount at its path; `lazy`:
    /// detach it if busy (MNT_DETACH). Between the check and umount(2) another mount could
    /// be stacked on ours (umount(2) takes a path, and holding a descriptor of our mount to
    /// name it would itself make it busy); that window is a few microseconds.
    pub fn unmount(&self, lazy: bool) -> io::Result<Unmounted> {
        let table = mount_table(None)?;
        if !table.iter().any(|e| self.is(e)) {
            return Ok(Unmounted::Gone);
        }
        match top_mount(&table, &self.mountpoint) {
            Some(top) if self.is(top) => {}
            _ => return Ok(Unmounted::Covered),
        }
        match nix::mount::umount(&self.mountpoint) {
            Ok(()) => Ok(Unmounted::Done),
            Err(nix::errno::Errno::EBUSY) if lazy => {
                nix::mount::umount2(&self.mountpoint, MntFlags::MNT_DETACH)?;
                Ok(Unmounted::Done)
            }
            // Not root: the set-uid helper may unmount what its user mounted.
            Err(nix::errno::Errno::EPERM) => {
                fusermount_unmount(&self.mountpoint, false).or_else(|e| {
                    if lazy {
                        fusermount_unmount(&self.mountpoint, true)
                    } else {
                        Err(e)
                    }
                })?;
                Ok(Unmounted::Done)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// mount(2) of a fresh /dev/fuse connection, as libfuse's `fuse_mount_sys` does it: the
/// connection descriptor, the root's file type and the owner go in the data string; a
/// `fuse.SUBTYPE` type sets the subtype.
fn mount_direct(mp: &Path, opts: &MountOptions) -> io::Result<OwnedFd> {
    let dev = File::options().read(true).write(true).open("/dev/fuse")?;
    let rootmode = std::fs::metadata(mp)?.mode() & libc::S_IFMT;
    let (flags, extra) = kernel_flags_and_data(opts);
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        rootmode,
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    for d in extra {
        data.push(',');
        data.push_str(&d);
    }
    nix::mount::mount(
        Some(opts.fsname.as_str()),
        mp,
        Some(FS_TYPE),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| io::Error::other(format!("mount(2) of {}: {e}", mp.display())))?;
    Ok(dev.into())
}

/// The mount(2) flags and FUSE data options of `opts`. Default `nosuid,nodev` as every FUSE
/// mount (`suid`/`dev` lift them).
fn kernel_flags_and_data(opts: &MountOptions) -> (MsFlags, Vec<String>) {
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | opts.atime_flags();
    if opts.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    let mut data = Vec::new();
    if opts.default_permissions {
        data.push("default_permissions".to_string());
    }
    if opts.allow_other {
        data.push("allow_other".to_string());
    }
    for p in &opts.passthrough {
        match kernel_option(p) {
            Some(KernelOption::Set(f)) => flags |= f,
            Some(KernelOption::Clear(f)) => flags &= !f,
            Some(KernelOption::Data) => data.push(p.clone()),
            // The parser refuses unknown options; nothing unknown reaches here.
            None => {}
        }
    }
    (flags, data)
}

/// The `-o` string fusermount3 takes: it knows the generic flags by name and sets the subtype.
fn fusermount_options(opts: &MountOptions) -> String {
    let mut v = vec![
        format!("fsname={}", opts.fsname),
        "subtype=fernfs".to_string(),
        if opts.read_only { "ro" } else { "rw" }.to_string(),
    ];
    if opts.default_permissions {
        v.push("default_permissions".into());
    }
    if opts.allow_other {
        v.push("allow_other".into());
    }
    if opts.atime.mode == fern_fs::AtimeMode::Never {
        v.push("noatime".into());
    }
    if opts.atime.nodiratime {
        v.push("nodiratime".into());
    }
    v.extend(opts.passthrough.iter().cloned());
    v.join(",")
}

/// Detaches whatever is mounted at `mountpoint` now (by path: for callers that know the top
/// mount there is theirs, or emergencies); the kernel finishes it when the last user goes.
pub fn lazy_unmount(mountpoint: &Path) -> io::Result<()> {
    match nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        // Not root: the setuid helper may unmount what its user mounted.
        Err(nix::errno::Errno::EPERM) => fusermount_unmount(mountpoint, true),
        Err(e) => Err(e.into()),
    }
}

/// Unmounts the top mount at `mountpoint` through `fusermount3 -u` (`-z`: lazily).
pub fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg("--").arg(mountpoint).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u {}: {}",
            mountpoint.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: u64, parent: u64, mp: &str) -> MountEntry {
        MountEntry {
            id,
            parent,
            dev: (0, id as u32),
            mount_point: mp.into(),
            fs_type: "x".into(),
            source: "s".into(),
        }
    }

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let l = "812 30 0:71 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:400 - fuse.fernfs \
                 /img\\040x rw,user_id=0,group_id=0,default_permissions";
        let m = parse_mountinfo_line(l).unwrap();
        assert_eq!((m.id, m.parent, m.dev), (812, 30, (0, 71)));
        assert_eq!(m.mount_point, Path::new("/tmp/a b"));
        assert_eq!((m.fs_type.as_str(), m.source.as_str()), (FS_TYPE, "/img x"));
        assert_eq!(unescape(r"/x\134y"), br"/x\y");
        assert_eq!(unescape(r"/end\04"), br"/end\04");
    }

    #[test]
    fn top_mount_is_the_one_nothing_is_stacked_on() {
        // tmpfs (10) on /m, fernfs (11) over it, then an unrelated mount listed later.
        let t = vec![e(10, 1, "/m"), e(11, 10, "/m"), e(12, 1, "/other")];
        assert_eq!(top_mount(&t, Path::new("/m")).unwrap().id, 11);
        // Listed out of order (after a move): still the one on top.
        let t = vec![e(11, 10, "/m"), e(10, 1, "/m")];
        assert_eq!(top_mount(&t, Path::new("/m")).unwrap().id, 11);
        assert!(top_mount(&t, Path::new("/n")).is_none());
    }
}
