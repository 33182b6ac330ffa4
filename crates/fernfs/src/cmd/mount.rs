//! `fernfs mount`, `fernfs umount` and the `mount.fernfs` helper of mount(8).
//!
//! Daemon mode re-executes this binary in the foreground mode (`-f`), in its own process
//! group with `/` as its working directory and stdin/stderr on /dev/null; the child reports
//! `ready` (or `error: ...`) on its stdout, a pipe the parent reads, so `fernfs mount` returns
//! exactly when the mount is usable and fails with the child's reason otherwise. No fork in a
//! threaded process, no unsafe. Whatever the daemon has to say later goes to its logger
//! (`daemon_log`: `-o log=PATH`, syslog, or stderr).
//!
//! The mount's `fsname` is the image's canonical path and its type `fuse.fernfs`, so the mount
//! table names the image and `fernfs umount` can wait for the daemon to release it (the image
//! lock) before returning: when `fernfs umount` returns, the image is closed and consistent.
//!
//! mount(8) reaches it two ways for type `fuse.fernfs` (fstab, `mount -t fuse.fernfs`): as
//! `mount.fuse.fernfs` / `mount.fernfs` (a symlink to this binary), or through fuse3's
//! `mount.fuse`, which runs `fernfs SOURCE MOUNTPOINT -o OPTIONS` — both parsed by
//! [`helper_main`].
//!
//! It owns process plumbing only; it must never implement file-system behaviour.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clap::Args;
use fern_fuse::{MountOptions, Stopped};
use fern_tree::Compression;

use super::image::{self, Access, CmdError, Image, DEFAULT_CACHE};

/// Environment variable telling a foreground child to report readiness on stdout.
const NOTIFY_ENV: &str = "FERNFS_NOTIFY_STDOUT";
/// How long `fernfs mount` waits for the daemon to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `fernfs umount` waits for the daemon to close the image.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(300);

/// Options of `fernfs mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// Image file made by `fernfs mkfs`, or `etcd://HOST:PORT[,...]/PREFIX`.
    pub target: PathBuf,
    /// Directory to mount it on.
    pub mountpoint: PathBuf,
    /// Stay in the foreground (default: become a daemon once the mount is ready).
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma-separated, mount(8)-style: ro, rw, allow_other,
    /// default_permissions, writeback_cache, threads=N, cache_size=SIZE (e.g. 256M),
    /// memory=SIZE (the daemon's whole budget; default its cgroup's memory limit, else a
    /// sixteenth of the machine's memory, 128 MiB to 1 GiB),
    /// entry_timeout=SECS, attr_timeout=SECS, max_write=BYTES, fsname=NAME,
    /// compression=zstd|zstd-N|lz4|none (an image file: new partitions use it from now on, and
    /// the image remembers it), delegations=off|auto|always (an etcd mount: when it takes the
    /// write-back delegation, default auto); other options (noatime, nodev, ...) go to the
    /// kernel.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
}

/// Options of `fernfs umount`.
#[derive(Debug, Args)]
pub struct UmountArgs {
    /// Where a fernfs image is mounted.
    pub mountpoint: PathBuf,
    /// Detach now even if busy; the daemon finishes when the last file is closed.
    #[arg(short, long)]
    pub lazy: bool,
}

/// The options of a mount of `target`: an etcd mount starts from short TTLs, no negative
/// entries and no writeback cache, since other mounts change what the kernel caches
/// (docs/distributed.md §7; `MountOptions::shared`); `-o` overrides each. `compression=` is
/// the image's, not the adapter's: it is taken out here and returned beside them.
fn parse_options(target: &Path, list: &[String]) -> Result<(MountOptions, StoreOptions), CmdError> {
    let etcd = super::etcd::url(target).is_some();
    let mut o = if etcd {
        MountOptions::shared(super::etcd::SHARED_TTL)
    } else {
        MountOptions::default()
    };
    let mut store = StoreOptions::default();
    for s in list {
        let mut rest = Vec::new();
        for opt in s.split(',') {
            let opt = opt.trim();
            if let Some(c) = opt.strip_prefix("compression=") {
                if etcd {
                    return Err(CmdError::new(format!(
                        "compression={c}: an etcd store is not compressed by fernfs"
                    )));
                }
                store.compression = Some(c.parse::<Compression>().map_err(CmdError::new)?);
            } else if let Some(d) = opt.strip_prefix("delegations=") {
                if !etcd {
                    return Err(CmdError::new(format!(
                        "delegations={d}: only an etcd mount shares its store"
                    )));
                }
                store.delegations = Some(super::etcd::take_policy(d)?);
            } else {
                rest.push(opt);
            }
        }
        o.parse_into(&rest.join(","))?;
    }
    Ok((o, store))
}

