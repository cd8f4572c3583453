//! `vgpu-bench apps`: the project's CUDA application suite (apps/, unmodified nvcc-built
//! programs) run as GPUvm ran Gdev's and Rodinia's programs: natively and in VMs (pt, full,
//! para, through vgpud), per program the library's phases (init / copies in / kernels / copies
//! out / close), the GPU-side time, the whole run and, in a VM, the guest's boot and the
//! program's time in the guest. Every run must PASS its own CPU check.
//!
//! Writes `--out DIR/summary.json`, `apps.csv` (one row per program, configuration and
//! repetition) and `apps-total.svg` / `apps-gpu.svg` (whole run and GPU-side time relative to
//! native, medians with min–max over the repetitions).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apps_exec::{self, Config, Env, Sample};
use crate::apps_output;
use crate::backend::Backend;
use crate::error::BenchError;
use crate::fairness_procs::{self, Proc};
use crate::progress::Progress;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU engine: sim, or cuda (native then means NVIDIA's libraries, --native-lib).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Output directory (summary.json, apps.csv, apps-total.svg, apps-gpu.svg).
    #[arg(long, default_value = "vgpu-bench-out/apps")]
    pub out: PathBuf,
    /// The suite's programs (apps/build.sh's output; default: target/apps beside this binary's
    /// target directory).
    #[arg(long)]
    pub apps: Option<PathBuf>,
    /// Programs to run (comma separated; default: every program of the suite).
    #[arg(long, value_delimiter = ',')]
    pub programs: Vec<String>,
    /// Problem size passed to every program: small (the software GPU, CI) or large (an H100).
    #[arg(long, default_value = "small", value_parser = ["small", "large"])]
    pub size: String,
    /// Configurations (comma separated): native, inproc (cuda only: the project's library
    /// in-process on the cuda engine), pt, full, para, vgpud.
    #[arg(long, value_delimiter = ',', default_value = "native,full,para")]
    pub configs: Vec<String>,
    /// Runs per program and configuration; figures are medians.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub reps: usize,
    /// Directory of the project's libcudart.so.13 and libcuda.so.1 (default: beside this binary).
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// Directory of NVIDIA's libcudart.so.13 (the native anchor on cuda).
    #[arg(long)]
    pub native_lib: Option<PathBuf>,
    /// Guest RAM of the VMs in MiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(64..=65536))]
    pub memory_mib: u64,
    /// VRAM of each VM (`--gpu vram=`).
    #[arg(long, default_value = "1G")]
    pub vram: String,
    /// Time limit of one run in seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub limit_s: u64,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
    /// The vgpud binary (default: next to this one), for the vgpud configuration.
    #[arg(long)]
    pub vgpud: Option<PathBuf>,
}

/// The runs of one program under one configuration.
pub struct Cell {
    pub program: String,
    pub config: String,
    pub samples: Vec<Sample>,
}

fn exe_dir() -> Result<PathBuf, BenchError> {
    let exe = std::env::current_exe().map_err(|source| BenchError::Io {
        path: "current_exe".into(),
        source,
    })?;
    Ok(exe.parent().map(Path::to_path_buf).unwrap_or_default())
}

