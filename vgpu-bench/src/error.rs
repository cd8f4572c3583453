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
    #[error("{0}")]
    Invalid(String),
}