/// The options `-o` gives the store rather than the adapter.
#[derive(Clone, Copy, Debug, Default)]
struct StoreOptions {
    /// `compression=`: the image's codec for new nodes.
    compression: Option<Compression>,
    /// `delegations=`: an etcd mount's write-back (docs/design.md §7.3).
    delegations: Option<fern_kv::TakePolicy>,
}

impl StoreOptions {
    /// The same options as `-o` words, for the daemon's command line.
    fn words(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let Some(c) = self.compression {
            w.push(format!("compression={c}"));
        }
        if let Some(d) = self.delegations {
            w.push(format!("delegations={}", super::etcd::take_policy_word(d)));
        }
        w
    }
}

/// Runs `fernfs mount`.
pub fn run(args: MountArgs) -> Result<(), CmdError> {
    let (opts, store_opts) = parse_options(&args.target, &args.options)?;
    let target = match super::etcd::url(&args.target) {
        Some(_) => args.target.clone(),
        None => args
            .target
            .canonicalize()
            .map_err(|e| CmdError::new(format!("{}: {e}", args.target.display())))?,
    };
    let mp = args
        .mountpoint
        .canonicalize()
        .map_err(|e| CmdError::new(format!("{}: {e}", args.mountpoint.display())))?;
    if !mp.is_dir() {
        return Err(CmdError::new(format!("{}: not a directory", mp.display())));
    }
    if args.foreground {
        let notify = std::env::var_os(NOTIFY_ENV).is_some();
        let r = foreground(&target, &mp, opts, store_opts, notify);
        if notify {
            if let Err(e) = &r {
                // The parent is still waiting for our first line.
                let _ = writeln!(std::io::stdout(), "error: {e}");
            }
        }
        r
    } else {
        // The daemon's stderr is /dev/null: wait here, announced, for a daemon that is still
        // unmounting this image (and fail here, naming its mount, if one has it mounted). An
        // etcd store has no image file to lock (several mounts of one prefix are allowed).
        if super::etcd::url(&target).is_none() {
            drop(image::lock(&target)?);
        }
        daemonize(&target, &mp, &opts, store_opts)
    }
}

/// fern-fuse's session waits for SIGTERM/SIGINT/SIGHUP/SIGUSR1 on a watcher thread and, when
/// the session ends by an unmount, wakes it with a process-directed SIGUSR1. A thread that does
/// not block these signals may be the one the kernel delivers it to, and SIGUSR1's default
/// action ends the process: the engine's checkpointer and log flusher, started when the image
/// opens (before the session blocks the signals on its own thread), made the daemon die at
/// every unmount with status 138 before it closed the image — no final checkpoint, the log
/// replayed at the next mount and its space never returned (F8 through FUSE: 101.4 MiB).
/// Blocked here, before the image opens, every thread inherits the mask and only the
/// watcher's wait receives them.
fn block_session_signals() -> Result<(), CmdError> {
    fern_fuse::block_session_signals()
        .map(drop)
        .map_err(|e| CmdError::new(format!("blocking the session's signals: {e}")))
}

