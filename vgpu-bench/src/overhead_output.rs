//! The overhead experiment's output: summary.json (slowdowns per configuration, size and phase,
//! with geometric means), overhead.csv and the SVG charts, and the one-line summary.

use std::path::Path;

use gpu_driver::suite_run::Phase;

use crate::error::BenchError;
use crate::exp_overhead::{Args, Table};
use crate::overhead_pt::{self, Ratios, VsPt};
use crate::overhead_vm::{Bench, PHASES};
use crate::{chart, overhead_split, report};

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

/// The chart's series of one size (one per configuration, in order) and its group names: the
/// first configuration's benchmarks, then `geomean` and `init`. A configuration that lacks a
/// group is an error (every configuration runs the same suite).
fn chart_series(
    of_size: &[&(&Table, Vec<(String, chart::Bar)>)],
) -> Result<(Vec<chart::Series>, Vec<String>), BenchError> {
    let Some((_, first)) = of_size.first() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let groups: Vec<String> = first.iter().map(|(n, _)| n.clone()).collect();
    let mut series = Vec::new();
    for (t, named) in of_size {
        let bars = groups
            .iter()
            .map(|g| {
                named
                    .iter()
                    .find(|(n, _)| n == g)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| {
                        BenchError::Invalid(format!(
                            "{}/{}: no figure for {g}",
                            t.config.name, t.size
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        series.push(chart::Series {
            config: t.config.name.to_string(),
            bars,
        });
    }
    Ok((series, groups))
}

/// A ratio for a CSV cell: empty when there is none (no pt run).
fn csv_opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |x| format!("{x:.3}"))
}

/// `a / b` (0 when `b` is 0).
fn ratio_f(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// What one configuration at one size contributes to the outputs.
struct ConfigOut<'t> {
    csv: Vec<String>,
    json: serde_json::Value,
    /// Its part of the one-line summary.
    line: String,
    /// Its chart bars: per benchmark, then "geomean" and "init".
    bars: (&'t Table<'t>, Vec<(String, chart::Bar)>),
    /// Its row of GPUvm's table (against native and against pt).
    gpuvm: overhead_pt::Row,
}

/// A configuration's figures, benchmark by benchmark.
#[derive(Default)]
struct Figures {
    csv: Vec<String>,
    benches: Vec<serde_json::Value>,
    slowdowns: Vec<f64>,
    with_inits: Vec<f64>,
    phase_slow: [Vec<f64>; 4],
    chart_bars: Vec<(String, chart::Bar)>,
    /// Slowdowns of each repetition (against native's median), per repetition.
    rep_slow: Vec<Vec<f64>>,
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
    // Per configuration and size: (benchmark or "geomean"/"init", bar).
    let mut bars: Vec<(&Table, Vec<(String, chart::Bar)>)> = Vec::new();
    // GPUvm's table: every configuration against native and against pt.
    let mut gpuvm_rows = Vec::new();
    for t in tables {
        let c = config_out(t, tables)?;
        csv.extend(c.csv);
        cfg_json.push(c.json);
        line.push(c.line);
        bars.push(c.bars);
        gpuvm_rows.push(c.gpuvm);
    }
    let notes = para_notes(tables);
    let summary = serde_json::json!({
        "experiment": "overhead",
        "backend": a.backend.name(),
        "sizes": sizes,
        "sys_mib": a.sys_mib,
        "vm_memory_mib": a.memory_mib,
        "reps": reps,
        "slowdown": "time of upload+kernel+download+free of a workload over native's; init (driver and channel set-up, once per run) separately; slowdown_with_init adds the run's init to both sides (a benchmark as one process, as GPUvm counts it); slowdown_min/max: the fastest and slowest repetition against native's median; geomean_slowdown_range: the same for each repetition's geomean",
        "slowdown_vs_pt": "the same ratios against the pass-through baseline (configuration pt, --gpu mode=pt) instead of native, GPUvm's FV/PT and PV/PT: slowdown_vs_pt and slowdown_with_init_vs_pt per benchmark, slowdown_vs_pt per phase, vs_pt per configuration (geomeans and init); null when pt did not run at that size; gpuvm_table and overhead-table.md put both side by side",
        "results": cfg_json,
        "gpuvm_table": overhead_pt::table_json(&gpuvm_rows),
        "skipped": skipped,
        "notes": notes,
    });
    overhead_pt::pad_csv(&mut csv);
    report::write(
        &a.out,
        &summary,
        "overhead.csv",
        overhead_pt::CSV_HEADER,
        &csv,
    )?;
    overhead_pt::write_markdown(
        &a.out,
        &overhead_pt::table_markdown(&gpuvm_rows, a.backend.name(), reps),
    )?;
    write_charts(a, sizes, reps, &bars)?;
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

/// What configuration `t` (at its size) contributes to the outputs.
fn config_out<'t>(t: &'t Table<'t>, tables: &'t [Table<'t>]) -> Result<ConfigOut<'t>, BenchError> {
    let base = tables
        .iter()
        .find(|b| b.config.native && b.size == t.size)
        .ok_or_else(|| BenchError::Invalid("no native run".into()))?;
    let mut f = Figures {
        rep_slow: vec![Vec::new(); t.runs.len()],
        ..Figures::default()
    };
    let mut vs_pt = VsPt::new(tables, t);
    let init_slow = ratio(t.data.init.ns, base.data.init.ns);
    let init_reps: Vec<f64> = t
        .runs
        .iter()
        .map(|r| ratio(r.init.ns, base.data.init.ns))
        .collect();
    f.csv.push(format!(
        "{},{},init,init,{:.1},{:.3},{},1,{}",
        t.config.name,
        t.size,
        t.data.init.ns as f64 / 1e3,
        init_slow,
        t.data.init.mmio,
        csv_opt(vs_pt.init())
    ));
    for b in &t.data.benches {
        add_bench(&mut f, t, base, b, &mut vs_pt)?;
    }
    let g = geomean(&f.slowdowns);
    // The geomean of each repetition: its benchmarks against native's medians.
    let rep_geomeans: Vec<f64> = f.rep_slow.iter().map(|r| geomean(r)).collect();
    let g_bar = chart::Bar::with_range(g, &rep_geomeans);
    let init_bar = chart::Bar::with_range(init_slow, &init_reps);
    f.chart_bars.push(("geomean".into(), g_bar));
    f.chart_bars.push(("init".into(), init_bar));
    let pt_ratios = vs_pt.ratios();
    let gpuvm = overhead_pt::Row {
        config: t.config.name.to_string(),
        size: t.size.to_string(),
        vs_native: Ratios {
            total: g,
            with_init: geomean(&f.with_inits),
            init: init_slow,
            phases: std::array::from_fn(|k| geomean(&f.phase_slow[k])),
        },
        vs_pt: pt_ratios,
    };
    // FV/PT, PV/PT in the one-line summary (not for native and pt themselves).
    let pt_note = match pt_ratios {
        Some(r) if t.config.name != crate::exp_overhead::PT => {
            format!(", {:.2}x pt", r.total)
        }
        _ => String::new(),
    };
    let line = if t.config.native {
        format!("{}/{} {:.2}x", t.config.name, t.size, g)
    } else {
        format!(
            "{}/{} {:.2}x ({:.2}x with init, {:.2} exits/launch, {:.2} without init{pt_note})",
            t.config.name,
            t.size,
            g,
            geomean(&f.with_inits),
            t.data.exits_per_launch(),
            ratio_f(
                t.data.benches.iter().map(|b| total(b).mmio).sum::<u64>(),
                t.data.launches
            )
        )
    };
    f.csv.extend(overhead_split::csv_rows(t, base));
    let phase_geomeans: serde_json::Map<String, serde_json::Value> = PHASES
        .iter()
        .zip(&f.phase_slow)
        .map(|(n, v)| (n.to_string(), serde_json::json!(geomean(v))))
        .collect();
    let json = serde_json::json!({
        "config": t.config.name,
        "gpu": t.gpu,
        "guest_args": t.guest_args,
        "in_process": t.config.native,
        "size": t.size,
        "all_ok": t.data.benches.iter().all(|b| b.ok),
        "geomean_slowdown": g,
        "geomean_slowdown_range": [g_bar.min, g_bar.max],
        "geomean_slowdown_with_init": geomean(&f.with_inits),
        "phase_geomean_slowdown": phase_geomeans,
        "vs_pt": pt_ratios.map(|r| r.json()),
        "init": {
            "us": t.data.init.ns as f64 / 1e3,
            "slowdown": init_slow,
            "slowdown_min": init_bar.min,
            "slowdown_max": init_bar.max,
            "mmio_exits": t.data.init.mmio,
        },
        "shadow_rebuilds": t.data.shadow_rebuilds,
        "tlb_flushes": t.data.tlb_flushes,
        "doorbells": t.data.doorbells,
        "vm_mmio_exits": t.data.vm_mmio_exits,
        "launches": t.data.launches,
        "exits_per_launch": t.data.exits_per_launch(),
        "exits_per_launch_workloads": ratio_f(
            t.data.benches.iter().map(|b| total(b).mmio).sum::<u64>(),
            t.data.launches
        ),
        "bell_doorbells": t.data.bell_polled,
        "submit_us": t.data.submit_ns as f64 / 1e3,
        "complete_us": t.data.complete_ns as f64 / 1e3,
        "hypercalls": t.data.hypercalls,
        "para_entries": t.data.para_entries,
        "download_split": overhead_split::download_json(t, base),
        "init_split": overhead_split::init_json(t, base),
        "benchmarks": f.benches,
    });
    Ok(ConfigOut {
        csv: f.csv,
        json,
        line,
        bars: (t, f.chart_bars),
        gpuvm,
    })
}

/// Adds benchmark `b` of configuration `t` (native figures in `base`) to `f`.
fn add_bench(
    f: &mut Figures,
    t: &Table<'_>,
    base: &Table<'_>,
    b: &Bench,
    vs_pt: &mut VsPt<'_>,
) -> Result<(), BenchError> {
    let nb = base
        .data
        .benches
        .iter()
        .find(|n| n.name == b.name)
        .ok_or_else(|| BenchError::Invalid(format!("{}: no native figure", b.name)))?;
    let (tot, ntot) = (total(b), total(nb));
    let slow = ratio(tot.ns, ntot.ns);
    let b_pt = vs_pt.bench(b, t.data.init.ns);
    f.slowdowns.push(slow);
    // As GPUvm counts a benchmark (one process: Init ... Close): with the set-up.
    let with_init = ratio(tot.ns + t.data.init.ns, ntot.ns + base.data.init.ns);
    f.with_inits.push(with_init);
    let reps: Vec<f64> = t
        .runs
        .iter()
        .filter_map(|r| r.benches.iter().find(|x| x.name == b.name))
        .map(|x| ratio(total(x).ns, ntot.ns))
        .collect();
    for (r, v) in f.rep_slow.iter_mut().zip(&reps) {
        r.push(*v);
    }
    let bar = chart::Bar::with_range(slow, &reps);
    f.chart_bars.push((b.name.clone(), bar));
    let mut phases = serde_json::Map::new();
    for (k, n) in PHASES.iter().enumerate() {
        let (p, np) = (b.phases[k], nb.phases[k]);
        f.phase_slow[k].push(ratio(p.ns, np.ns));
        let p_pt = b_pt.map(|r| r.phases[k]);
        phases.insert(
            n.to_string(),
            serde_json::json!({
                "us": p.ns as f64 / 1e3,
                "slowdown": ratio(p.ns, np.ns),
                "slowdown_vs_pt": p_pt,
                "mmio_exits": p.mmio,
            }),
        );
        f.csv.push(format!(
            "{},{},{},{n},{:.1},{:.3},{},{},{}",
            t.config.name,
            t.size,
            b.name,
            p.ns as f64 / 1e3,
            ratio(p.ns, np.ns),
            p.mmio,
            u8::from(b.ok),
            csv_opt(p_pt)
        ));
    }
    f.csv.push(format!(
        "{},{},{},with_init,{:.1},{:.3},{},{},{}",
        t.config.name,
        t.size,
        b.name,
        (tot.ns + t.data.init.ns) as f64 / 1e3,
        with_init,
        tot.mmio + t.data.init.mmio,
        u8::from(b.ok),
        csv_opt(b_pt.map(|r| r.with_init))
    ));
    f.csv.push(format!(
        "{},{},{},total,{:.1},{:.3},{},{},{}",
        t.config.name,
        t.size,
        b.name,
        tot.ns as f64 / 1e3,
        slow,
        tot.mmio,
        u8::from(b.ok),
        csv_opt(b_pt.map(|r| r.total))
    ));
    f.benches.push(serde_json::json!({
        "name": b.name,
        "ok": b.ok,
        "gpu_us": b.gpu_ns as f64 / 1e3,
        "total_us": tot.ns as f64 / 1e3,
        "slowdown": slow,
        "slowdown_min": bar.min,
        "slowdown_max": bar.max,
        "slowdown_with_init": with_init,
        "slowdown_vs_pt": b_pt.map(|r| r.total),
        "slowdown_with_init_vs_pt": b_pt.map(|r| r.with_init),
        "mmio_exits": tot.mmio,
        "phases": phases,
    }));
    Ok(())
}

/// Notes on the runs: a `para` configuration that made no more hypercalls than
/// `para-multicall` is the same configuration here.
fn para_notes(tables: &[Table<'_>]) -> Vec<String> {
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
    notes
}

/// One bar chart per size: each configuration's time relative to native.
fn write_charts(
    a: &Args,
    sizes: &[String],
    reps: usize,
    bars: &[(&Table<'_>, Vec<(String, chart::Bar)>)],
) -> Result<(), BenchError> {
    for s in sizes {
        let of_size: Vec<&(&Table, Vec<(String, chart::Bar)>)> =
            bars.iter().filter(|(t, _)| t.size == s).collect();
        let (series, groups) = chart_series(&of_size)?;
        if series.is_empty() {
            continue;
        }
        let bench_n = groups.len().saturating_sub(2);
        let c = chart::BarChart {
            title: format!(
                "Time relative to native, size {s} (backend {})",
                a.backend.name()
            ),
            note: format!(
                "Bars: median of {reps} run{}; error bars: fastest and slowest run; geomean over \
                 the {bench_n} benchmarks (init excluded); init: driver and channel set-up, once per run",
                if reps == 1 { "" } else { "s" }
            ),
            y_desc: "time relative to native (native = 1)".into(),
            dividers: vec![bench_n, bench_n + 1],
            groups,
            reference: 1.0,
            series: series.iter().collect(),
        };
        chart::draw(&a.out.join(format!("overhead-{s}.svg")), &c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::exp_overhead::CONFIGS;
    use crate::overhead_vm::RunData;

    /// A run of two workloads taking `a` and `b` ns in total (their upload phase) after an
    /// init of `init` ns (each of its parts `init` ns too); their download parts take a
    /// quarter and a half of that (not counted in the total: the figures only test the split).
    fn run(init: u64, a: u64, b: u64) -> RunData {
        let bench = |name: &str, ns| Bench {
            name: name.into(),
            ok: true,
            gpu_ns: 0,
            phases: [
                Phase { ns, mmio: 0 },
                Phase::default(),
                Phase::default(),
                Phase::default(),
            ],
            download_parts: [
                Phase {
                    ns: ns / 4,
                    mmio: 1,
                },
                Phase {
                    ns: ns / 2,
                    mmio: 0,
                },
            ],
            reread_ns: ns / 8,
        };
        RunData {
            init: Phase { ns: init, mmio: 0 },
            init_parts: [init; 6],
            benches: vec![bench("a", a), bench("b", b)],
            ..RunData::default()
        }
    }

    #[test]
    fn error_bars_and_the_geomean_come_from_the_repetitions() {
        let out = std::env::temp_dir().join(format!("vgpu-bench-ovout-{}", std::process::id()));
        let a = Args {
            backend: Backend::Sim,
            out: out.clone(),
            sizes: vec!["small".into()],
            configs: vec![],
            reps: 3,
            sys_mib: None,
            memory_mib: None,
            quick: false,
            gpu_extra: None,
            vmm: None,
        };
        // Native medians: a 100, b 400, init 10.
        let native_runs = vec![run(10, 100, 400), run(10, 100, 400), run(10, 100, 400)];
        // full: a 200 (reps 150..300), b 800 (reps 800..1600), init 20..40.
        let full_runs = vec![run(20, 150, 800), run(30, 200, 1600), run(40, 300, 800)];
        let table = |c, runs: Vec<RunData>, data| Table {
            config: c,
            gpu: String::new(),
            guest_args: String::new(),
            size: "small",
            data,
            runs,
        };
        let tables = [
            table(&CONFIGS[0], native_runs, run(10, 100, 400)),
            table(&CONFIGS[2], full_runs, run(30, 200, 800)),
        ];
        write(&a, &["small".into()], 3, &tables, &[]).unwrap();
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        let svg = std::fs::read_to_string(out.join("overhead-small.svg")).unwrap();
        let csv = std::fs::read_to_string(out.join("overhead.csv")).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        // Full's workload a: median 200 ns, download copy 50 ns (native 25: 2x), 1 exit.
        assert!(
            csv.contains("\nfull,small,a,download_copy,0.1,2.000,1,1,\n"),
            "{csv}"
        );
        assert!(
            csv.contains("\nfull,small,init,init_pool_warm,0.0,3.000,,1,\n"),
            "{csv}"
        );
        let full = &s["results"][1];
        assert_eq!(full["config"], "full");
        // Medians 2x and 2x: geomean 2; per repetition (1.5, 2) (2, 4) (3, 2).
        assert!((full["geomean_slowdown"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        let range: Vec<f64> = full["geomean_slowdown_range"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!((range[0] - 3f64.sqrt()).abs() < 1e-9, "{range:?}");
        assert!((range[1] - 8f64.sqrt()).abs() < 1e-9, "{range:?}");
        let b = &full["benchmarks"][1];
        assert_eq!(
            (b["slowdown_min"].as_f64(), b["slowdown_max"].as_f64()),
            (Some(2.0), Some(4.0))
        );
        assert_eq!(full["init"]["slowdown_min"].as_f64(), Some(2.0));
        assert_eq!(full["init"]["slowdown_max"].as_f64(), Some(4.0));
        // The splits: download parts 2x native in both workloads, init parts 30 vs 10 ns.
        let dl = &full["download_split"];
        assert!((dl["download_copy"]["geomean_slowdown"].as_f64().unwrap() - 2.0).abs() < 1e-9);
        assert!(
            (dl["download_read"]["us"].as_f64().unwrap() - 0.5).abs() < 1e-9,
            "{dl}"
        );
        // Rereads: an eighth of 200 and 800 ns.
        assert!(
            (dl["reread_us"].as_f64().unwrap() - 0.125).abs() < 1e-9,
            "{dl}"
        );
        assert_eq!(dl["device"]["copy_to_sysmem"]["copies"].as_u64(), Some(0));
        assert_eq!(
            full["init_split"]["pool_warm"]["slowdown"].as_f64(),
            Some(3.0)
        );
        assert_eq!(full["init_split"]["channel"]["us"].as_f64(), Some(0.03));
        let texts = chart::svg_texts(&svg);
        for t in ["a", "b", "geomean", "init", "native", "full"] {
            assert_eq!(
                texts.iter().filter(|x| *x == t).count(),
                1,
                "{t}: {texts:?}"
            );
        }
    }
}
