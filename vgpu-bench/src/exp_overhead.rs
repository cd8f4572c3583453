//! `vgpu-bench overhead`: GPUvm's core result table with our stack. The workload suite runs
//! through gpu-driver's shared loop (`gpu_driver::suite_run`) under each configuration —
//! native (in this process, no VM), full virtualization naive and optimized, para-virtual
//! naive and multicall (each a `vgpu-vmm --guest workloads` child) — and per benchmark and
//! phase the time, the slowdown against native and the MMIO exits are reported. `--backend`
//! picks the engine under every configuration (sim, or cuda on a real GPU: `backend=cuda` in
//! each `--gpu`, and a `CudaEngine` under native).

use std::path::{Path, PathBuf};

use gpu_driver::suite_run::Phase;

use crate::error::BenchError;
use crate::overhead_vm::{self, Bench, PHASES, RunData};
use crate::{chart, native, report};

/// A configuration of the experiment.
#[derive(Debug, Clone, Copy)]
pub struct ConfigDef {
    pub name: &'static str,
    /// `--gpu` options (native: of its in-process device).
    pub gpu: &'static str,
    /// Extra guest command-line arguments.
    pub args: &'static str,
    pub native: bool,
}

/// Every configuration, in table order.
pub const CONFIGS: [ConfigDef; 5] = [
    ConfigDef {
        name: "native",
        gpu: "mode=full,opt=all",
        args: "",
        native: true,
    },
    ConfigDef {
        name: "full-naive",
        gpu: "mode=full,opt=none",
        args: "",
        native: false,
    },
    ConfigDef {
        name: "full",
        gpu: "mode=full,opt=all",
        args: "",
        native: false,
    },
    // Para-virtual naive: one hypercall per page-table entry (`para_batch=1`).
    ConfigDef {
        name: "para",
        gpu: "mode=para",
        args: "para_batch=1",
        native: false,
    },
    ConfigDef {
        name: "para-multicall",
        gpu: "mode=para",
        args: "",
        native: false,
    },
];

/// The engine under every configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The software GPU (`pgpu::sim`).
    Sim,
    /// A real NVIDIA GPU (`pgpu::cuda`; needs the CUDA driver).
    Cuda,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Cuda => "cuda",
        }
    }
}

/// The `--gpu` options of configuration `c` on `backend`.
pub fn gpu_opts(c: &ConfigDef, backend: Backend) -> String {
    match backend {
        Backend::Sim => c.gpu.to_string(),
        Backend::Cuda => format!("{},backend=cuda", c.gpu),
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Engine under every configuration: sim, or cuda (a real GPU; native then runs the suite
    /// on an in-process `CudaEngine`, the VMs get `backend=cuda`).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Output directory (summary.json, overhead.csv, overhead-SIZE.svg).
    #[arg(long, default_value = "vgpu-bench-out/overhead")]
    pub out: PathBuf,
    /// Problem sizes (comma separated): small shows fixed costs, medium runs kernels of a few ms.
    #[arg(long, value_delimiter = ',', default_value = "small,medium")]
    pub sizes: Vec<String>,
    /// Configurations (comma separated): native, full-naive, full, para, para-multicall.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native,full-naive,full,para,para-multicall"
    )]
    pub configs: Vec<String>,
    /// Runs per configuration and size; each figure is the median over them.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// The driver's system-memory pool in MiB, native and guests alike (the guest's
    /// `sys_mib=`; default the driver's 8 MiB, too small for `large`: 64 fits it).
    #[arg(long)]
    pub sys_mib: Option<u64>,
    /// Guest RAM of the VMs in MiB (vgpu-vmm's `--memory`; default its 256). The guest's bump
    /// heap keeps every workload's host copies: `large` needs about 1024.
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// CI mode: small size only, one repetition.
    #[arg(long)]
    pub quick: bool,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
}

/// Median of `v` (upper median; 0 when empty).
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn median_phase(ps: &[Phase]) -> Phase {
    Phase {
        ns: median(ps.iter().map(|p| p.ns).collect()),
        mmio: median(ps.iter().map(|p| p.mmio).collect()),
    }
}

