//! The device's physical limits of docs/workloads.md, measured by fio (Debian package `fio`) in
//! the same run as the file systems, on the disk that holds their images: a file in the
//! task's scratch directory, next to where the loop images and fernfs images live.
//!
//! Figures (records with workload [`LIMITS_WORKLOAD`] and system [`LIMITS_SYSTEM`], shown in
//! their own table, not as a file system):
//! - sequential write: F7's size in 1 MiB blocks, `O_DIRECT`, 16 in flight (libaio), fio's
//!   `end_fsync` at the end: the most the device takes, which bounds F7's write figure. The
//!   loop devices of the kernel file systems also use direct I/O on their image files.
//! - sequential read of the same file, `O_DIRECT`, 16 in flight: bounds F7's cold read.
//! - fsync rate: 4 KiB overwrites each followed by `fsync`, one at a time, for a fixed time:
//!   the ceiling of any workload that waits for one device flush per operation (F5/F6's final
//!   fsync, F11 with `fs_mark -S 1`, F9's "+ sync" figures).
//!
//! fio missing is a note, not a failure (the rest of the run stands without these rows);
//! fio failing is a task failure with fio's message.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::workloads::{run_prog, FsTaskOutput, FsTaskSpec};
use crate::report::Record;
use crate::{BenchError, Result};

/// The system name of the limits' records.
pub const LIMITS_SYSTEM: &str = "device (fio)";
/// The workload id of the limits' records.
pub const LIMITS_WORKLOAD: &str = "limits";

/// Whether fio can be run here.
pub fn fio_available() -> bool {
    Command::new("fio").arg("--version").output().is_ok()
}

/// One fio job's figures from its `--output-format=json` report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FioJob {
    /// Bytes per second of the job's reads or writes.
    pub bw_bytes: f64,
    /// Operations per second.
    pub iops: f64,
    /// Operations done.
    pub ios: u64,
}

/// Reads the `dir` ("read" or "write") side of the first job of fio's JSON output (fio may
/// print warnings before the JSON).
pub fn parse_fio(text: &str, dir: &str) -> Result<FioJob> {
    let bad = |why: &str| BenchError::Usage(format!("unexpected fio output ({why})"));
    let start = text.find('{').ok_or_else(|| bad("no JSON"))?;
    let v: Value = serde_json::from_str(&text[start..])?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .ok_or_else(|| bad("no job"))?;
    let err = job.get("error").and_then(Value::as_i64).unwrap_or(0);
    if err != 0 {
        return Err(BenchError::Usage(format!(
            "fio job failed with error {err}"
        )));
    }
    let side = job.get(dir).ok_or_else(|| bad(dir))?;
    let num = |k: &str| side.get(k).and_then(Value::as_f64).ok_or_else(|| bad(k));
    Ok(FioJob {
        bw_bytes: num("bw_bytes")?,
        iops: num("iops")?,
        ios: side
            .get("total_ios")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("total_ios"))?,
    })
}

fn fio(file: &Path, args: &[String], dir: &str, what: &str) -> Result<FioJob> {
    let text = run_prog(
        Command::new("fio")
            .arg(format!("--name={what}"))
            .arg(format!("--filename={}", file.display()))
            .args(args)
            .arg("--output-format=json"),
        &format!("fio {what}"),
    )?;
    let job = parse_fio(&text, dir)?;
    if job.ios == 0 {
        return Err(BenchError::Usage(format!("fio {what} did no I/O")));
    }
    Ok(job)
}

/// Measures the limits in `spec.dir` (created, and its fio files removed afterwards).
pub fn run(spec: &FsTaskSpec) -> Result<FsTaskOutput> {
    let mut out = FsTaskOutput::default();
    if !fio_available() {
        out.notes.push(
            "device limits (sequential bandwidth, fsync rate) not measured: fio is not \
             installed (apt-get install fio)"
                .into(),
        );
        return Ok(out);
    }
    std::fs::create_dir_all(&spec.dir)?;
    let seq = spec.dir.join("fio-seq");
    let sync = spec.dir.join("fio-sync");
    let res = measure(spec, &seq, &sync, &mut out);
    let _ = std::fs::remove_file(&seq);
    let _ = std::fs::remove_file(&sync);
    res?;
    out.notes.push(format!(
        "device limits: fio on a file in {} (the disk holding the images)",
        spec.dir.display()
    ));
    Ok(out)
}

fn measure(spec: &FsTaskSpec, seq: &Path, sync: &Path, out: &mut FsTaskOutput) -> Result<()> {
    let bytes = spec.sizes.f7_file_bytes.max(1 << 20);
    let mib = bytes >> 20;
    let common = |rw: &str| -> Vec<String> {
        vec![
            format!("--rw={rw}"),
            "--bs=1M".into(),
            format!("--size={bytes}"),
            "--direct=1".into(),
            "--ioengine=libaio".into(),
            "--iodepth=16".into(),
        ]
    };
    let mut w = common("write");
    w.push("--end_fsync=1".into());
    let write = fio(seq, &w, "write", "seq-write")?;
    let read = fio(seq, &common("read"), "read", "seq-read")?;
    let secs = spec.sizes.limits_fsync_seconds.max(1);
    let fsyncs = fio(
        sync,
        &[
            "--rw=write".into(),
            "--bs=4k".into(),
            "--size=16M".into(),
            "--ioengine=psync".into(),
            "--fsync=1".into(),
            "--time_based".into(),
            format!("--runtime={secs}"),
        ],
        "write",
        "fsync-rate",
    )?;
    let push = |out: &mut FsTaskOutput, metric: String, value: f64, unit: &str, ios: u64| {
        let mut r = Record::named(LIMITS_WORKLOAD, LIMITS_SYSTEM, value, unit);
        r.metric = Some(metric);
        r.keys = Some(ios);
        out.records.push(r);
    };
    push(
        out,
        format!(
            "sequential write {mib} MiB, 1 MiB O_DIRECT × 16 in flight + fsync (bounds F7 write)"
        ),
        write.bw_bytes / 1e6,
        "MB/s",
        write.ios,
    );
    push(
        out,
        format!("sequential read {mib} MiB, 1 MiB O_DIRECT × 16 in flight (bounds F7 cold read)"),
        read.bw_bytes / 1e6,
        "MB/s",
        read.ios,
    );
    push(
        out,
        format!("4 KiB write + fsync, one at a time, {secs} s (bounds one flush per operation)"),
        fsyncs.iops,
        "fsyncs/s",
        fsyncs.ios,
    );
    Ok(())
}
