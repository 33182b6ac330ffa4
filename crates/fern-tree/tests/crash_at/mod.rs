//! What the seeded crash tests (crash.rs, extent_crash.rs) share: the power-cut device wrapper,
//! the history of model states a workload issued and acknowledged, the image recovery starts
//! from (cut again during recovery for half the seeds), and the running and reporting of seeds.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fern_testkit::SplitMix64;
use fern_tree::device::{CrashDevice, Gate, GatedDevice};
use fern_tree::{Durability, Env, Options, WriteBatch};
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

/// A seeded crash test: runs `run` for the seeds `{prefix}_SEED*` select (default
/// `0..default`, see [`seeds`]), fails the test naming every failed seed with the command that
/// replays it, and returns the outcomes (one per seed, all passed).
pub fn run_all<O: Send>(
    prefix: &str,
    test: &str,
    default: u64,
    run: impl Fn(u64) -> Result<O, String> + Sync,
) -> Vec<O> {
    let seeds = seeds(prefix, default);
    let (passed, failures) = run_seeds(&seeds, run);
    assert_all_passed(prefix, test, &seeds, &failures);
    passed
}

/// The seeds a run asks for: `{prefix}_SEED=s` alone, else `{prefix}_SEEDS=n` (default
/// `default`) seeds from `{prefix}_SEED_BASE=b` (default 0).
fn seeds(prefix: &str, default: u64) -> Vec<u64> {
    fern_testkit::seeds_from_env(
        &format!("{prefix}_SEED"),
        &format!("{prefix}_SEEDS"),
        &format!("{prefix}_SEED_BASE"),
        default,
    )
}

/// Runs `run` for every seed on up to four threads (a panic is a failure); returns the
/// outcomes of the seeds that passed and `(seed, why)` for the others, by seed.
fn run_seeds<O: Send>(
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

/// The model after each batch a workload issued: `states[k]` is the model after k batches,
/// `durable` the last k acknowledged durable (W3) and `issued` the highest k a crash may leave
/// (it includes a batch whose write failed).
pub struct History<M> {
    pub states: Vec<M>,
    pub durable: usize,
    pub issued: usize,
}

impl<M: Clone> History<M> {
    /// A history whose state 0 is `empty`.
    pub fn new(empty: M) -> Self {
        History {
            states: vec![empty],
            durable: 0,
            issued: 0,
        }
    }

    /// A copy of the model after the last batch issued, for the next batch to change.
    pub fn next_model(&self) -> M {
        self.states[self.states.len() - 1].clone()
    }

    /// Issues `batch`, which takes the model to `model`, as `Sync` for a third of the seeds and
    /// `Buffered` otherwise (from `rng`); a `Sync` write that returns makes it durable.
    pub fn write(
        &mut self,
        env: &Env,
        batch: WriteBatch,
        model: M,
        rng: &mut SplitMix64,
    ) -> fern_tree::Result<()> {
        let d = if rng.below(3) == 0 {
            Durability::Sync
        } else {
            Durability::Buffered
        };
        self.states.push(model);
        self.issued = self.states.len() - 1;
        env.write_with(batch, d)?;
        if d == Durability::Sync {
            self.durable = self.issued;
        }
        Ok(())
    }

    /// Passes on the result of a call that makes every issued batch durable (`sync()`, a
    /// checkpoint, a log flush), recording that it did when it returned.
    pub fn settled<E>(&mut self, r: Result<(), E>) -> Result<(), E> {
        r?;
        self.durable = self.issued;
        Ok(())
    }

    /// The k in `durable..=issued` whose state `same` says recovery left; an error naming the
    /// states that match otherwise, with `what` recovery left.
    pub fn recovered(&self, same: impl Fn(&M) -> bool, what: &str) -> Result<usize, String> {
        let (durable, issued) = (self.durable, self.issued);
        (durable..=issued)
            .find(|&k| same(&self.states[k]))
            .ok_or_else(|| {
                let near: Vec<usize> = (0..self.states.len())
                    .filter(|&k| same(&self.states[k]))
                    .collect();
                format!(
                    "recovered state matches no model state in {durable}..={issued} \
                     (matches {near:?}); {what}"
                )
            })
    }
}

/// The image recovery starts from after the power cut of `dev`. Half the seeds (by `rng`) cut
/// the power again while recovering from it, at one of its first 12 mutating calls: recovery
/// must be idempotent (W7).
pub fn image_after_cut(
    dev: &GatedDevice<CrashAt>,
    rng: &mut SplitMix64,
    seed: u64,
    opts: &Options,
) -> Vec<u8> {
    let image = dev.gate().image();
    if rng.below(2) != 0 {
        return image;
    }
    let second = Arc::new(CrashAt::device(
        Arc::new(CrashDevice::from_bytes(image)),
        rng.below(12),
        seed ^ 0xABCD,
    ));
    let env = Env::open_on(second.clone(), opts.clone());
    second.gate().cut();
    drop(env);
    second.gate().image()
}

/// Prints each failed seed with the command that replays it (`{prefix}_SEED=s cargo test -p
/// fern-tree --release --test {test}`) and fails the test if any seed failed.
fn assert_all_passed(prefix: &str, test: &str, seeds: &[u64], failures: &[(u64, String)]) {
    for (seed, e) in failures {
        eprintln!(
            "{test} seed {seed} failed: {e}\n  reproduce: {prefix}_SEED={seed} cargo test -p \
             fern-tree --release --test {test}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} {test} seeds failed",
        failures.len(),
        seeds.len()
    );
}
