//! `fernfs import HOSTDIR TARGET[:/path]` and `fernfs export TARGET[:/path] HOSTDIR`: copying
//! trees between the host and an unmounted image, or an etcd file system (docs/distributed.md
//! §10), through the library API (`fern_fs::path` to
//! find and create, `fern_fs::Fs` by inode for attributes, so symlinks get theirs too), no
//! FUSE involved. Like `cp -a` / `tar --xattrs`, by default: every file type (regular files,
//! directories, symlinks, FIFOs, sockets, device nodes), owner and group, permission bits
//! (set-id included), access and modification times, extended attributes, hard links, and
//! holes (import asks the source for its data ranges with SEEK_DATA/SEEK_HOLE; export leaves
//! every all-zero block a hole), so no zero block is written. Owners and device nodes need
//! root on the host side of an export; as another user they are skipped with a note, as tar
//! does. Ctrl-C stops at a clean point: the file being copied is removed, the image is closed
//! consistent, and the message says what was copied and where it stopped.
//! It owns the walk and the progress bar; it must never bypass the path API.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Attr, Cred, FileType, SetAttr, TimeSet, Timespec};
use indicatif::{ProgressBar, ProgressStyle};

use super::image::{Access, CmdError};
use super::interrupt::Interrupt;
use super::target::{split_target, Target};

/// Bytes per read or write call.
const CHUNK: usize = 1 << 20;
/// Export's hole granularity: an all-zero block of this size is skipped, not written.
const HOLE_BLOCK: usize = 4096;

/// Options of `fernfs import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Host directory to copy from.
    pub hostdir: PathBuf,
    /// Image or etcd URL, optionally with a directory inside it: IMAGE or IMAGE:/path
    /// (created if missing).
    pub target: String,
}

/// Options of `fernfs export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Image or etcd URL, optionally with a directory inside it: IMAGE or IMAGE:/path.
    pub source: String,
    /// Host directory to copy into (created if missing).
    pub hostdir: PathBuf,
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn ctx(what: &str, path: &[u8], e: impl std::fmt::Display) -> CmdError {
    CmdError::new(format!("{what} {}: {e}", String::from_utf8_lossy(path)))
}

fn host_err(p: &Path, e: impl std::fmt::Display) -> CmdError {
    CmdError::new(format!("{}: {e}", p.display()))
}

fn bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

fn host_total(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}

/// What a copy has done so far: for the summary, and for the message when it stops early.
#[derive(Default)]
struct Tally {
    entries: u64,
    bytes: u64,
    notes: u64,
    /// The entry being copied (host path for import, image path for export).
    current: Option<String>,
    /// A regular file created but not completely written: removed if the copy stops.
    partial: Option<PathBuf>,
}

impl Tally {
    /// The error of a copy that stopped early, saying what is there and what is not.
    fn stopped(&self, e: CmdError, into: &str) -> CmdError {
        CmdError::new(format!(
            "{e}\n  copied: {} entries, {} bytes of file data into {into}{}\n  not copied: {} and \
             every entry after it in name order{}",
            self.entries,
            self.bytes,
            if self.partial.is_some() {
                " (the file being copied when it stopped was removed)"
            } else {
                ""
            },
            self.current.as_deref().unwrap_or("everything"),
            if into.contains(':') {
                "; the image is closed and consistent"
            } else {
                ""
            }
        ))
    }
}

fn ts(sec: i64, nsec: i64) -> TimeSet {
    TimeSet::At(Timespec {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    })
}

/// The host entry's owner, mode and times onto image path `ip`, not following a symlink
/// (mode: not for symlinks). chown first: a chown may clear set-id bits, which the mode then
/// restores.
fn set_image_attrs(pfs: &PathFs, ip: &[u8], m: &Metadata, mode: bool) -> Result<(), CmdError> {
    let own = SetAttr {
        uid: Some(m.uid()),
        gid: Some(m.gid()),
        ..SetAttr::default()
    };
    let rest = SetAttr {
        mode: mode.then_some(m.mode() & 0o7777),
        atime: Some(ts(m.atime(), m.atime_nsec())),
        mtime: Some(ts(m.mtime(), m.mtime_nsec())),
        ..SetAttr::default()
    };
    pfs.lsetattr(ip, &own)
        .and_then(|()| pfs.lsetattr(ip, &rest))
        .map_err(|e| ctx("setting attributes of", ip, e))
}

