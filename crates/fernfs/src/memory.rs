//! The process's memory budget and the allocator (design.md §2.5, "One memory budget").
//!
//! The engine keeps its own memory inside its cache's bound (everything node-sized is counted
//! there), but the allocator keeps pages the engine freed: jemalloc returns them to the kernel
//! only after `dirty_decay_ms` (1 s in this binary, main.rs). At the engine's rate of node-sized
//! allocations that was ~20 MiB of resident memory beyond the live heap on E1 quick — pages a
//! cgroup limit counts and cannot reclaim (they are anonymous), so a process sized to its
//! budget was OOM-killed. Returning every page at once (decay 0) costs ~40 % of E1's
//! throughput (every node-sized buffer faulted in fresh). So a process with a budget keeps
//! freed pages for [`budgeted_decay_ms`] only — long enough to reuse a buffer within a burst,
//! short enough that a second of churn never piles up — and the governor returns them at once
//! near the budget: a thread samples the process's anonymous resident memory (every
//! [`SAMPLE_EVERY`] near the threshold, less often the farther it is: [`sample_after`]); above
//! the tight threshold ([`thresholds`]) it purges the allocator and sets decay 0, and below
//! the loose one it restores [`budgeted_decay_ms`]. The governor alone was not
//! enough: on a busy machine its thread waits for a CPU while the engine keeps freeing, and with
//! 1 s of freed pages kept, E1 inside a 32 MiB limit equal to its budget was OOM-killed at 31.6
//! MiB of anonymous memory in 4–5 of 10 runs beside other tests (BENCHMARKS.md, "The engines
//! inside a memory cap equal to their budget").
//!
//! Owns: that thread and the allocator's decay setting. Never: sizes the engine's caches
//! (`fern_tree::cache_within_memory` does), or kills or refuses anything — it can only give
//! back what the allocator holds.

use std::time::Duration;

/// How often the governor samples the process's memory when it is near the point where it
/// acts; farther away it samples less often ([`sample_after`]).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// The longest wait between two samples.
const SAMPLE_AT_MOST: Duration = Duration::from_secs(1);
/// The fastest the process's anonymous memory is assumed to grow, in bytes per second: what
/// faulting in fresh pages allows on these machines, with room to spare (a fault costs
/// ~1 µs per 4 KiB page, 4 GiB/s).
const FASTEST_GROWTH: u64 = 4 << 30;

/// How long the governor may wait before the next sample, with `anon` bytes in use and
/// action due at `tight_from`: the time memory growing at [`FASTEST_GROWTH`] needs to get
/// there, between [`SAMPLE_EVERY`] and [`SAMPLE_AT_MOST`]. A daemon far inside its budget
/// (the default budget of a mount is up to 1 GiB) would otherwise wake 200 times a second for
/// nothing — a read of `/proc` each time, on a CPU the requests need.
pub fn sample_after(anon: u64, tight_from: u64) -> Duration {
    let headroom = tight_from.saturating_sub(anon);
    let wait = Duration::from_micros(headroom.saturating_mul(1_000_000) / FASTEST_GROWTH);
    wait.clamp(SAMPLE_EVERY, SAMPLE_AT_MOST)
}

/// Where the governor turns tight (freed pages go back to the kernel at once) and where it
/// turns loose again, for a process whose whole memory is `budget` bytes: tight above the
/// budget less [`TIGHT_HEADROOM_MIN`] or an eighth of it, whichever is more; loose again an
/// eighth of the budget below that. At 32 MiB (E1 quick, the measured OOM-prone case) that
/// is 24 and 20 MiB, as it always was. A large budget's node cache is three quarters of it
/// (`fern_tree::cache_within_memory`), so a fixed 6/8 made a full cache alone "tight": at
/// 256 MiB E1 ran with every free returned at once, the madvise, the TLB shootdowns and the
/// pages faulted back in ~30 % of its CPU (BENCHMARKS.md, "The governor's headroom").
pub fn thresholds(budget: u64) -> (u64, u64) {
    let tight_from = budget.saturating_sub((budget / 8).max(TIGHT_HEADROOM_MIN));
    (tight_from, tight_from.saturating_sub(budget / 8))
}

/// The least room above the tight threshold: what the process may grow by between two
/// samples ([`SAMPLE_EVERY`] at [`FASTEST_GROWTH`] is 20 MiB; the cap's page cache and the
/// governor's own lateness on a busy machine need the rest, measured at 32 MiB).
const TIGHT_HEADROOM_MIN: u64 = 8 << 20;

