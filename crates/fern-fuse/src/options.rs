//! Mount options: the mount(8)-style `-o a,b=c` vocabulary of `fernfs mount`, parsed into
//! [`MountOptions`], and their translation into fuser's session [`fuser::Config`]. It owns the
//! defaults and why they are what they are; it must never touch the file system.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fern_fs::{AtimeMode, AtimePolicy};
use fuser::{Config, SessionACL};
use nix::mount::MsFlags;

/// How a fernfs mount talks to the kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct MountOptions {
    /// Mount read-only (`ro`).
    pub read_only: bool,
    /// Let other users use the mount (`allow_other`; needs root or `user_allow_other` in
    /// /etc/fuse.conf). Off unless asked: a FUSE mount is private to its owner by default.
    pub allow_other: bool,
    /// Let the kernel check permissions from the attributes we return (`default_permissions`).
    /// On by default: fern-fs's own checks are then only needed by the library API, and the
    /// kernel's checks also cover what FUSE never sends us (e.g. search permission on every
    /// path component of a cached lookup). `-o nodefault_permissions` turns it off, and then
    /// the adapter checks with `fern_fs::perm` itself.
    pub default_permissions: bool,
    /// How long the kernel may trust a name→inode answer (`entry_timeout=SECS`).
    pub entry_ttl: Duration,
    /// How long the kernel may trust attributes (`attr_timeout=SECS`; 1 h, the entry TTL's
    /// value, on a local store: see `Default`; the shared TTL on etcd).
    pub attr_ttl: Duration,
    /// How long the kernel may trust that a name does not exist (`negative_timeout=SECS`; 0:
    /// never). A failed LOOKUP is answered with an entry of inode 0 and this TTL, which the
    /// kernel keeps as a negative dentry, so asking again for the same missing name (a stat
    /// before a create, `git status` probing ignore files, PATH searches) costs no round
    /// trip. Safe only where this mount is the only writer of its store: the kernel turns the
    /// negative dentry positive itself when *it* creates the name, but a name another writer
    /// creates stays invisible here for this long. Shared (etcd) stores use 0
    /// ([`MountOptions::shared`]).
    pub negative_ttl: Duration,
    /// Kernel writeback cache (`writeback_cache`, `no_writeback_cache`): writes are gathered
    /// in the page cache and sent merged, at close, fsync or writeback; the kernel owns size
    /// and mtime while a file is cached. Off by default, because measured request counts
    /// (docs/fuse.md, "Kernel caching, choice by choice") show it costs round trips on
    /// fernfs's workloads rather than saving them: a write smaller than a page into a page
    /// not cached becomes a READ of that page first (F5's 5,000 blind 575-byte writes became
    /// 5,520 READs + 4,445 WRITEs — fern-fs's writes never read), and every written or
    /// unlinked file gets one more SETATTR when the kernel writes back its times (F1: 6
    /// requests per file instead of 5). Never on for shared stores ([`MountOptions::shared`]):
    /// another mount's writes would not invalidate pages the kernel caches here.
    pub writeback_cache: bool,
    /// Keep a file's page cache across opens (FOPEN_KEEP_CACHE). Right when this mount is the
    /// only writer; a mount of a shared store (etcd) turns it off, so every open drops what
    /// the kernel cached and reads what other mounts wrote before (close-to-open,
    /// docs/distributed.md §7). `-o keep_cache` / `-o no_keep_cache` override the default.
    pub keep_cache: bool,
    /// Request-handling threads (`threads=N`).
    pub threads: usize,
    /// How requests travel (`transport=auto|dev|uring`; docs/fuse.md, "Transports").
    pub transport: crate::uring::Transport,
    /// When ring threads wait for requests at the idle policy so a woken requester stays on
    /// their CPU (`ring_wakeups=auto|always|off`; docs/fuse.md, "Wake-ups on the serving CPU").
    pub ring_wakeups: crate::uring::WakeMode,
    /// Switch the kernel's `enable_uring` parameter on before mounting if it is off
    /// (`enable_uring`, root only; a global setting that outlives the mount, so never done
    /// unless asked: docs/fuse.md, "Transports").
    pub enable_uring: bool,
    /// Largest write the kernel sends in one request (`max_write=BYTES`), 1 MiB by default:
    /// a larger write means fewer requests and fewer (bigger) batches in the store.
    pub max_write: u32,
    /// The kernel's read-ahead for the mount (`read_ahead=BYTES`, suffixes k/m), 4 MiB by
    /// default; 0 leaves the kernel's own (128 KiB). Set after the handshake through the
    /// mount's backing device (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`, root only; the INIT
    /// reply can only lower it): with 128 KiB a sequential read of a large file arrives as
    /// 128 KiB READs, eight per 1 MiB data extent; with 1 MiB or more, one per extent, and with
    /// 4 MiB the kernel keeps several in flight while the reader copies (docs/fuse.md).
    pub read_ahead: u32,
    /// Store cache size in bytes (`cache_size=BYTES`, suffixes k/m/g); used by whoever opens
    /// the store, not by the adapter.
    pub cache_size: Option<u64>,
    /// The daemon's whole memory in bytes (`memory=BYTES`, suffixes k/m/g): what a cgroup
    /// limit would count. Whoever opens the store sizes its cache inside it (unless
    /// `cache_size` is given) and keeps the process under it; by default the daemon's cgroup
    /// limit, if it has one. Not used by the adapter.
    pub memory: Option<u64>,
    /// When reads update atime (`relatime`, the default; `strictatime`; `noatime`; and
    /// `nodiratime`). FUSE leaves atime to the file system (the kernel marks FUSE inodes
    /// S_NOATIME), so this goes to fern-fs (`Fs::set_atime_policy`); the kernel mount gets the
    /// matching flags too ([`MountOptions::atime_flags`]), so /proc/mounts shows them.
    pub atime: AtimePolicy,
    /// Generic mount flags and FUSE kernel options, passed through to the kernel mount
    /// (`dev`, `noatime`, `max_read=N`, ...; see `kernel_option`). Anything else is refused
    /// when parsed.
    pub passthrough: Vec<String>,
    /// Where the mount daemon logs (`log=PATH`, appended to); `None`: syslog when
    /// `/dev/log` exists, else stderr. Used by whoever runs the daemon, not by the adapter.
    pub log: Option<PathBuf>,
    /// `fsname` shown in /proc/mounts.
    pub fsname: String,
    /// Where the virtual `fernfs.stats` xattr of the root gets its value (set by whoever
    /// opened the store; not a `-o` option).
    pub stats: StatsSource,
}

