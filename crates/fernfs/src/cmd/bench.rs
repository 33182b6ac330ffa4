//! `fernfs bench fs`: the file-system workloads through fern-fs's library API and the FUSE
//! mount, beside the null FUSE file system and ext4/XFS/Btrfs (module `fern_bench::fs`; tasks
//! re-execute this binary as `bench fs-task`, the null FUSE daemon as `bench null-fuse`).
//!
//! `fernfs bench engine`: the engine workloads E1–E7 and E9 against the peer engines compiled into
//! this build (`--features peers`, `--features rocksdb`), with a table on stdout, progress on
//! stderr and `--json FILE` records in the format of docs/workloads.md "Reporting".
//!
//! Each task runs in a child process (this binary, re-executed with the hidden subcommand
//! `bench engine-task`), so one engine's memory never counts against another's peak RSS.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use fern_bench::data::ValueKind;
use fern_bench::procinfo::{self, Machine};
use fern_bench::{
    report, runner, BenchConfig, BenchError, Isolation, Progress, Sizes, System, Workload,
};
use indicatif::{ProgressBar, ProgressStyle};

/// `fernfs bench ...`
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// Which benchmark.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Engine workloads E1-E7 and E9: fern-tree against peer engines, same memory budget.
    Engine(EngineArgs),
    /// File-system workloads (F1-F12): fernfs through its library API and its FUSE mount,
    /// beside a null FUSE file system and kernel file systems on loop-mounted images.
    Fs(FsArgs),
    /// Runs one task of `bench fs` in this process (internal).
    #[command(hide = true)]
    FsTask {
        /// The task, as JSON.
        #[arg(long)]
        spec: String,
        /// Where to write the task's records.
        #[arg(long)]
        out: PathBuf,
    },
    /// Serves the null FUSE file system (the FUSE-path limit of `bench fs`) on MOUNTPOINT
    /// until it is unmounted (internal: `bench fs` starts it as the `null-fuse` system).
    #[command(hide = true)]
    NullFuse {
        /// Where to mount it.
        mountpoint: PathBuf,
        /// Namespace kept between mounts (read at start if present, written at unmount).
        #[arg(long)]
        state: PathBuf,
        /// `dev` (read/write on /dev/fuse) or `uring` (FUSE over io_uring, falling back to
        /// `dev` where the kernel does not allow it).
        #[arg(long, default_value = "dev")]
        transport: fern_fuse::uring::Transport,
    },
    /// Runs one task of `bench engine` in this process (internal: the parent re-executes
    /// itself so each engine's peak RSS is its own).
    #[command(hide = true)]
    EngineTask {
        /// The task, as JSON.
        #[arg(long)]
        spec: String,
        /// Where to write the task's records.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Options both benchmarks take.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Repetitions (default 3 full, 1 quick); medians are reported.
    #[arg(long)]
    pub reps: Option<u32>,
    /// Write the median records as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Scratch directory for the databases, images and mount points (default: a directory
    /// under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seed of the generated data.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Do not drop the OS page cache before cold reads (it is dropped when running as root).
    #[arg(long)]
    pub no_drop_caches: bool,
}

impl RunArgs {
    /// Repetitions asked for, else 3 full and 1 quick.
    fn reps(&self, quick: bool) -> u32 {
        self.reps.unwrap_or(if quick { 1 } else { 3 })
    }

    /// The scratch directory asked for, else `NAME-PID` under the system temp dir.
    fn scratch(&self, name: &str) -> PathBuf {
        self.dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("{name}-{}", std::process::id())))
    }

    /// Writes the median records as JSON if `--json` asked for them.
    fn write_json(&self, medians: &[fern_bench::Record]) -> Result<(), BenchError> {
        if let Some(path) = &self.json {
            report::write_json(path, medians)?;
            eprintln!("wrote {}", path.display());
        }
        Ok(())
    }
}