fn foreground(
    target: &Path,
    mp: &Path,
    mut opts: MountOptions,
    store_opts: StoreOptions,
    notify: bool,
) -> Result<(), CmdError> {
    let compression = store_opts.compression;
    block_session_signals()?;
    // The logger first: from here on the daemon's stderr may be /dev/null.
    let log_place = super::daemon_log::install(opts.log.as_deref())?;
    if let Some(url) = super::etcd::url(target) {
        let policy = store_opts
            .delegations
            .unwrap_or(super::etcd::DEFAULT_TAKE_POLICY);
        return foreground_etcd(url, policy, mp, opts, notify, &log_place);
    }
    let plan = memory_plan(&opts);
    let image = Image::open_changing(target, plan.cache, Access::ReadWrite, compression)
        .inspect_err(|e| {
            log::error!("mount {} on {}: {e}", target.display(), mp.display());
        })?;
    let fs = image.fs()?;
    if let Some(m) = plan.fs {
        let bytes = |b: u64| usize::try_from(b).unwrap_or(usize::MAX);
        fs.set_name_cache_bytes(bytes(m.name_sets));
        fs.set_inode_table_bytes(bytes(m.inode_table));
    }
    opts.fsname = target.display().to_string();
    // The adapter answers the root's `fernfs.stats` xattr from here. Weak handles: the
    // image's close must find the store unshared to checkpoint and close it.
    let store = std::sync::Arc::downgrade(&image.store);
    let fs_figures = std::sync::Arc::downgrade(&fs);
    opts.stats = fern_fuse::StatsSource::new(move || match store.upgrade() {
        Some(s) => {
            let mut v = super::stat::engine_figures(&s, true);
            if let Some(fs) = fs_figures.upgrade() {
                let t = fs.inode_table_figures();
                v["inode_table"] = serde_json::json!({
                    "entries": t.entries,
                    "bytes": t.bytes,
                    "limit_bytes": t.max_bytes,
                    "released": t.released,
                });
            }
            v.to_string().into_bytes()
        }
        None => b"{}".to_vec(),
    });
    let stopped = serve(
        fs,
        mp,
        &opts,
        notify,
        &target.display().to_string(),
        &log_place,
    );
    let closed = image.close();
    match (&stopped, &closed) {
        (Ok(_), Ok(())) => log::info!("{} unmounted; {} closed", mp.display(), target.display()),
        (Err(e), _) | (_, Err(e)) => log::error!("{}: {e}", mp.display()),
    }
    log::logger().flush();
    let stopped = stopped?;
    closed?;
    if !notify {
        match stopped {
            Stopped::Unmounted => eprintln!("fernfs: {} unmounted; image closed", mp.display()),
            Stopped::Signal(s) => {
                eprintln!(
                    "fernfs: signal {s}: {} unmounted; image closed",
                    mp.display()
                )
            }
        }
    }
    Ok(())
}

/// How a mount spends its memory.
struct MemoryPlan {
    /// The engine's node cache.
    cache: u64,
    /// The budget's plan (`FsMemory::within`), whose fern-fs parts bound its name sets and
    /// inode table; `None`: no budget, so fern-fs's defaults.
    fs: Option<fern_kv_tree::FsMemory>,
}

/// The memory plan of a mount, and its memory governor: with a budget (`-o memory=`, else the
/// daemon's cgroup limit, else `memory::default_budget`) the budget is split by `FsMemory::within` (fern-fs's name sets and
/// inode table, which grow with the files, and the node cache; `cache_size` overrides the
/// cache) and the governor keeps the allocator's freed pages under it (memory.rs); without one
/// (a machine whose memory is unknown), the default cache, fern-fs's default bounds, and no
/// governor.
fn memory_plan(opts: &MountOptions) -> MemoryPlan {
    let (budget, from) = match opts.memory {
        Some(m) => (Some(m), "-o memory"),
        None => match crate::memory::cgroup_limit() {
            Some(l) => (Some(l), "the cgroup's limit"),
            None => (
                crate::memory::default_budget(),
                "a sixteenth of the machine's memory",
            ),
        },
    };
    let fs = budget.map(fern_kv_tree::FsMemory::within);
    let cache = match (opts.cache_size, fs) {
        (Some(c), _) => c,
        (None, Some(m)) => m.node_cache,
        (None, None) => DEFAULT_CACHE,
    };
    match (budget, fs) {
        (Some(b), Some(m)) => {
            crate::memory::govern(b);
            log::info!(
                "memory budget {} MiB ({from}): node cache {} MiB, inode table {} MiB, name \
                 sets {} MiB",
                b >> 20,
                cache >> 20,
                m.inode_table >> 20,
                m.name_sets >> 20
            );
        }
        _ => log::info!("no memory budget: node cache {} MiB", cache >> 20),
    }
    MemoryPlan { cache, fs }
}

