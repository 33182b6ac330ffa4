//! Running a mount: [`Mounted`] (a background session, for tests and embedding; unmount with
//! [`Mounted::unmount`]) and [`serve`] (the daemon's foreground loop, ended by an unmount or by
//! SIGTERM/SIGINT/SIGHUP). It owns the shutdown order — stop taking requests, then make the
//! store durable — and must never return while requests it acknowledged are not yet durable.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fern_fs::Fs;
use fuser::BackgroundSession;
use nix::sys::signal::{SigSet, Signal};

use crate::adapter::FernFuse;
use crate::options::MountOptions;
use crate::uring::{Mount, Rings, TransportStatus};

/// A mount served by background threads of this process.
pub struct Mounted {
    session: Option<BackgroundSession>,
    rings: Option<Rings>,
    status: Arc<TransportStatus>,
    fs: Arc<Fs>,
    mountpoint: PathBuf,
}

impl Mounted {
    /// Mounts `fs` at `mountpoint`; returns once the kernel has completed the FUSE handshake,
    /// so the mount is usable.
    pub fn spawn(fs: Arc<Fs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mounted> {
        let mount = mount(&fs, mountpoint, opts)?;
        Ok(Mounted {
            session: Some(mount.session.spawn()?),
            rings: mount.rings,
            status: mount.status,
            fs,
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    /// The transport it uses.
    pub fn transport(&self) -> &Arc<TransportStatus> {
        &self.status
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (fails with EBUSY while something on the mount is in use), waits for the
    /// request threads to finish, then syncs the store.
    pub fn unmount(mut self) -> io::Result<()> {
        if let Some(s) = self.session.take() {
            s.umount_and_join()?;
        }
        if let Some(r) = self.rings.take() {
            r.join();
        }
        self.fs.syncfs().map_err(io::Error::other)
    }
}

impl Drop for Mounted {
    /// A forgotten `unmount` must not leave a mount behind: detach it (lazily if busy).
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                let _ = lazy_unmount(&self.mountpoint);
            }
            let _ = self.fs.syncfs();
        }
    }
}

/// Why [`serve`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Someone unmounted the file system (umount, fusermount3 -u, fernfs umount).
    Unmounted,
    /// A signal asked the daemon to stop; it unmounted itself.
    Signal(i32),
}

/// Blocks the signals a session waits for (SIGTERM, SIGINT, SIGHUP, and SIGUSR1, its own
/// "session over" wake-up, which is sent to the whole process) in the calling thread, and so
/// in every thread it starts afterwards; returns the set. [`serve`] calls it, but a daemon
/// must call it itself before it starts any other thread (opening the store starts the
/// engine's): a thread that does not block SIGUSR1 may receive the wake-up, whose default
/// action ends the process before the store is closed.
pub fn block_session_signals() -> io::Result<SigSet> {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGUSR1,
    ] {
        set.add(s);
    }
    set.thread_block().map_err(io::Error::from)?;
    Ok(set)
}

/// Serves `fs` at `mountpoint` on this thread until unmounted or signalled; `on_ready` runs
/// once the mount is usable (the daemon tells its parent then). On SIGTERM, SIGINT or SIGHUP
/// the store is synced at once and the mount is unmounted (lazily, if busy: the kernel then
/// keeps the connection until the last open file closes, and we keep serving it). When the
/// session ends the store is synced again, so every acknowledged write is durable.
///
/// Blocks those signals in the calling thread (and so in every thread it starts); call it
/// from the process's main thread before starting other threads.
pub fn serve(
    fs: Arc<Fs>,
    mountpoint: &Path,
    opts: &MountOptions,
    on_ready: impl FnOnce(),
) -> io::Result<Stopped> {
    let set = block_session_signals()?;
    let Mount {
        mut session, rings, ..
    } = mount(&fs, mountpoint, opts)?;
    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.to_path_buf();
    let sig_fs = fs.clone();
    let watcher = std::thread::Builder::new()
        .name("fernfs-signals".into())
        .spawn(move || -> Option<i32> {
            // SIGUSR1 is our own "session over" wake-up, sent after the loop ends.
            let sig = set.wait().ok()?;
            if sig == Signal::SIGUSR1 {
                return None;
            }
            if let Err(e) = sig_fs.syncfs() {
                log::error!("sync on {sig} failed: {e}");
            }
            if unmounter.unmount().is_err() {
                let _ = lazy_unmount(&mp);
            }
            Some(sig as i32)
        })?;
    on_ready();
    let run = session.run();
    if let Some(r) = rings {
        r.join();
    }
    // Wake the watcher if the session ended by an unmount (if it already returned, the
    // signal stays pending on a blocked mask and is discarded at exit).
    let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGUSR1);
    let stopped = match watcher.join() {
        Ok(Some(sig)) => Stopped::Signal(sig),
        _ => Stopped::Unmounted,
    };
    let synced = fs.syncfs().map_err(io::Error::other);
    run?;
    synced?;
    Ok(stopped)
}

/// Mounts the adapter over `fs` with the transport `opts` asks for; `fernfs.stats` then
/// reports the transport too.
fn mount(fs: &Arc<Fs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mount<FernFuse>> {
    let status = TransportStatus::new(opts.transport);
    let mut opts = opts.clone();
    opts.stats = crate::uring::stats_with_transport(opts.stats, status.clone());
    let adapter = FernFuse::new(fs.clone(), &opts);
    Mount::new(
        adapter,
        mountpoint,
        &opts.fuser_config(),
        status,
        opts.max_write,
    )
}

/// Detaches the mount now; the kernel finishes it when the last user goes.
pub fn lazy_unmount(mountpoint: &Path) -> io::Result<()> {
    match nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        // Not root: the setuid helper may unmount what its user mounted.
        Err(nix::errno::Errno::EPERM) => fusermount_unmount(mountpoint, true),
        Err(e) => Err(e.into()),
    }
}

/// Unmounts through `fusermount3 -u` (`-z`: lazily).
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