/// Name of the read-only virtual xattr of the root directory that reports live engine figures
/// (`fernfs stat MOUNTPOINT` reads it). Outside every xattr namespace (`user.`, `trusted.`,
/// ...), so no stored attribute can have it; FUSE passes such names through to us.
pub const STATS_XATTR: &[u8] = b"fernfs.stats";

/// A function producing the value of [`STATS_XATTR`] on request (JSON, by convention). The
/// adapter knows nothing about the engine; the daemon that opened the store supplies this.
#[derive(Clone, Default)]
pub struct StatsSource(Option<Arc<dyn Fn() -> Vec<u8> + Send + Sync>>);

impl StatsSource {
    /// A source calling `f` for every read of the xattr.
    pub fn new(f: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> Self {
        StatsSource(Some(Arc::new(f)))
    }

    /// The current value, or `None` when no source was set.
    pub fn get(&self) -> Option<Vec<u8>> {
        self.0.as_ref().map(|f| f())
    }
}

impl std::fmt::Debug for StatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "StatsSource(set)"
        } else {
            "StatsSource(none)"
        })
    }
}

impl PartialEq for StatsSource {
    /// Option comparisons are about parsed `-o` values; every source compares equal.
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            allow_other: false,
            default_permissions: true,
            // Names change only through requests of this kernel (one writer per store:
            // fsck --repair of a mounted image is refused), and the kernel drops or updates
            // the dentries its own create/unlink/rename/link requests change. So a name the
            // kernel has resolved stays right until the kernel itself changes it, and an
            // entry TTL only costs one LOOKUP per name per TTL: with libfuse's 1 s, a
            // workload that comes back to files older than a second (F10's chmod + utime of
            // the F1 tree, postmark, rm -r after a scan) re-looked up every one of them.
            entry_ttl: Duration::from_secs(3600),
            // The same reasoning for attributes: the kernel invalidates what its own requests
            // change (size, times, blocks after a write; ctime and nlink at link, unlink,
            // rename; the directory at every create and remove; everything a SETATTR reply
            // carries). The one change fern-fs makes behind it — set-id bits cleared by an
            // unprivileged write or fallocate under HANDLE_KILLPRIV_V2 — is followed by an
            // explicit FUSE_NOTIFY_INVAL_INODE (adapter.rs). Entry replies (lookup, create,
            // readdirplus) always gave their attributes the entry TTL (1 h); with 1 s here
            // only GETATTR/SETATTR answers expired, which cost a GETATTR per file wherever a
            // workload came back to a file after a second (F10, docs/fuse.md).
            attr_ttl: Duration::from_secs(3600),
            // The same reasoning as the entry TTL: only this kernel creates names.
            negative_ttl: Duration::from_secs(3600),
            writeback_cache: false,
            keep_cache: true,
            // Measured with F1 (sequential creates) on the 2-core CI box: 1 loop ~7000-9500
            // files/s, 2 loops ~4400-7000, 4 loops ~1400-3200; with 4 parallel writers 2
            // loops were best (~5500 vs ~4750 with 1). Every extra idle loop costs wake-ups
            // and context switches per request, so 2 is the default; raise it on big machines.
            threads: 2,
            // io_uring where the kernel allows it: it serves a request on the CPU that made
            // it, without a read/write pair and a cross-CPU wake-up (docs/fuse.md).
            transport: crate::uring::Transport::Auto,
            ring_wakeups: crate::uring::WakeMode::Auto,
            enable_uring: false,
            max_write: 1 << 20,
            read_ahead: 4 << 20,
            cache_size: None,
            memory: None,
            atime: AtimePolicy::default(),
            passthrough: Vec::new(),
            log: None,
            fsname: "fernfs".into(),
            stats: StatsSource::default(),
        }
    }
}

