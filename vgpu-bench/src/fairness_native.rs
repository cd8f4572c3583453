//! `fairness --baseline native` (cuda): the same load as the VMs, run afterwards as plain CUDA
//! processes (`native-load --role lp`, one per VM, same kernel length, depth, threads and
//! blocks) sharing the GPU under the driver's own time-slicing, so that every fairness figure
//! has its native anchor from the same run. The driver knows no weights: the processes' shares
//! are compared with equal shares (weights are reported, not applied).
//!
//! No daemon accounts for plain processes, so GPU time is the work done: kernels completed ×
//! the calibrated kernel length, per 100 ms window on a common time base (every process starts
//! at one agreed wall-clock instant; each process's progress lines are interpolated at the
//! window edges). Jain's index per window over the processes, its min and mean; utilization =
//! the GPU time of all processes / the measured time.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::error::BenchError;
use crate::exp_fairness::{Args, Plan};
use crate::fairness_guest::{self, GuestRun};
use crate::fairness_metrics::jain;
use crate::procs::Proc;

/// Period of the processes' progress lines and of the windows, ms.
const WINDOW_MS: u64 = 100;
/// Time every process gets to create its CUDA context before the common start.
const CONTEXT_SETUP: Duration = Duration::from_secs(3);

/// What the native processes did.
#[derive(Debug, Clone)]
pub struct Native {
    pub runs: Vec<(GuestRun, Option<i32>)>,
    pub commands: Vec<String>,
    pub figures: Figures,
}

/// The native figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Windows measured (after the ramp, before the first process ended).
    pub windows: usize,
    pub jain_min: Option<f64>,
    pub jain_mean: Option<f64>,
    /// Each process's GPU time over all processes' in the measured windows.
    pub shares: Vec<f64>,
    /// GPU time of all processes / measured time.
    pub utilization: f64,
    pub ok: bool,
}

/// Kernels `g` had completed at `t` ms (linear between its progress points; all of them when
/// its run ended before `t`).
pub fn done_at(g: &GuestRun, t: f64) -> f64 {
    let mut pts: Vec<(f64, f64)> = vec![(0.0, 0.0)];
    pts.extend(g.progress.iter().map(|&(t, d)| (t as f64, d as f64)));
    if let Some(e) = g.end {
        pts.push((e.t_ms as f64, e.done as f64));
    }
    match pts.iter().position(|&(pt, _)| pt >= t) {
        Some(0) => 0.0,
        Some(i) => {
            let ((t0, d0), (t1, d1)) = (pts[i - 1], pts[i]);
            if t1 > t0 {
                d0 + (d1 - d0) * (t - t0) / (t1 - t0)
            } else {
                d1
            }
        }
        None => pts.last().map_or(0.0, |p| p.1),
    }
}

/// The figures of processes `runs` running kernels of `kernel_us` each, windows of
/// `WINDOW_MS` from `ramp_ms` to the earliest end.
pub fn compute(runs: &[(GuestRun, Option<i32>)], kernel_us: &[f64], ramp_ms: f64) -> Figures {
    let end = runs
        .iter()
        .map(|(g, _)| g.end.map_or(0.0, |e| e.t_ms as f64))
        .fold(f64::INFINITY, f64::min);
    let w = WINDOW_MS as f64;
    let first = (ramp_ms / w).ceil();
    let windows = if end.is_finite() && end > first * w {
        ((end - first * w) / w).floor() as usize
    } else {
        0
    };
    let mut jains = Vec::new();
    let mut gpu = vec![0.0; runs.len()];
    for k in 0..windows {
        let (t0, t1) = ((first + k as f64) * w, (first + k as f64 + 1.0) * w);
        let pairs: Vec<(f64, f64)> = runs
            .iter()
            .zip(kernel_us)
            .map(|((g, _), us)| ((done_at(g, t1) - done_at(g, t0)) * us, 1.0))
            .collect();
        for (acc, (g, _)) in gpu.iter_mut().zip(&pairs) {
            *acc += g;
        }
        if let Some(j) = jain(&pairs) {
            jains.push(j);
        }
    }
    let total: f64 = gpu.iter().sum();
    let measured_us = windows as f64 * w * 1e3;
    Figures {
        windows,
        jain_min: jains.iter().copied().reduce(f64::min),
        jain_mean: (!jains.is_empty()).then(|| jains.iter().sum::<f64>() / jains.len() as f64),
        shares: gpu
            .iter()
            .map(|g| if total > 0.0 { g / total } else { 0.0 })
            .collect(),
        utilization: if measured_us > 0.0 {
            total / measured_us
        } else {
            0.0
        },
        ok: !runs.is_empty() && runs.iter().all(|(g, c)| g.ok() && *c == Some(0)),
    }
}

