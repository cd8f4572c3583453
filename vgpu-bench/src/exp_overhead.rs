//! `vgpu-bench overhead`: GPUvm's core result table with our stack. The workload suite runs
//! through gpu-driver's shared loop (`gpu_driver::suite_run`) under each configuration —
//! native (in this process, no VM), full virtualization naive and optimized, para-virtual
//! naive and multicall, and the pass-through baseline `pt` (each a `vgpu-vmm --guest workloads`
//! child) — and per benchmark and phase the time, the slowdown against native (and against pt,
//! GPUvm's FV/PT and PV/PT, when pt ran) and the MMIO exits are reported. `--backend`
//! picks the engine under every configuration (sim, or cuda on a real GPU: `backend=cuda` in
//! each `--gpu`, and a `CudaEngine` under native).

use std::path::PathBuf;

use gpu_driver::suite_run::Phase;

use crate::backend::Backend;
use crate::error::BenchError;
use crate::overhead_vm::{self, Bench, DeviceCopies, RunData};
use crate::{native, overhead_output};

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

/// The pass-through baseline's name (GPUvm's PT column: FV/PT and PV/PT are against it).
pub const PT: &str = "pt";

/// Every configuration (a run's table follows `--configs`' order).
pub const CONFIGS: [ConfigDef; 8] = [
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
    // The two optimized configurations with trapped doorbells only (no doorbell page).
    ConfigDef {
        name: "full-mmio",
        gpu: "mode=full,opt=all,doorbell=mmio",
        args: "",
        native: false,
    },
    ConfigDef {
        name: "para-multicall-mmio",
        gpu: "mode=para,doorbell=mmio",
        args: "",
        native: false,
    },
    // The pass-through baseline: the same VM and guest, a trusted device without isolation
    // (no shadow partition, no watched pages, the aperture mapped whole on sim).
    ConfigDef {
        name: PT,
        gpu: "mode=pt",
        args: "",
        native: false,
    },
];

/// The `--gpu` options of configuration `c` on `backend`.
pub fn gpu_opts(c: &ConfigDef, backend: Backend) -> String {
    match backend {
        Backend::Sim => c.gpu.to_string(),
        Backend::Cuda => format!("{},backend=cuda", c.gpu),
    }
}

/// `opts` for a run at `size`: with the VRAM the size needs when that is more than the
/// virtual GPU's default (before `--gpu-extra`, whose keys override).
pub fn gpu_opts_for_size(opts: &str, size: suite::Size) -> String {
    let default_mib = vgpu::GpuConfig::default().vram >> 20;
    match size.vram_mib() {
        Some(m) if m > default_mib => format!("{opts},vram={m}M"),
        _ => opts.to_string(),
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Engine under every configuration: sim, or cuda (a real GPU; native then runs the suite
    /// in this process on the GPU, the VMs get `backend=cuda`).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Output directory (summary.json, overhead.csv, overhead-SIZE.svg).
    #[arg(long, default_value = "vgpu-bench-out/overhead")]
    pub out: PathBuf,
    /// Problem sizes (comma separated): small shows fixed costs, medium runs kernels of a few ms
    /// (on sim); large and xl are for real GPUs (xl: kernels of a millisecond or more on an
    /// H100; it needs a 160 MiB driver pool, 3072 MiB guests and vram=512M, all set by default;
    /// refused on sim, where it would take many minutes).
    #[arg(long, value_delimiter = ',', default_value = "small,medium")]
    pub sizes: Vec<String>,
    /// Configurations (comma separated): native, pt, full-naive, full, para, para-multicall,
    /// full-mmio, para-multicall-mmio (the -mmio ones: trapped doorbells, no doorbell page; pt:
    /// the pass-through baseline, `--gpu mode=pt`, against which FV/PT and PV/PT are reported).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native,pt,full-naive,full,para,para-multicall"
    )]
    pub configs: Vec<String>,
    /// Runs per configuration and size; each figure is the median over them.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub reps: usize,
    /// The driver's system-memory pool in MiB, native and guests alike (the guest's
    /// `sys_mib=`; default: what each size needs, 64 for `large`, 160 for `xl`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub sys_mib: Option<u64>,
    /// Guest RAM of the VMs in MiB (vgpu-vmm's `--memory`; default: what each size needs, 256,
    /// 512 for `large`, 3072 for `xl`: upper bounds measured
    /// when the guest's heap kept every workload's host copies).
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1_048_576))]
    pub memory_mib: Option<u64>,
    /// CI mode: small size only, one repetition.
    #[arg(long)]
    pub quick: bool,
    /// More `--gpu` options for every configuration, native included (e.g. `spin_us=0`;
    /// a key given again overrides the configuration's).
    #[arg(long, value_name = "OPTS")]
    pub gpu_extra: Option<String>,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
}

/// Median of `v` (upper median; 0 when empty).
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn median_copies(cs: &[DeviceCopies]) -> DeviceCopies {
    DeviceCopies {
        n: median(cs.iter().map(|c| c.n).collect()),
        ns: median(cs.iter().map(|c| c.ns).collect()),
        bytes: median(cs.iter().map(|c| c.bytes).collect()),
    }
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
        launches: median(runs.iter().map(|r| r.launches).collect()),
        bell_polled: median(runs.iter().map(|r| r.bell_polled).collect()),
        submit_ns: median(runs.iter().map(|r| r.submit_ns).collect()),
        complete_ns: median(runs.iter().map(|r| r.complete_ns).collect()),
        init_parts: core::array::from_fn(|k| {
            median(runs.iter().map(|r| r.init_parts[k]).collect())
        }),
        copies: core::array::from_fn(|k| {
            median_copies(&runs.iter().map(|r| r.copies[k]).collect::<Vec<_>>())
        }),
        launch_prep_ns: median(runs.iter().map(|r| r.launch_prep_ns).collect()),
        heap_used_mib: runs.iter().map(|r| r.heap_used_mib).max().unwrap_or(0),
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
        let mut download_parts = [Phase::default(); 2];
        for (k, p) in download_parts.iter_mut().enumerate() {
            *p = median_phase(&same.iter().map(|s| s.download_parts[k]).collect::<Vec<_>>());
        }
        d.benches.push(Bench {
            name: b.name.clone(),
            ok: same.iter().all(|s| s.ok),
            gpu_ns: median(same.iter().map(|s| s.gpu_ns).collect()),
            phases,
            download_parts,
            reread_ns: median(same.iter().map(|s| s.reread_ns).collect()),
        });
    }
    Ok(d)
}