/// An extended attribute: name and value.
type Xattr = (Vec<u8>, Vec<u8>);

/// The host entry's extended attributes (not following a symlink). Linux bounds a name list
/// and a value at 64 KiB each, so one buffer of that size always suffices.
fn host_xattrs(p: &Path) -> Result<Vec<Xattr>, CmdError> {
    const XATTR_MAX: usize = 64 << 10;
    let mut names = vec![0u8; XATTR_MAX];
    let n = rustix::fs::llistxattr(p, &mut names[..]).map_err(|e| host_err(p, e))?;
    names.truncate(n);
    let mut out = Vec::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let c = std::ffi::CString::new(name).map_err(|e| host_err(p, e))?;
        let mut v = vec![0u8; XATTR_MAX];
        let len = rustix::fs::lgetxattr(p, &c, &mut v[..]).map_err(|e| host_err(p, e))?;
        v.truncate(len);
        out.push((name.to_vec(), v));
    }
    Ok(out)
}

/// Runs `fernfs import`.
pub fn import(args: ImportArgs) -> Result<(), CmdError> {
    let stop = Interrupt::install()?;
    if !std::fs::metadata(&args.hostdir)
        .map_err(|e| host_err(&args.hostdir, e))?
        .is_dir()
    {
        return Err(host_err(&args.hostdir, "not a directory"));
    }
    let (img_path, dest) = split_target(&args.target);
    let image = Target::open(&img_path, Access::ReadWrite)?;
    let pfs = PathFs::new(image.fs(Access::ReadWrite)?, Cred::root());
    let img_name = image.name();
    let pb = bar(host_total(&args.hostdir));
    let mut t = Tally::default();
    let mut dirs = Vec::new();
    let r = import_tree(&pfs, &args, &dest, &stop, &pb, &mut t, &mut dirs);
    if r.is_err() {
        if let Some(p) = &t.partial {
            let _ = pfs.unlink(p.as_os_str().as_bytes());
        }
    }
    // Directory modes and times last, also after a stop: adding entries changed their
    // mtimes, and a read-only mode would have refused our own writes.
    let finished = dirs
        .iter()
        .rev()
        .try_for_each(|(ip, m)| set_image_attrs(&pfs, ip, m, true));
    pb.finish_and_clear();
    drop(pfs);
    let closed = image.close();
    let into = format!("{img_name}:{}", String::from_utf8_lossy(&dest));
    r.and(finished)
        .and(closed)
        .map_err(|e| t.stopped(e, &into))?;
    eprintln!(
        "fernfs: imported {} into {into}: {} entries, {} bytes{}",
        args.hostdir.display(),
        t.entries,
        t.bytes,
        notes(t.notes)
    );
    Ok(())
}

fn notes(n: u64) -> String {
    if n > 0 {
        format!(" ({n} notes above)")
    } else {
        String::new()
    }
}