/// Options of `fernfs bench engine`.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// Quick size: 1M keys, 32 MiB budget (full: 10M keys, 256 MiB).
    #[arg(long)]
    pub quick: bool,
    /// Workloads to run (E1..E7, E9; default all).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Systems to run (default: every system compiled into this build).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
    /// Value kinds of E1 (incompressible, text).
    #[arg(long, value_delimiter = ',', default_value = "incompressible,text")]
    pub variants: Vec<String>,
    /// Override the number of keys.
    #[arg(long)]
    pub keys: Option<u64>,
    /// Override the memory budget, MiB.
    #[arg(long)]
    pub budget_mib: Option<u64>,
    /// Override the number of E2 lookups.
    #[arg(long)]
    pub lookups: Option<u64>,
    /// E9 thread counts (default 1,4,16).
    #[arg(long, value_delimiter = ',')]
    pub commit_threads: Vec<u32>,
    /// E9 seconds of committing per thread count (default 10 full, 3 quick).
    #[arg(long)]
    pub commit_seconds: Option<f64>,
    /// Run every task in this process instead of a child process (peak RSS is then shared).
    #[arg(long)]
    pub in_process: bool,
    /// Memory cap, MiB: a cgroup v1 memory limit holding each engine's task process, page
    /// cache included (needs root). docs/workloads.md's rule is the budget itself
    /// (`--mem-cap-mib` equal to `--budget-mib`, or 32 quick and 256 full): an engine that
    /// reads through mmap or the page cache is then held to the memory every other one gets.
    #[arg(long)]
    pub mem_cap_mib: Option<u64>,
}

/// Runs `fernfs bench ...`.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    // Task processes keep the allocator's freed pages inside their budget (memory.rs).
    fern_bench::memcap::set_memory_governor(crate::memory::govern);
    match args.command {
        BenchCommand::Engine(e) => engine(e),
        BenchCommand::EngineTask { spec, out } => runner::child_main(&spec, &out),
        BenchCommand::Fs(f) => fs_bench(f),
        BenchCommand::FsTask { spec, out } => fern_bench::fs::runner::child_main(&spec, &out),
        BenchCommand::NullFuse {
            mountpoint,
            state,
            transport,
        } => fern_bench::fs::null_fuse::serve(&mountpoint, &state, transport),
    }
}

/// Options of `fernfs bench fs`.
#[derive(Debug, Args)]
pub struct FsArgs {
    /// Quick sizes of docs/workloads.md (20k files, 256 MiB files, 10k-file rename, 1 repetition).
    #[arg(long)]
    pub quick: bool,
    /// Systems (fernfs-lib, fernfs-fuse, null-fuse, ext4, xfs, btrfs, fernfs-etcd,
    /// juicefs-etcd); a system that cannot be mounted here (not root, no mkfs tool, no
    /// /dev/fuse, no etcd or juicefs binary) is skipped with a message. The etcd systems
    /// start a private etcd per task, or use the cluster named by FERN_BENCH_ETCD
    /// (HOST:PORT,...; scripts/etcd-cluster prints it); scripts/build-juicefs builds juicefs.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fernfs-lib,fernfs-fuse,null-fuse,ext4,xfs,btrfs"
    )]
    pub systems: Vec<String>,
    /// Workloads (F1-F8, F9a, F9b, F9c, F10, F11, F12; F9 = all three; default all).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
    /// Files of the F1 tree (F2, F9b and F10 use it too).
    #[arg(long)]
    pub files: Option<u64>,
    /// F1 thread counts.
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<u32>,
    /// Files in F9a's renamed directory.
    #[arg(long)]
    pub rename_files: Option<u64>,
    /// Size of F9c's unlinked file, MiB.
    #[arg(long)]
    pub unlink_mib: Option<u64>,
    /// Do not pin tasks to CPU 0 with taskset.
    #[arg(long)]
    pub no_pin: bool,
    /// Memory cap, MiB: a cgroup v1 memory limit holding each task with its FUSE daemon and
    /// programs (needs root); it is fernfs's budget, its node cache sized inside it.
    #[arg(long)]
    pub mem_cap_mib: Option<u64>,
    /// fernfs's node cache, MiB (fernfs-lib and the fernfs-fuse daemon; default 128, or under a
    /// memory cap the cache `fern_kv_tree::FsMemory::within` gives the cap, as a mount inside
    /// that budget has). The report says when it differs from that.
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// Write SVG plots into this directory: each figure per system, every system relative to
    /// the best kernel file system, and throughput over time for F1 and F5.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Do not measure the device's limits with fio (sequential bandwidth, fsync rate) at the
    /// start of each repetition.
    #[arg(long)]
    pub no_limits: bool,
}

