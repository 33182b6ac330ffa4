//! The harness's error type: which engine failed, or which answer was wrong.

use std::error::Error as StdError;

/// Result of the benchmark harness.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// What went wrong while benchmarking.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// An engine under test returned an error.
    #[error("{system}: {source}")]
    Engine {
        /// The engine's system name (`fern-tree`, `redb`, ...).
        system: &'static str,
        /// The engine's own error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// An I/O error of the harness itself (directories, /proc, child processes).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The command line or configuration asks for something this build cannot do.
    #[error("{0}")]
    Usage(String),
    /// A child process running one task failed.
    #[error("task {task} failed: {message}")]
    Task {
        /// Which task (system, scenario, repetition).
        task: String,
        /// What the child reported (the tail of its stderr).
        message: String,
    },
    /// JSON encoding or decoding failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// Wraps an engine's error, naming the engine.
    pub fn engine(system: &'static str, e: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        BenchError::Engine {
            system,
            source: e.into(),
        }
    }
}