fn native_run(gpu: &str, size: suite::Size, sys_mib: Option<u64>) -> Result<RunData, BenchError> {
    let all: Vec<&'static suite::Workload> = suite::all().collect();
    let n = native::run(gpu, size, &all, sys_mib)?;
    let path = &n.counters.path;
    let copies = |l: &vgpu::state::Latency, bytes| DeviceCopies {
        n: l.n,
        ns: l.total_ns,
        bytes,
    };
    Ok(RunData {
        init: n.init,
        init_parts: n.init_parts.named().map(|(_, ns)| ns),
        copies: [
            copies(&path.copy_to_sysmem, path.copy_to_sysmem_bytes),
            copies(&path.copy_to_vram, path.copy_to_vram_bytes),
            copies(&path.copy_unclassified, path.copy_unclassified_bytes),
        ],
        launch_prep_ns: path.launch_prep.total_ns,
        heap_used_mib: 0,
        benches: n
            .results
            .into_iter()
            .map(|(name, o)| Bench {
                name,
                ok: o.ok,
                gpu_ns: o.gpu_ns,
                phases: [o.upload, o.kernel, o.download, o.free],
                download_parts: [o.download_copy, o.download_read],
                reread_ns: o.download_reread.ns,
            })
            .collect(),
        shadow_rebuilds: n.counters.shadow_rebuilds,
        tlb_flushes: n.counters.tlb_flushes,
        doorbells: n.counters.doorbells,
        vm_mmio_exits: 0,
        hypercalls: 0,
        para_entries: 0,
        launches: n.counters.launches,
        bell_polled: n.counters.bell.polled,
        submit_ns: mean(&n.counters.path.submit),
        complete_ns: mean(&n.counters.path.complete),
    })
}

fn mean(l: &vgpu::state::Latency) -> u64 {
    l.total_ns / l.n.max(1)
}

/// Results of one configuration at one size, with slowdowns against `base` (native).
pub(crate) struct Table<'a> {
    pub config: &'a ConfigDef,
    /// The `--gpu` options and extra guest arguments it ran with.
    pub gpu: String,
    pub guest_args: String,
    pub size: &'a str,
    /// The medians over the repetitions.
    pub data: RunData,
    /// Every repetition (for the charts' min-max error bars).
    pub runs: Vec<RunData>,
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
        let size = suite::Size::from_name(s)
            .ok_or_else(|| BenchError::Invalid(format!("unknown size `{s}`")))?;
        if size.real_gpu_only() && a.backend == Backend::Sim {
            return Err(BenchError::Invalid(format!(
                "size {s} is for real GPUs (--backend cuda): on the sim interpreter one run of \
                 the suite takes many minutes per configuration"
            )));
        }
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
    let with_extra = |gpu: String| match &a.gpu_extra {
        Some(extra) => format!("{gpu},{extra}"),
        None => gpu,
    };
    for c in &configs {
        let gpu = with_extra(gpu_opts(c, a.backend));
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
            let gpu = with_extra(gpu_opts_for_size(&gpu_opts(c, a.backend), size));
            let mut runs = Vec::with_capacity(reps);
            for r in 0..reps {
                runs.push(if c.native {
                    native_run(&gpu, size, a.sys_mib)?
                } else {
                    let stats = a.out.join(format!("stats-{}-{s}-{r}.json", c.name));
                    // Default: the guest RAM the guest says this size needs.
                    let memory = a.memory_mib.unwrap_or(size.guest_ram_mib());
                    overhead_vm::run(&vmm, &gpu, s, guest_args.trim(), Some(memory), &stats)?
                });
            }
            tables.push(Table {
                config: c,
                gpu: gpu.clone(),
                guest_args: guest_args.trim().to_string(),
                size: s,
                data: combine(&runs)?,
                runs,
            });
        }
    }
    overhead_output::write(a, &sizes, reps, &tables, &skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overhead_output::{geomean, total};

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
            download_parts: [Phase::default(); 2],
            reread_ns: 0,
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

    #[test]
    fn xl_runs_get_the_vram_they_need_unless_overridden() {
        let full = gpu_opts(&CONFIGS[2], Backend::Cuda);
        assert_eq!(gpu_opts_for_size(&full, suite::Size::Large), full);
        let xl = gpu_opts_for_size(&full, suite::Size::Xl);
        let cfg = vgpu::GpuConfig::parse(&xl).unwrap();
        assert_eq!(cfg.vram, suite::Size::Xl.vram_mib().unwrap() << 20, "{xl}");
        // `--gpu-extra` comes after and overrides.
        let cfg = vgpu::GpuConfig::parse(&format!("{xl},vram=1G")).unwrap();
        assert_eq!(cfg.vram, 1 << 30);
    }

    /// `--backend cuda` where there is no NVIDIA driver (CI): a clear error from the native
    /// baseline, before any VM is started.
    #[test]
    fn cuda_without_a_driver_is_a_clear_error() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
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
            gpu_extra: None,
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