/// A malformed or unknown option.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// A known option with a bad value.
    #[error("bad mount option `{0}`: {1}")]
    Bad(String, &'static str),
    /// Neither ours, nor a generic mount flag, nor a FUSE kernel option: refused before any
    /// mount is attempted (the kernel would refuse it with a bare EINVAL).
    #[error("unknown mount option '{0}'")]
    Unknown(String),
}

impl MountOptions {
    /// The options of a mount whose store other mounts change too (etcd): names and
    /// attributes are trusted for `ttl` only, missing names are never cached (another mount
    /// may create them), no writeback cache (another mount's writes would not reach
    /// pages cached here), and no page cache kept across opens (close-to-open: each open
    /// reads what other mounts wrote before it). `-o` options applied afterwards still
    /// override each.
    pub fn shared(ttl: Duration) -> Self {
        MountOptions {
            entry_ttl: ttl,
            attr_ttl: ttl,
            negative_ttl: Duration::ZERO,
            writeback_cache: false,
            keep_cache: false,
            ..MountOptions::default()
        }
    }

    /// Applies a comma-separated option string (may be given several times, later wins).
    pub fn parse_into(&mut self, s: &str) -> Result<(), OptionError> {
        for opt in s.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let (key, val) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let bad = |why| OptionError::Bad(opt.to_string(), why);
            let num = |v: Option<&str>| -> Result<u64, OptionError> {
                v.ok_or_else(|| bad("needs a value"))
                    .and_then(|v| parse_size(v).ok_or_else(|| bad("not a number")))
            };
            let secs = |v: Option<&str>| -> Result<Duration, OptionError> {
                v.and_then(|v| v.parse::<f64>().ok())
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| bad("needs seconds"))
            };
            match key {
                "ro" => self.read_only = true,
                "rw" => self.read_only = false,
                "allow_other" => self.allow_other = true,
                "default_permissions" => self.default_permissions = true,
                "nodefault_permissions" => self.default_permissions = false,
                "writeback_cache" => self.writeback_cache = true,
                "no_writeback_cache" => self.writeback_cache = false,
                "keep_cache" => self.keep_cache = true,
                "no_keep_cache" => self.keep_cache = false,
                "entry_timeout" => self.entry_ttl = secs(val)?,
                "attr_timeout" => self.attr_ttl = secs(val)?,
                "negative_timeout" => self.negative_ttl = secs(val)?,
                "threads" => {
                    let n = num(val)?;
                    if !(1..=256).contains(&n) {
                        return Err(bad("threads must be 1..=256"));
                    }
                    self.threads = n as usize;
                }
                "transport" => {
                    self.transport = val
                        .ok_or_else(|| bad("needs a value"))?
                        .parse()
                        .map_err(|_| bad("transport must be auto, dev or uring"))?
                }
                "ring_wakeups" => {
                    self.ring_wakeups = val
                        .ok_or_else(|| bad("needs a value"))?
                        .parse()
                        .map_err(|_| bad("ring_wakeups must be auto, always or off"))?
                }
                "enable_uring" => self.enable_uring = true,
                "max_write" => {
                    let n = num(val)?;
                    if !(4096..=16 << 20).contains(&n) {
                        return Err(bad("max_write must be 4096..=16M"));
                    }
                    self.max_write = n as u32;
                }
                "read_ahead" => {
                    let n = num(val)?;
                    if n > 16 << 20 {
                        return Err(bad("read_ahead must be 0..=16M"));
                    }
                    self.read_ahead = n as u32;
                }
                "cache_size" => self.cache_size = Some(num(val)?),
                "memory" => self.memory = Some(num(val)?),
                // mount(8): `atime` and `norelatime` mean "the default" and "not relatime";
                // the kernel's default is relatime, and "not relatime" is strict.
                "relatime" | "atime" => self.atime.mode = AtimeMode::Relatime,
                "strictatime" | "norelatime" => self.atime.mode = AtimeMode::Strict,
                "noatime" => self.atime.mode = AtimeMode::Never,
                "nodiratime" => self.atime.nodiratime = true,
                "diratime" => self.atime.nodiratime = false,
                "fsname" => self.fsname = val.ok_or_else(|| bad("needs a value"))?.to_string(),
                "log" => {
                    let p = val
                        .filter(|v| !v.is_empty())
                        .ok_or_else(|| bad("needs a path"))?;
                    self.log = Some(PathBuf::from(p));
                }
                // mount(8) and fstab noise that means nothing to a FUSE mount.
                "defaults" | "auto" | "noauto" | "user" | "users" | "nofail" | "_netdev" => {}
                k if k.starts_with("x-") || k.starts_with("comment=") => {}
                _ if kernel_option(opt).is_some() => self.passthrough.push(opt.to_string()),
                _ => return Err(OptionError::Unknown(key.to_string())),
            }
        }
        Ok(())
    }

    /// Back to the `-o` string form (for re-executing the daemon).
    pub fn to_option_string(&self) -> String {
        let mut v: Vec<String> = vec![if self.read_only { "ro" } else { "rw" }.into()];
        if self.allow_other {
            v.push("allow_other".into());
        }
        v.push(
            if self.default_permissions {
                "default_permissions"
            } else {
                "nodefault_permissions"
            }
            .into(),
        );
        v.push(
            if self.writeback_cache {
                "writeback_cache"
            } else {
                "no_writeback_cache"
            }
            .into(),
        );
        v.push(
            if self.keep_cache {
                "keep_cache"
            } else {
                "no_keep_cache"
            }
            .into(),
        );
        v.push(format!("entry_timeout={}", self.entry_ttl.as_secs_f64()));
        v.push(format!("attr_timeout={}", self.attr_ttl.as_secs_f64()));
        v.push(format!(
            "negative_timeout={}",
            self.negative_ttl.as_secs_f64()
        ));
        v.push(format!("threads={}", self.threads));
        v.push(format!("transport={}", self.transport.name()));
        v.push(format!("ring_wakeups={}", self.ring_wakeups.name()));
        if self.enable_uring {
            v.push("enable_uring".into());
        }
        v.push(format!("max_write={}", self.max_write));
        v.push(format!("read_ahead={}", self.read_ahead));
        if let Some(c) = self.cache_size {
            v.push(format!("cache_size={c}"));
        }
        if let Some(m) = self.memory {
            v.push(format!("memory={m}"));
        }
        v.push(
            match self.atime.mode {
                AtimeMode::Relatime => "relatime",
                AtimeMode::Strict => "strictatime",
                AtimeMode::Never => "noatime",
            }
            .into(),
        );
        if self.atime.nodiratime {
            v.push("nodiratime".into());
        }
        if let Some(l) = &self.log {
            v.push(format!("log={}", l.display()));
        }
        v.push(format!("fsname={}", self.fsname));
        v.extend(self.passthrough.iter().cloned());
        v.join(",")
    }

    /// The kernel mount flags that show the atime policy (fern-fs applies it; FUSE inodes are
    /// S_NOATIME to the kernel, so these only inform /proc/mounts and findmnt).
    pub(crate) fn atime_flags(&self) -> MsFlags {
        let mode = match self.atime.mode {
            AtimeMode::Relatime => MsFlags::MS_RELATIME,
            AtimeMode::Strict => MsFlags::MS_STRICTATIME,
            AtimeMode::Never => MsFlags::MS_NOATIME,
        };
        if self.atime.nodiratime {
            mode | MsFlags::MS_NODIRATIME
        } else {
            mode
        }
    }

    /// The fuser session configuration: the ACL and the request loops. fern-fuse mounts by
    /// itself (`mount.rs`) and hands fuser only the descriptor (`Session::from_fd`), on both
    /// transports and for the benchmarks' null file system too, so no mount options go here.
    pub fn fuser_config(&self) -> Config {
        let mut c = Config::default();
        c.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        c.n_threads = Some(self.threads);
        // Each loop reads its own clone of the /dev/fuse descriptor (FUSE_DEV_IOC_CLONE), which
        // measured faster than sharing one descriptor between loops.
        c.clone_fd = self.threads > 1;
        c
    }
}

