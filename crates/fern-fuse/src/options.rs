//! Mount options: the mount(8)-style `-o a,b=c` vocabulary of `fernfs mount`, parsed into
//! [`MountOptions`], and their translation into fuser's session [`fuser::Config`]. It owns the
//! defaults and why they are what they are; it must never touch the file system.

use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};

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
    /// How long the kernel may trust attributes (`attr_timeout=SECS`).
    pub attr_ttl: Duration,
    /// Kernel writeback cache (`writeback_cache`): writes are gathered in the page cache and
    /// sent in large chunks; the kernel owns size and mtime while a file is cached. Off by
    /// default because a crash of the *kernel side* can then lose writes that `write(2)`
    /// already acknowledged to the application until they are flushed (which is also true of
    /// every local file system, but FUSE users rarely expect it).
    pub writeback_cache: bool,
    /// Request-handling threads (`threads=N`).
    pub threads: usize,
    /// How requests travel (`transport=dev|uring`; docs/fuse.md, "Transports").
    pub transport: crate::uring::Transport,
    /// Largest write the kernel sends in one request (`max_write=BYTES`), 1 MiB by default:
    /// a larger write means fewer requests and fewer (bigger) batches in the store.
    pub max_write: u32,
    /// Store cache size in bytes (`cache_size=BYTES`, suffixes k/m/g); used by whoever opens
    /// the store, not by the adapter.
    pub cache_size: Option<u64>,
    /// Options the adapter does not know, passed through to the kernel mount (`dev`, `suid`...).
    pub passthrough: Vec<String>,
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
            // Attributes do change behind the kernel: with HANDLE_KILLPRIV_V2 we clear set-id
            // bits on writes (and fallocate) by unprivileged callers, and the kernel does not
            // invalidate the cached mode after a write (only size and times). Until the attr
            // TTL runs out it could still honour a set-uid bit we dropped (e.g. at execve),
            // so this stays at libfuse's 1 s.
            attr_ttl: Duration::from_secs(1),
            writeback_cache: false,
            // Measured with F1 (sequential creates) on the 2-core CI box: 1 loop ~7000-9500
            // files/s, 2 loops ~4400-7000, 4 loops ~1400-3200; with 4 parallel writers 2
            // loops were best (~5500 vs ~4750 with 1). Every extra idle loop costs wake-ups
            // and context switches per request, so 2 is the default; raise it on big machines.
            threads: 2,
            transport: crate::uring::Transport::Dev,
            max_write: 1 << 20,
            cache_size: None,
            passthrough: Vec::new(),
            fsname: "fernfs".into(),
            stats: StatsSource::default(),
        }
    }
}

/// A malformed option.
#[derive(Debug, thiserror::Error)]
#[error("bad mount option `{0}`: {1}")]
pub struct OptionError(pub String, pub &'static str);

impl MountOptions {
    /// Applies a comma-separated option string (may be given several times, later wins).
    pub fn parse_into(&mut self, s: &str) -> Result<(), OptionError> {
        for opt in s.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let (key, val) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let bad = |why| OptionError(opt.to_string(), why);
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
                "entry_timeout" => self.entry_ttl = secs(val)?,
                "attr_timeout" => self.attr_ttl = secs(val)?,
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
                        .map_err(|_| bad("transport must be dev or uring"))?
                }
                "max_write" => {
                    let n = num(val)?;
                    if !(4096..=16 << 20).contains(&n) {
                        return Err(bad("max_write must be 4096..=16M"));
                    }
                    self.max_write = n as u32;
                }
                "cache_size" => self.cache_size = Some(num(val)?),
                "fsname" => self.fsname = val.ok_or_else(|| bad("needs a value"))?.to_string(),
                // mount(8) and fstab noise that means nothing to a FUSE mount.
                "defaults" | "auto" | "noauto" | "user" | "users" | "nofail" | "_netdev" => {}
                k if k.starts_with("x-") || k.starts_with("comment=") => {}
                _ => self.passthrough.push(opt.to_string()),
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
        if self.writeback_cache {
            v.push("writeback_cache".into());
        }
        v.push(format!("entry_timeout={}", self.entry_ttl.as_secs_f64()));
        v.push(format!("attr_timeout={}", self.attr_ttl.as_secs_f64()));
        v.push(format!("threads={}", self.threads));
        v.push(format!("transport={}", self.transport.name()));
        v.push(format!("max_write={}", self.max_write));
        if let Some(c) = self.cache_size {
            v.push(format!("cache_size={c}"));
        }
        v.push(format!("fsname={}", self.fsname));
        v.extend(self.passthrough.iter().cloned());
        v.join(",")
    }

    /// The fuser session configuration.
    pub fn fuser_config(&self) -> Config {
        let mut c = Config::default();
        let mut o = vec![
            MountOption::FSName(self.fsname.clone()),
            MountOption::Subtype("fernfs".into()),
            if self.read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        if self.default_permissions {
            o.push(MountOption::DefaultPermissions);
        }
        o.extend(self.passthrough.iter().filter_map(|p| kernel_option(p)));
        c.mount_options = o;
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

/// A pass-through option as fuser's mount option: the generic mount flags by name (they are
/// `mount(2)` flags, not FUSE data options, so they must not be sent as text); atime variants
/// fuser cannot express (`relatime`, the default, `strictatime`, `nodiratime`) are dropped;
/// anything else goes to the kernel as a FUSE option, which rejects what it does not know.
fn kernel_option(opt: &str) -> Option<MountOption> {
    Some(match opt {
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        "relatime" | "strictatime" | "nodiratime" | "lazytime" => return None,
        other => MountOption::CUSTOM(other.to_string()),
    })
}

/// `123`, `64k`, `256M`, `2g` as bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
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
        o.parse_into("ro,allow_other,threads=8,cache_size=64M,attr_timeout=0.5,noatime,defaults")
            .unwrap();
        assert!(o.read_only && o.allow_other);
        assert_eq!(o.threads, 8);
        assert_eq!(o.cache_size, Some(64 << 20));
        assert_eq!(o.attr_ttl, Duration::from_millis(500));
        assert_eq!(o.passthrough, vec!["noatime".to_string()]);
        let mut p = MountOptions::default();
        p.parse_into(&o.to_option_string()).unwrap();
        assert_eq!(o, p);
    }

    #[test]
    fn mount_flags_are_flags_not_fuse_options() {
        let mut o = MountOptions::default();
        o.parse_into("noatime,relatime,nodev,max_read=65536")
            .unwrap();
        let c = o.fuser_config();
        assert!(c.mount_options.contains(&MountOption::NoAtime));
        assert!(c.mount_options.contains(&MountOption::NoDev));
        assert!(c
            .mount_options
            .contains(&MountOption::CUSTOM("max_read=65536".into())));
        assert!(!c
            .mount_options
            .iter()
            .any(|m| matches!(m, MountOption::CUSTOM(s) if s.contains("atime"))));
    }

    #[test]
    fn rejects_bad_values() {
        let mut o = MountOptions::default();
        assert!(o.parse_into("threads=0").is_err());
        assert!(o.parse_into("threads=x").is_err());
        assert!(o.parse_into("attr_timeout=-1").is_err());
        assert!(o.parse_into("max_write=1").is_err());
    }
}