/// Runs the native processes of `plan` with `bench` (this binary) in `dir`/native.
pub fn run(
    a: &Args,
    plan: &Plan,
    bench: &Path,
    iters: &[u32],
    dir: &Path,
) -> Result<Native, BenchError> {
    let dir = dir.join("native");
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let start_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        + CONTEXT_SETUP.as_millis() as u64;
    let ms = (plan.duration * 1e3).round().max(1.0) as u64;
    let mut procs = Vec::with_capacity(iters.len());
    for (k, it) in iters.iter().enumerate() {
        let args: Vec<String> = vec![
            "native-load".into(),
            "--role".into(),
            "lp".into(),
            "--iters".into(),
            it.to_string(),
            "--threads".into(),
            a.threads.to_string(),
            "--blocks".into(),
            a.blocks.to_string(),
            "--depth".into(),
            a.depth.to_string(),
            "--ms".into(),
            ms.to_string(),
            "--report-ms".into(),
            WINDOW_MS.to_string(),
            "--start-at".into(),
            start_at.to_string(),
        ];
        procs.push(Proc::spawn(&dir, &format!("p{k}"), bench, &args)?);
    }
    let deadline = Instant::now()
        + CONTEXT_SETUP
        + Duration::from_millis(ms)
        + Duration::from_secs_f64(10.0 + 0.5 * iters.len() as f64);
    while Instant::now() < deadline && !procs.iter_mut().all(|p| p.poll()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in &mut procs {
        p.stop(libc::SIGTERM, Duration::from_secs(2));
    }
    let runs: Vec<(GuestRun, Option<i32>)> = procs
        .iter()
        .map(|p| {
            let out = std::fs::read_to_string(&p.out).unwrap_or_default();
            (fairness_guest::parse(&out), p.code())
        })
        .collect();
    if !runs.iter().any(|(g, _)| g.started) {
        return Err(BenchError::Invalid(format!(
            "--baseline native: no native process started ({}): {}",
            procs[0].status.map_or("running".into(), |s| s.to_string()),
            procs[0].stderr_head()
        )));
    }
    let figures = compute(&runs, &plan.kernel_us, a.ramp_ms.max(0.0));
    Ok(Native {
        runs,
        commands: procs.iter().map(|p| p.command.clone()).collect(),
        figures,
    })
}

impl Native {
    /// The `native` section of summary.json.
    pub fn json(&self, weights: &[u32]) -> serde_json::Value {
        let f = &self.figures;
        json!({
            "definitions": "plain CUDA processes (vgpu-bench native-load), one per VM, same kernels, started together, sharing the GPU under the driver's time-slicing; weights are not applied (the driver has none); GPU time = kernels completed x calibrated kernel length per 100 ms window (progress lines interpolated), windows from ramp_ms to the first process's end; jain over equal weights per window; utilization = GPU time / measured time",
            "windows": f.windows,
            "jain": {"min": f.jain_min, "mean": f.jain_mean},
            "utilization": f.utilization,
            "all_ok": f.ok,
            "processes": self.runs.iter().zip(&f.shares).enumerate().map(|(k, ((g, code), share))| json!({
                "name": format!("p{k}"),
                "weight_not_applied": weights.get(k),
                "share": share,
                "kernels_completed": g.done(),
                "t_ms": g.end.map(|e| e.t_ms),
                "ok": g.ok(),
                "fault": g.fault,
                "exit_code": code,
            })).collect::<Vec<_>>(),
            "commands": self.commands,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(text: &str) -> (GuestRun, Option<i32>) {
        (fairness_guest::parse(text), Some(0))
    }

    #[test]
    fn windows_jain_and_utilization_from_progress_lines() {
        // Two processes of 1000 µs kernels: p0 does 50 kernels per 100 ms (50%), p1 25 (25%):
        // Jain of (50, 25) = 75^2 / (2 * (2500 + 625)) = 0.9; utilization 75%.
        let mut a = String::from("FAIRNESS start\n");
        let mut b = String::from("FAIRNESS start\n");
        for k in 1..=10u64 {
            a.push_str(&format!("FAIRNESS t_ms={} done={}\n", k * 100, k * 50));
            b.push_str(&format!(
                "FAIRNESS t_ms={} done={}\n",
                k * 100 + 50,
                k * 25 + 12
            ));
        }
        a.push_str("FAIRNESS end t_ms=1000 done=500 ok=1\n");
        b.push_str("FAIRNESS end t_ms=1050 done=262 ok=1\n");
        let runs = [lp(&a), lp(&b)];
        let f = compute(&runs, &[1000.0, 1000.0], 200.0);
        // Windows 200..300 .. 900..1000: 8.
        assert_eq!(f.windows, 8);
        assert!((f.jain_min.unwrap() - 0.9).abs() < 1e-9, "{f:?}");
        assert!((f.jain_mean.unwrap() - 0.9).abs() < 1e-9);
        assert!((f.utilization - 0.75).abs() < 1e-9, "{}", f.utilization);
        assert!((f.shares[0] - 2.0 / 3.0).abs() < 1e-9);
        assert!(f.ok);
        let mut bad = runs.to_vec();
        bad[1].1 = Some(13);
        assert!(!compute(&bad, &[1000.0, 1000.0], 200.0).ok);
        assert_eq!(compute(&[], &[], 0.0).windows, 0);
    }
}