/// What a pass-through option is to the kernel: a generic mount(2) flag set or cleared (they
/// are flags, not FUSE data options, so they must not be sent as text), or a FUSE data
/// option. `None`: not a kernel option at all. The atime options never get here: they are
/// parsed into [`MountOptions::atime`] and reach the kernel through `atime_flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelOption {
    Set(MsFlags),
    Clear(MsFlags),
    Data,
}

pub(crate) fn kernel_option(opt: &str) -> Option<KernelOption> {
    use KernelOption::{Clear, Data, Set};
    Some(match opt {
        "dev" => Clear(MsFlags::MS_NODEV),
        "nodev" => Set(MsFlags::MS_NODEV),
        "suid" => Clear(MsFlags::MS_NOSUID),
        "nosuid" => Set(MsFlags::MS_NOSUID),
        "exec" => Clear(MsFlags::MS_NOEXEC),
        "noexec" => Set(MsFlags::MS_NOEXEC),
        "lazytime" => Set(MsFlags::MS_LAZYTIME),
        "nolazytime" => Clear(MsFlags::MS_LAZYTIME),
        "sync" => Set(MsFlags::MS_SYNCHRONOUS),
        "async" => Clear(MsFlags::MS_SYNCHRONOUS),
        "dirsync" => Set(MsFlags::MS_DIRSYNC),
        o if o
            .strip_prefix("max_read=")
            .is_some_and(|n| n.parse::<u32>().is_ok()) =>
        {
            Data
        }
        _ => return None,
    })
}

