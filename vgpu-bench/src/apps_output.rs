//! Output of `vgpu-bench apps`: summary.json (per program and configuration the medians of
//! every figure, with min and max, and the ratios to native), apps.csv (every run), two SVG
//! charts (whole run and GPU-side time relative to native), and the one-line summary; under
//! `--preempt`, per program the method the engine used and, per method, the overhead against
//! the configuration without it (`apps_preempt`).

use std::path::Path;

use crate::apps_exec::Sample;
use crate::apps_preempt;
use crate::backend::Backend;
use crate::chart::{self, Bar, BarChart, Series};
use crate::error::BenchError;
use crate::exp_apps::Cell;
use crate::overhead_output::geomean;
use crate::report::{self, median};

fn stat(v: &[f64]) -> serde_json::Value {
    let m = median(v);
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    serde_json::json!({ "median": m, "min": if lo.is_finite() { lo } else { 0.0 },
                        "max": if hi.is_finite() { hi } else { 0.0 } })
}

/// GPU-side time of a run, measured the same way in every configuration: the program's own
/// event-timed GPU section (`gpu_ms=`; NVIDIA's library reports no phases, so the library's
/// copies + kernels, `lib_gpu_side_ms`, are reported beside it but not compared with native).
pub fn gpu_side(s: &Sample) -> f64 {
    s.app_gpu_ms
}

fn pick(samples: &[Sample], f: impl Fn(&Sample) -> Option<f64>) -> Vec<f64> {
    samples.iter().filter(|s| s.pass).filter_map(f).collect()
}

fn cell_json(c: &Cell, native: Option<&Cell>) -> serde_json::Value {
    let total = pick(&c.samples, |s| Some(s.total_ms));
    let gpu = pick(&c.samples, |s| Some(gpu_side(s)));
    let ph = |f: fn(&crate::apps_exec::Phases) -> f64| {
        stat(&pick(&c.samples, |s| s.phases.as_ref().map(f)))
    };
    let mut j = serde_json::json!({
        "program": c.program, "config": c.config,
        "runs": c.samples.len(), "passed": c.samples.iter().filter(|s| s.pass).count(),
        "total_ms": stat(&total), "gpu_side_ms": stat(&gpu),
        "lib_gpu_side_ms": stat(&pick(&c.samples, |s| s.phases.map(|p| p.gpu_side()))),
        "phases_ms": {
            "init": ph(|p| p.init), "copies_in": ph(|p| p.copies_in), "kernels": ph(|p| p.kernels),
            "copies_out": ph(|p| p.copies_out), "close": ph(|p| p.close),
        },
        "launch_overhead_us": ph(|p| p.launch_overhead_us),
        "boot_ms": stat(&pick(&c.samples, |s| s.boot_ms)),
        "guest_prog_ms": stat(&pick(&c.samples, |s| s.guest_prog_ms)),
        "errors": c.samples.iter().filter(|s| !s.pass).map(|s| s.error.clone()).collect::<Vec<_>>(),
    });
    if let Some(u) = c.samples.iter().rev().find_map(|s| s.preempt.as_ref()) {
        j["preempt"] = u.json();
    }
    if let Some(n) = native {
        let nt = median(&pick(&n.samples, |s| Some(s.total_ms)));
        let ng = median(&pick(&n.samples, |s| Some(gpu_side(s))));
        let r = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
        j["vs_native"] = serde_json::json!({
            "total": r(median(&total), nt),
            "gpu_side": r(median(&gpu), ng),
        });
    }
    j
}

fn row(c: &Cell, rep: usize, s: &Sample) -> String {
    let p = s.phases.unwrap_or_default();
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    format!(
        "{},{},{rep},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},\"{}\"",
        c.program,
        c.config,
        u8::from(s.pass),
        s.total_ms,
        gpu_side(s),
        p.gpu_side(),
        p.init,
        p.copies_in,
        p.kernels,
        p.copies_out,
        p.close,
        p.launch_overhead_us,
        p.launches,
        opt(s.boot_ms),
        opt(s.guest_prog_ms),
        s.preempt
            .as_ref()
            .map(|u| u.describe().replace(',', ";"))
            .unwrap_or_default(),
        s.error.replace('"', "'")
    )
}

const HEADER: &str = "program,config,rep,pass,total_ms,gpu_side_ms,lib_gpu_side_ms,init_ms,\
copies_in_ms,kernels_ms,copies_out_ms,close_ms,launch_overhead_us,launches,boot_ms,\
guest_prog_ms,preempt_used,error";

