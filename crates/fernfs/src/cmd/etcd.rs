//! The etcd form of a file-system target, `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`
//! (docs/distributed.md): recognising it, opening the store, formatting it. It owns nothing
//! of the store itself (fern-etcd does); it must never read or write outside the prefix.

use std::path::Path;
use std::sync::Arc;

use fern_etcd::{EtcdConfig, EtcdStore};
use fern_fs::{Fs, FsError, MkfsOptions};
use fern_kv::{KvStore, TakePolicy, WriteBack, WriteBackConfig};

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

/// When an etcd mount takes the file system's write-back delegation (`-o delegations=`,
/// docs/design.md §7.3): `off` never (every operation one or more etcd Txns, as before
/// write-back), `auto` once it is busy (32 writes within a second) and nobody else holds it,
/// `always` at mount and after every revocation's cool-down.
pub fn take_policy(word: &str) -> Result<TakePolicy, CmdError> {
    match word {
        "off" => Ok(TakePolicy::Never),
        "auto" => Ok(TakePolicy::Auto),
        "always" => Ok(TakePolicy::Always),
        w => Err(CmdError::new(format!(
            "delegations={w}: expected off, auto or always"
        ))),
    }
}

/// The word of `policy` in `-o delegations=`.
pub fn take_policy_word(policy: TakePolicy) -> &'static str {
    match policy {
        TakePolicy::Never => "off",
        TakePolicy::Auto => "auto",
        TakePolicy::Always => "always",
    }
}

/// The policy of an etcd mount without `-o delegations=`: `auto` — a busy mount takes the
/// write-back delegation, two mounts working in turn fall back to per-operation Txns
/// (docs/design.md §7.3). It was `off` while a holder sometimes answered EIO after leader
/// elections (its periodic lease renewals lagged past the W6 margin); a holder now renews
/// itself before refusing, and `tests/etcd_faults.rs` runs at this default.
pub const DEFAULT_TAKE_POLICY: TakePolicy = TakePolicy::Auto;

/// The file system at `url` as every fern-fs user of an etcd store must see it: through the
/// write-back wrapper, so that its reads and commits are guarded against a mount holding the
/// write-back delegation (and revoke it), and with `policy` it may hold the delegation
/// itself (docs/design.md §7.3).
pub fn open_shared(url: &str, policy: TakePolicy) -> Result<Arc<dyn KvStore>, CmdError> {
    shared(url, open(url)?, policy)
}

/// [`open_shared`] of a store already connected.
pub fn shared(
    url: &str,
    store: Arc<EtcdStore>,
    policy: TakePolicy,
) -> Result<Arc<dyn KvStore>, CmdError> {
    let cfg = WriteBackConfig {
        deleg_tree: fern_fs::DELEG_TREE.into(),
        revoke_tree: fern_fs::REVOKE_TREE.into(),
        part: fern_fs::WRITE_BACK_PART.to_vec(),
        policy,
        cool_down: fern_kv::COOL_DOWN,
    };
    WriteBack::open(store, fern_fs::registry(), cfg)
        .map(|wb| wb as Arc<dyn KvStore>)
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
