//! The file system an offline subcommand (`stat`, `import`, `export`) works on: an image file
//! or block device, or an etcd URL (docs/distributed.md §10). It owns opening either as one
//! [`Fs`], and closing it; it must never hold an image lock or an etcd connection past
//! [`Target::close`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fern_etcd::EtcdStore;
use fern_fs::Fs;

use super::image::{Access, CmdError, Image, DEFAULT_CACHE};

/// An opened file-system target.
pub enum Target {
    /// An image file or block device, locked as opened.
    Image(Image),
    /// A file system in etcd (no lock: other mounts may be working on it).
    Etcd {
        /// The URL as given.
        url: String,
        /// The connected store (its request count).
        store: Arc<EtcdStore>,
        /// The same store as fern-fs uses it: guarded, revoking a write-back holder, never
        /// taking the delegation itself (docs/design.md §7.3).
        shared: Arc<dyn fern_kv::KvStore>,
    },
}

impl Target {
    /// Opens `spec` (an image path or an `etcd://` URL) as `access` says.
    pub fn open(spec: &Path, access: Access) -> Result<Self, CmdError> {
        match super::etcd::url(spec) {
            Some(url) => {
                let store = super::etcd::open(url)?;
                let shared = super::etcd::shared(url, store.clone(), fern_kv::TakePolicy::Never)?;
                Ok(Target::Etcd {
                    url: url.to_string(),
                    store,
                    shared,
                })
            }
            None => Image::open_as(spec, DEFAULT_CACHE, access).map(Target::Image),
        }
    }

    /// The file system inside. Read-only images (and etcd opened for reading) are mounted
    /// without writing anything (no orphan cleanup).
    pub fn fs(&self, access: Access) -> Result<Arc<Fs>, CmdError> {
        match self {
            Target::Image(img) => img.fs(),
            Target::Etcd { url, shared, .. } => {
                let kv = shared.clone();
                let fs = if access == Access::ReadOnly {
                    Fs::mount_read_only(kv)
                } else {
                    Fs::mount(kv)
                };
                fs.map(Arc::new)
                    .map_err(|e| CmdError::new(format!("{url}: cannot mount the file system: {e}")))
            }
        }
    }

    /// How the target is named in messages: the image path or the URL.
    pub fn name(&self) -> String {
        match self {
            Target::Image(img) => img.path.display().to_string(),
            Target::Etcd { url, .. } => url.clone(),
        }
    }

    /// The etcd requests sent so far (`None` for an image).
    pub fn etcd_requests(&self) -> Option<u64> {
        match self {
            Target::Image(_) => None,
            Target::Etcd { store, .. } => Some(store.requests()),
        }
    }

    /// Makes everything written durable and lets go of the image or the connection. (On
    /// etcd every write was durable when it returned.)
    pub fn close(self) -> Result<(), CmdError> {
        match self {
            Target::Image(img) => img.close(),
            Target::Etcd { .. } => Ok(()),
        }
    }
}

/// `TARGET[:/path]` split, TARGET an image path or an `etcd://` URL; a colon counts only when
/// a `/` follows it, and for a URL only after the scheme (so `etcd://h:1/fs:/dir` is the file
/// system `etcd://h:1/fs`, directory `/dir`).
pub fn split_target(s: &str) -> (PathBuf, Vec<u8>) {
    let skip = if fern_etcd::EtcdConfig::is_url(s) {
        "etcd://".len()
    } else {
        0
    };
    match s[skip..].rfind(":/") {
        Some(i) => (
            PathBuf::from(&s[..skip + i]),
            s.as_bytes()[skip + i + 1..].to_vec(),
        ),
        None => (PathBuf::from(s), b"/".to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::split_target;

    #[test]
    fn splits_images_and_urls() {
        let s = |t: &str| {
            let (a, b) = split_target(t);
            (a.display().to_string(), String::from_utf8(b).expect("utf8"))
        };
        assert_eq!(s("img"), ("img".into(), "/".into()));
        assert_eq!(s("img:/a/b"), ("img".into(), "/a/b".into()));
        assert_eq!(
            s("etcd://h:1,g:2/fs"),
            ("etcd://h:1,g:2/fs".into(), "/".into())
        );
        assert_eq!(
            s("etcd://u@h:1/fs/x:/d"),
            ("etcd://u@h:1/fs/x".into(), "/d".into())
        );
    }
}
