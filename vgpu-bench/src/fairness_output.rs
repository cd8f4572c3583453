//! The files of a fairness run: `summary.json` (configuration, calibration, per-VM figures,
//! Jain's index, share errors, utilization, latencies), `fairness.csv` (GPU ms per VM per
//! window), `fairness-shares.svg`, `fairness-targets.svg` and `fairness-latency.svg` (the
//! charts of `fairness_chart`); and the one-line summary.

use std::path::Path;

use crate::error::BenchError;
use crate::exp_fairness::{Args, Plan};
use crate::fairness_calib::Calibration;
use crate::fairness_guest::GuestRun;
use crate::fairness_metrics::{Figures, GpuFigures, SteadyMax};
use crate::fairness_native::Native;
use crate::fairness_window::SliceWindow;
use crate::{fairness_chart, report};

/// One VM as run.
pub struct VmRun {
    pub name: String,
    pub weight: u32,
    pub kernel_us: f64,
    pub iters: u32,
    pub guest: GuestRun,
    pub exit_code: Option<i32>,
    pub command: String,
}

/// Everything the files are made of.
pub struct Run<'a> {
    pub policy: &'a str,
    pub plan: &'a Plan,
    pub args: &'a Args,
    pub calibration: &'a Calibration,
    pub daemon_command: &'a str,
    pub report: &'a vgpud::Report,
    pub vms: &'a [VmRun],
    pub figures: &'a Figures,
    /// The figures over windows holding `rounds` turns of every VM, and how that window was
    /// chosen (`fairness_window`).
    pub slices: (&'a SliceWindow, &'a Figures),
    /// Per GPU (`--gpus` 2 or more; empty otherwise).
    pub gpus: &'a [GpuFigures],
    /// `--baseline native`.
    pub native: Option<&'a Native>,
}

fn opt(v: Option<f64>) -> serde_json::Value {
    v.map_or(serde_json::Value::Null, serde_json::Value::from)
}

