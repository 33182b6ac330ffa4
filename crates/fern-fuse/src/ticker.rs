//! The file system's work on a clock while mounted: on a shared store, the accesses fern-fs
//! records and writes lazily (fern-fs atime.rs) are written within about
//! [`fern_fs::LAZY_FOR`] even when no request comes to write them. It owns only that thread.

use std::sync::{Arc, Condvar, Mutex, Weak};

use fern_fs::Fs;

/// The clock thread; stopped and joined when dropped.
pub(crate) struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    /// Starts the clock for `fs`, if it has work on one (a shared store).
    pub(crate) fn start(fs: &Arc<Fs>) -> Option<Ticker> {
        if !fs.writes_atime_lazily() {
            return None;
        }
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (s, weak): (_, Weak<Fs>) = (stop.clone(), Arc::downgrade(fs));
        let thread = std::thread::Builder::new()
            .name("fern-ticker".into())
            .spawn(move || run(&s, &weak));
        match thread {
            Ok(t) => Some(Ticker {
                stop,
                thread: Some(t),
            }),
            Err(e) => {
                log::error!("cannot start the clock thread (access times wait for a sync): {e}");
                None
            }
        }
    }
}

fn run(stop: &(Mutex<bool>, Condvar), fs: &Weak<Fs>) {
    let (lock, wake) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        stopped = wake
            .wait_timeout(stopped, fern_fs::LAZY_FOR)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        if *stopped {
            return;
        }
        let Some(fs) = fs.upgrade() else { return };
        if let Err(e) = fs.flush_due_atimes() {
            log::warn!("writing access times failed (tried again later): {e}");
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
