//! The figures of a fairness run, from the daemon's report (`vgpud::Report`), with the
//! definitions of the scheduler simulator (scheduler/src/sim/report.rs): per accounting window,
//! the weighted Jain's index over the VMs active for the whole window (`x_i = gpu_i / weight_i`)
//! and the largest `|share − weight share|`; per VM, its share of the GPU time of the VMs active
//! beside it in the measured windows against the mean weight share there; utilization (GPU busy
//! / time some VM wanted it); latency percentiles.
//!
//! What the daemon cannot tell (when a guest's kernels started) is read off its windows: a VM is
//! *active* in a window when it used the GPU in an earlier and in a later window. Measured
//! windows start `ramp` after the first window with any use, exclude the last one, and end
//! before the first VM's last window with any use: every VM competes in every measured window
//! (the native anchor's windows likewise end at the first process's end, `fairness_native`).
//! While VMs finish, the others' shares and preemptions reflect VM processes ending (a cuda
//! VM's context torn down on the GPU), not the scheduler; the whole run's figures stay beside.

use vgpud::Report;

use crate::error::BenchError;
use crate::report::Percentiles;

/// A VM of the experiment: its name in the report and its weight.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub name: String,
    pub weight: u32,
}

/// One accounting window.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub start_ns: u64,
    /// GPU ns per VM (index = VM of the experiment).
    pub gpu_ns: Vec<u64>,
    /// Counted in Jain's index and the shares (after the ramp, not the last).
    pub measured: bool,
    /// VMs active for the whole window.
    pub active: Vec<bool>,
    /// Weighted Jain's index over the active VMs (measured windows with two or more).
    pub jain: Option<f64>,
    /// Largest share error among the active VMs (fraction).
    pub max_error: Option<f64>,
}

/// Per-VM figures.
#[derive(Debug, Clone, PartialEq)]
pub struct VmFig {
    /// The daemon's id (`None`: the VM never registered).
    pub id: Option<u32>,
    /// GPU ns over the whole run.
    pub gpu_ns: u64,
    /// Fraction of the whole run's GPU time.
    pub share_run: f64,
    /// Share in the measured windows it was active in (simulator definition).
    pub share: f64,
    /// Mean weight share over those windows.
    pub expected: f64,
    /// `weight / Σ weights` of all VMs.
    pub target: f64,
    /// `|share − expected|` (fraction).
    pub error: f64,
    pub measured_windows: u32,
    pub jobs_completed: u64,
    pub preempted: u64,
    pub grants: u64,
    pub evicted: bool,
}

/// Everything computed.
#[derive(Debug, Clone)]
pub struct Figures {
    pub window_ns: u64,
    pub windows: Vec<Window>,
    pub vms: Vec<VmFig>,
    pub jain_min: Option<f64>,
    pub jain_mean: Option<f64>,
    pub jain_windows: usize,
    /// Largest per-VM share error (fraction).
    pub share_error_max: f64,
    /// Largest per-window share error (fraction).
    pub window_error_max: f64,
    pub utilization: f64,
    pub preempt_us: Percentiles,
    pub switch_us: Percentiles,
    /// The longest preemption whose stop was due inside the measured windows (the steady
    /// state Jain's index is taken over, start-up ramp and last window excluded); `None` from
    /// a daemon that does not say when its stops were due.
    pub steady_preempt: Option<SteadyMax>,
}

/// [`Figures::steady_preempt`], from the daemon's `worst_preemptions` (its longest, with when
/// each was due). Exact when one of them was due in the interval: a longer one there would be
/// among them too. Otherwise an upper bound (`exact` false): the shortest of a full list, or 0
/// exactly when the list holds every preemption of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SteadyMax {
    pub max_us: f64,
    pub exact: bool,
}