fn fs_bench(a: FsArgs) -> Result<(), BenchError> {
    use fern_bench::fs::{self, FsSizes, FsSystem, FsWorkload};
    let mut sizes = if a.quick {
        FsSizes::quick()
    } else {
        FsSizes::full()
    };
    if let Some(n) = a.files {
        sizes.tree_files = n.max(1);
    }
    if !a.threads.is_empty() {
        sizes.tree_threads = a.threads.iter().map(|&t| t.max(1)).collect();
    }
    if let Some(n) = a.rename_files {
        sizes.rename_files = n;
    }
    if let Some(m) = a.unlink_mib {
        sizes.unlink_bytes = m.max(1) << 20;
    }
    if let Some(m) = a.mem_cap_mib {
        // docs/workloads.md: under a memory cap the cap is the budget, and fernfs's node cache
        // is sized inside it (design.md §2.5, "One memory budget").
        sizes.fern_cache_bytes = fern_kv_tree::FsMemory::within(m.max(16) << 20).node_cache;
    }
    if let Some(c) = a.cache_mib {
        if c == 0 {
            return Err(BenchError::Usage("--cache-mib must be at least 1".into()));
        }
        sizes.fern_cache_bytes = c << 20;
    }
    let mut workloads = Vec::new();
    for w in &a.workloads {
        for x in FsWorkload::parse_list(w)? {
            if !workloads.contains(&x) {
                workloads.push(x);
            }
        }
    }
    if workloads.is_empty() {
        workloads = FsWorkload::ALL.to_vec();
    }
    let mut systems = Vec::new();
    let mut skipped = Vec::new();
    for s in &a.systems {
        let sys = FsSystem::parse(s)?;
        if let Some(fstype) = sys.mkfs_type() {
            if let Some(why) = fs::posix::loop_mount_unavailable(fstype) {
                eprintln!("{why}");
                skipped.push(why);
                continue;
            }
        }
        if sys.is_fuse() {
            if let Some(why) = fs::fuse_mount::fuse_unavailable(sys.name()).or_else(|| match sys {
                FsSystem::FernfsEtcd | FsSystem::JuicefsEtcd => {
                    fs::etcd_mount::etcd_unavailable(sys.name())
                }
                _ => None,
            }) {
                eprintln!("{why}");
                skipped.push(why);
                continue;
            }
        }
        if !systems.contains(&sys) {
            systems.push(sys);
        }
    }
    if systems.is_empty() {
        return Err(BenchError::Usage(
            "no system left to run (see above)".into(),
        ));
    }
    let dir = a.run.scratch("fernfs-bench-fs");
    let cfg = fs::runner::FsBenchConfig {
        systems,
        workloads,
        sizes,
        reps: a.run.reps(a.quick).max(1),
        dir: dir.clone(),
        seed: a.run.seed,
        drop_caches: !a.run.no_drop_caches && procinfo::is_root(),
        isolation: Isolation::Subprocess {
            program: std::env::current_exe()?,
            args: vec![OsString::from("bench"), OsString::from("fs-task")],
        },
        pin: !a.no_pin,
        mem_cap: a.mem_cap_mib.map(|m| m.max(16) << 20),
        limits: !a.no_limits,
    };
    let pinned = cfg.pin && fs::runner::taskset_available();
    let mut progress = Bar::new(&dir, true)?;
    let out = fs::runner::run(&cfg, &mut progress)?;
    let _ = std::fs::remove_dir(&dir);
    let command: Vec<String> = std::env::args().collect();
    print!(
        "{}",
        fs::report::render(
            &cfg,
            &out,
            &Machine::detect(),
            &command.join(" "),
            pinned,
            &skipped
        )
    );
    a.run.write_json(&out.medians)?;
    if let Some(dir) = &a.plot {
        let names: Vec<String> = cfg.systems.iter().map(|s| s.name().to_string()).collect();
        // The device limits have their own table; they are not a file system to plot.
        let figures: Vec<_> = out
            .medians
            .iter()
            .filter(|r| r.workload != fs::limits::LIMITS_WORKLOAD)
            .cloned()
            .collect();
        let files = fs::plot::write_plots(dir, &figures, &out.series, &names)?;
        eprintln!("wrote {} plots into {}", files.len(), dir.display());
    }
    Ok(())
}