/// `123`, `64k`, `256M`, `2g`, `1T` as bytes (binary multiples).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        let mut o = MountOptions::default();
        o.parse_into(
            "ro,allow_other,threads=8,cache_size=64M,memory=96M,attr_timeout=0.5,noatime,nodiratime,defaults,\
             writeback_cache,negative_timeout=0,transport=dev,enable_uring",
        )
        .unwrap();
        assert_eq!(o.transport, crate::uring::Transport::Dev);
        assert!(o.enable_uring);
        assert!(o.read_only && o.allow_other);
        assert!(o.writeback_cache);
        assert_eq!(o.negative_ttl, Duration::ZERO);
        assert_eq!(o.threads, 8);
        assert_eq!(o.cache_size, Some(64 << 20));
        assert_eq!(o.memory, Some(96 << 20));
        assert_eq!(o.attr_ttl, Duration::from_millis(500));
        assert_eq!(
            o.atime,
            AtimePolicy {
                mode: AtimeMode::Never,
                nodiratime: true
            }
        );
        assert_eq!(
            o.atime_flags(),
            MsFlags::MS_NOATIME | MsFlags::MS_NODIRATIME
        );
        assert!(o.passthrough.is_empty());
        let mut p = MountOptions::default();
        p.parse_into(&o.to_option_string()).unwrap();
        assert_eq!(o, p);
    }

    #[test]
    fn shared_stores_cache_no_missing_names_and_no_writes() {
        let local = MountOptions::default();
        assert!(local.negative_ttl > Duration::ZERO);
        let mut o = MountOptions::shared(Duration::from_secs(1));
        assert!(!o.writeback_cache);
        assert_eq!(o.negative_ttl, Duration::ZERO);
        assert_eq!(o.entry_ttl, Duration::from_secs(1));
        // What the daemon is re-executed with keeps every choice, defaults included.
        let mut p = MountOptions::default();
        p.parse_into(&o.to_option_string()).unwrap();
        assert_eq!(o, p);
        o.parse_into("writeback_cache").unwrap();
        assert!(o.writeback_cache, "-o still overrides");
    }

    #[test]
    fn mount_flags_are_flags_not_fuse_options() {
        let mut o = MountOptions::default();
        o.parse_into("noatime,relatime,nodev,max_read=65536,log=/tmp/l")
            .unwrap();
        assert_eq!(o.log.as_deref(), Some(std::path::Path::new("/tmp/l")));
        assert_eq!(kernel_option("noatime"), None, "parsed as the atime policy");
        assert_eq!(
            o.atime.mode,
            AtimeMode::Relatime,
            "the last atime option wins"
        );
        assert_eq!(
            kernel_option("nodev"),
            Some(KernelOption::Set(MsFlags::MS_NODEV))
        );
        assert_eq!(
            kernel_option("dev"),
            Some(KernelOption::Clear(MsFlags::MS_NODEV))
        );
        assert_eq!(kernel_option("max_read=65536"), Some(KernelOption::Data));
        assert_eq!(kernel_option("max_read=x"), None);
    }

    #[test]
    fn atime_options_last_one_wins() {
        let mut o = MountOptions::default();
        assert_eq!(o.atime.mode, AtimeMode::Relatime);
        assert_eq!(o.atime_flags(), MsFlags::MS_RELATIME);
        o.parse_into("noatime,strictatime").unwrap();
        assert_eq!(o.atime.mode, AtimeMode::Strict);
        o.parse_into("atime").unwrap();
        assert_eq!(o.atime.mode, AtimeMode::Relatime);
    }

    #[test]
    fn read_ahead_is_a_size_and_zero_leaves_the_kernels() {
        let mut o = MountOptions::default();
        assert_eq!(o.read_ahead, 4 << 20);
        o.parse_into("read_ahead=256k").unwrap();
        assert_eq!(o.read_ahead, 256 << 10);
        o.parse_into("read_ahead=0").unwrap();
        assert_eq!(o.read_ahead, 0);
    }

    #[test]
    fn unknown_options_are_refused_by_name() {
        let mut o = MountOptions::default();
        let e = o.parse_into("rw,x").unwrap_err();
        assert_eq!(e.to_string(), "unknown mount option 'x'");
        let e = o.parse_into("bogus=3").unwrap_err();
        assert_eq!(e.to_string(), "unknown mount option 'bogus'");
    }

    #[test]
    fn rejects_bad_values() {
        let mut o = MountOptions::default();
        assert!(o.parse_into("threads=0").is_err());
        assert!(o.parse_into("threads=x").is_err());
        assert!(o.parse_into("attr_timeout=-1").is_err());
        assert!(o.parse_into("max_write=1").is_err());
        assert!(o.parse_into("read_ahead=17M").is_err());
        assert!(o.parse_into("read_ahead").is_err());
        assert!(o.parse_into("transport=ring").is_err());
        assert!(o.parse_into("transport").is_err());
    }
}
