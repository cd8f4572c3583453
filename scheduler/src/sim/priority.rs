//! The priority experiment in simulation: one high-priority request VM beside backlogged
//! low-priority VMs, run alone (exclusive), under TIMESLICE equal shares (one class), under
//! strict priority without filling and with filling (`fill=on`); the figures the targets
//! are stated in (request latency vs alone, low-priority throughput vs the GPU time the
//! high-priority VM leaves idle, utilization, overhead).

use std::time::Duration;

use super::{SimError, SimSpec, simulate};
use crate::config::Config;

/// How the VMs share the GPU in one run of the experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The high-priority VM alone.
    Exclusive,
    /// Every VM in one class, TIMESLICE equal weights.
    Timeslice,
    /// High priority in class 1, strict priority, no filling.
    Priority,
    /// As `Priority` with `fill=on`.
    Fill,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Self::Exclusive, Self::Timeslice, Self::Priority, Self::Fill];
    pub fn name(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Timeslice => "timeslice",
            Self::Priority => "priority",
            Self::Fill => "fikit",
        }
    }
}

/// Results of one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct ModeResult {
    pub mode: Mode,
    pub requests: usize,
    pub p50: Duration,
    pub p99: Duration,
    /// Kernel progress (GPU time less preemption overhead) of the high-priority VM and of the
    /// low-priority VMs together, after the warm-up.
    pub hp_progress: Duration,
    pub lp_progress: Duration,
    /// GPU held / measured time.
    pub utilization: f64,
    /// Preemption overhead (GPU held but no kernel progress) / GPU held.
    pub overhead: f64,
    pub preemptions: u64,
    /// Time measured (after the warm-up).
    pub measured: Duration,
}

/// The experiment's comparison: every mode on `spec` (VM 0 is the high-priority VM, the others
/// low priority) under `base` (its `policy` and `fill` are set per mode).
pub fn compare(base: &Config, spec: &SimSpec) -> Result<Vec<ModeResult>, SimError> {
    Mode::ALL
        .into_iter()
        .map(|mode| run(base, spec, mode))
        .collect()
}

/// One mode of the experiment.
pub fn run(base: &Config, spec: &SimSpec, mode: Mode) -> Result<ModeResult, SimError> {
    let mut spec = spec.clone();
    let mut config = base.clone();
    config.policy = crate::config::PolicyKind::Timeslice;
    config.fill = mode == Mode::Fill;
    for (i, vm) in spec.vms.iter_mut().enumerate() {
        vm.priority = match mode {
            Mode::Timeslice => 0,
            _ => u8::from(i == 0),
        };
    }
    if mode == Mode::Exclusive {
        spec.vms.truncate(1);
    }
    let r = simulate(&config, &spec)?;
    let hp = r.vms.first();
    let lp_progress = r.vms.iter().skip(1).map(|v| v.progress).sum();
    let frac = |a: Duration, b: Duration| {
        if b.is_zero() {
            0.0
        } else {
            a.as_secs_f64() / b.as_secs_f64()
        }
    };
    Ok(ModeResult {
        mode,
        requests: hp.map_or(0, |v| v.latencies.len()),
        p50: hp.map_or(Duration::ZERO, |v| v.latency(0.50)),
        p99: hp.map_or(Duration::ZERO, |v| v.latency(0.99)),
        hp_progress: hp.map_or(Duration::ZERO, |v| v.progress),
        lp_progress,
        utilization: frac(r.busy, r.measured),
        overhead: frac(r.busy.saturating_sub(r.useful_time), r.busy),
        preemptions: r.preemptions,
        measured: r.measured,
    })
}
