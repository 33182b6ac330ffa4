//! The power-cut device wrapper shared by the seeded crash tests (crash.rs, extent_crash.rs).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fern_tree::device::{CrashDevice, Gate, GatedDevice};
use parking_lot::Mutex;

/// The gate of a [`CrashDevice`] that passes calls until mutating call number `crash_at`;
/// there it records the crash image and fails that call and every later one (the machine is
/// gone).
#[derive(Debug)]
pub struct CrashAt {
    inner: Arc<CrashDevice>,
    crash_at: u64,
    seed: u64,
    calls: AtomicU64,
    image: Mutex<Option<Vec<u8>>>,
}

impl CrashAt {
    /// `inner` behind a power cut at mutating call `crash_at`.
    pub fn device(inner: Arc<CrashDevice>, crash_at: u64, seed: u64) -> GatedDevice<CrashAt> {
        let gate = CrashAt {
            inner: inner.clone(),
            crash_at,
            seed,
            calls: AtomicU64::new(0),
            image: Mutex::new(None),
        };
        GatedDevice::new(inner, gate)
    }

    /// Cuts the power now if it has not been cut yet (the end of a workload).
    pub fn cut(&self) {
        let n = self.calls.fetch_max(self.crash_at, Ordering::SeqCst);
        if n < self.crash_at {
            *self.image.lock() = Some(self.inner.crash_image(self.seed));
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
    }

    /// The crash image: taken at the crash point, or now if the workload ended first.
    pub fn image(&self) -> Vec<u8> {
        self.image
            .lock()
            .clone()
            .unwrap_or_else(|| self.inner.crash_image(self.seed))
    }
}

impl Gate for CrashAt {
    fn mutating(&self) -> io::Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n == self.crash_at {
            *self.image.lock() = Some(self.inner.crash_image(self.seed));
        }
        if n >= self.crash_at {
            return Err(io::Error::other("power cut"));
        }
        Ok(())
    }
}

/// The seeds a run asks for: `{prefix}_SEED=s` alone, else `{prefix}_SEEDS=n` (default
/// `default`) seeds from `{prefix}_SEED_BASE=b` (default 0).
pub fn seeds(prefix: &str, default: u64) -> Vec<u64> {
    fern_testkit::seeds_from_env(
        &format!("{prefix}_SEED"),
        &format!("{prefix}_SEEDS"),
        &format!("{prefix}_SEED_BASE"),
        default,
    )
}

/// Runs `run` for every seed on up to four threads (a panic is a failure); returns the
/// outcomes of the seeds that passed and `(seed, why)` for the others, by seed.
pub fn run_seeds<O: Send>(
    seeds: &[u64],
    run: impl Fn(u64) -> Result<O, String> + Sync,
) -> (Vec<O>, Vec<(u64, String)>) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let next = AtomicU64::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&seed) = seeds.get(i) else { return };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed)))
                    .unwrap_or_else(|_| Err("panicked".into()));
                results.lock().push((seed, r));
            });
        }
    });
    let mut results = results.into_inner();
    results.sort_by_key(|(s, _)| *s);
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (seed, r) in results {
        match r {
            Ok(o) => ok.push(o),
            Err(e) => failed.push((seed, e)),
        }
    }
    (ok, failed)
}