fn engine(a: EngineArgs) -> Result<(), BenchError> {
    let mut sizes = if a.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    if let Some(k) = a.keys {
        sizes.keys = k.max(1);
    }
    if let Some(m) = a.budget_mib {
        sizes.budget_bytes = m << 20;
    }
    if let Some(l) = a.lookups {
        sizes.lookups = l;
    }
    if !a.commit_threads.is_empty() {
        sizes.commit_threads = a.commit_threads.iter().map(|&t| t.max(1)).collect();
    }
    if let Some(s) = a.commit_seconds {
        sizes.commit_seconds = s.max(0.0);
    }
    let systems = if a.systems.is_empty() {
        System::compiled()
    } else {
        a.systems
            .iter()
            .map(|s| System::parse(s))
            .collect::<Result<_, _>>()?
    };
    let workloads = if a.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        a.workloads
            .iter()
            .map(|w| Workload::parse(w))
            .collect::<Result<_, _>>()?
    };
    if systems.is_empty() {
        return Err(BenchError::Usage(
            "no engine in this build (fern-tree is always built once its API is ready; peers \
             need --features peers or rocksdb)"
                .into(),
        ));
    }
    let variants = a
        .variants
        .iter()
        .map(|v| {
            ValueKind::parse(v).ok_or_else(|| {
                BenchError::Usage(format!("unknown variant {v:?}: incompressible, text"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dir = a.run.scratch("fernfs-bench");
    let isolation = if a.in_process {
        Isolation::InProcess
    } else {
        Isolation::Subprocess {
            program: std::env::current_exe()?,
            args: vec![OsString::from("bench"), OsString::from("engine-task")],
        }
    };
    let drop_caches = !a.run.no_drop_caches;
    let cfg = BenchConfig {
        systems,
        workloads,
        variants,
        sizes,
        reps: a.run.reps(a.quick),
        dir: dir.clone(),
        seed: a.run.seed,
        drop_caches,
        isolation,
        mem_cap: a.mem_cap_mib.map(|m| m.max(16) << 20),
    };

    let machine = Machine::detect();
    let command: Vec<String> = std::env::args().collect();
    println!("# fernfs bench engine");
    println!();
    println!("- command: `{}`", command.join(" "));
    println!("- machine: {}", machine.summary());
    println!(
        "- sizes: {} keys (16 B keys, 100 B values), budget {} MiB per engine, {} E2 lookups, \
         batches of {}, {} repetition(s), seed {}",
        cfg.sizes.keys,
        cfg.sizes.budget_bytes >> 20,
        cfg.sizes.lookups,
        cfg.sizes.batch,
        cfg.reps,
        cfg.seed
    );
    if let Some(cap) = cfg.mem_cap {
        println!(
            "- memory cap: {} MiB per task (cgroup v1 memory.limit_in_bytes, page cache \
             included); each task's peak is among the notes",
            cap >> 20
        );
    }
    if cfg.workloads.contains(&Workload::E9) {
        println!(
            "- E9: {} s of durable commits of {} rows per thread count, threads {:?}",
            cfg.sizes.commit_seconds, cfg.sizes.commit_rows, cfg.sizes.commit_threads
        );
    }
    let cold = if drop_caches && procinfo::is_root() {
        "page cache dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before E2"
    } else {
        "page cache NOT dropped before E2 (not root, or --no-drop-caches)"
    };
    println!("- cold reads: {cold}");
    println!();

    let mut progress = Bar::new(&dir, false)?;
    let out = runner::run(&cfg, &mut progress)?;
    let _ = std::fs::remove_dir(&dir);

    let names: Vec<String> = cfg.systems.iter().map(|s| s.name().to_string()).collect();
    println!("{}", report::markdown_table(&out.medians, &names));
    if !out.notes.is_empty() {
        println!("Notes:");
        for n in &out.notes {
            println!("- {n}");
        }
    }
    if !out.failures.is_empty() {
        println!("Failed tasks:");
        for f in &out.failures {
            println!("- {f}");
        }
    }
    a.run.write_json(&out.medians)?;
    Ok(())
}

/// Progress on stderr: an indicatif bar with the elapsed time and the task when stderr is a
/// terminal, else one line per task (logs stay readable). It also owns Ctrl-C: the tasks run
/// in child processes, so on SIGINT/SIGTERM/SIGHUP the signal thread kills them, removes the
/// scratch directory — or, for `bench fs`, whose scratch may still hold mounts, removes what it
/// can and says what is left and how to remove it — and ends the process with 130; the
/// runner, if it reaches its next task meanwhile, waits there instead of starting it.
struct Bar {
    bar: ProgressBar,
    lines: bool,
    total: usize,
    stop: super::interrupt::Interrupt,
}

/// Removes the scratch directory of an interrupted run, or says what is left.
fn clean_scratch(dir: &std::path::Path, may_hold_mounts: bool) {
    let mounts: Vec<PathBuf> = if may_hold_mounts {
        fern_fuse::mount_table(None)
            .map(|t| {
                t.into_iter()
                    .map(|e| e.mount_point)
                    .filter(|m| m.starts_with(dir))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    if !mounts.is_empty() {
        eprintln!(
            "fernfs bench: interrupted; scratch data left in {} with {} mount(s) under it ({}); \
             remove it with `umount -R -l {} ; rm -rf {}`",
            dir.display(),
            mounts.len(),
            mounts
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            dir.display(),
            dir.display()
        );
        return;
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => eprintln!(
            "fernfs bench: interrupted; scratch data removed ({})",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("fernfs bench: interrupted; no scratch data was left")
        }
        Err(e) => eprintln!(
            "fernfs bench: interrupted; could not remove the scratch data in {}: {e}",
            dir.display()
        ),
    }
}

impl Bar {
    fn new(scratch: &std::path::Path, may_hold_mounts: bool) -> Result<Bar, BenchError> {
        use std::io::IsTerminal;
        let dir = scratch.to_path_buf();
        let stop = super::interrupt::Interrupt::install_with(move |_| {
            super::interrupt::kill_children();
            clean_scratch(&dir, may_hold_mounts);
            std::process::exit(130);
        })
        .map_err(|e| BenchError::Usage(e.to_string()))?;
        let lines = !std::io::stderr().is_terminal();
        let bar = if lines {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(500));
            bar
        };
        Ok(Bar {
            bar,
            lines,
            total: 0,
            stop,
        })
    }
}

impl Progress for Bar {
    fn start(&mut self, total: usize) {
        self.total = total;
        self.bar.set_length(total as u64);
    }

    fn task(&mut self, index: usize, label: &str) {
        // Interrupted: the signal thread is cleaning up and ends the process; start nothing.
        while self.stop.signal().is_some() {
            std::thread::sleep(Duration::from_secs(1));
        }
        if self.lines {
            eprintln!("fernfs bench: task {}/{}: {label}", index + 1, self.total);
        }
        self.bar.set_position(index as u64);
        self.bar.set_message(label.to_string());
    }

    fn note(&mut self, text: &str) {
        if self.lines {
            eprintln!("{text}");
        } else {
            self.bar.println(text);
        }
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}