fn import_tree(
    pfs: &PathFs,
    args: &ImportArgs,
    dest: &[u8],
    stop: &Interrupt,
    pb: &ProgressBar,
    t: &mut Tally,
    dirs: &mut Vec<(Vec<u8>, Metadata)>,
) -> Result<(), CmdError> {
    // mkdir -p of the destination.
    let mut cur = b"/".to_vec();
    for comp in dest.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        cur = join(&cur, comp);
        match pfs.mkdir(&cur, 0o755) {
            Ok(_) | Err(fern_fs::FsError::Exists) => {}
            Err(e) => return Err(ctx("mkdir", &cur, e)),
        }
    }
    let root_meta = std::fs::metadata(&args.hostdir).map_err(|e| host_err(&args.hostdir, e))?;
    dirs.push((dest.to_vec(), root_meta));
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut stack = vec![(args.hostdir.clone(), dest.to_vec())];
    while let Some((host, inner)) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&host)
            .map_err(|e| host_err(&host, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| host_err(&host, e))?;
        entries.sort_by_key(|e| e.file_name());
        // Pushed in reverse, so subdirectories are visited in name order.
        let mut subdirs = Vec::new();
        for e in entries {
            stop.check()?;
            let hp = e.path();
            t.current = Some(hp.display().to_string());
            let ip = join(&inner, e.file_name().as_bytes());
            let m = std::fs::symlink_metadata(&hp).map_err(|e| host_err(&hp, e))?;
            let ft = m.file_type();
            if !ft.is_dir() && m.nlink() > 1 {
                if let Some(first) = links.get(&(m.dev(), m.ino())) {
                    pfs.link(first, &ip).map_err(|e| ctx("link", &ip, e))?;
                    t.entries += 1;
                    continue;
                }
                links.insert((m.dev(), m.ino()), ip.clone());
            }
            if ft.is_dir() {
                pfs.mkdir(&ip, 0o700).map_err(|e| ctx("mkdir", &ip, e))?;
                subdirs.push((hp.clone(), ip.clone()));
                dirs.push((ip.clone(), m.clone()));
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&hp).map_err(|e| host_err(&hp, e))?;
                pfs.symlink(target.as_os_str().as_bytes(), &ip)
                    .map_err(|e| ctx("symlink", &ip, e))?;
                set_image_attrs(pfs, &ip, &m, false)?;
            } else if ft.is_file() {
                t.partial = Some(PathBuf::from(OsStr::from_bytes(&ip)));
                import_file(pfs, &hp, &ip, &m, stop, pb, t)?;
                t.partial = None;
                set_image_attrs(pfs, &ip, &m, true)?;
            } else {
                // FIFO, socket, character or block device: the type is in the mode.
                pfs.mknod(&ip, m.mode(), m.rdev())
                    .map_err(|e| ctx("mknod", &ip, e))?;
                set_image_attrs(pfs, &ip, &m, true)?;
            }
            for (name, value) in host_xattrs(&hp)? {
                pfs.lsetxattr(&ip, &name, &value, 0)
                    .map_err(|e| ctx("setxattr", &ip, e))?;
            }
            t.entries += 1;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    t.current = None;
    Ok(())
}

/// Copies the data ranges of host file `hp` (SEEK_DATA/SEEK_HOLE) into a new image file, and
/// sets its size: holes stay holes.
fn import_file(
    pfs: &PathFs,
    hp: &Path,
    ip: &[u8],
    m: &Metadata,
    stop: &Interrupt,
    pb: &ProgressBar,
    t: &mut Tally,
) -> Result<(), CmdError> {
    let f = pfs
        .open(ip, OpenOptions::create_new(0o600))
        .map_err(|e| ctx("create", ip, e))?;
    let src = std::fs::File::open(hp).map_err(|e| host_err(hp, e))?;
    let len = m.len();
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    while pos < len {
        use rustix::fs::SeekFrom;
        let data = match rustix::fs::seek(&src, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break, // only a hole is left
            Err(_) => pos,                         // no SEEK_DATA here: all data
        };
        let end = rustix::fs::seek(&src, SeekFrom::Hole(data))
            .unwrap_or(len)
            .min(len);
        let mut off = data;
        while off < end {
            stop.check()?;
            let want = ((end - off) as usize).min(CHUNK);
            let n = src
                .read_at(&mut buf[..want], off)
                .map_err(|e| host_err(hp, e))?;
            if n == 0 {
                break; // the file shrank under us
            }
            let mut done = 0;
            while done < n {
                done += pfs
                    .write_at(&f, off + done as u64, &buf[done..n])
                    .map_err(|e| ctx("write", ip, e))?;
            }
            off += n as u64;
            t.bytes += n as u64;
            pb.inc(n as u64);
        }
        pos = end.max(data + 1).max(off);
    }
    pfs.ftruncate(&f, len).map_err(|e| ctx("truncate", ip, e))?;
    pfs.close(f).map_err(|e| ctx("close", ip, e))
}

