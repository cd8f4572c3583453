//! The overhead experiment's output: summary.json (slowdowns per configuration, size and phase,
//! with geometric means), overhead.csv and the SVG charts, and the one-line summary.

use std::path::Path;

use gpu_driver::suite_run::Phase;

use crate::error::BenchError;
use crate::exp_overhead::{Args, Table};
use crate::overhead_vm::{Bench, PHASES};
use crate::{chart, report};

pub(crate) fn total(b: &Bench) -> Phase {
    b.phases.iter().fold(Phase::default(), |a, p| Phase {
        ns: a.ns + p.ns,
        mmio: a.mmio + p.mmio,
    })
}

pub(crate) fn ratio(x: u64, base: u64) -> f64 {
    x as f64 / base.max(1) as f64
}

pub(crate) fn geomean(v: &[f64]) -> f64 {
    let v: Vec<f64> = v
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    if v.is_empty() {
        return 0.0;
    }
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// Writes summary.json, overhead.csv and the charts; returns the one-line summary.
pub(crate) fn write(
    a: &Args,
    sizes: &[String],
    reps: usize,
    tables: &[Table],
    skipped: &[serde_json::Value],
) -> Result<String, BenchError> {
    let mut csv = Vec::new();
    let mut cfg_json = Vec::new();
    let mut line = Vec::new();
    let mut bars: Vec<chart::Series> = Vec::new();
    for t in tables {
        let base = tables
            .iter()
            .find(|b| b.config.native && b.size == t.size)
            .ok_or_else(|| BenchError::Invalid("no native run".into()))?;
        let mut benches = Vec::new();
        let mut slowdowns = Vec::new();
        let mut with_inits = Vec::new();
        let mut phase_slow: [Vec<f64>; 4] = Default::default();
        let mut series = chart::Series {
            config: t.config.name.to_string(),
            size: t.size.to_string(),
            values: Vec::new(),
        };
        let init_slow = ratio(t.data.init.ns, base.data.init.ns);
        csv.push(format!(
            "{},{},init,init,{:.1},{:.3},{},1",
            t.config.name,
            t.size,
            t.data.init.ns as f64 / 1e3,
            init_slow,
            t.data.init.mmio
        ));
        for b in &t.data.benches {
            let nb = base
                .data
                .benches
                .iter()
                .find(|n| n.name == b.name)
                .ok_or_else(|| BenchError::Invalid(format!("{}: no native figure", b.name)))?;
            let (tot, ntot) = (total(b), total(nb));
            let slow = ratio(tot.ns, ntot.ns);
            slowdowns.push(slow);
            // As GPUvm counts a benchmark (one process: Init ... Close): with the set-up.
            let with_init = ratio(tot.ns + t.data.init.ns, ntot.ns + base.data.init.ns);
            with_inits.push(with_init);
            series.values.push((b.name.clone(), slow));
            let mut phases = serde_json::Map::new();
            for (k, n) in PHASES.iter().enumerate() {
                let (p, np) = (b.phases[k], nb.phases[k]);
                phase_slow[k].push(ratio(p.ns, np.ns));
                phases.insert(
                    n.to_string(),
                    serde_json::json!({
                        "us": p.ns as f64 / 1e3,
                        "slowdown": ratio(p.ns, np.ns),
                        "mmio_exits": p.mmio,
                    }),
                );
                csv.push(format!(
                    "{},{},{},{n},{:.1},{:.3},{},{}",
                    t.config.name,
                    t.size,
                    b.name,
                    p.ns as f64 / 1e3,
                    ratio(p.ns, np.ns),
                    p.mmio,
                    u8::from(b.ok)
                ));
            }
            csv.push(format!(
                "{},{},{},with_init,{:.1},{:.3},{},{}",
                t.config.name,
                t.size,
                b.name,
                (tot.ns + t.data.init.ns) as f64 / 1e3,
                with_init,
                tot.mmio + t.data.init.mmio,
                u8::from(b.ok)
            ));
            csv.push(format!(
                "{},{},{},total,{:.1},{:.3},{},{}",
                t.config.name,
                t.size,
                b.name,
                tot.ns as f64 / 1e3,
                slow,
                tot.mmio,
                u8::from(b.ok)
            ));
            benches.push(serde_json::json!({
                "name": b.name,
                "ok": b.ok,
                "gpu_us": b.gpu_ns as f64 / 1e3,
                "total_us": tot.ns as f64 / 1e3,
                "slowdown": slow,
                "slowdown_with_init": with_init,
                "mmio_exits": tot.mmio,
                "phases": phases,
            }));
        }
        series.values.push(("init".into(), init_slow));
        bars.push(series);
        let g = geomean(&slowdowns);
        line.push(format!(
            "{}/{} {:.2}x ({:.2}x with init)",
            t.config.name,
            t.size,
            g,
            geomean(&with_inits)
        ));
        let phase_geomeans: serde_json::Map<String, serde_json::Value> = PHASES
            .iter()
            .zip(&phase_slow)
            .map(|(n, v)| (n.to_string(), serde_json::json!(geomean(v))))
            .collect();
        cfg_json.push(serde_json::json!({
            "config": t.config.name,
            "gpu": t.gpu,
            "guest_args": t.guest_args,
            "in_process": t.config.native,
            "size": t.size,
            "all_ok": t.data.benches.iter().all(|b| b.ok),
            "geomean_slowdown": g,
            "geomean_slowdown_with_init": geomean(&with_inits),
            "phase_geomean_slowdown": phase_geomeans,
            "init": {
                "us": t.data.init.ns as f64 / 1e3,
                "slowdown": init_slow,
                "mmio_exits": t.data.init.mmio,
            },
            "shadow_rebuilds": t.data.shadow_rebuilds,
            "tlb_flushes": t.data.tlb_flushes,
            "doorbells": t.data.doorbells,
            "vm_mmio_exits": t.data.vm_mmio_exits,
            "hypercalls": t.data.hypercalls,
            "para_entries": t.data.para_entries,
            "benchmarks": benches,
        }));
    }
    let mut notes = Vec::new();
    for t in tables.iter().filter(|t| t.config.name == "para") {
        if let Some(m) = tables
            .iter()
            .find(|m| m.config.name == "para-multicall" && m.size == t.size)
            && t.data.hypercalls <= m.data.hypercalls
        {
            notes.push(format!(
                "para/{}: `{}` made no more hypercalls than para-multicall ({} vs {}): the guest \
                 driver batches regardless, so the two are the same configuration here",
                t.size, t.config.args, t.data.hypercalls, m.data.hypercalls
            ));
        }
    }
    let summary = serde_json::json!({
        "experiment": "overhead",
        "backend": a.backend.name(),
        "sizes": sizes,
        "sys_mib": a.sys_mib,
        "vm_memory_mib": a.memory_mib,
        "reps": reps,
        "slowdown": "time of upload+kernel+download+free of a workload over native's; init (driver and channel set-up, once per run) separately; slowdown_with_init adds the run's init to both sides (a benchmark as one process, as GPUvm counts it)",
        "results": cfg_json,
        "skipped": skipped,
        "notes": notes,
    });
    report::write(
        &a.out,
        &summary,
        "overhead.csv",
        "config,size,benchmark,phase,time_us,slowdown,mmio_exits,ok",
        &csv,
    )?;
    for s in sizes {
        let series: Vec<&chart::Series> = bars.iter().filter(|b| &b.size == s).collect();
        chart::draw(&a.out.join(format!("overhead-{s}.svg")), s, &series)?;
    }
    let skipped_note = if skipped.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = skipped
            .iter()
            .filter_map(|s| s["config"].as_str())
            .collect();
        format!(
            " (skipped, not supported by vgpu-vmm: {})",
            names.join(", ")
        )
    };
    Ok(format!(
        "overhead: geomean slowdown vs native (backend {}): {}{skipped_note}; {}",
        a.backend.name(),
        line.join(", "),
        Path::new(&a.out).join("summary.json").display()
    ))
}
