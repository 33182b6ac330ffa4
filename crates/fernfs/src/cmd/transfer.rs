//! `fernfs import HOSTDIR TARGET[:/path]` and `fernfs export TARGET[:/path] HOSTDIR`: copying
//! trees between the host and an unmounted image through the library API (`fern_fs::path`),
//! no FUSE involved. Regular files, directories, symlinks and hard links are copied with
//! their permission bits and modification times; other file types are skipped with a note.
//! It owns the walk and the progress bar; it must never bypass the path API.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use fern_fs::path::{OpenOptions, PathFs};
use fern_fs::{Cred, FileType, TimeSet, Timespec};
use indicatif::{ProgressBar, ProgressStyle};

use super::image::{Access, CmdError, Image, DEFAULT_CACHE};

/// Bytes per read or write call.
const CHUNK: usize = 1 << 20;

/// Options of `fernfs import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Host directory to copy from.
    pub hostdir: PathBuf,
    /// Image, optionally with a directory inside it: IMAGE or IMAGE:/path (created if missing).
    pub target: String,
}

/// Options of `fernfs export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Image, optionally with a directory inside it: IMAGE or IMAGE:/path.
    pub source: String,
    /// Host directory to copy into (created if missing).
    pub hostdir: PathBuf,
}

/// `IMAGE[:/path]` split; a colon counts only when a `/` follows it.
fn split_target(s: &str) -> (PathBuf, Vec<u8>) {
    match s.rfind(":/") {
        Some(i) => (PathBuf::from(&s[..i]), s.as_bytes()[i + 1..].to_vec()),
        None => (PathBuf::from(s), b"/".to_vec()),
    }
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

/// Runs `fernfs import`.
pub fn import(args: ImportArgs) -> Result<(), CmdError> {
    let (img_path, dest) = split_target(&args.target);
    let image = Image::open(&img_path, DEFAULT_CACHE)?;
    let pfs = PathFs::new(image.fs()?, Cred::root());
    let pb = bar(host_total(&args.hostdir));
    // mkdir -p of the destination.
    let mut cur = b"/".to_vec();
    for comp in dest.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        cur = join(&cur, comp);
        match pfs.mkdir(&cur, 0o755) {
            Ok(_) | Err(fern_fs::FsError::Exists) => {}
            Err(e) => return Err(ctx("mkdir", &cur, e)),
        }
    }
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut stack = vec![(args.hostdir.clone(), dest.clone())];
    let mut dirs = Vec::new();
    let mut skipped = 0u64;
    while let Some((host, inner)) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&host)
            .map_err(|e| CmdError::new(format!("{}: {e}", host.display())))?
            .collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let hp = e.path();
            let ip = join(&inner, e.file_name().as_bytes());
            let m = std::fs::symlink_metadata(&hp)?;
            let perm = m.permissions().mode() & 0o7777;
            let ft = m.file_type();
            if ft.is_dir() {
                pfs.mkdir(&ip, 0o700).map_err(|e| ctx("mkdir", &ip, e))?;
                stack.push((hp, ip.clone()));
                dirs.push((ip, perm, m.mtime(), m.mtime_nsec()));
                continue;
            }
            if ft.is_symlink() {
                let t = std::fs::read_link(&hp)?;
                pfs.symlink(t.as_os_str().as_bytes(), &ip)
                    .map_err(|e| ctx("symlink", &ip, e))?;
                continue;
            }
            if !ft.is_file() {
                pb.println(format!("skipped (not a file): {}", hp.display()));
                skipped += 1;
                continue;
            }
            if m.nlink() > 1 {
                if let Some(first) = links.get(&(m.dev(), m.ino())) {
                    pfs.link(first, &ip).map_err(|e| ctx("link", &ip, e))?;
                    continue;
                }
                links.insert((m.dev(), m.ino()), ip.clone());
            }
            let opts = OpenOptions::create_new(perm);
            let f = pfs.open(&ip, opts).map_err(|e| ctx("create", &ip, e))?;
            let mut src = std::fs::File::open(&hp)?;
            let mut buf = vec![0u8; CHUNK];
            let mut off = 0u64;
            loop {
                let n = src.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                let mut done = 0;
                while done < n {
                    done += pfs
                        .write_at(&f, off + done as u64, &buf[done..n])
                        .map_err(|e| ctx("write", &ip, e))?;
                }
                off += n as u64;
                pb.inc(n as u64);
            }
            pfs.close(f).map_err(|e| ctx("close", &ip, e))?;
            set_times(&pfs, &ip, m.mtime(), m.mtime_nsec())?;
        }
    }
    // Directory modes and times last: adding entries changed their mtimes, and a read-only
    // mode would have refused our own writes (the library API does not check, but be exact).
    for (ip, perm, sec, nsec) in dirs.into_iter().rev() {
        pfs.chmod(&ip, perm).map_err(|e| ctx("chmod", &ip, e))?;
        set_times(&pfs, &ip, sec, nsec)?;
    }
    pb.finish_and_clear();
    drop(pfs);
    image.close()?;
    eprintln!(
        "fernfs: imported {} into {}:{}{}",
        args.hostdir.display(),
        img_path.display(),
        String::from_utf8_lossy(&dest),
        if skipped > 0 {
            format!(" ({skipped} special files skipped)")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn set_times(pfs: &PathFs, ip: &[u8], sec: i64, nsec: i64) -> Result<(), CmdError> {
    let t = TimeSet::At(Timespec {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    });
    pfs.utimens(ip, None, Some(t))
        .map(|_| ())
        .map_err(|e| ctx("utimens", ip, e))
}

/// Runs `fernfs export`.
pub fn export(args: ExportArgs) -> Result<(), CmdError> {
    let (img_path, src) = split_target(&args.source);
    let image = Image::open_as(&img_path, DEFAULT_CACHE, Access::ReadOnly)?;
    let pfs = PathFs::new(image.fs()?, Cred::root());
    std::fs::create_dir_all(&args.hostdir)?;
    let pb = bar(0);
    let mut links: HashMap<u64, PathBuf> = HashMap::new();
    let mut stack = vec![(src.clone(), args.hostdir.clone())];
    let mut dirs = Vec::new();
    while let Some((inner, host)) = stack.pop() {
        let entries = pfs.read_dir(&inner).map_err(|e| ctx("list", &inner, e))?;
        for e in entries {
            let ip = join(&inner, &e.name);
            let hp = host.join(std::ffi::OsString::from_vec(e.name.clone()));
            let Some(attr) = e.attr else { continue };
            let mtime = UNIX_EPOCH + Duration::new(attr.mtime.sec.max(0) as u64, attr.mtime.nsec);
            match e.kind {
                FileType::Directory => {
                    std::fs::create_dir(&hp)
                        .map_err(|err| CmdError::new(format!("{}: {err}", hp.display())))?;
                    stack.push((ip, hp.clone()));
                    dirs.push((hp, attr.perm, mtime));
                }
                FileType::Symlink => {
                    let t = pfs.readlink(&ip).map_err(|err| ctx("readlink", &ip, err))?;
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), &hp)?;
                }
                FileType::Regular => {
                    if attr.nlink > 1 {
                        if let Some(first) = links.get(&attr.ino.0) {
                            std::fs::hard_link(first, &hp)?;
                            continue;
                        }
                        links.insert(attr.ino.0, hp.clone());
                    }
                    pb.inc_length(attr.size);
                    let f = pfs
                        .open(&ip, OpenOptions::default())
                        .map_err(|err| ctx("open", &ip, err))?;
                    let mut out = std::fs::File::create(&hp)?;
                    let mut off = 0u64;
                    loop {
                        let d = pfs
                            .read_at(&f, off, CHUNK as u32)
                            .map_err(|err| ctx("read", &ip, err))?;
                        if d.is_empty() {
                            break;
                        }
                        out.write_all(&d)?;
                        off += d.len() as u64;
                        pb.inc(d.len() as u64);
                    }
                    pfs.close(f).map_err(|err| ctx("close", &ip, err))?;
                    out.set_permissions(std::fs::Permissions::from_mode(attr.perm))?;
                    out.set_modified(mtime)?;
                }
                other => {
                    pb.println(format!("skipped ({other:?}): {}", hp.display()));
                }
            }
        }
    }
    for (hp, perm, mtime) in dirs.into_iter().rev() {
        std::fs::set_permissions(&hp, std::fs::Permissions::from_mode(perm))?;
        std::fs::File::open(&hp)?.set_modified(mtime)?;
    }
    pb.finish_and_clear();
    drop(pfs);
    image.close()?;
    eprintln!(
        "fernfs: exported {}:{} to {}",
        img_path.display(),
        String::from_utf8_lossy(&src),
        args.hostdir.display()
    );
    Ok(())
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