/// Runs `fernfs export`.
pub fn export(args: ExportArgs) -> Result<(), CmdError> {
    let stop = Interrupt::install()?;
    let (img_path, src) = split_target(&args.source);
    let image = Target::open(&img_path, Access::ReadOnly)?;
    let pfs = PathFs::new(image.fs(Access::ReadOnly)?, Cred::root());
    let img_name = image.name();
    // The source must exist (and be a directory) before anything is created on the host.
    let top = pfs.stat(&src).map_err(|e| ctx("export", &src, e))?;
    if top.kind != FileType::Directory {
        return Err(ctx("export", &src, "not a directory"));
    }
    std::fs::create_dir_all(&args.hostdir).map_err(|e| host_err(&args.hostdir, e))?;
    let pb = bar(0);
    let mut t = Tally::default();
    let mut dirs = vec![(args.hostdir.clone(), top)];
    let r = export_tree(&pfs, &src, &args.hostdir, &stop, &pb, &mut t, &mut dirs);
    if r.is_err() {
        if let Some(p) = &t.partial {
            let _ = std::fs::remove_file(p);
        }
    }
    let finished = dirs
        .iter()
        .rev()
        .try_for_each(|(hp, a)| set_host_attrs(hp, a, true, &pb, &mut t.notes));
    pb.finish_and_clear();
    drop(pfs);
    let closed = image.close();
    let into = args.hostdir.display().to_string();
    r.and(finished)
        .and(closed)
        .map_err(|e| t.stopped(e, &into))?;
    eprintln!(
        "fernfs: exported {img_name}:{} to {into}: {} entries, {} bytes{}",
        String::from_utf8_lossy(&src),
        t.entries,
        t.bytes,
        notes(t.notes)
    );
    Ok(())
}

fn export_tree(
    pfs: &PathFs,
    src: &[u8],
    hostdir: &Path,
    stop: &Interrupt,
    pb: &ProgressBar,
    t: &mut Tally,
    dirs: &mut Vec<(PathBuf, Attr)>,
) -> Result<(), CmdError> {
    let root = nix::unistd::geteuid().is_root();
    let mut links: HashMap<u64, PathBuf> = HashMap::new();
    let mut stack = vec![(src.to_vec(), hostdir.to_path_buf())];
    while let Some((inner, host)) = stack.pop() {
        let entries = pfs.read_dir(&inner).map_err(|e| ctx("list", &inner, e))?;
        let mut subdirs = Vec::new();
        for e in entries {
            stop.check()?;
            let ip = join(&inner, &e.name);
            t.current = Some(String::from_utf8_lossy(&ip).into_owned());
            let hp = host.join(OsString::from_vec(e.name.clone()));
            let Some(attr) = e.attr else { continue };
            if attr.kind != FileType::Directory && attr.nlink > 1 {
                if let Some(first) = links.get(&attr.ino.0) {
                    std::fs::hard_link(first, &hp).map_err(|e| host_err(&hp, e))?;
                    t.entries += 1;
                    continue;
                }
                links.insert(attr.ino.0, hp.clone());
            }
            match attr.kind {
                FileType::Directory => {
                    std::fs::create_dir(&hp).map_err(|e| host_err(&hp, e))?;
                    subdirs.push((ip.clone(), hp.clone()));
                    dirs.push((hp.clone(), attr));
                }
                FileType::Symlink => {
                    let target = pfs.readlink(&ip).map_err(|e| ctx("readlink", &ip, e))?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), &hp)
                        .map_err(|e| host_err(&hp, e))?;
                }
                FileType::Regular => {
                    t.partial = Some(hp.clone());
                    export_file(pfs, &ip, &hp, &attr, stop, pb, t)?;
                    t.partial = None;
                }
                FileType::CharDevice | FileType::BlockDevice if !root => {
                    pb.println(format!(
                        "skipped (device node; needs root): {}",
                        hp.display()
                    ));
                    t.notes += 1;
                    continue;
                }
                kind => {
                    let ty = rustix::fs::FileType::from_raw_mode(kind.mode_bits());
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        &hp,
                        ty,
                        rustix::fs::Mode::from_raw_mode(attr.perm),
                        attr.rdev,
                    )
                    .map_err(|e| host_err(&hp, e))?;
                }
            }
            for (name, value) in pfs.lxattrs(&ip).map_err(|e| ctx("xattrs of", &ip, e))? {
                if let Err(err) =
                    rustix::fs::lsetxattr(&hp, &name[..], &value, rustix::fs::XattrFlags::empty())
                {
                    pb.println(format!(
                        "xattr {} not kept on {}: {err}",
                        String::from_utf8_lossy(&name),
                        hp.display()
                    ));
                    t.notes += 1;
                }
            }
            if attr.kind != FileType::Directory {
                set_host_attrs(&hp, &attr, attr.kind != FileType::Symlink, pb, &mut t.notes)?;
            }
            t.entries += 1;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    t.current = None;
    Ok(())
}

