//! Results of a simulation: per-window GPU time per VM, weighted Jain's index, share error vs
//! weights, utilization, switch counts.

use std::time::Duration;

use super::{SimSpec, SimVm};
use crate::scheduler::Scheduler;
use crate::types::VmId;

/// Per-VM results over the measured windows.
#[derive(Debug, Clone, PartialEq)]
pub struct VmReport {
    pub gpu_time: Duration,
    /// Fraction of the GPU time of the VMs active in the measured windows.
    pub share: f64,
    /// `weight / total weight` of those VMs (mean over the windows it was active in).
    pub expected: f64,
    pub completions: u64,
    pub preemptions: u64,
    /// Kernel progress after the warm-up (GPU time less preemption overhead).
    pub progress: Duration,
    /// Latency of every request started after the warm-up (`SimVm::requests`).
    pub latencies: Vec<Duration>,
}

impl VmReport {
    /// The `q` quantile (0..=1, nearest rank) of the request latencies; zero without requests.
    pub fn latency(&self, q: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let rank = (q.clamp(0.0, 1.0) * l.len() as f64).ceil() as usize;
        l.get(rank.saturating_sub(1)).copied().unwrap_or_default()
    }

    /// `|share - expected|` (a fraction: 0.02 = 2 percentage points).
    pub fn error(&self) -> f64 {
        (self.share - self.expected).abs()
    }
}

/// One measured window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowReport {
    pub start: Duration,
    /// GPU time per VM (index = VM).
    pub gpu: Vec<Duration>,
    /// Weighted Jain's index over the VMs active for the whole window.
    pub jain: Option<f64>,
    /// Largest `|share - weight share|` among those VMs.
    pub max_error: Option<f64>,
}

/// Results of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    pub windows: Vec<WindowReport>,
    pub vms: Vec<VmReport>,
    /// GPU held by some VM / time during which some VM had work (measured part).
    pub utilization: f64,
    /// Kernel progress (held time less preemption overhead) / time with work.
    pub useful: f64,
    /// Grants that changed the running VM.
    pub switches: u64,
    pub preemptions: u64,
    /// `Pick::Wait` answers (BAND, filling).
    pub waits: u64,
    /// Time measured (after the warm-up), GPU held, and kernel progress in it.
    pub measured: Duration,
    pub busy: Duration,
    pub useful_time: Duration,
}

impl SimReport {
    pub fn jain_min(&self) -> f64 {
        self.windows
            .iter()
            .filter_map(|w| w.jain)
            .fold(1.0, f64::min)
    }
    pub fn jain_mean(&self) -> f64 {
        let j: Vec<f64> = self.windows.iter().filter_map(|w| w.jain).collect();
        if j.is_empty() {
            1.0
        } else {
            j.iter().sum::<f64>() / j.len() as f64
        }
    }
    /// Largest whole-run share error among the VMs.
    pub fn share_error_max(&self) -> f64 {
        self.vms.iter().map(VmReport::error).fold(0.0, f64::max)
    }
    /// Largest per-window share error.
    pub fn window_error_max(&self) -> f64 {
        self.windows
            .iter()
            .filter_map(|w| w.max_error)
            .fold(0.0, f64::max)
    }
    /// One line: Jain min/mean, share errors, utilization, switches.
    pub fn summary(&self) -> String {
        format!(
            "jain min {:.4} mean {:.4} | share err max {:.2}% (window {:.2}%) | util {:.1}% useful {:.1}% | switches {} preemptions {} waits {}",
            self.jain_min(),
            self.jain_mean(),
            100.0 * self.share_error_max(),
            100.0 * self.window_error_max(),
            100.0 * self.utilization,
            100.0 * self.useful,
            self.switches,
            self.preemptions,
            self.waits
        )
    }
}

pub(super) struct Counts {
    pub(super) switches: u64,
    pub(super) preemptions: u64,
    pub(super) waits: u64,
    pub(super) completions: Vec<u64>,
    pub(super) vm_preemptions: Vec<u64>,
    pub(super) latencies: Vec<Vec<Duration>>,
    pub(super) progress: Vec<Duration>,
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

pub(super) fn report(
    sched: &Scheduler,
    spec: &SimSpec,
    window: Duration,
    demand: Duration,
    busy: Duration,
    useful: Duration,
    counts: Counts,
) -> SimReport {
    let n = spec.vms.len();
    let active = |v: &SimVm, ws: Duration, we: Duration| {
        v.depth > 0
            && v.start <= ws
            && v.stop.is_none_or(|s| s >= we)
            && v.remove_at.is_none_or(|r| r >= we)
    };
    let mut windows = Vec::new();
    let (mut vm_gpu, mut vm_total, mut vm_expected, mut vm_windows) = (
        vec![Duration::ZERO; n],
        vec![Duration::ZERO; n],
        vec![0.0; n],
        vec![0u32; n],
    );
    for w in sched.accounting().windows() {
        let (ws, we) = (w.start, w.start.saturating_add(window));
        if ws < spec.warmup || we > spec.duration {
            continue;
        }
        let gpu: Vec<Duration> = (0..n)
            .map(|i| w.per_vm.get(&VmId(i as u32)).copied().unwrap_or_default())
            .collect();
        let act: Vec<usize> = (0..n).filter(|&i| active(&spec.vms[i], ws, we)).collect();
        // Strict priority: only the highest active class is expected to share.
        let top = act.iter().map(|&i| spec.vms[i].priority).max();
        let act: Vec<usize> = act
            .into_iter()
            .filter(|&i| Some(spec.vms[i].priority) == top)
            .collect();
        let total: Duration = act.iter().map(|&i| gpu[i]).sum();
        let wsum: f64 = act.iter().map(|&i| f64::from(spec.vms[i].weight)).sum();
        let (mut jain, mut max_error) = (None, None);
        if !act.is_empty() && !total.is_zero() {
            let x: Vec<f64> = act
                .iter()
                .map(|&i| gpu[i].as_secs_f64() / f64::from(spec.vms[i].weight))
                .collect();
            let (s, s2) = (x.iter().sum::<f64>(), x.iter().map(|v| v * v).sum::<f64>());
            jain = (s2 > 0.0).then(|| s * s / (x.len() as f64 * s2));
            let mut worst: f64 = 0.0;
            for &i in &act {
                let expected = f64::from(spec.vms[i].weight) / wsum;
                worst = worst.max((ratio(gpu[i], total) - expected).abs());
                vm_gpu[i] += gpu[i];
                vm_total[i] += total;
                vm_expected[i] += expected;
                vm_windows[i] += 1;
            }
            max_error = Some(worst);
        }
        windows.push(WindowReport {
            start: ws,
            gpu,
            jain,
            max_error,
        });
    }
    let vms = (0..n)
        .map(|i| VmReport {
            gpu_time: vm_gpu[i],
            share: ratio(vm_gpu[i], vm_total[i]),
            expected: if vm_windows[i] == 0 {
                0.0
            } else {
                vm_expected[i] / f64::from(vm_windows[i])
            },
            completions: counts.completions[i],
            preemptions: counts.vm_preemptions[i],
            latencies: counts.latencies.get(i).cloned().unwrap_or_default(),
            progress: counts.progress.get(i).copied().unwrap_or_default(),
        })
        .collect();
    SimReport {
        windows,
        vms,
        utilization: ratio(busy, demand),
        useful: ratio(useful, demand),
        switches: counts.switches,
        preemptions: counts.preemptions,
        waits: counts.waits,
        measured: spec.duration.saturating_sub(spec.warmup),
        busy,
        useful_time: useful,
    }
}