/// The medians over repetitions of one configuration and size.
fn combine(runs: &[RunData]) -> Result<RunData, BenchError> {
    let first = runs
        .first()
        .ok_or_else(|| BenchError::Invalid("no runs".into()))?;
    let mut d = RunData {
        init: median_phase(&runs.iter().map(|r| r.init).collect::<Vec<_>>()),
        shadow_rebuilds: median(runs.iter().map(|r| r.shadow_rebuilds).collect()),
        tlb_flushes: median(runs.iter().map(|r| r.tlb_flushes).collect()),
        doorbells: median(runs.iter().map(|r| r.doorbells).collect()),
        vm_mmio_exits: median(runs.iter().map(|r| r.vm_mmio_exits).collect()),
        hypercalls: median(runs.iter().map(|r| r.hypercalls).collect()),
        para_entries: median(runs.iter().map(|r| r.para_entries).collect()),
        benches: Vec::new(),
    };
    for (i, b) in first.benches.iter().enumerate() {
        let same: Vec<&Bench> = runs.iter().filter_map(|r| r.benches.get(i)).collect();
        if same.len() != runs.len() || same.iter().any(|s| s.name != b.name) {
            return Err(BenchError::Invalid(format!(
                "runs disagree on workload {i}"
            )));
        }
        let mut phases = [Phase::default(); 4];
        for (k, p) in phases.iter_mut().enumerate() {
            *p = median_phase(&same.iter().map(|s| s.phases[k]).collect::<Vec<_>>());
        }
        d.benches.push(Bench {
            name: b.name.clone(),
            ok: same.iter().all(|s| s.ok),
            gpu_ns: median(same.iter().map(|s| s.gpu_ns).collect()),
            phases,
        });
    }
    Ok(d)
}

fn native_run(gpu: &str, size: suite::Size, sys_mib: Option<u64>) -> Result<RunData, BenchError> {
    let all: Vec<&'static suite::Workload> = suite::all().collect();
    let n = native::run(gpu, size, &all, sys_mib)?;
    Ok(RunData {
        init: n.init,
        benches: n
            .results
            .into_iter()
            .map(|(name, o)| Bench {
                name,
                ok: o.ok,
                gpu_ns: o.gpu_ns,
                phases: [o.upload, o.kernel, o.download, o.free],
            })
            .collect(),
        shadow_rebuilds: n.counters.shadow_rebuilds,
        tlb_flushes: n.counters.tlb_flushes,
        doorbells: n.counters.doorbells,
        vm_mmio_exits: 0,
        hypercalls: 0,
        para_entries: 0,
    })
}

fn total(b: &Bench) -> Phase {
    b.phases.iter().fold(Phase::default(), |a, p| Phase {
        ns: a.ns + p.ns,
        mmio: a.mmio + p.mmio,
    })
}

fn ratio(x: u64, base: u64) -> f64 {
    x as f64 / base.max(1) as f64
}

fn geomean(v: &[f64]) -> f64 {
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

/// Results of one configuration at one size, with slowdowns against `base` (native).
struct Table<'a> {
    config: &'a ConfigDef,
    /// The `--gpu` options and extra guest arguments it ran with.
    gpu: String,
    guest_args: String,
    size: &'a str,
    data: RunData,
}

