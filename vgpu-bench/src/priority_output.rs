//! The files of `priority`: summary.json (per mode the figures, the targets' verdicts, the
//! commands), priority.csv (one row per mode), priority-latency.svg (the HP request latency
//! CDF per mode), and the one-line summary.

use std::path::Path;

use plotters::style::RGBColor;
use serde_json::json;

use crate::chart;
use crate::chart_cdf;
use crate::error::BenchError;
use crate::exp_priority::{Args, ModeRun, Plan};
use crate::fairness_calib::Calibration;
use crate::priority_metrics::{self, Figures, LATENCY_RATIO_MAX, LP_FILL_MIN, UTILIZATION_MIN};
use crate::report;

/// Everything a run produced.
pub struct Run<'a> {
    pub args: &'a Args,
    pub plan: &'a Plan,
    pub calibration: &'a Calibration,
    /// lcg_spin iterations of the HP and the LP kernels.
    pub iters: (u32, u32),
    pub modes: &'a [ModeRun],
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0, 0, 0),
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(110, 110, 110),
    RGBColor(204, 121, 167),
];

fn ratio(v: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| v / base)
}

pub fn write(dir: &Path, r: &Run) -> Result<String, BenchError> {
    let ramp_ns = (r.args.ramp_ms.max(0.0) * 1e6) as u64;
    let figs: Vec<Figures> = r
        .modes
        .iter()
        .map(|m| priority_metrics::compute(m, ramp_ns, r.plan, r.args.kernels))
        .collect();
    // Latency ratios: the VM modes against `alone`, the native ones against `native-alone`.
    let base_of = |native: bool| {
        r.modes
            .iter()
            .zip(&figs)
            .find(|(m, _)| m.mode.native == native && !m.mode.with_lp)
            .map(|(_, f)| f.lat_us)
            .unwrap_or(report::Percentiles::of(&[]))
    };
    let all_ok = figs.iter().all(|f| f.ok);
    let mut modes_json = Vec::new();
    let mut rows = Vec::new();
    for (m, f) in r.modes.iter().zip(&figs) {
        let base = base_of(m.mode.native);
        let (r50, r99) = (ratio(f.lat_us.p50, base.p50), ratio(f.lat_us.p99, base.p99));
        let targets = m.mode.with_lp.then(|| {
            json!({
                "hp_p50_within_1_10x": r50.map(|x| x <= LATENCY_RATIO_MAX),
                "hp_p99_within_1_10x": r99.map(|x| x <= LATENCY_RATIO_MAX),
                "lp_fill_at_least_90pct": f.lp_fill.map(|x| x >= LP_FILL_MIN),
                "utilization_at_least_95pct": f.utilization >= UTILIZATION_MIN,
            })
        });
        let guest_end = m.hp.end.map(|e| {
            json!({"t_ms": e.t_ms, "requests": e.requests, "p50_us": e.p50_us,
                   "p99_us": e.p99_us, "max_us": e.max_us})
        });
        modes_json.push(json!({
            "mode": m.mode.name,
            "sched": m.sched,
            "hp_priority": m.mode.hp_priority,
            "lp_vms": m.lp.len(),
            "ok": f.ok,
            "hp": {
                "requests": f.requests,
                "latency_samples": f.samples.len(),
                "latency_us": f.lat_us.json(),
                "p50_ratio_to_alone": r50,
                "p99_ratio_to_alone": r99,
                "ratio_base": if m.mode.native { "native-alone" } else { "alone" },
                "guest_histogram": guest_end,
                "exit_code": m.hp_exit,
                "mismatches": f.mismatches,
                "fault": m.hp.fault,
            },
            "lp": {
                "kernels_per_s": f.lp_kernels_per_s,
                "gpu_share": f.lp_share,
                "fill_of_hp_idle": f.lp_fill,
                "guests": m.lp.iter().map(|(g, code)| json!({
                    "done": g.done(), "ok": g.ok(), "exit_code": code,
                    "t_ms": g.end.map(|e| e.t_ms), "fault": g.fault,
                })).collect::<Vec<_>>(),
            },
            "gpu": {
                "share_source": f.share_source,
                "windows": f.windows,
                "window_ms": m.report.as_ref().map(|r| r.window_ns as f64 / 1e6),
                "hp_share": f.hp_share,
                "utilization": f.utilization,
                "switches": m.report.as_ref().map(|r| r.switches),
                "preempts": m.report.as_ref().map(|r| r.preempts),
                "evictions": m.report.as_ref().map(|r| r.evictions),
            },
            "targets": targets,
            "commands": m.commands,
        }));
        let o = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.4}"));
        rows.push(format!(
            "{},{},{},{},{:.0},{:.0},{},{},{:.2},{:.4},{:.4},{},{:.4},{}",
            m.mode.name,
            m.sched.replace(',', ";"),
            m.lp.len(),
            f.requests,
            f.lat_us.p50,
            f.lat_us.p99,
            o(r50),
            o(r99),
            f.lp_kernels_per_s,
            f.lp_share,
            f.hp_share,
            o(f.lp_fill),
            f.utilization,
            f.ok
        ));
    }
    let a = r.args;
    let summary = json!({
        "experiment": "priority",
        "backend": a.backend.name(),
        "short": a.short,
        "gpu_extra": a.gpu_extra,
        "lp_vms": r.plan.lp,
        "duration_s": r.plan.duration,
        "hp_kernel_us": r.plan.hp_kernel_us,
        "lp_kernel_us": r.plan.lp_kernel_us,
        "hp_kernels_per_request": a.kernels,
        "think_us": a.think_us,
        "lp_depth": a.depth,
        "threads": a.threads,
        "blocks": a.blocks,
        "ramp_ms": a.ramp_ms,
        "iters": {"hp": r.iters.0, "lp": r.iters.1},
        "calibration": r.calibration.json(),
        "targets": {
            "hp_latency_ratio_max": LATENCY_RATIO_MAX,
            "lp_fill_min": LP_FILL_MIN,
            "utilization_min": UTILIZATION_MIN,
        },
        "all_ok": all_ok,
        "modes": modes_json,
    });
    report::write(
        dir,
        &summary,
        "priority.csv",
        "mode,sched,lp_vms,hp_requests,hp_p50_us,hp_p99_us,p50_ratio,p99_ratio,lp_kernels_per_s,lp_share,hp_share,lp_fill,utilization,ok",
        &rows,
    )?;
    let ns: Vec<Vec<u64>> = figs
        .iter()
        .map(|f| f.samples.iter().map(|us| us * 1000).collect())
        .collect();
    let series: Vec<chart_cdf::Series> = r
        .modes
        .iter()
        .zip(&ns)
        .enumerate()
        .map(|(k, (m, v))| chart_cdf::Series {
            name: format!("{} ({} requests)", m.mode.name, v.len()),
            ns: v,
            color: COLORS[k % COLORS.len()],
        })
        .collect();
    let title = format!(
        "HP request latency: {} x {} µs kernels, {} µs think; {} LP VMs of {} µs kernels",
        a.kernels, r.plan.hp_kernel_us, a.think_us, r.plan.lp, r.plan.lp_kernel_us
    );
    chart_cdf::draw(
        &dir.join("priority-latency.svg"),
        &title,
        &series,
        "Latency: the HP guest's first launch of a request -> its last output checked (guest TSC)",
    )?;
    draw_shares(&dir.join("priority-gpu.svg"), r, &figs)?;
    let mut line = format!("priority: {} LP VMs {} s:", r.plan.lp, r.plan.duration);
    for (m, f) in r.modes.iter().zip(&figs) {
        line.push_str(&format!(
            " {} p50/p99 {:.0}/{:.0} µs util {:.1}% lp {:.1} k/s;",
            m.mode.name,
            f.lat_us.p50,
            f.lat_us.p99,
            100.0 * f.utilization,
            f.lp_kernels_per_s
        ));
    }
    line.push_str(if all_ok { " all ok" } else { " NOT all ok" });
    if !all_ok {
        return Err(BenchError::Invalid(format!(
            "{line} (see {})",
            dir.join("summary.json").display()
        )));
    }
    Ok(line)
}