fn programs(dir: &Path, wanted: &[String]) -> Result<Vec<String>, BenchError> {
    let list = dir.join("PROGRAMS");
    let text = std::fs::read_to_string(&list).map_err(|source| BenchError::Io {
        path: format!("{} (build the suite: apps/build.sh)", list.display()),
        source,
    })?;
    let all: Vec<String> = text.split_whitespace().map(String::from).collect();
    if wanted.is_empty() {
        return Ok(all);
    }
    for w in wanted {
        if !all.contains(w) {
            return Err(BenchError::Invalid(format!(
                "--programs: `{w}` is not in {} ({})",
                list.display(),
                all.join(", ")
            )));
        }
    }
    Ok(wanted.to_vec())
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let here = exe_dir()?;
    let dir = a.apps.clone().unwrap_or_else(|| here.join("../apps"));
    let progs = programs(&dir, &a.programs)?;
    let configs: Vec<Config> = a
        .configs
        .iter()
        .map(|c| Config::parse(c))
        .collect::<Result<_, _>>()?;
    if a.backend == Backend::Cuda && configs.contains(&Config::Native) && a.native_lib.is_none() {
        return Err(BenchError::Invalid(
            "--backend cuda with native needs --native-lib DIR (NVIDIA's libcudart.so.13)".into(),
        ));
    }
    if a.backend == Backend::Sim && configs.contains(&Config::InProc) {
        return Err(BenchError::Invalid(
            "inproc is native on sim: use native (the project's library in-process)".into(),
        ));
    }
    let lib = a.lib.clone().unwrap_or_else(|| here.clone());
    for f in ["libcudart.so.13", "libcuda.so.1"] {
        if !lib.join(f).exists() {
            return Err(BenchError::Invalid(format!(
                "{} has no {f} (cargo build --release builds it)",
                lib.display()
            )));
        }
    }
    let vmm = fairness_procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    let mut daemon = None;
    let sock = a.out.join("vgpud.sock");
    if configs.contains(&Config::Vgpud) {
        let bin = fairness_procs::sibling(a.vgpud.as_deref(), "vgpud")?;
        let args: Vec<String> = vec![
            "--socket".into(),
            sock.display().to_string(),
            "--sched".into(),
            "policy=timeslice".into(),
        ];
        let mut d = Proc::spawn(&a.out, "vgpud", &bin, &args)?;
        fairness_procs::wait_socket(&mut d, &sock, Duration::from_secs(10))?;
        daemon = Some(d);
    }
    let env = Env {
        backend: a.backend,
        lib: &lib,
        native_lib: a.native_lib.as_deref(),
        vmm: &vmm,
        vgpud_socket: daemon.as_ref().map(|_| sock.as_path()),
        size: &a.size,
        memory_mib: a.memory_mib,
        vram: &a.vram,
        limit: Duration::from_secs(a.limit_s),
    };
    let mut cells = Vec::new();
    let mut bar = Progress::new("apps");
    let total = (progs.len() * configs.len() * a.reps) as f64;
    let mut done = 0.0;
    // Repetitions outermost, so that a slow drift of the host spreads over every cell alike.
    for p in &progs {
        for c in &configs {
            cells.push(Cell {
                program: p.clone(),
                config: c.name(),
                samples: Vec::new(),
            });
        }
    }
    for _ in 0..a.reps {
        for (pi, p) in progs.iter().enumerate() {
            for (ci, c) in configs.iter().enumerate() {
                bar.update(done / total, &format!("{p} {}", c.name()));
                let s = apps_exec::run(&env, &dir, p, c)?;
                if !s.pass {
                    bar.note(&format!("{p} {}: {}", c.name(), s.error));
                }
                cells[pi * configs.len() + ci].samples.push(s);
                done += 1.0;
            }
        }
    }
    bar.finish();
    if let Some(mut d) = daemon {
        d.stop(libc::SIGTERM, Duration::from_secs(5));
    }
    let names: Vec<String> = configs.iter().map(Config::name).collect();
    let line = apps_output::write(&a.out, a.backend, &a.size, &names, &cells)?;
    let failed = cells
        .iter()
        .flat_map(|c| c.samples.iter().map(move |s| (c, s)))
        .filter(|(_, s)| !s.pass)
        .map(|(c, s)| format!("{} {}: {}", c.program, c.config, s.error))
        .collect::<Vec<_>>();
    if !failed.is_empty() {
        return Err(BenchError::Check {
            workload: "apps".into(),
            msg: format!("{} run(s) failed: {}", failed.len(), failed.join("; ")),
        });
    }
    Ok(line)
}
