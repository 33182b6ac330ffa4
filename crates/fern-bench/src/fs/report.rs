//! The `bench fs` report: header (command, machine, sizes, pinning, cold reads), the markdown
//! table (workload × system, with each non-kernel system's ratio to the best kernel file
//! system), notes and failed tasks.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::limits::{LIMITS_SYSTEM, LIMITS_WORKLOAD};
use super::runner::FsBenchConfig;
use super::target::FsSystem;
use crate::procinfo::Machine;
use crate::report::{fmt_value, row_order, Record};
use crate::runner::RunOutput;

/// A value for the table: sub-second times in ms or µs, the rest as the engine report does.
pub fn fmt_fs_value(v: f64, unit: &str) -> String {
    if unit == "seconds" && v < 1.0 {
        if v < 1e-3 {
            return format!("{:.1} µs", v * 1e6);
        }
        return format!("{:.2} ms", v * 1e3);
    }
    if unit == "seconds" {
        return format!("{v:.2} s");
    }
    if unit == "bytes" {
        return format!("{:.1} MiB", v / (1u64 << 20) as f64);
    }
    fmt_value(v)
}

/// The markdown table. The ratio column of a system other than a kernel file system is its
/// speedup over the best kernel file system of the same row: value / best for `.../s` units,
/// best / value for `seconds`; above 1 means faster than every kernel file system.
pub fn markdown_table(records: &[Record], systems: &[String]) -> String {
    let order = row_order(records);
    let mut rows: BTreeMap<usize, BTreeMap<String, &Record>> = BTreeMap::new();
    for r in records {
        rows.entry(order[&r.row_key()])
            .or_default()
            .insert(r.system.clone(), r);
    }
    let others: Vec<&String> = systems
        .iter()
        .filter(|s| !FsSystem::name_is_kernel(s))
        .collect();
    let mut s = String::new();
    let _ = write!(s, "| workload | figure | threads | unit |");
    for sys in systems {
        let _ = write!(s, " {sys} |");
    }
    for o in &others {
        let _ = write!(s, " {o} vs best kernel FS (>1: better) |");
    }
    let _ = writeln!(s);
    let _ = write!(s, "|---|---|---:|---|");
    for _ in systems.iter().chain(others.iter().copied()) {
        let _ = write!(s, "---:|");
    }
    let _ = writeln!(s);
    for by_sys in rows.values() {
        let Some(any) = by_sys.values().next() else {
            continue;
        };
        let higher = any.higher_is_better();
        let arrow = if higher { "↑" } else { "↓" };
        let threads = any.threads.map(|t| t.to_string()).unwrap_or_default();
        let _ = write!(
            s,
            "| {} | {} | {} | {} {arrow} |",
            any.workload,
            any.metric.clone().unwrap_or_default(),
            threads,
            any.unit
        );
        for sys in systems {
            match by_sys.get(sys) {
                Some(r) if r.errors > 0 => {
                    let _ = write!(
                        s,
                        " {} ({} wrong) |",
                        fmt_fs_value(r.value, &r.unit),
                        r.errors
                    );
                }
                Some(r) => {
                    let _ = write!(s, " {} |", fmt_fs_value(r.value, &r.unit));
                }
                None => {
                    let _ = write!(s, " – |");
                }
            }
        }
        let best_kernel = by_sys
            .iter()
            .filter(|(sys, _)| FsSystem::name_is_kernel(sys))
            .map(|(sys, r)| (sys.clone(), r.value))
            .reduce(|a, b| {
                let a_better = if higher { a.1 >= b.1 } else { a.1 <= b.1 };
                if a_better {
                    a
                } else {
                    b
                }
            });
        for o in &others {
            match (by_sys.get(*o), &best_kernel) {
                (Some(r), Some((k, v))) if *v > 0.0 && r.value > 0.0 => {
                    let x = if higher { r.value / v } else { v / r.value };
                    let _ = write!(s, " {x:.2}× ({k}) |");
                }
                _ => {
                    let _ = write!(s, " – |");
                }
            }
        }
        let _ = writeln!(s);
    }
    s
}

