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

/// A kernel's identity for filling: a stable 64-bit hash of (module content hash, entry name,
/// grid, block, dynamic shared memory size). Two launches with the same identity are expected
/// to take about the same GPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelKey(pub u64);

impl KernelKey {
    /// The identity of a launch (FNV-1a over the fields, little-endian; stable across builds and
    /// machines, so a VM process and the daemon compute the same key). `module` is the module's
    /// [`KernelKey::content_hash`].
    pub fn of(module: u64, entry: &str, grid: [u32; 3], block: [u32; 3], shared: u32) -> Self {
        let mut h = Fnv::default();
        h.eat(&module.to_le_bytes());
        h.eat(&(entry.len() as u64).to_le_bytes());
        h.eat(entry.as_bytes());
        for v in grid.into_iter().chain(block).chain([shared]) {
            h.eat(&v.to_le_bytes());
        }
        Self(h.0)
    }

    /// The stable content hash of a module's text (FNV-1a, like [`KernelKey::of`]): the
    /// `module` argument of `of`. A VM process computes it once per loaded module.
    pub fn content_hash(bytes: &[u8]) -> u64 {
        let mut h = Fnv::default();
        h.eat(bytes);
        h.0
    }
}

/// 64-bit FNV-1a.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
        }
    }
}

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
