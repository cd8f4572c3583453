//! Value types of the event API: VM ids, registration parameters, decisions and actions.

use std::fmt;
use std::time::Duration;

/// A VM as the scheduler knows it; the caller chooses the numbers (the daemon: one per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VmId(pub u32);

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vm{}", self.0)
    }
}

/// Registration parameters of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmParams {
    /// Share weight within its priority class, `1..=Config::max_weight`.
    pub weight: u32,
    /// Priority class: a higher class always runs before a lower one (strict).
    pub priority: u8,
}

impl Default for VmParams {
    fn default() -> Self {
        Self {
            weight: 1,
            priority: 0,
        }
    }
}

/// Grant of the GPU: run `run`'s next job (or resume its saved context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub run: VmId,
    /// Preempt the job when it has run this long (`None`: let it complete; non-preemptive policy).
    pub slice: Option<Duration>,
}

/// Answer of [`crate::Scheduler::pick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Give the GPU to a VM.
    Run(Decision),
    /// Keep the GPU idle until `until` or until `vm` submits (BAND's wait), then pick again.
    Wait { vm: VmId, until: Duration },
    /// No VM has work: pick again after the next submission.
    Idle,
}

/// What the caller must do after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Preempt the running VM now (a VM of a higher priority class has work); report
    /// `on_preempted` when it has stopped, then pick.
    Preempt(VmId),
    /// Filling (`fill=on`): the running filler is predicted to end within `fill_bound`; let it,
    /// but preempt it at `at` if it is still running then (it overran its prediction).
    PreemptAt { vm: VmId, at: Duration },
}

/// A kernel's identity for filling, defined with the protocol that carries it (`vgpu_proto::kernel`):
/// the VM process computes it, the scheduler learns under it.
pub use vgpu_proto::kernel::KernelKey;

/// Result of [`crate::Scheduler::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// The VM held the GPU: its job must be stopped or abandoned; the GPU is free for `pick`.
    pub was_running: bool,
    /// Jobs it had queued (dropped).
    pub pending: u64,
}

/// The run in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    pub vm: VmId,
    /// When `pick` granted it.
    pub since: Duration,
    pub slice: Option<Duration>,
}

/// Per-VM totals since registration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmStats {
    /// GPU time charged.
    pub gpu_time: Duration,
    /// Grants received.
    pub runs: u64,
    pub completions: u64,
    pub preemptions: u64,
    pub faults: u64,
    /// Jobs queued now.
    pub pending: u64,
}