/// Serves `fs` on `mp` until unmounted or signalled, reporting readiness (on stdout to the
/// parent when `notify`, else on stderr).
fn serve(
    fs: std::sync::Arc<fern_fs::Fs>,
    mp: &Path,
    opts: &MountOptions,
    notify: bool,
    source: &str,
    log_place: &dyn std::fmt::Display,
) -> Result<Stopped, CmdError> {
    let ready = || {
        log::info!(
            "{source} mounted on {} (pid {}; logging to {log_place})",
            mp.display(),
            std::process::id()
        );
        if notify {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "ready");
            let _ = out.flush();
        } else {
            eprintln!("fernfs: {source} mounted on {}", mp.display());
        }
    };
    fern_fuse::serve(fs, mp, opts, ready)
        .map_err(|e| CmdError::new(format!("mount {}: {e}", mp.display())))
}

/// An etcd mount: every write is durable in etcd when it returns, so there is no image to
/// close at the end.
fn foreground_etcd(
    url: &str,
    policy: fern_kv::TakePolicy,
    mp: &Path,
    mut opts: MountOptions,
    notify: bool,
    log_place: &dyn std::fmt::Display,
) -> Result<(), CmdError> {
    let store =
        super::etcd::open_shared(url, policy).inspect_err(|e| log::error!("mount {url}: {e}"))?;
    let fs = fern_fs::Fs::mount(store)
        .map(std::sync::Arc::new)
        .map_err(|e| CmdError::new(format!("{url}: cannot mount the file system: {e}")))?;
    opts.fsname = super::etcd::fsname(url);
    let stopped = serve(fs, mp, &opts, notify, url, log_place);
    match &stopped {
        Ok(_) => log::info!("{} unmounted ({url})", mp.display()),
        Err(e) => log::error!("{}: {e}", mp.display()),
    }
    log::logger().flush();
    let stopped = stopped?;
    if !notify {
        eprintln!("fernfs: {} unmounted ({stopped:?})", mp.display());
    }
    Ok(())
}

fn daemonize(
    target: &Path,
    mp: &Path,
    opts: &MountOptions,
    store_opts: StoreOptions,
) -> Result<(), CmdError> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(target)
        .arg(mp)
        .arg("-f")
        .arg("-o")
        .arg(opts.to_option_string());
    for w in store_opts.words() {
        cmd.arg("-o").arg(w);
    }
    let mut child = cmd
        .env(NOTIFY_ENV, "1")
        .current_dir("/")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| CmdError::new("daemon: no stdout pipe"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(line) if line.trim() == "ready" => Ok(()),
        Ok(line) => {
            let _ = child.wait();
            let msg = line.trim().strip_prefix("error: ").unwrap_or(line.trim());
            Err(CmdError::new(if msg.is_empty() {
                "the mount daemon exited before the mount was ready".to_string()
            } else {
                msg.to_string()
            }))
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(CmdError::new(format!(
                "the mount was not ready after {} s; daemon stopped",
                READY_TIMEOUT.as_secs()
            )))
        }
    }
}

