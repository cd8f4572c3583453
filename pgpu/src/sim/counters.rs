//! Cumulative work counters of the sim engine.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::Outcome;

/// Cumulative work counters of a sim engine (for experiments: interpreter throughput, job mix).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Thread-instructions executed by kernels (active lanes summed over warp-instructions).
    pub thread_instructions: u64,
    /// Warp-instructions executed by kernels.
    pub warp_instructions: u64,
    /// `execute`/`resume` calls that ran a job.
    pub runs: u64,
    /// Runs that ended preempted.
    pub preemptions: u64,
    /// Runs that ended faulted.
    pub faults: u64,
    /// Bytes moved by the copy engine (jobs only, not host copies).
    pub copy_bytes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub thread_instructions: AtomicU64,
    pub warp_instructions: AtomicU64,
    pub runs: AtomicU64,
    pub preemptions: AtomicU64,
    pub faults: AtomicU64,
    pub copy_bytes: AtomicU64,
}

impl Counters {
    /// Counts one run and how it ended.
    pub fn outcome(&self, o: &Outcome) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        match o {
            Outcome::Completed { .. } => {}
            Outcome::Preempted { .. } => {
                self.preemptions.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Faulted { .. } => {
                self.faults.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
