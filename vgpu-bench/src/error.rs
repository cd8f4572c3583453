//! Errors of the experiment binary.

use thiserror::Error;

/// Why an experiment could not produce its figures.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error("engine: {0}")]
    Engine(#[from] pgpu::EngineError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("unknown workload `{0}`")]
    UnknownWorkload(String),
    #[error("{workload}: kernel faulted: {fault}")]
    Fault {
        workload: String,
        fault: pgpu::JobFault,
    },
    #[error("{workload}: wrong result: {msg}")]
    Check { workload: String, msg: String },
    /// A chart could not be drawn.
    #[error("{path}: chart: {msg}")]
    Chart { path: String, msg: String },
    /// The in-process (native) baseline's RAM could not be set up.
    #[error("native RAM: {0}")]
    NativeRam(String),
    #[error("{0}")]
    Invalid(String),
}

impl BenchError {
    /// The error of drawing the chart at `path`, as a closure for `map_err`.
    pub fn chart(path: &std::path::Path) -> impl Fn(String) -> BenchError + '_ {
        move |msg| BenchError::Chart {
            path: path.display().to_string(),
            msg,
        }
    }
}
