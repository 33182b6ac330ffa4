//! Running a mount: [`Mounted`] (a background session, for tests and embedding; unmount with
//! [`Mounted::unmount`]) and [`serve`] (the daemon's foreground loop, ended by an unmount or by
//! SIGTERM/SIGINT/SIGHUP). It owns the shutdown order — stop taking requests, then make the
//! store durable — and must never return while requests it acknowledged are not yet durable.
//! It never unmounts by path: every unmount goes through `mount::KernelMount`.

use std::io;
use std::path::Path;
use std::sync::Arc;

use fern_fs::Fs;
use fuser::BackgroundSession;
use nix::sys::signal::{SigSet, Signal};

use crate::adapter::FernFuse;
use crate::mount::{KernelMount, Unmounted};
use crate::options::MountOptions;
use crate::uring::{Mount, Rings, TransportStatus};

/// A mount served by background threads of this process.
pub struct Mounted {
    session: Option<BackgroundSession>,
    rings: Option<Rings>,
    status: Arc<TransportStatus>,
    fs: Arc<Fs>,
    mount: KernelMount,
}

/// Mounts the adapter over `fs` with the transport `opts` asks for (`uring::Mount`: our own
/// kernel mount, fuser's session on its descriptor, then the ring queues if negotiated);
/// fuser never owns the mount, so it never unmounts anything. `fernfs.stats` then reports
/// the transport too.
fn start(fs: &Arc<Fs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mount<FernFuse>> {
    let status = TransportStatus::new(opts.transport);
    let mut opts = opts.clone();
    opts.stats = crate::uring::stats_with_transport(opts.stats, status.clone());
    Mount::new(FernFuse::new(fs.clone(), &opts), mountpoint, &opts, status)
}

impl Mounted {
    /// Mounts `fs` at `mountpoint`; returns once the kernel has completed the FUSE handshake,
    /// so the mount is usable.
    pub fn spawn(fs: Arc<Fs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<Mounted> {
        let m = start(&fs, mountpoint, opts)?;
        Ok(Mounted {
            session: Some(m.session.spawn()?),
            rings: m.rings,
            status: m.status,
            fs,
            mount: m.kernel,
        })
    }

    /// The transport it uses.
    pub fn transport(&self) -> &Arc<TransportStatus> {
        &self.status
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        self.mount.mountpoint()
    }

    /// Unmounts (fails with EBUSY while something on the mount is in use, and when another
    /// mount covers ours), waits for the request threads to finish, then syncs the store.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.mount.unmount(false)? {
            Unmounted::Done | Unmounted::Gone => {}
            Unmounted::Covered => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "another file system is mounted over {}",
                        self.mount.mountpoint().display()
                    ),
                ))
            }
        }
        if let Some(s) = self.session.take() {
            s.join()?;
        }
        if let Some(r) = self.rings.take() {
            r.join();
        }
        self.fs.syncfs().map_err(io::Error::other)
    }
}

impl Drop for Mounted {
    /// A forgotten `unmount` must not leave a mount behind: detach ours (lazily if busy; not
    /// at all if something covers it — the session thread then stays until it is unmounted).
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if matches!(
                self.mount.unmount(false),
                Ok(Unmounted::Done | Unmounted::Gone)
            ) {
                let _ = s.join();
                if let Some(r) = self.rings.take() {
                    r.join();
                }
            } else {
                let _ = self.mount.unmount(true);
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
/// the store is synced at once and our mount is unmounted (lazily, if busy: the kernel then
/// keeps the connection until the last open file closes, and we keep serving it) — only if it
/// is the topmost mount at its path (`KernelMount::unmount`); a session ended by someone
/// else's unmount unmounts nothing. When the session ends the store is synced again, so every
/// acknowledged write is durable.
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
        session,
        rings,
        kernel: mount,
        ..
    } = start(&fs, mountpoint, opts)?;
    let mount = Arc::new(mount);
    let sig_mount = mount.clone();
    let sig_fs = fs.clone();
    let watcher = std::thread::Builder::new()
        .name("fernfs-signals".into())
        .spawn(move || -> Option<i32> {
            loop {
                // SIGUSR1 is our own "session over" wake-up, sent after the loop ends.
                let sig = set.wait().ok()?;
                if sig == Signal::SIGUSR1 {
                    return None;
                }
                if let Err(e) = sig_fs.syncfs() {
                    log::error!("sync on {sig} failed: {e}");
                }
                let mp = sig_mount.mountpoint().display();
                match sig_mount.unmount(true) {
                    Ok(Unmounted::Done) => log::info!("{sig}: unmounting {mp}"),
                    Ok(Unmounted::Gone) => log::info!("{sig}: {mp} is already unmounted"),
                    // Unmounting by path would hit the mount on top: keep serving (the
                    // store is synced) until ours is unmounted.
                    Ok(Unmounted::Covered) => {
                        log::warn!(
                            "{sig}: another file system is mounted over {mp}; not unmounting \
                             (store synced); unmount that one first"
                        );
                        continue;
                    }
                    Err(e) => log::error!("{sig}: unmounting {mp} failed: {e}"),
                }
                return Some(sig as i32);
            }
        })?;
    on_ready();
    let run = session.run();
    // Wake the watcher if the session ended by an unmount (if it already returned, the
    // signal stays pending on a blocked mask and is discarded at exit).
    let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGUSR1);
    let stopped = match watcher.join() {
        Ok(Some(sig)) => Stopped::Signal(sig),
        _ => Stopped::Unmounted,
    };
    // A session that ended by an error leaves its mount attached to no one: detach it, if it
    // is still there and ours (after an unmount it is Gone and nothing is touched).
    if run.is_err() {
        let _ = mount.unmount(true);
    }
    // The ring queues end when the kernel ends their entries, at the end of the connection.
    if let Some(r) = rings {
        r.join();
    }
    let synced = fs.syncfs().map_err(io::Error::other);
    run?;
    synced?;
    Ok(stopped)
}