fn vmm_path(a: &Args) -> Result<PathBuf, BenchError> {
    if let Some(p) = &a.vmm {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|source| BenchError::Io {
        path: "current_exe".into(),
        source,
    })?;
    Ok(exe.with_file_name("vgpu-vmm"))
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let sizes: Vec<String> = if a.quick {
        vec!["small".into()]
    } else {
        a.sizes.clone()
    };
    let reps = if a.quick { 1 } else { a.reps.max(1) };
    let mut configs = Vec::new();
    for name in &a.configs {
        let c = CONFIGS
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| BenchError::Invalid(format!("unknown configuration `{name}`")))?;
        configs.push(c);
    }
    if !configs.first().is_some_and(|c| c.native) {
        return Err(BenchError::Invalid(
            "--configs must start with native (the baseline)".into(),
        ));
    }
    for s in &sizes {
        suite::Size::from_name(s)
            .ok_or_else(|| BenchError::Invalid(format!("unknown size `{s}`")))?;
    }
    let needs_vmm = configs.iter().any(|c| !c.native);
    let vmm = vmm_path(a)?;
    if needs_vmm && !vmm.is_file() {
        return Err(BenchError::Invalid(format!(
            "{}: no vgpu-vmm binary (build it, or pass --vmm)",
            vmm.display()
        )));
    }
    std::fs::create_dir_all(&a.out).map_err(|source| BenchError::Io {
        path: a.out.display().to_string(),
        source,
    })?;
    let mut skipped = Vec::new();
    let mut tables: Vec<Table> = Vec::new();
    for c in &configs {
        let gpu = gpu_opts(c, a.backend);
        let guest_args = match a.sys_mib {
            Some(m) => format!("sys_mib={m} {}", c.args),
            None => c.args.to_string(),
        };
        if !c.native
            && let Some(why) = overhead_vm::refuses(&vmm, &gpu)?
        {
            skipped.push(serde_json::json!({ "config": c.name, "gpu": gpu, "why": why }));
            continue;
        }
        for s in &sizes {
            let size = suite::Size::from_name(s)
                .ok_or_else(|| BenchError::Invalid(format!("unknown size `{s}`")))?;
            let mut runs = Vec::with_capacity(reps);
            for r in 0..reps {
                runs.push(if c.native {
                    native_run(&gpu, size, a.sys_mib)?
                } else {
                    let stats = a.out.join(format!("stats-{}-{s}-{r}.json", c.name));
                    overhead_vm::run(&vmm, &gpu, s, guest_args.trim(), a.memory_mib, &stats)?
                });
            }
            tables.push(Table {
                config: c,
                gpu: gpu.clone(),
                guest_args: guest_args.trim().to_string(),
                size: s,
                data: combine(&runs)?,
            });
        }
    }
    write(a, &sizes, reps, &tables, &skipped)
}

/// Writes summary.json, overhead.csv and the charts; returns the one-line summary.
fn write(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_geomeans() {
        assert_eq!(median(vec![5, 1, 3]), 3);
        assert_eq!(median(vec![]), 0);
        assert!((geomean(&[2.0, 8.0]) - 4.0).abs() < 1e-9);
        assert_eq!(geomean(&[]), 0.0);
        let b = |ns| Bench {
            name: "x".into(),
            ok: true,
            gpu_ns: 0,
            phases: [Phase { ns, mmio: 1 }; 4],
        };
        let runs = [10, 30, 20].map(|ns| RunData {
            benches: vec![b(ns)],
            ..RunData::default()
        });
        let d = combine(&runs).unwrap();
        assert_eq!(total(&d.benches[0]), Phase { ns: 80, mmio: 4 });
    }

    #[test]
    fn cuda_adds_the_backend_to_every_configuration() {
        for c in &CONFIGS {
            assert_eq!(gpu_opts(c, Backend::Sim), c.gpu);
            let cuda = gpu_opts(c, Backend::Cuda);
            let cfg = vgpu::GpuConfig::parse(&cuda).unwrap();
            assert_eq!(cfg.backend, vgpu::config::Backend::Cuda, "{cuda}");
        }
    }

    /// `--backend cuda` where there is no NVIDIA driver (CI): a clear error from the native
    /// baseline, before any VM is started.
    #[test]
    fn cuda_without_a_driver_is_a_clear_error() {
        if Path::new("/dev/nvidiactl").exists() {
            return; // a GPU machine: run the experiment itself there
        }
        let a = Args {
            backend: Backend::Cuda,
            out: std::env::temp_dir().join(format!("vgpu-bench-ov-cuda-{}", std::process::id())),
            sizes: vec!["small".into()],
            configs: vec!["native".into()],
            reps: 1,
            sys_mib: None,
            memory_mib: None,
            quick: true,
            vmm: None,
        };
        let e = run(&a).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&a.out);
        assert!(
            e.contains("backend=cuda") && e.contains("CUDA driver not found"),
            "{e}"
        );
    }
}