/// How long the allocator keeps freed pages in a process with a budget while memory is loose:
/// 20 ms per 32 MiB of budget, at most the binary's 1 s default (main.rs `JEMALLOC_CONF`).
/// What it keeps grows with the time and the rate of freeing, and the room for it with the
/// budget: 20 ms at 32 MiB was measured safe (100 ms was not), and a daemon far inside a large
/// budget should not pay for returning pages every 20 ms (a 1 GiB budget with 20 ms: F4 create
/// −21 %, BENCHMARKS.md "E1 inside a cap equal to its budget was still OOM-killed sometimes").
pub fn budgeted_decay_ms(budget: u64) -> isize {
    ((budget >> 20) * 20 / 32).clamp(1, NORMAL_DECAY_MS as u64) as isize
}

/// The binary's decay without a budget (main.rs `JEMALLOC_CONF`).
const NORMAL_DECAY_MS: isize = 1000;

/// Starts the governor for a process whose whole memory is `budget` bytes. Once per process.
pub fn govern(budget: u64) {
    let spawned = std::thread::Builder::new()
        .name("fern-memory".into())
        .spawn(move || {
            let loose_decay = budgeted_decay_ms(budget);
            set_decay(loose_decay);
            let (tight_from, loose_below) = thresholds(budget);
            let mut tight = false;
            let mut wait = SAMPLE_EVERY;
            loop {
                std::thread::sleep(wait);
                let Some(anon) = anonymous_resident() else {
                    return; // no /proc: nothing to govern by
                };
                wait = sample_after(anon, tight_from);
                if !tight && anon > tight_from {
                    tight = true;
                    set_decay(0);
                    purge();
                } else if tight && anon < loose_below {
                    tight = false;
                    set_decay(loose_decay);
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("fernfs: no memory governor (thread: {e}); freed pages stay until they decay");
    }
}

/// The memory limit of this process's cgroup: the tightest of its own and its ancestors'
/// (cgroup v1 `memory.limit_in_bytes`, v2 `memory.max`), or `None` when there is none (v1
/// reports "no limit" as a number near 2^63; anything at or above physical memory is none).
pub fn cgroup_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let ram = physical_memory();
    let mut tightest: Option<u64> = None;
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let (root, file) = if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max") // the v2 hierarchy
        } else {
            continue;
        };
        // The cgroup itself, then each ancestor up to the root.
        let mut dir = std::path::PathBuf::from(format!("{root}{path}"));
        loop {
            let limit = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok()) // "max" (v2): no limit
                .filter(|&l| ram.is_none_or(|r| l < r));
            if let Some(l) = limit {
                tightest = Some(tightest.map_or(l, |t| t.min(l)));
            }
            if dir.as_os_str().len() <= root.len() || !dir.pop() {
                break;
            }
        }
    }
    tightest
}

/// The budget of a daemon given none and in no memory cgroup: a sixteenth of the machine's
/// memory, at least [`DEFAULT_BUDGET_MIN`] and at most [`DEFAULT_BUDGET_MAX`]; `None` when the
/// machine's memory is unknown. Without a budget nothing bounds fern-fs's inode table, which
/// holds an entry for every inode the kernel keeps (~300 bytes each, and the kernel keeps every
/// file made or looked up): a daemon grew without limit with the files it served
/// (BENCHMARKS.md, "The mount's own memory inside its budget").
pub fn default_budget() -> Option<u64> {
    physical_memory().map(|ram| (ram / 16).clamp(DEFAULT_BUDGET_MIN, DEFAULT_BUDGET_MAX))
}

/// Smallest default budget ([`default_budget`]).
pub const DEFAULT_BUDGET_MIN: u64 = 128 << 20;
/// Largest default budget ([`default_budget`]): past it a daemon with no stated budget would
/// hold memory a machine's other work may want; `-o memory=` gives more.
pub const DEFAULT_BUDGET_MAX: u64 = 1 << 30;

/// Physical memory in bytes, if known.
fn physical_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// The process's anonymous resident memory in bytes (resident minus file-backed, statm).
pub fn anonymous_resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut f = statm.split_whitespace().map(|x| x.parse::<u64>().ok());
    let (_size, resident, shared) = (f.next()??, f.next()??, f.next()??);
    Some(resident.saturating_sub(shared) * page_size())
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64)
}