/// Copies an image file to the host, leaving every all-zero block a hole.
fn export_file(
    pfs: &PathFs,
    ip: &[u8],
    hp: &Path,
    attr: &Attr,
    stop: &Interrupt,
    pb: &ProgressBar,
    t: &mut Tally,
) -> Result<(), CmdError> {
    pb.inc_length(attr.size);
    let f = pfs
        .open(ip, OpenOptions::default())
        .map_err(|e| ctx("open", ip, e))?;
    let out = std::fs::File::create(hp).map_err(|e| host_err(hp, e))?;
    let mut off = 0u64;
    while off < attr.size {
        stop.check()?;
        let d = pfs
            .read_at(&f, off, CHUNK as u32)
            .map_err(|e| ctx("read", ip, e))?;
        if d.is_empty() {
            break;
        }
        for (i, block) in d.chunks(HOLE_BLOCK).enumerate() {
            if block.iter().any(|b| *b != 0) {
                out.write_all_at(block, off + (i * HOLE_BLOCK) as u64)
                    .map_err(|e| host_err(hp, e))?;
            }
        }
        off += d.len() as u64;
        t.bytes += d.len() as u64;
        pb.inc(d.len() as u64);
    }
    out.set_len(attr.size).map_err(|e| host_err(hp, e))?;
    pfs.close(f).map_err(|e| ctx("close", ip, e))
}

/// Owner (as root; otherwise skipped with a note), mode (`mode`: not for symlinks) and times
/// of an image entry onto host path `hp`, not following a symlink.
fn set_host_attrs(
    hp: &Path,
    a: &Attr,
    mode: bool,
    pb: &ProgressBar,
    notes: &mut u64,
) -> Result<(), CmdError> {
    match std::os::unix::fs::lchown(hp, Some(a.uid), Some(a.gid)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            pb.println(format!(
                "owner {}:{} not kept on {} (needs root)",
                a.uid,
                a.gid,
                hp.display()
            ));
            *notes += 1;
        }
        Err(e) => return Err(host_err(hp, e)),
    }
    if mode {
        std::fs::set_permissions(hp, std::fs::Permissions::from_mode(a.perm))
            .map_err(|e| host_err(hp, e))?;
    }
    let t = |s: &Timespec| rustix::fs::Timespec {
        tv_sec: s.sec,
        tv_nsec: s.nsec.into(),
    };
    let times = rustix::fs::Timestamps {
        last_access: t(&a.atime),
        last_modification: t(&a.mtime),
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        hp,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| host_err(hp, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split_at_colon_slash_only() {
        assert_eq!(
            split_target("a.img"),
            (PathBuf::from("a.img"), b"/".to_vec())
        );
        assert_eq!(
            split_target("dir:x/a.img:/in/side"),
            (PathBuf::from("dir:x/a.img"), b"/in/side".to_vec())
        );
    }
}