/// The device limits (records of [`LIMITS_WORKLOAD`]) as a table of their own: one row per
/// figure with the median and every repetition's value.
pub fn limits_table(records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| limit | unit | {LIMITS_SYSTEM} | repetitions |");
    let _ = writeln!(s, "|---|---|---:|---|");
    for r in records.iter().filter(|r| r.workload == LIMITS_WORKLOAD) {
        let values: Vec<String> = r.values.iter().map(|v| fmt_fs_value(*v, &r.unit)).collect();
        let _ = writeln!(
            s,
            "| {} | {} ↑ | {} | {} |",
            r.metric.clone().unwrap_or_default(),
            r.unit,
            fmt_fs_value(r.value, &r.unit),
            values.join(", ")
        );
    }
    s
}

/// The whole report as markdown.
pub fn render(
    cfg: &FsBenchConfig,
    out: &RunOutput,
    machine: &Machine,
    command: &str,
    pinned: bool,
    skipped: &[String],
) -> String {
    let mut s = String::new();
    let z = &cfg.sizes;
    let _ = writeln!(s, "# fernfs bench fs\n");
    let _ = writeln!(s, "- command: `{command}`");
    let _ = writeln!(s, "- machine: {}", machine.summary());
    let _ = writeln!(
        s,
        "- sizes: F1/F2/F9b/F10 tree of {} files × {} B (≤ {} per directory; F1 threads {:?}), \
         F4 {} files, F5 {} × {} B into {} MiB, F6 {} × {} B into {} MiB, F7 {} MiB, \
         F8 {} MiB corpus, F9a {} files, F9c {} MiB, F11 postmark {} files / {} tx (instances \
         {:?}) and fs_mark -S 1 {} files, F12 {} files; {} repetition(s) (medians), seed {}",
        z.tree_files,
        z.file_bytes,
        z.fanout,
        z.tree_threads,
        z.onedir_files,
        z.f5_writes,
        z.f5_write_len,
        z.f5_file_bytes >> 20,
        z.f6_writes,
        z.f6_write_len,
        z.f6_file_bytes >> 20,
        z.f7_file_bytes >> 20,
        z.f8_corpus_bytes >> 20,
        z.rename_files,
        z.unlink_bytes >> 20,
        z.postmark_files,
        z.postmark_transactions,
        z.postmark_threads,
        z.fsmark_sync_files,
        z.apps_files,
        cfg.reps,
        cfg.seed
    );
    let _ = writeln!(
        s,
        "- CPU pinning: {}",
        if pinned {
            "every task (child process, all its threads) pinned to CPU 0 with `taskset -c 0`"
        } else {
            "NOT pinned (taskset unavailable, --no-pin, or in-process run)"
        }
    );
    let _ = writeln!(
        s,
        "- durability: every timed region that writes ends with syncfs (fernfs-lib: the store's \
         sync) or fsync; cold phases unmount + mount (fernfs-lib: close + reopen the image){}",
        if cfg.drop_caches {
            " and drop the page cache"
        } else {
            ", page cache NOT dropped"
        }
    );
    if let Some(cap) = cfg.mem_cap {
        let _ = writeln!(
            s,
            "- memory cap: {} MiB per task (cgroup v1 memory.limit_in_bytes, FUSE daemon and \
             programs inside; fernfs node cache {} MiB{})",
            cap >> 20,
            z.fern_cache_bytes >> 20,
            if z.fern_cache_bytes == fern_kv_tree::FsMemory::within(cap).node_cache {
                ", sized inside the cap: the cap is its budget"
            } else {
                ", NOT sized from the cap (--cache-mib)"
            }
        );
    }
    for k in skipped {
        let _ = writeln!(s, "- {k}");
    }
    let _ = writeln!(s);
    let names: Vec<String> = cfg.systems.iter().map(|x| x.name().to_string()).collect();
    let (limits, fs): (Vec<Record>, Vec<Record>) = out
        .medians
        .iter()
        .cloned()
        .partition(|r| r.workload == LIMITS_WORKLOAD);
    s.push_str(&markdown_table(&fs, &names));
    if !limits.is_empty() {
        let _ = writeln!(
            s,
            "\nPhysical limits of the device holding the images (fio, same run, one \
             measurement at the start of each repetition; medians):\n"
        );
        s.push_str(&limits_table(&limits));
    }
    if !out.notes.is_empty() {
        let _ = writeln!(s, "\nNotes:");
        for n in &out.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    if !out.failures.is_empty() {
        let _ = writeln!(s, "\nFailed tasks:");
        for f in &out.failures {
            let _ = writeln!(s, "- {f}");
        }
    }
    s
}