/// priority-gpu.svg: per mode the HP and LP GPU shares, the utilization, and the LP share of the
/// time the HP side left idle (the fill), as fractions of the GPU.
fn draw_shares(path: &Path, r: &Run, figs: &[Figures]) -> Result<(), BenchError> {
    let bar = |v: f64| chart::Bar::with_range(v, &[]);
    let pick = |f: fn(&Figures) -> f64| chart::Series {
        config: String::new(),
        bars: figs.iter().map(|x| bar(f(x))).collect(),
    };
    let mut series = [
        pick(|f| f.hp_share),
        pick(|f| f.lp_share),
        pick(|f| f.utilization),
        pick(|f| f.lp_fill.unwrap_or(0.0)),
    ];
    for (s, name) in series.iter_mut().zip([
        "HP GPU share",
        "LP GPU share",
        "utilization",
        "LP fill of HP idle time",
    ]) {
        s.config = name.into();
    }
    let chart = chart::BarChart {
        title: format!(
            "GPU use per mode: {} LP of {} µs kernels beside HP requests of {} x {} µs",
            r.plan.lp, r.plan.lp_kernel_us, r.args.kernels, r.plan.hp_kernel_us
        ),
        note: "Fractions of GPU time while the HP side ran: vgpud's accounting for the VM modes, \
               kernels x calibrated length for the native ones; line: the whole GPU"
            .into(),
        y_desc: "fraction of GPU time".into(),
        groups: r.modes.iter().map(|m| m.mode.name.to_string()).collect(),
        dividers: r
            .modes
            .iter()
            .position(|m| m.mode.native)
            .into_iter()
            .collect(),
        reference: 1.0,
        series: series.iter().collect(),
    };
    chart::draw(path, &chart)
}