/// Sets every arena's dirty-page decay (and the default of arenas made later).
fn set_decay(ms: isize) {
    let mut narenas: u32 = 1;
    let mut len = std::mem::size_of::<u32>();
    mallctl::<u32, u8>(c"arenas.narenas", Some((&mut narenas, &mut len)), None);
    for i in 0..narenas {
        let name = std::ffi::CString::new(format!("arena.{i}.dirty_decay_ms")).expect("no NUL");
        mallctl::<u8, isize>(&name, None, Some(&ms));
    }
    mallctl::<u8, isize>(c"arenas.dirty_decay_ms", None, Some(&ms));
}

/// Returns every arena's unused dirty pages to the kernel now
/// (`arena.<MALLCTL_ARENAS_ALL>.purge`).
fn purge() {
    mallctl::<u8, u8>(c"arena.4096.purge", None, None);
}

/// One jemalloc control: reads into `old` (with its length) and/or writes `new`. Errors (an
/// unknown name on another jemalloc) are ignored: the governor then only does less.
#[allow(unsafe_code)]
fn mallctl<O, N>(name: &std::ffi::CStr, old: Option<(&mut O, &mut usize)>, new: Option<&N>) {
    let (oldp, oldlenp) = match old {
        Some((o, l)) => (o as *mut O as *mut std::ffi::c_void, l as *mut usize),
        None => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    let (newp, newlen) = match new {
        Some(n) => (
            n as *const N as *mut std::ffi::c_void,
            std::mem::size_of::<N>(),
        ),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `name` is NUL-terminated; `old`/`new` point to live values of the type the named
    // control reads or writes (u32 for arenas.narenas, ssize_t for the decays, none for purge),
    // with their sizes.
    unsafe {
        tikv_jemalloc_sys::mallctl(name.as_ptr(), oldp, oldlenp, newp, newlen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budgeted_decay_grows_with_the_budget() {
        assert_eq!(budgeted_decay_ms(32 << 20), 20);
        assert_eq!(budgeted_decay_ms(256 << 20), 160);
        assert_eq!(budgeted_decay_ms(1 << 30), 640);
        assert_eq!(budgeted_decay_ms(64 << 30), 1000);
        assert_eq!(budgeted_decay_ms(1 << 20), 1);
    }

    #[test]
    fn the_default_budget_is_a_sixteenth_of_memory_within_its_bounds() {
        let ram = physical_memory().expect("/proc/meminfo");
        let b = default_budget().expect("known memory");
        assert!(
            (DEFAULT_BUDGET_MIN..=DEFAULT_BUDGET_MAX).contains(&b),
            "{b}"
        );
        if (DEFAULT_BUDGET_MIN * 16..=DEFAULT_BUDGET_MAX * 16).contains(&ram) {
            assert_eq!(b, ram / 16);
        }
    }

    #[test]
    fn the_governor_leaves_a_full_cache_loose_and_small_budgets_as_measured() {
        let mib = 1u64 << 20;
        // E1 quick inside 32 MiB: the thresholds measured safe there.
        assert_eq!(thresholds(32 * mib), (24 * mib, 20 * mib));
        assert_eq!(thresholds(64 * mib), (56 * mib, 48 * mib));
        // Full size: the node cache alone (3/4 of the budget) is below the tight threshold.
        let (tight, loose) = thresholds(256 * mib);
        assert_eq!((tight, loose), (224 * mib, 192 * mib));
        assert!(fern_tree::cache_within_memory(256 * mib) < tight);
        assert!(fern_tree::cache_within_memory(1 << 30) < thresholds(1 << 30).0);
        // Tiny budgets saturate instead of wrapping.
        assert_eq!(thresholds(4 * mib), (0, 0));
    }

    #[test]
    fn the_governor_samples_often_only_near_its_threshold() {
        let mib = 1u64 << 20;
        // E1 inside 32 MiB: action at 24 MiB, 4 MiB away: every 5 ms.
        assert_eq!(sample_after(20 * mib, 24 * mib), SAMPLE_EVERY);
        assert_eq!(sample_after(30 * mib, 24 * mib), SAMPLE_EVERY);
        // A daemon using 100 MiB of a 1 GiB budget: action at 768 MiB, 668 MiB away.
        let far = sample_after(100 * mib, 768 * mib);
        assert!(
            far > Duration::from_millis(100) && far < Duration::from_millis(200),
            "{far:?}"
        );
        assert_eq!(sample_after(0, u64::MAX), SAMPLE_AT_MOST);
    }

    #[test]
    fn anonymous_resident_memory_grows_with_what_the_process_touches() {
        let before = anonymous_resident().expect("statm");
        let block = vec![1u8; 64 << 20];
        let during = anonymous_resident().expect("statm");
        assert!(
            during >= before + (48 << 20),
            "64 MiB touched: {before} -> {during}"
        );
        drop(block);
    }
}
