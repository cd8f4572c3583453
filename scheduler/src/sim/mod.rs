//! Deterministic discrete-event simulator: drives a [`Scheduler`] with synthetic VMs (kernel
//! lengths, weights, arrival patterns, preemption cost) and measures shares per window, Jain's
//! index, share error vs weights, utilization and switch counts; with per-kernel think times
//! (`SimVm::requests`), the latency of requests (one cycle through a VM's kernels).

use std::collections::VecDeque;
use std::time::Duration;

use crate::config::{Config, ConfigError};
use crate::error::SchedError;
use crate::scheduler::Scheduler;
use crate::types::{Action, KernelKey, Pick, VmId, VmParams};

pub mod priority;
mod report;
pub mod turns;

pub use report::{SimReport, VmReport, WindowReport};

/// A synthetic VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimVm {
    pub weight: u32,
    pub priority: u8,
    /// Lengths of its kernels, used in turn (cycled).
    pub kernels: Vec<Duration>,
    /// Jobs it keeps queued (1 = a synchronous application; 0 = never submits).
    pub depth: u32,
    /// Think time between a completion and the next submission.
    pub gap: Duration,
    /// Think time after each kernel (index as `kernels`); empty: `gap` after every kernel.
    pub gaps: Vec<Duration>,
    /// First submission.
    pub start: Duration,
    /// No submissions from this time on.
    pub stop: Option<Duration>,
    /// Removed from the scheduler at this time (dies), even mid-kernel.
    pub remove_at: Option<Duration>,
    /// Time from a preemption request to the job being stopped and saved (charged to the VM).
    pub preempt_cost: Duration,
}

impl SimVm {
    /// Always has work: keeps two jobs queued, no think time.
    pub fn backlogged(weight: u32, kernels: &[Duration]) -> Self {
        Self {
            weight,
            priority: 0,
            kernels: kernels.to_vec(),
            depth: 2,
            gap: Duration::ZERO,
            gaps: Vec::new(),
            start: Duration::ZERO,
            stop: None,
            remove_at: None,
            preempt_cost: Duration::from_micros(30),
        }
    }

    /// A synchronous application: one kernel at a time, `gap` of CPU time between kernels.
    pub fn synchronous(weight: u32, kernels: &[Duration], gap: Duration) -> Self {
        Self {
            depth: 1,
            gap,
            ..Self::backlogged(weight, kernels)
        }
    }

    /// A latency-sensitive application (inference): requests of `kernels` run one at a time,
    /// `gaps[i]` of CPU time after kernel `i` (the last one: the think time between requests).
    /// Kernel `i` has identity `KernelKey(i)`; a request's latency is from its first submission
    /// to its last completion.
    pub fn requests(priority: u8, kernels: &[Duration], gaps: &[Duration]) -> Self {
        Self {
            priority,
            gaps: gaps.to_vec(),
            ..Self::synchronous(1, kernels, Duration::ZERO)
        }
    }

    fn gap_after(&self, kernel: usize) -> Duration {
        self.gaps.get(kernel).copied().unwrap_or(self.gap)
    }
}

/// A simulation run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSpec {
    pub vms: Vec<SimVm>,
    pub duration: Duration,
    /// Windows starting before this are not measured.
    pub warmup: Duration,
}

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("scheduler refused an event: {0}")]
    Sched(#[from] SchedError),
    #[error("VM {0} submits but has no kernel lengths (or a zero-length kernel)")]
    BadKernels(usize),
    #[error("too many VMs for u32 ids")]
    TooManyVms,
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Complete,
    Preempt { progress: Duration },
}

#[derive(Debug, Clone, Copy)]
struct Run {
    vm: usize,
    start: Duration,
    end: Duration,
    outcome: Outcome,
}

#[derive(Debug, Default)]
struct VmState {
    /// Queued jobs: (GPU time left, kernel index).
    jobs: VecDeque<(Duration, usize)>,
    next_kernel: usize,
    next_submit: Option<Duration>,
    removed: bool,
    /// Submission of the first kernel of the request in progress.
    request_start: Option<Duration>,
    latencies: Vec<Duration>,
}

