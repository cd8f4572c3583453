//! Runtime configuration of the sim engine.

use crate::ckpt::PreemptMethod;
use crate::engine::{EngineLimits, PageSize};

/// Configuration of a [`super::SimEngine`]. Everything is chosen at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Physical VRAM size in bytes (a multiple of 2 MiB; reserved lazily).
    pub vram_size: u64,
    /// Worker threads that run a kernel's CTAs (1 runs on the caller's thread).
    pub workers: usize,
    /// Bytes the copy engine moves between preemption checks.
    pub copy_chunk: u64,
    /// Page sizes `map` accepts (any of 4 KiB and 2 MiB).
    pub page_sizes: Vec<PageSize>,
    /// Limits on hostile requests.
    pub limits: EngineLimits,
    /// How kernels are preempted: `Slice` (default) stops the interpreter between
    /// instructions (exact state, any kernel); `Checkpoint` runs the `ptx::ckpt`-transformed
    /// module and stops it at its compiler-chosen points (the method the cuda engine can use on
    /// a real GPU, proven here without one).
    pub preempt: PreemptMethod,
    /// Largest save area of one checkpointed launch (host memory, bytes); a launch that needs
    /// more runs with the `Slice` method (counted as a fallback).
    pub max_save_area_bytes: u64,
    /// Longest a checkpointed kernel may run once its flag is raised before every thread has
    /// reached a point (a kernel that never does, e.g. a barrier-free endless loop in a
    /// CTA-class kernel, would otherwise hold the engine forever): the job then faults.
    pub max_checkpoint_drain: std::time::Duration,
    /// `ptx::ckpt::Options::poll_interval` of the transformation: a thread reads the flag at
    /// every this many point crossings (1: at every point; larger: less steady-state cost,
    /// longer preemption latency). Default: the transformation's (64).
    pub ckpt_poll_interval: u32,
    /// `Auto`'s wait budget (`crate::ckwait`): a request for a launch expected to end within
    /// it is not acted on (the launch completes). Zero: never waited. Default
    /// [`crate::ckwait::DEFAULT_WAIT_BUDGET`].
    pub preempt_wait: std::time::Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            vram_size: 1 << 30,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            copy_chunk: 64 << 10,
            page_sizes: vec![PageSize::Size4K, PageSize::Size2M],
            limits: EngineLimits::default(),
            preempt: PreemptMethod::Slice,
            max_save_area_bytes: 64 << 20,
            max_checkpoint_drain: std::time::Duration::from_millis(500),
            ckpt_poll_interval: crate::ckpt::default_poll_interval(),
            preempt_wait: crate::ckwait::DEFAULT_WAIT_BUDGET,
        }
    }
}
