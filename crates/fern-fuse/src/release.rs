//! Keeps fern-fs's inode table inside its memory bound by asking the kernel to forget inodes:
//! the kernel, not the daemon, decides which inodes it holds, and every inode it holds must
//! stay in the table until its FORGET. When the table is past its bound
//! (`Fs::inodes_over_bound`), a thread of its own names the inodes fern-fs picked
//! (`Fs::inodes_to_release`) to the kernel — by `FUSE_NOTIFY_PRUNE` where the kernel has it
//! (Linux 6.18, protocol 7.45: drop the inode if nothing uses it), else by
//! `FUSE_NOTIFY_INVAL_ENTRY` of a non-directory's name (the kernel then drops the unused
//! dentry and with it the inode). The kernel's FORGETs then shrink the table
//! (docs/fs-design.md §4, "A bounded inode table").
//!
//! A thread, not the request that noticed: the kernel takes the parent directory's lock to
//! drop a name, and the request being served (a CREATE in that directory) may hold it until
//! it is answered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use crate::Notifier;
use fern_fs::Fs;

/// Most inodes named per round; a round is followed by a pause for the FORGETs to arrive.
const ROUND: usize = 1024;

/// The pause between rounds while the table stays past its bound.
const PAUSE: Duration = Duration::from_millis(10);

/// Wakes the release thread; dropping it stops the thread and waits for it (at most a
/// round's pause), so that no reference to the file system outlives the session: the image's
/// close wants the store unshared.
pub(crate) struct Releaser {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    woken: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Releaser {
    /// Starts the thread for `fs`, naming inodes through `notifier`.
    pub(crate) fn start(fs: Weak<Fs>, notifier: Notifier) -> std::io::Result<Releaser> {
        let shared = Arc::new(Shared {
            woken: Mutex::new(false),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fern-forget".into())
            .spawn(move || run(&s, &fs, &notifier))?;
        Ok(Releaser {
            shared,
            thread: Some(thread),
        })
    }

    /// Wakes the thread if it sleeps (cheap when it is already awake).
    pub(crate) fn wake(&self) {
        let mut w = self.shared.woken.lock().unwrap_or_else(|p| p.into_inner());
        if !*w {
            *w = true;
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Releaser {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(s: &Shared, weak_fs: &Weak<Fs>, notifier: &Notifier) {
    // Whether the kernel refused FUSE_NOTIFY_PRUNE once: names are dropped instead from then
    // on. `FERN_FUSE_NO_PRUNE` starts that way (the tests run the fallback on a kernel that
    // has prune).
    let mut no_prune = std::env::var_os("FERN_FUSE_NO_PRUNE").is_some();
    loop {
        {
            let mut w = s.woken.lock().unwrap_or_else(|p| p.into_inner());
            while !*w && !s.stop.load(Ordering::Relaxed) {
                w = s.wake.wait(w).unwrap_or_else(|p| p.into_inner());
            }
            *w = false;
        }
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        loop {
            let Some(fs) = weak_fs.upgrade() else {
                return;
            };
            let named = fs.inodes_to_release(ROUND);
            drop(fs);
            if named.is_empty() || s.stop.load(Ordering::Relaxed) {
                break;
            }
            if !no_prune {
                let ids: Vec<u64> = named.iter().map(|r| r.id.0).collect();
                match notifier.prune(&ids) {
                    Ok(true) => {
                        std::thread::sleep(PAUSE);
                        continue;
                    }
                    Ok(false) => {
                        log::info!(
                            "the kernel has no FUSE_NOTIFY_PRUNE: the inode table's bound \
                             is kept by dropping names instead"
                        );
                        no_prune = true;
                    }
                    Err(e) => {
                        log::warn!("FUSE notify prune: {e}");
                        break;
                    }
                }
            }
            // Names are looked up only here, where a kernel without prune needs them.
            let Some(fs) = weak_fs.upgrade() else {
                return;
            };
            let entries: Vec<_> = named
                .iter()
                .filter(|r| !r.is_dir)
                .filter_map(|r| fs.inode_entry(r.id))
                .collect();
            drop(fs);
            for (parent, name) in &entries {
                if let Err(e) = notifier.inval_entry(parent.0, name) {
                    log::warn!("FUSE notify inval_entry: {e}");
                    break;
                }
            }
            std::thread::sleep(PAUSE);
        }
    }
}