/// Writes the files; returns the summary line.
pub fn write(dir: &Path, r: &Run) -> Result<String, BenchError> {
    let f = r.figures;
    let (sw, sf) = r.slices;
    let mut vms = Vec::new();
    let mut kernels = 0;
    for (v, fig) in r.vms.iter().zip(&f.vms) {
        let g = &v.guest;
        let secs = g.end.map(|e| e.t_ms as f64 / 1e3);
        kernels += g.done();
        vms.push(serde_json::json!({
            "name": v.name,
            "vgpud_id": fig.id,
            "weight": v.weight,
            "kernel_us": v.kernel_us,
            "iters": v.iters,
            "kernel_us_model": r.calibration.us_at(v.iters),
            "kernel_us_measured": (fig.jobs_completed > 0)
                .then(|| fig.gpu_ns as f64 / fig.jobs_completed as f64 / 1e3),
            "gpu_ms": fig.gpu_ns as f64 / 1e6,
            "share": fig.share,
            "share_run": fig.share_run,
            "target_share": fig.target,
            "expected_share": fig.expected,
            "share_error": fig.error,
            "measured_windows": fig.measured_windows,
            "kernels_completed": g.done(),
            "kernels_per_s": secs.filter(|s| *s > 0.0).map(|s| g.done() as f64 / s),
            "guest_ms": g.end.map(|e| e.t_ms),
            "ok": g.ok(),
            "fault": g.fault,
            "exit_code": v.exit_code,
            "jobs_completed": fig.jobs_completed,
            "preempted": fig.preempted,
            "grants": fig.grants,
            "evicted": fig.evicted,
            "command": v.command,
        }));
    }
    let all_ok = r.vms.iter().all(|v| v.guest.ok() && v.exit_code == Some(0));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    // Other work on the host competes with the daemon and the VMs for the CPUs: record how much.
    let load: Option<f64> = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok());
    let summary = serde_json::json!({
        "experiment": "fairness",
        "backend": r.args.backend.name(),
        "policy": r.policy,
        "sched": r.plan.sched,
        "n": r.plan.vms,
        "weights": r.plan.weights,
        "kernel_us": r.plan.kernel_us,
        "config": {
            "duration_s": r.plan.duration,
            "depth": r.args.depth,
            "threads": r.args.threads,
            "blocks": r.args.blocks,
            "vram_per_vm": r.plan.vram_per_vm,
            "ramp_ms": r.args.ramp_ms,
            "window_ms": f.window_ns as f64 / 1e6,
            "short": r.args.short,
            "gpu_extra": r.args.gpu_extra,
            "daemon_cpus": r.args.daemon_cpus.as_ref().map(|c| c.0.clone()),
            "gpu_cpus": r.args.gpu_cpus.as_ref().map(|c| c.0.clone()),
            "host_cpus": cpus,
            "host_load_1min_at_end": load,
        },
        "definitions": "windows of the daemon's accounting; a VM is active in a window when it used the GPU in an earlier and a later one; measured windows start ramp_ms after the first GPU use, exclude the last, and end before the first VM's last window with GPU use (every VM competes in each; as the native anchor's end at the first process's end); preempt_steady_max_us = the longest preemption due inside the measured windows; jain = weighted Jain's index (x = gpu/weight) over the active VMs of a measured window with 2 or more (daemon windows); jain_slices = the same over windows of whole daemon windows holding jain_slices.rounds turns of every VM (its rule); share = a VM's GPU time over that of the VMs active beside it in its measured windows, expected_share the mean weight share there, share_error = |share - expected_share|; share_run = of the whole run; target_share = weight / sum of weights; utilization = busy_ns / demand_ns of the daemon; idle_while_wanted = demand - busy, with the switches' part (one VM's run ended → the next VM's started, summed) and the part between two jobs of one grant (one job's end → the next's start), each also as a fraction of demand",
        "calibration": r.calibration.json(),
        "commands": {
            "vgpud": r.daemon_command,
            "vms": r.vms.iter().map(|v| v.command.clone()).collect::<Vec<_>>(),
        },
        "vms": vms,
        "all_ok": all_ok,
        "kernels_completed": kernels,
        "jain": {
            "min": opt(f.jain_min),
            "mean": opt(f.jain_mean),
            "windows": f.jain_windows,
        },
        "jain_slices": {
            "window_ms": sw.window_ns as f64 / 1e6,
            "daemon_windows": sw.daemon_windows,
            "rounds": sw.rounds,
            "turn_ms": sw.turn_ns as f64 / 1e6,
            "turn_from": sw.turn_from,
            "rule": sw.rule(),
            "quantization_floor": sw.quantization_floor(),
            "min": opt(sf.jain_min),
            "mean": opt(sf.jain_mean),
            "windows": sf.jain_windows,
            "window_share_error_max": sf.window_error_max,
        },
        "share_error_max": f.share_error_max,
        "window_share_error_max": f.window_error_max,
        "utilization": f.utilization,
        "busy_ms": r.report.busy_ns as f64 / 1e6,
        "demand_ms": r.report.demand_ns as f64 / 1e6,
        "idle_while_wanted": idle_split(r.report),
        "preempt_latency_us": f.preempt_us.json(),
        "preempt_latency_samples": r.report.preempt_latency_ns.len(),
        "preempt_steady_max_us": steady_json(f.steady_preempt),
        "switch_latency_us": f.switch_us.json(),
        "switch_latency_samples": r.report.switch_latency_ns.len(),
        "grants": r.report.grants,
        "switches": r.report.switches,
        "preempts": r.report.preempts,
        "evictions": r.report.evictions,
        "refused": r.report.refused,
        "vgpud_vms": r.report.vms.len(),
        "native": r.native.map(|n| n.json(&r.plan.weights)),
        "gpus": r.gpus.iter().map(gpu_json).collect::<Vec<_>>(),
    });
    let names: Vec<String> = r.vms.iter().map(|v| v.name.clone()).collect();
    let header = format!(
        "window_start_ms,measured,jain,{}",
        names
            .iter()
            .map(|n| format!("{n}_gpu_ms"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let rows: Vec<String> = f
        .windows
        .iter()
        .map(|w| {
            let mut row = format!(
                "{:.0},{},{}",
                w.start_ns as f64 / 1e6,
                u8::from(w.measured),
                w.jain.map_or(String::new(), |j| format!("{j:.5}"))
            );
            for g in &w.gpu_ns {
                row.push_str(&format!(",{:.3}", *g as f64 / 1e6));
            }
            row
        })
        .collect();
    report::write(dir, &summary, "fairness.csv", &header, &rows)?;
    let list = |v: Vec<String>| v.join(",");
    let title = format!(
        "{}: {} VMs, weights {}, kernels {} µs",
        r.plan.sched,
        r.plan.vms,
        list(r.plan.weights.iter().map(u32::to_string).collect()),
        list(r.plan.kernel_us.iter().map(f64::to_string).collect())
    );
    fairness_chart::shares_over_time(
        &dir.join("fairness-shares.svg"),
        &title,
        &names,
        f,
        r.args.ramp_ms.max(0.0),
    )?;
    fairness_chart::share_vs_target(&dir.join("fairness-targets.svg"), &title, &names, f)?;
    fairness_chart::latency_cdf(
        &dir.join("fairness-latency.svg"),
        &title,
        &r.report.preempt_latency_ns,
        &r.report.switch_latency_ns,
    )?;
    let fmt = |v: Option<f64>| v.map_or("-".into(), |j| format!("{j:.4}"));
    let native = r.native.map_or(String::new(), |n| {
        format!(
            "; native processes: jain min {} mean {}, utilization {:.1}%{}",
            fmt(n.figures.jain_min),
            fmt(n.figures.jain_mean),
            100.0 * n.figures.utilization,
            if n.figures.ok { "" } else { ", NOT all ok" }
        )
    });
    let all_ok = all_ok && r.native.is_none_or(|n| n.figures.ok);
    let per_gpu: String = r
        .gpus
        .iter()
        .map(|g| {
            format!(
                "; gpu {} ({} VMs, {:.1}% of the GPU time): jain min {} mean {} ({} windows), share error max {:.2}%, utilization {:.1}%, preempt p99 {:.0} µs",
                g.index,
                g.vms.len(),
                100.0 * g.gpu_share,
                fmt(g.figures.jain_min),
                fmt(g.figures.jain_mean),
                g.figures.jain_windows,
                100.0 * g.figures.share_error_max,
                100.0 * g.figures.utilization,
                g.figures.preempt_us.p99,
            )
        })
        .collect();
    Ok(format!(
        "fairness: {} {} VMs {} s: jain min {} mean {} ({} windows of {:.0} ms; over {:.0} ms windows holding {} turns of every VM: min {} mean {}), share error max {:.2}%, utilization {:.1}%, preempt p50/p99/max {:.0}/{:.0}/{:.0} µs (steady state max {}), switch p50/p99 {:.0}/{:.0} µs, {} switches, {} evictions, {kernels} kernels, {}",
        r.plan.sched,
        r.plan.vms,
        r.plan.duration,
        fmt(f.jain_min),
        fmt(f.jain_mean),
        f.jain_windows,
        f.window_ns as f64 / 1e6,
        sw.window_ns as f64 / 1e6,
        sw.rounds,
        fmt(sf.jain_min),
        fmt(sf.jain_mean),
        100.0 * f.share_error_max,
        100.0 * f.utilization,
        f.preempt_us.p50,
        f.preempt_us.p99,
        f.preempt_us.max,
        steady_text(f.steady_preempt),
        f.switch_us.p50,
        f.switch_us.p99,
        r.report.switches,
        r.report.evictions,
        if all_ok { "all ok" } else { "NOT all ok" },
    ) + &per_gpu
        + &native)
}

/// [`SteadyMax`] in summary.json: `{max_us, exact}` (`exact` false: an upper bound), or null.
fn steady_json(s: Option<SteadyMax>) -> serde_json::Value {
    s.map_or(
        serde_json::Value::Null,
        |s| serde_json::json!({ "max_us": s.max_us, "exact": s.exact }),
    )
}

/// [`SteadyMax`] in the summary line: `N µs`, `≤ N µs` (a bound) or `unknown`.
fn steady_text(s: Option<SteadyMax>) -> String {
    match s {
        Some(s) if s.exact => format!("{:.0} µs", s.max_us),
        Some(s) => format!("≤ {:.0} µs", s.max_us),
        None => "unknown".into(),
    }
}

/// One GPU's figures in summary.json.
fn gpu_json(g: &GpuFigures) -> serde_json::Value {
    let f = &g.figures;
    serde_json::json!({
        "index": g.index,
        "device": g.device,
        "vms": g.vms,
        "gpu_share": g.gpu_share,
        "jain": {
            "min": opt(f.jain_min),
            "mean": opt(f.jain_mean),
            "windows": f.jain_windows,
        },
        "share_error_max": f.share_error_max,
        "window_share_error_max": f.window_error_max,
        "utilization": f.utilization,
        "preempt_latency_us": f.preempt_us.json(),
        "preempt_steady_max_us": steady_json(f.steady_preempt),
        "switch_latency_us": f.switch_us.json(),
        "vm_shares": g.vms.iter().zip(&f.vms).map(|(n, v)| serde_json::json!({
            "name": n, "share": v.share, "expected_share": v.expected, "gpu_ms": v.gpu_ns as f64 / 1e6,
        })).collect::<Vec<_>>(),
    })
}

/// `demand - busy` of the daemon's report, and the parts the switches between VMs and the
/// gaps between two jobs of one grant make of it (ms, and as fractions of `demand`).
fn idle_split(report: &vgpud::Report) -> serde_json::Value {
    let demand = report.demand_ns as f64;
    let idle = report.demand_ns.saturating_sub(report.busy_ns) as f64;
    let switches: u64 = report.switch_latency_ns.iter().sum();
    let part = |ns: f64| if demand > 0.0 { ns / demand } else { 0.0 };
    serde_json::json!({
        "ms": idle / 1e6,
        "fraction": part(idle),
        "switches_ms": switches as f64 / 1e6,
        "switches_fraction": part(switches as f64),
        "between_jobs_ms": report.job_gap_ns as f64 / 1e6,
        "between_jobs_fraction": part(report.job_gap_ns as f64),
        "between_jobs": report.job_gaps,
    })
}