/// The image mounted at `mp`, if the topmost mount there is a fernfs one (its source is the
/// image path). Only the top counts: unmounting by path reaches nothing else.
pub fn mounted_image(mp: &Path) -> Option<PathBuf> {
    let table = fern_fuse::mount_table(None).ok()?;
    let top = fern_fuse::top_mount(&table, mp)?;
    let src = PathBuf::from(&top.source);
    // Mounts made before fern-fuse mounted by itself had type "fuse"; a FUSE mount whose
    // source is an existing file or block device (or an etcd file system's name) is taken as
    // ours.
    let ours = top.fs_type == fern_fuse::FS_TYPE
        || (top.fs_type == "fuse"
            && (src.is_file()
                || super::blockdev::is_block_device(&src)
                || super::etcd::is_fsname(&top.source)));
    ours.then_some(src)
}

/// Runs `fernfs umount`: unmounts, then waits until the daemon has closed the image.
pub fn umount(args: UmountArgs) -> Result<(), CmdError> {
    let mp = args
        .mountpoint
        .canonicalize()
        .map_err(|e| CmdError::new(format!("{}: {e}", args.mountpoint.display())))?;
    let image = mounted_image(&mp).ok_or_else(|| {
        CmdError::new(format!(
            "{}: no fernfs mounted there (or another file system is mounted over it)",
            mp.display()
        ))
    })?;
    let r = if args.lazy {
        fern_fuse::lazy_unmount(&mp)
    } else if nix::unistd::geteuid().is_root() {
        nix::mount::umount(&mp).map_err(std::io::Error::from)
    } else {
        fern_fuse::fusermount_unmount(&mp, false)
    };
    r.map_err(|e| {
        CmdError::new(format!(
            "unmount {}: {e} (busy? close its files, or use --lazy)",
            mp.display()
        ))
    })?;
    if args.lazy || !image.exists() {
        return Ok(());
    }
    image::wait_unlocked(&image, CLOSE_TIMEOUT).map_err(|_| {
        CmdError::new(format!(
            "{} unmounted, but the daemon has not closed {} after {} s",
            mp.display(),
            image.display(),
            CLOSE_TIMEOUT.as_secs()
        ))
    })
}

/// mount(8)'s helper conventions: under the name `mount.fernfs` / `mount.fuse.fernfs`,
/// `mount.fernfs SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`; and, as fuse3's
/// `mount.fuse` runs the program of a `fuse.fernfs` mount, `fernfs SOURCE MOUNTPOINT
/// [-o OPTIONS]` — taken when the first argument is none of `subcommands` and not a flag.
/// Returns `None` otherwise.
pub fn helper_main(subcommands: &[&str]) -> Option<ExitCode> {
    let mut argv = std::env::args_os();
    let arg0 = PathBuf::from(argv.next()?);
    let name = arg0.file_name()?.to_str()?.to_string();
    let first = std::env::args_os().nth(1)?;
    let first = first.to_string_lossy();
    let by_name = name == "mount.fernfs" || name == "mount.fuse.fernfs";
    let program_form = !first.starts_with('-') && !subcommands.contains(&first.as_ref());
    if !by_name && !program_form {
        return None;
    }
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut foreground = false;
    let rest: Vec<_> = argv.collect();
    let mut i = 0;
    while i < rest.len() {
        let a = rest[i].to_string_lossy().into_owned();
        match a.as_str() {
            "-o" => {
                i += 1;
                if let Some(o) = rest.get(i) {
                    options.push(o.to_string_lossy().into_owned());
                }
            }
            "-t" | "-N" => i += 1, // the type we already are; namespaces are not supported
            "-f" => foreground = true,
            s if s.starts_with("-o") => options.push(s[2..].to_string()),
            s if s.starts_with('-') => {} // -s (sloppy), -n (no mtab), -v (verbose)
            _ => pos.push(rest[i].clone()),
        }
        i += 1;
    }
    let [source, mountpoint] = match <[_; 2]>::try_from(pos) {
        Ok(p) => p,
        Err(_) => {
            eprintln!("usage: {name} SOURCE MOUNTPOINT [-o OPTIONS]");
            return Some(ExitCode::from(1));
        }
    };
    let args = MountArgs {
        target: source.into(),
        mountpoint: mountpoint.into(),
        foreground,
        options,
    };
    Some(match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            // mount(8) helpers: 32 = mount failure.
            ExitCode::from(32)
        }
    })
}