fn chart(
    out: &Path,
    file: &str,
    what: &str,
    configs: &[String],
    programs: &[String],
    cells: &[Cell],
    f: fn(&Sample) -> f64,
) -> Result<Vec<(String, f64)>, BenchError> {
    let find = |p: &str, c: &str| cells.iter().find(|x| x.program == p && x.config == c);
    let mut series = Vec::new();
    let mut geo = Vec::new();
    for c in configs.iter().filter(|c| *c != "native") {
        let mut bars = Vec::new();
        let mut ratios = Vec::new();
        for p in programs {
            let (Some(cell), Some(nat)) = (find(p, c), find(p, "native")) else {
                bars.push(Bar::with_range(0.0, &[]));
                continue;
            };
            let n = median(&pick(&nat.samples, |s| Some(f(s))));
            let v = pick(&cell.samples, |s| Some(f(s)));
            let rel: Vec<f64> = v
                .iter()
                .map(|x| if n > 0.0 { x / n } else { 0.0 })
                .collect();
            let m = median(&rel);
            ratios.push(m);
            bars.push(Bar::with_range(m, &rel));
        }
        let g = geomean(&ratios);
        geo.push((c.clone(), g));
        bars.push(Bar::with_range(g, &[]));
        series.push(Series {
            config: c.clone(),
            bars,
        });
    }
    if series.is_empty() {
        return Ok(geo);
    }
    let mut groups = programs.to_vec();
    groups.push("geomean".into());
    chart::draw(
        &out.join(file),
        &BarChart {
            title: format!("CUDA application suite: {what} relative to native"),
            note: "bars: median over the repetitions; whiskers: min and max; 1.0 = native".into(),
            y_desc: format!("{what} / native"),
            dividers: vec![programs.len()],
            groups,
            reference: 1.0,
            series: series.iter().collect(),
        },
    )?;
    Ok(geo)
}

/// Writes everything and returns the one-line summary. `forced`: the variants' launches were
/// preempted on purpose (`--preempt-test`), so their times are not the never-preempted cost.
pub fn write(
    out: &Path,
    backend: Backend,
    size: &str,
    configs: &[String],
    cells: &[Cell],
    forced: bool,
) -> Result<String, BenchError> {
    let mut programs: Vec<String> = Vec::new();
    for c in cells {
        if !programs.contains(&c.program) {
            programs.push(c.program.clone());
        }
    }
    let native = |p: &str| {
        cells
            .iter()
            .find(|c| c.program == p && c.config == "native")
    };
    let rows: Vec<String> = cells
        .iter()
        .flat_map(|c| c.samples.iter().enumerate().map(move |(i, s)| row(c, i, s)))
        .collect();
    let per: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| cell_json(c, native(&c.program).filter(|_| c.config != "native")))
        .collect();
    let total = chart(
        out,
        "apps-total.svg",
        "whole run",
        configs,
        &programs,
        cells,
        |s| s.total_ms,
    )?;
    let gpu = chart(
        out,
        "apps-gpu.svg",
        "GPU-side time",
        configs,
        &programs,
        cells,
        gpu_side,
    )?;
    let passed = cells
        .iter()
        .flat_map(|c| &c.samples)
        .filter(|s| s.pass)
        .count();
    let runs = cells.iter().map(|c| c.samples.len()).sum::<usize>();
    let over = apps_preempt::overheads(configs, cells);
    let mut summary = serde_json::json!({
        "experiment": "apps", "backend": backend.name(), "size": size, "configs": configs,
        "programs": programs, "runs": runs, "passed": passed,
        "geomean_vs_native": {
            "total": total.iter().map(|(c, g)| (c.clone(), serde_json::json!(g))).collect::<serde_json::Map<_, _>>(),
            "gpu_side": gpu.iter().map(|(c, g)| (c.clone(), serde_json::json!(g))).collect::<serde_json::Map<_, _>>(),
        },
        "cells": per,
    });
    if !over.is_empty() {
        summary["preempt_overhead"] = apps_preempt::overheads_json(&over);
        summary["preempt_forced"] = forced.into();
    }
    report::write(out, &summary, "apps.csv", HEADER, &rows)?;
    let g: Vec<String> = gpu
        .iter()
        .zip(&total)
        .map(|((c, g), (_, t))| format!("{c} gpu-side {g:.2}x total {t:.2}x"))
        .collect();
    let mut line = format!(
        "apps ({} {size}): {passed}/{runs} runs passed, {} programs; geomean vs native: {}",
        backend.name(),
        programs.len(),
        if g.is_empty() {
            "-".into()
        } else {
            g.join(", ")
        }
    );
    if !over.is_empty() {
        line.push_str(&format!(
            "; {} geomean vs the same configuration without the method: {}",
            if forced {
                "preempted (--preempt-test)"
            } else {
                "never-preempted"
            },
            apps_preempt::line(&over)
        ));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(total: f64, gpu: f64) -> Sample {
        Sample {
            pass: true,
            total_ms: total,
            app_gpu_ms: gpu,
            ..Sample::default()
        }
    }

    #[test]
    fn ratios_to_native_in_the_summary_and_csv() {
        let dir = std::env::temp_dir().join(format!("vgpu-bench-apps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cells = vec![
            Cell {
                program: "matmul".into(),
                config: "native".into(),
                samples: vec![s(100.0, 10.0), s(110.0, 10.0), s(90.0, 10.0)],
            },
            Cell {
                program: "matmul".into(),
                config: "full".into(),
                samples: vec![s(200.0, 11.0), s(220.0, 12.0), s(180.0, 11.0)],
            },
        ];
        let cfg = vec!["native".to_string(), "full".to_string()];
        let line = write(&dir, Backend::Sim, "small", &cfg, &cells, false).unwrap();
        assert!(line.contains("6/6 runs passed"), "{line}");
        assert!(line.contains("full gpu-side 1.10x total 2.00x"), "{line}");
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(j["cells"][1]["vs_native"]["total"].as_f64(), Some(2.0));
        let csv = std::fs::read_to_string(dir.join("apps.csv")).unwrap();
        assert_eq!(csv.lines().count(), 7);
        assert!(dir.join("apps-gpu.svg").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