/// [`SteadyMax`] over the measured `windows` (of `window_ns`), for the preemptions of `gpu`
/// (all GPUs with `None`).
pub fn steady_max(report: &Report, windows: &[Window], gpu: Option<u32>) -> Option<SteadyMax> {
    let worst = &report.worst_preemptions;
    if worst.iter().any(|p| p.due_at_ns == 0) {
        return None;
    }
    let from = windows.iter().find(|w| w.measured)?.start_ns;
    let to = windows.iter().rev().find(|w| w.measured)?.start_ns + report.window_ns;
    let inside = worst
        .iter()
        .filter(|p| gpu.is_none_or(|g| p.gpu == g) && (from..to).contains(&p.due_at_ns))
        .map(|p| p.late_ns)
        .max();
    let us = |ns: u64| ns as f64 / 1e3;
    Some(match inside {
        Some(ns) => SteadyMax {
            max_us: us(ns),
            exact: true,
        },
        None if worst.len() < vgpud::report::WORST_KEPT => SteadyMax {
            max_us: 0.0,
            exact: true,
        },
        None => SteadyMax {
            max_us: us(worst.iter().map(|p| p.late_ns).min().unwrap_or(0)),
            exact: false,
        },
    })
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Weighted Jain's index of `(gpu, weight)` pairs; `None` when empty or all zero.
pub fn jain(pairs: &[(f64, f64)]) -> Option<f64> {
    let x: Vec<f64> = pairs.iter().map(|(g, w)| g / w).collect();
    let (s, s2) = (x.iter().sum::<f64>(), x.iter().map(|v| v * v).sum::<f64>());
    (!x.is_empty() && s2 > 0.0).then(|| s * s / (x.len() as f64 * s2))
}

/// Computes the figures of `report` for the experiment's `vms` (matched by name).
pub fn compute(report: &Report, vms: &[VmSpec], ramp_ns: u64) -> Result<Figures, BenchError> {
    let wn = report.window_ns;
    if wn == 0 {
        return Err(BenchError::Invalid("vgpud report: window_ns is 0".into()));
    }
    let n = vms.len();
    // The report's id of each VM (the last registration of that name).
    let ids: Vec<Option<&vgpud::report::VmReport>> = vms
        .iter()
        .map(|v| report.vms.iter().rev().find(|r| r.name == v.name))
        .collect();
    let index = |id: u32| ids.iter().position(|r| r.is_some_and(|r| r.id == id));
    // Dense windows from the first to the last one with any use.
    let first = report.windows.iter().map(|w| w.start_ns / wn).min();
    let last = report.windows.iter().map(|w| w.start_ns / wn).max();
    let mut windows: Vec<Window> = match (first, last) {
        (Some(f), Some(l)) => (f..=l)
            .map(|k| Window {
                start_ns: k * wn,
                gpu_ns: vec![0; n],
                measured: false,
                active: vec![false; n],
                jain: None,
                max_error: None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let base = first.unwrap_or(0);
    for w in &report.windows {
        let k = (w.start_ns / wn - base) as usize;
        for &(id, ns) in &w.per_vm {
            if let Some(i) = index(id) {
                windows[k].gpu_ns[i] += ns;
            }
        }
    }
    let used: Vec<(Option<usize>, Option<usize>)> = (0..n)
        .map(|i| {
            let mut it = windows.iter().enumerate().filter(|(_, w)| w.gpu_ns[i] > 0);
            let f = it.next().map(|(k, _)| k);
            (f, it.next_back().map(|(k, _)| k).or(f))
        })
        .collect();
    let t0 = windows.first().map_or(0, |w| w.start_ns);
    let count = windows.len();
    // The first VM's last window with use (VMs that never used the GPU, or that the daemon
    // evicted, are left out: their end is not the run's).
    let all_end = used
        .iter()
        .zip(&ids)
        .filter(|(_, r)| !r.is_some_and(|r| r.evicted))
        .filter_map(|(u, _)| u.1)
        .min();
    let (mut vm_gpu, mut vm_total, mut vm_expected, mut vm_windows) =
        (vec![0u64; n], vec![0u64; n], vec![0.0; n], vec![0u32; n]);
    for (k, w) in windows.iter_mut().enumerate() {
        w.measured = w.start_ns >= t0 + ramp_ns && k + 1 < count && all_end.is_none_or(|e| k < e);
        for (a, u) in w.active.iter_mut().zip(&used) {
            *a = matches!(*u, (Some(f), Some(l)) if f < k && k < l);
        }
        if !w.measured {
            continue;
        }
        let act: Vec<usize> = (0..n).filter(|&i| w.active[i]).collect();
        let total: u64 = act.iter().map(|&i| w.gpu_ns[i]).sum();
        if act.is_empty() || total == 0 {
            continue;
        }
        let wsum: f64 = act.iter().map(|&i| f64::from(vms[i].weight)).sum();
        let pairs: Vec<(f64, f64)> = act
            .iter()
            .map(|&i| (w.gpu_ns[i] as f64, f64::from(vms[i].weight)))
            .collect();
        if act.len() >= 2 {
            w.jain = jain(&pairs);
        }
        let mut worst: f64 = 0.0;
        for &i in &act {
            let expected = f64::from(vms[i].weight) / wsum;
            worst = worst.max((ratio(w.gpu_ns[i] as f64, total as f64) - expected).abs());
            vm_gpu[i] += w.gpu_ns[i];
            vm_total[i] += total;
            vm_expected[i] += expected;
            vm_windows[i] += 1;
        }
        w.max_error = Some(worst);
    }
    let all_gpu: u64 = ids.iter().flatten().map(|r| r.gpu_ns).sum();
    let wsum_all: f64 = vms.iter().map(|v| f64::from(v.weight)).sum();
    let figs: Vec<VmFig> = (0..n)
        .map(|i| {
            let r = ids[i];
            let share = ratio(vm_gpu[i] as f64, vm_total[i] as f64);
            let expected = ratio(vm_expected[i], f64::from(vm_windows[i]));
            VmFig {
                id: r.map(|r| r.id),
                gpu_ns: r.map_or(0, |r| r.gpu_ns),
                share_run: ratio(r.map_or(0, |r| r.gpu_ns) as f64, all_gpu as f64),
                share,
                expected,
                target: ratio(f64::from(vms[i].weight), wsum_all),
                error: if vm_windows[i] == 0 {
                    0.0
                } else {
                    (share - expected).abs()
                },
                measured_windows: vm_windows[i],
                jobs_completed: r.map_or(0, |r| r.completed),
                preempted: r.map_or(0, |r| r.preempted),
                grants: r.map_or(0, |r| r.grants),
                evicted: r.is_some_and(|r| r.evicted),
            }
        })
        .collect();
    let js: Vec<f64> = windows.iter().filter_map(|w| w.jain).collect();
    let us = |v: &[u64]| v.iter().map(|&x| x as f64 / 1e3).collect::<Vec<f64>>();
    Ok(Figures {
        window_ns: wn,
        jain_min: js.iter().copied().reduce(f64::min),
        jain_mean: (!js.is_empty()).then(|| js.iter().sum::<f64>() / js.len() as f64),
        jain_windows: js.len(),
        share_error_max: figs.iter().map(|v| v.error).fold(0.0, f64::max),
        window_error_max: windows
            .iter()
            .filter_map(|w| w.max_error)
            .fold(0.0, f64::max),
        utilization: ratio(report.busy_ns as f64, report.demand_ns as f64),
        preempt_us: Percentiles::of(&us(&report.preempt_latency_ns)),
        switch_us: Percentiles::of(&us(&report.switch_latency_ns)),
        steady_preempt: steady_max(report, &windows, None),
        windows,
        vms: figs,
    })
}

/// The figures of one GPU of a multi-GPU daemon: those of its VMs alone (Jain's index within
/// them, shares of that GPU's time, its utilization and latencies).
#[derive(Debug, Clone)]
pub struct GpuFigures {
    pub index: u32,
    pub device: u32,
    /// The experiment's VMs placed on it, by name.
    pub vms: Vec<String>,
    /// Fraction of all VMs' GPU time that this GPU's VMs got (their GPU time over everyone's).
    pub gpu_share: f64,
    pub figures: Figures,
}

/// Per-GPU figures (empty for a daemon of one GPU): the report restricted to each GPU's VMs,
/// windows and counters, through [`compute`].
pub fn per_gpu(
    report: &Report,
    vms: &[VmSpec],
    ramp_ns: u64,
) -> Result<Vec<GpuFigures>, BenchError> {
    if report.gpus.len() < 2 {
        return Ok(Vec::new());
    }
    let total: u64 = report.vms.iter().map(|v| v.gpu_ns).sum();
    let mut out = Vec::new();
    for g in &report.gpus {
        let mut sub = Report {
            vms: report
                .vms
                .iter()
                .filter(|v| v.gpu == g.index)
                .cloned()
                .collect(),
            busy_ns: g.busy_ns,
            demand_ns: g.demand_ns,
            preempt_latency_ns: g.preempt_latency_ns.clone(),
            switch_latency_ns: g.switch_latency_ns.clone(),
            grants: g.grants,
            switches: g.switches,
            preempts: g.preempts,
            gpus: Vec::new(),
            windows: Vec::new(),
            ..report.clone()
        };
        let ids: Vec<u32> = sub.vms.iter().map(|v| v.id).collect();
        sub.windows = report
            .windows
            .iter()
            .map(|w| vgpud::report::WindowReport {
                start_ns: w.start_ns,
                per_vm: w
                    .per_vm
                    .iter()
                    .filter(|(id, _)| ids.contains(id))
                    .copied()
                    .collect(),
            })
            .filter(|w| !w.per_vm.is_empty())
            .collect();
        let specs: Vec<VmSpec> = vms
            .iter()
            .filter(|s| {
                report
                    .vms
                    .iter()
                    .rev()
                    .find(|r| r.name == s.name)
                    .is_some_and(|r| r.gpu == g.index)
            })
            .cloned()
            .collect();
        let mine: u64 = sub.vms.iter().map(|v| v.gpu_ns).sum();
        let mut figures = compute(&sub, &specs, ramp_ns)?;
        // The daemon's list is for all GPUs: this GPU's entries of it, its bound.
        figures.steady_preempt = steady_max(report, &figures.windows, Some(g.index));
        out.push(GpuFigures {
            index: g.index,
            device: g.device,
            vms: specs.iter().map(|s| s.name.clone()).collect(),
            gpu_share: ratio(mine as f64, total as f64),
            figures,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpud::report::{VmReport, WindowReport};

    const MS: u64 = 1_000_000;

    fn spec(weights: &[u32]) -> Vec<VmSpec> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| VmSpec {
                name: format!("vm{i}"),
                weight: w,
            })
            .collect()
    }

    /// A report of `per_window[k][i]` ms for VM i (id 10 + i) in window k.
    fn report(per_window: &[Vec<u64>]) -> Report {
        let n = per_window[0].len();
        let mut r = Report {
            window_ns: 100 * MS,
            busy_ns: 90,
            demand_ns: 100,
            preempt_latency_ns: (1..=100).map(|x| x * 1000).collect(),
            switch_latency_ns: vec![5000, 7000],
            ..Report::default()
        };
        for i in 0..n {
            r.vms.push(VmReport {
                id: 10 + i as u32,
                name: format!("vm{i}"),
                gpu_ns: per_window.iter().map(|w| w[i] * MS).sum(),
                completed: 7,
                ..VmReport::default()
            });
        }
        for (k, w) in per_window.iter().enumerate() {
            r.windows.push(WindowReport {
                start_ns: (k as u64 + 3) * 100 * MS,
                per_vm: w
                    .iter()
                    .enumerate()
                    .filter(|(_, ms)| **ms > 0)
                    .map(|(i, ms)| (10 + i as u32, ms * MS))
                    .collect(),
            });
        }
        r
    }

    #[test]
    fn weighted_jain() {
        assert_eq!(jain(&[(1.0, 1.0), (1.0, 1.0)]), Some(1.0));
        assert_eq!(jain(&[(1.0, 1.0), (2.0, 2.0), (8.0, 8.0)]), Some(1.0));
        assert!((jain(&[(1.0, 1.0), (0.0, 1.0)]).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[(0.0, 1.0)]), None);
    }

    #[test]
    fn measured_windows_end_before_the_first_vm_finishes() {
        // VM 1 uses the GPU until window 3; VM 0 to window 6 (the last). Measured: from the
        // ramp (window 1) to window 2, the last one before VM 1's last window.
        let r = report(&[
            vec![90, 10],
            vec![50, 50],
            vec![50, 50],
            vec![90, 10],
            vec![100, 0],
            vec![100, 0],
            vec![100, 0],
        ]);
        let f = compute(&r, &spec(&[1, 1]), 100 * MS).unwrap();
        let measured: Vec<bool> = f.windows.iter().map(|w| w.measured).collect();
        assert_eq!(measured, [false, true, true, false, false, false, false]);
        assert_eq!(f.jain_windows, 2);
        assert_eq!(f.jain_min, Some(1.0));
        // A VM the daemon evicted does not end the measurement: every window but the ramp
        // and the last.
        let mut r = r;
        r.vms[1].evicted = true;
        let f = compute(&r, &spec(&[1, 1]), 100 * MS).unwrap();
        let measured: Vec<bool> = f.windows.iter().map(|w| w.measured).collect();
        assert_eq!(measured, [false, true, true, true, true, true, false]);
    }

    #[test]
    fn equal_shares_and_ramp() {
        // Window 0 (ramp) is uneven, windows 1..=3 even, window 4 is the last (excluded).
        let r = report(&[
            vec![90, 10],
            vec![50, 50],
            vec![50, 50],
            vec![50, 50],
            vec![60, 40],
        ]);
        let f = compute(&r, &spec(&[1, 1]), 100 * MS).unwrap();
        assert_eq!(f.windows.len(), 5);
        let measured: Vec<bool> = f.windows.iter().map(|w| w.measured).collect();
        assert_eq!(measured, [false, true, true, true, false]);
        assert_eq!(f.jain_windows, 3);
        assert_eq!(f.jain_min, Some(1.0));
        assert_eq!(f.share_error_max, 0.0);
        assert_eq!(f.vms[0].share, 0.5);
        assert_eq!(f.vms[0].target, 0.5);
        assert_eq!(f.vms[0].id, Some(10));
        assert_eq!(f.vms[1].gpu_ns, 200 * MS);
        assert!((f.utilization - 0.9).abs() < 1e-12);
        assert_eq!(f.preempt_us.p99, 99.0);
        assert_eq!(f.switch_us.p50, 5.0);
    }

    #[test]
    fn steady_state_preemption_max_leaves_the_ramp_out() {
        use vgpud::report::LatePreempt;
        // Windows start at 300 ms; window 0 is the ramp, window 4 the last: measured 400-700.
        let mut r = report(&vec![vec![50, 50]; 5]);
        let late = |late_ms: u64, due_ms: u64, gpu: u32| LatePreempt {
            late_ns: late_ms * MS,
            due_at_ns: due_ms * MS,
            gpu,
            ..LatePreempt::default()
        };
        r.worst_preemptions = vec![late(9, 350, 0), late(3, 650, 1), late(2, 450, 0)];
        let f = compute(&r, &spec(&[1, 1]), 100 * MS).unwrap();
        let exact = |max_us| {
            Some(SteadyMax {
                max_us,
                exact: true,
            })
        };
        assert_eq!(f.steady_preempt, exact(3000.0));
        assert_eq!(steady_max(&r, &f.windows, Some(0)), exact(2000.0));
        // Nothing due inside: 0 when the list holds every preemption, else the list's bound.
        r.worst_preemptions = vec![late(9, 350, 0)];
        assert_eq!(steady_max(&r, &f.windows, None), exact(0.0));
        r.worst_preemptions = (0..vgpud::report::WORST_KEPT as u64)
            .map(|k| late(5 + k, 320, 0))
            .collect();
        assert_eq!(
            steady_max(&r, &f.windows, None),
            Some(SteadyMax {
                max_us: 5000.0,
                exact: false
            })
        );
        // An older daemon (no due times): unknown.
        r.worst_preemptions[0].due_at_ns = 0;
        assert_eq!(steady_max(&r, &f.windows, None), None);
    }

    #[test]
    fn weights_errors_and_inactive_vms() {
        // VM 2 (weight 2) uses the GPU only from window 2 on: active from window 3.
        let r = report(&[
            vec![50, 50, 0],
            vec![50, 50, 0],
            vec![30, 30, 40],
            vec![20, 30, 50],
            vec![25, 25, 50],
            vec![25, 25, 50],
        ]);
        let f = compute(&r, &spec(&[1, 1, 2]), 0).unwrap();
        let w1 = &f.windows[1];
        assert_eq!(w1.active, [true, true, false]);
        assert_eq!(w1.jain, Some(1.0));
        let w3 = &f.windows[3];
        assert_eq!(w3.active, [true, true, true]);
        // x = 20, 30, 25: (75)^2 / (3 * (400 + 900 + 625)).
        assert!((w3.jain.unwrap() - 5625.0 / 5775.0).abs() < 1e-12);
        assert!((w3.max_error.unwrap() - 0.05).abs() < 1e-12);
        assert!(!f.windows[5].measured);
        // VM 2 is measured in windows 3 and 4: share 100 / 200, expected 0.5.
        assert_eq!(f.vms[2].measured_windows, 2);
        assert!((f.vms[2].share - 0.5).abs() < 1e-12);
        assert!((f.vms[2].target - 0.5).abs() < 1e-12);
        assert!((f.window_error_max - 0.05).abs() < 1e-12);
        // A VM absent from the report has no figures but does not break the rest.
        let mut s = spec(&[1, 1, 2]);
        s.push(VmSpec {
            name: "ghost".into(),
            weight: 1,
        });
        let f = compute(&r, &s, 0).unwrap();
        assert_eq!((f.vms[3].id, f.vms[3].gpu_ns), (None, 0));
        assert!(compute(&Report::default(), &s, 0).is_err());
    }

    #[test]
    fn each_gpu_is_measured_over_its_own_vms() {
        // VMs 0 and 1 on GPU 0 share it evenly; VMs 2 and 3 on GPU 1 share it 3:1.
        let mut r = report(&[
            vec![50, 50, 75, 25],
            vec![50, 50, 75, 25],
            vec![50, 50, 75, 25],
            vec![50, 50, 75, 25],
        ]);
        assert!(per_gpu(&r, &spec(&[1, 1, 1, 1]), 0).unwrap().is_empty());
        for (i, v) in r.vms.iter_mut().enumerate() {
            v.gpu = u32::from(i >= 2);
        }
        r.gpus = (0..2)
            .map(|g| vgpud::report::GpuReport {
                index: g,
                device: g + 4,
                busy_ns: 80,
                demand_ns: 100,
                ..Default::default()
            })
            .collect();
        let g = per_gpu(&r, &spec(&[1, 1, 1, 1]), 0).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].vms.clone(), g[1].device),
            (vec!["vm0".to_string(), "vm1".into()], 5)
        );
        assert_eq!(g[0].figures.jain_min, Some(1.0));
        assert_eq!(g[0].figures.vms.len(), 2);
        // 75 vs 25: (100)^2 / (2 * (75^2 + 25^2)) = 0.8.
        assert!((g[1].figures.jain_min.unwrap() - 0.8).abs() < 1e-12);
        assert!((g[0].gpu_share - 0.5).abs() < 1e-12);
        assert!((g[1].figures.utilization - 0.8).abs() < 1e-12);
    }
}