/// Runs `spec` under `config` (its `history` is raised to hold the whole run).
pub fn simulate(config: &Config, spec: &SimSpec) -> Result<SimReport, SimError> {
    let mut config = config.clone();
    let windows = spec.duration.as_nanos() / config.window.as_nanos().max(1) + 2;
    config.history = config
        .history
        .max(usize::try_from(windows).unwrap_or(usize::MAX));
    config.max_vms = config.max_vms.max(spec.vms.len());
    let window = config.window;
    let mut sched = Scheduler::new(config)?;
    let id = |i: usize| u32::try_from(i).map(VmId).map_err(|_| SimError::TooManyVms);
    let mut st: Vec<VmState> = Vec::with_capacity(spec.vms.len());
    for (i, vm) in spec.vms.iter().enumerate() {
        if vm.depth > 0 && (vm.kernels.is_empty() || vm.kernels.iter().any(Duration::is_zero)) {
            return Err(SimError::BadKernels(i));
        }
        sched.register(
            id(i)?,
            VmParams {
                weight: vm.weight,
                priority: vm.priority,
            },
            Duration::ZERO,
        )?;
        let next_submit = (vm.depth > 0).then_some(vm.start);
        st.push(VmState {
            next_submit,
            ..VmState::default()
        });
    }

    let (mut now, mut running, mut timer) = (Duration::ZERO, None::<Run>, None::<Duration>);
    let mut need_pick = true;
    let (mut demand, mut busy, mut useful) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut switches, mut preemptions, mut waits) = (0u64, 0u64, 0u64);
    let mut last_vm = None::<usize>;
    let mut completions = vec![0u64; spec.vms.len()];
    let mut vm_preemptions = vec![0u64; spec.vms.len()];
    let mut progress = vec![Duration::ZERO; spec.vms.len()];
    loop {
        if running.is_none() && need_pick {
            need_pick = false;
            timer = None;
            match sched.pick(now)? {
                Pick::Run(d) => {
                    let vm = d.run.0 as usize;
                    let remaining = st
                        .get(vm)
                        .and_then(|s| s.jobs.front().map(|j| j.0))
                        .unwrap_or_default();
                    let cost = spec.vms.get(vm).map_or(Duration::ZERO, |v| v.preempt_cost);
                    let run = match d.slice {
                        Some(s) if remaining > s => Run {
                            vm,
                            start: now,
                            end: now.saturating_add(s).saturating_add(cost),
                            outcome: Outcome::Preempt { progress: s },
                        },
                        _ => Run {
                            vm,
                            start: now,
                            end: now.saturating_add(remaining),
                            outcome: Outcome::Complete,
                        },
                    };
                    if last_vm.is_some_and(|l| l != vm) {
                        switches += 1;
                    }
                    last_vm = Some(vm);
                    running = Some(run);
                }
                Pick::Wait { until, .. } => {
                    waits += 1;
                    timer = Some(until);
                }
                Pick::Idle => {}
            }
        }
        let next_submit = st
            .iter()
            .filter(|s| !s.removed)
            .filter_map(|s| s.next_submit)
            .min();
        let next_remove = spec
            .vms
            .iter()
            .zip(&st)
            .filter(|(_, s)| !s.removed)
            .filter_map(|(v, _)| v.remove_at)
            .min();
        let t = [
            running.map(|r| r.end),
            next_submit,
            next_remove,
            timer,
            Some(spec.duration),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(spec.duration)
        .max(now);
        // Measure [now, t) after the warm-up.
        let lo = now.max(spec.warmup);
        if t > lo {
            if sched.has_work() {
                demand += t - lo;
            }
            if let Some(r) = running {
                busy += t - lo;
                let overhead_from = match r.outcome {
                    Outcome::Preempt { progress } => r.start.saturating_add(progress),
                    Outcome::Complete => r.end,
                };
                useful += overhead_from.max(lo).min(t) - lo;
            }
        }
        now = t;
        if now >= spec.duration {
            // Close the books: the run in progress is charged up to the end.
            if let Some(r) = running {
                sched.on_preempted(id(r.vm)?, now.saturating_sub(r.start), now)?;
            }
            break;
        }
        if let Some(r) = running.filter(|r| r.end == now) {
            running = None;
            need_pick = true;
            let gpu = r.end - r.start;
            let done = match r.outcome {
                Outcome::Complete => gpu,
                Outcome::Preempt { progress } => progress,
            };
            if r.start >= spec.warmup {
                progress[r.vm] += done;
            }
            let s = &mut st[r.vm];
            match r.outcome {
                Outcome::Complete => {
                    let kernel = s.jobs.pop_front().map_or(0, |j| j.1);
                    completions[r.vm] += 1;
                    sched.on_complete(id(r.vm)?, gpu, now)?;
                    let v = &spec.vms[r.vm];
                    if kernel + 1 == v.kernels.len()
                        && let Some(start) = s.request_start.take()
                        && start >= spec.warmup
                    {
                        s.latencies.push(now - start);
                    }
                    let gap = v.gap_after(kernel);
                    if s.next_submit.is_none()
                        && v.stop.is_none_or(|stop| now.saturating_add(gap) < stop)
                    {
                        s.next_submit = Some(now.saturating_add(gap));
                    }
                }
                Outcome::Preempt { progress } => {
                    if let Some(j) = s.jobs.front_mut() {
                        j.0 = j.0.saturating_sub(progress);
                    }
                    preemptions += 1;
                    vm_preemptions[r.vm] += 1;
                    sched.on_preempted(id(r.vm)?, gpu, now)?;
                }
            }
        }
        for (i, (s, v)) in st.iter_mut().zip(&spec.vms).enumerate() {
            if !s.removed && v.remove_at == Some(now) {
                s.removed = true;
                s.jobs.clear();
                sched.remove(id(i)?, now)?;
                if running.is_some_and(|r| r.vm == i) {
                    running = None;
                }
                need_pick = true;
            }
        }
        for (i, (s, v)) in st.iter_mut().zip(&spec.vms).enumerate() {
            if s.removed || s.next_submit != Some(now) {
                continue;
            }
            s.next_submit = None;
            while s.jobs.len() < v.depth as usize {
                let index = s.next_kernel % v.kernels.len().max(1);
                let Some(&k) = v.kernels.get(index) else {
                    return Err(SimError::BadKernels(i));
                };
                s.next_kernel = s.next_kernel.wrapping_add(1);
                s.jobs.push_back((k, index));
                if index == 0 {
                    s.request_start = Some(now);
                }
                need_pick = true;
                let key = Some(KernelKey(index as u64));
                let (p, at) = match sched.on_submit_kernel(id(i)?, key, now)? {
                    Action::None => continue,
                    Action::Preempt(p) => (p, now),
                    Action::PreemptAt { vm, at } => (vm, at),
                };
                let cost = spec
                    .vms
                    .get(p.0 as usize)
                    .map_or(Duration::ZERO, |v| v.preempt_cost);
                if let Some(r) = running.as_mut().filter(|r| r.vm == p.0 as usize) {
                    // Stopped at `at` (now, or the bound a finishing filler was given) unless
                    // it completes first; saving the context costs `cost`.
                    let at = at.max(r.start);
                    if r.end > at {
                        r.end = at.saturating_add(cost);
                        r.outcome = Outcome::Preempt {
                            progress: at - r.start,
                        };
                    }
                }
            }
        }
        if timer == Some(now) {
            need_pick = true;
        }
    }
    Ok(report::report(
        &sched,
        spec,
        window,
        demand,
        busy,
        useful,
        report::Counts {
            switches,
            preemptions,
            waits,
            completions,
            vm_preemptions,
            latencies: st.into_iter().map(|s| s.latencies).collect(),
            progress,
        },
    ))
}
