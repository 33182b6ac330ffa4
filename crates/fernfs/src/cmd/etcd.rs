//! The etcd form of a file-system target, `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`
//! (docs/distributed.md): recognising it, opening the store, formatting it. It owns nothing
//! of the store itself (fern-etcd does); it must never read or write outside the prefix.

use std::path::Path;
use std::sync::Arc;

use fern_etcd::{EtcdConfig, EtcdStore};
use fern_fs::{Fs, FsError, MkfsOptions};

use super::image::CmdError;

/// Entry and attribute TTL of an etcd mount unless `-o entry_timeout/attr_timeout` say
/// otherwise: another mount's namespace change is seen by a lookup here within this long
/// (docs/distributed.md §7).
pub const SHARED_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// The URL, when `target` is one.
pub fn url(target: &Path) -> Option<&str> {
    target.to_str().filter(|s| EtcdConfig::is_url(s))
}

/// Connects to the file system at `url` (no check that it is formatted), with the TLS files
/// and password of the environment (`FERN_ETCD_CONFIG`, `FERN_ETCD_PASSWORD[_FILE]`).
pub fn open(url: &str) -> Result<Arc<EtcdStore>, CmdError> {
    let cfg = EtcdConfig::resolve(url).map_err(|e| CmdError::new(e.to_string()))?;
    EtcdStore::connect(&cfg, fern_fs::registry())
        .map(Arc::new)
        .map_err(|e| CmdError::new(format!("{url}: {e}")))
}

/// `fernfs mkfs etcd://…`: refuses a prefix that already holds a file system unless `force`,
/// which first removes everything under the prefix.
pub fn mkfs(url: &str, block_size: u32, force: bool) -> Result<(), CmdError> {
    let store = open(url)?;
    if force {
        store.destroy()?;
    }
    let opts = MkfsOptions {
        block_size,
        root_uid: nix::unistd::getuid().as_raw(),
        root_gid: nix::unistd::getgid().as_raw(),
        ..MkfsOptions::default()
    };
    match Fs::mkfs(&*store, opts) {
        Err(FsError::Exists) => Err(CmdError::new(format!(
            "{url} already holds a file system; add --force to replace it"
        ))),
        r => r.map_err(CmdError::from),
    }?;
    eprintln!("fernfs: made a file system in {url} (block size {block_size})");
    Ok(())
}

/// The `fsname` of a mount of `url`: the kernel splits its option string at commas, so the
/// endpoint list's commas become `+`.
pub fn fsname(url: &str) -> String {
    url.replace(',', "+")
}

/// True when a /proc/mounts source names an etcd file system.
pub fn is_fsname(src: &str) -> bool {
    EtcdConfig::is_url(src)
}
