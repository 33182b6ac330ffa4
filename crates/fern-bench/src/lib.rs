//! fern-bench: the benchmark harness of fernfs (docs/workloads.md): the engine workloads
//! E1–E7 and E9 (below) and the file-system workloads F1–F12 ([`fs`]).
//!
//! It owns: the [`Engine`] trait every engine under test is driven through, one thin adapter
//! per engine (fern-tree always; each peer behind its own cargo feature), the deterministic data
//! generators, the workloads themselves, the run plan (peers interleaved, repetitions, medians,
//! one child process per task so peak RSS is per engine) and the reports (markdown, JSON).
//!
//! It must never fail a test run because a number is low: benchmarks report. It does fail when
//! an engine gives a wrong answer, because a fast wrong answer is not a result; a workload
//! counts such answers in the `errors` field of its records.
//!
//! Percentiles are computed over the sorted latencies a workload kept (`workloads.rs`,
//! nearest rank, five lines), on purpose: every latency a run measures is at hand, so an
//! exact percentile costs a sort, and hdrhistogram's bucketed estimate would add a dependency
//! and an error bound to a figure that needs neither.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod adapters;
pub mod data;
mod engine;
mod error;
pub mod fs;
pub mod memcap;
pub mod procinfo;
pub mod report;
pub mod runner;
pub mod workloads;

pub use engine::{
    Batch, Committer, Committers, Durability, Engine, EngineConfig, OpenMode, System,
};
pub use error::{BenchError, Result};
pub use report::Record;
pub use runner::{BenchConfig, Isolation, Progress, RunOutput};
pub use workloads::{Scenario, Sizes, TaskSpec, Workload};
