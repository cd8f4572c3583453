//! `vgpu-bench apps`: the project's CUDA application suite (apps/, unmodified nvcc-built
//! programs) run as GPUvm ran Gdev's and Rodinia's programs: natively and in VMs (pt, full,
//! para, through vgpud), per program the library's phases (init / copies in / kernels / copies
//! out / close), the GPU-side time, the whole run and, in a VM, the guest's boot and the
//! program's time in the guest. Every run must PASS its own CPU check.
//!
//! `--preempt M,...` (issue 23) runs every configuration also under each preemption method
//! (`CONFIG+M`) and reports the method the engine used and the time against the configuration
//! without it (`apps_preempt`); `--preempt-test SEED[:N]` (in-process runs: sim's native, cuda's
//! inproc) also preempts every launch at random moments, so the programs' own checks (and their
//! checksums against the runs without the method) say whether a method kept their results
//! right.
//!
//! Writes `--out DIR/summary.json`, `apps.csv` (one row per program, configuration and
//! repetition) and `apps-total.svg` / `apps-gpu.svg` (whole run and GPU-side time relative to
//! native, medians with min–max over the repetitions).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apps_exec::{self, Config, Env, Sample};
use crate::apps_output;
use crate::apps_preempt;
use crate::backend::Backend;
use crate::error::BenchError;
use crate::procs::{self, Proc};
use crate::progress::Progress;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU engine: sim, or cuda (native then means NVIDIA's libraries, --native-lib).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Output directory (summary.json, apps.csv, apps-total.svg, apps-gpu.svg; vm-stats.json:
    /// the last VM run's `--stats`, replaced by every VM run).
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
    /// Preemption methods (comma separated: slice, checkpoint, restart, auto): every
    /// configuration also runs under each (`CONFIG+METHOD`: a VM's `--gpu preempt=M`, an
    /// in-process run's `VGPU_CUDA_PREEMPT=M`), reported against the same configuration
    /// without it (never-preempted overhead) with the method the engine used.
    #[arg(long, value_delimiter = ',')]
    pub preempt: Vec<String>,
    /// With --preempt: in-process runs under a method (sim's native, cuda's inproc) preempt
    /// every launch up to N times (default 3) at seeded random moments
    /// (`VGPU_CUDA_PREEMPT_TEST=SEED[:N]`): a correctness run (the programs' checks, their
    /// checksums against the runs without the method), whose times are not overheads.
    #[arg(long, value_name = "SEED[:N]")]
    pub preempt_test: Option<String>,
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

/// Whether `config` runs the project's library (the one a method applies to): every
/// configuration but native on cuda (NVIDIA's).
fn preemptible(backend: Backend, config: &Config) -> bool {
    !(backend == Backend::Cuda && *config == Config::Native)
}

/// What runs: every configuration as it is, then each one the methods apply to under each
/// method (`CONFIG+METHOD`).
fn variants<'a>(
    backend: Backend,
    configs: &[Config],
    preempt: &'a [String],
) -> Vec<(Config, Option<&'a str>, String)> {
    let mut runs: Vec<(Config, Option<&str>, String)> = configs
        .iter()
        .map(|c| (c.clone(), None, c.name()))
        .collect();
    for m in preempt {
        for c in configs.iter().filter(|c| preemptible(backend, c)) {
            runs.push((
                c.clone(),
                Some(m.as_str()),
                apps_preempt::variant(&c.name(), m),
            ));
        }
    }
    runs
}

/// `--preempt` names known methods, once each, and has a configuration to apply to;
/// `--preempt-test` comes with `--preempt` and on sim only.
fn check_preempt(a: &Args, configs: &[Config]) -> Result<(), BenchError> {
    for (i, m) in a.preempt.iter().enumerate() {
        if !apps_preempt::METHODS.contains(&m.as_str()) {
            return Err(BenchError::Invalid(format!(
                "--preempt: unknown method `{m}` ({})",
                apps_preempt::METHODS.join(", ")
            )));
        }
        if a.preempt[..i].contains(m) {
            return Err(BenchError::Invalid(format!("--preempt: `{m}` twice")));
        }
    }
    if !a.preempt.is_empty() && !configs.iter().any(|c| preemptible(a.backend, c)) {
        return Err(BenchError::Invalid(
            "--preempt applies to the project's library: add inproc or a VM configuration \
             (native on cuda is NVIDIA's)"
                .into(),
        ));
    }
    if let Some(t) = &a.preempt_test {
        if a.preempt.is_empty() {
            return Err(BenchError::Invalid(
                "--preempt-test needs --preempt (the methods to preempt under)".into(),
            ));
        }
        if !configs
            .iter()
            .any(|c| !c.is_vm() && preemptible(a.backend, c))
        {
            return Err(BenchError::Invalid(
                "--preempt-test preempts in-process runs of the project's library: add native \
                 (sim) or inproc (cuda)"
                    .into(),
            ));
        }
        let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let valid = match t.split_once(':') {
            Some((s, n)) => ok(s) && ok(n),
            None => ok(t),
        };
        if !valid {
            return Err(BenchError::Invalid(format!(
                "--preempt-test {t:?}: SEED or SEED:N (decimal)"
            )));
        }
    }
    Ok(())
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
    check_preempt(a, &configs)?;
    let lib = a.lib.clone().unwrap_or_else(|| here.clone());
    for f in ["libcudart.so.13", "libcuda.so.1"] {
        if !lib.join(f).exists() {
            return Err(BenchError::Invalid(format!(
                "{} has no {f} (cargo build --release builds it)",
                lib.display()
            )));
        }
    }
    let vmm = procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    let mut daemon = None;
    let vm_stats = a.out.join("vm-stats.json");
    let sock = a.out.join("vgpud.sock");
    if configs.contains(&Config::Vgpud) {
        let bin = procs::sibling(a.vgpud.as_deref(), "vgpud")?;
        let args: Vec<String> = vec![
            "--socket".into(),
            sock.display().to_string(),
            "--sched".into(),
            "policy=timeslice".into(),
        ];
        let mut d = Proc::spawn(&a.out, "vgpud", &bin, &args)?;
        procs::wait_socket(&mut d, &sock, Duration::from_secs(10))?;
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
        preempt_test: a.preempt_test.as_deref(),
        vm_stats: &vm_stats,
    };
    let runs = variants(a.backend, &configs, &a.preempt);
    let mut cells = Vec::new();
    let mut bar = Progress::new("apps");
    let total = (progs.len() * runs.len() * a.reps) as f64;
    let mut done = 0.0;
    // Repetitions outermost, so that a slow drift of the host spreads over every cell alike.
    for p in &progs {
        for (_, _, name) in &runs {
            cells.push(Cell {
                program: p.clone(),
                config: name.clone(),
                samples: Vec::new(),
            });
        }
    }
    for _ in 0..a.reps {
        for (pi, p) in progs.iter().enumerate() {
            for (ci, (c, m, name)) in runs.iter().enumerate() {
                bar.update(done / total, &format!("{p} {name}"));
                let s = apps_exec::run(&env, &dir, p, c, *m)?;
                if !s.pass {
                    bar.note(&format!("{p} {name}: {}", s.error));
                }
                cells[pi * runs.len() + ci].samples.push(s);
                done += 1.0;
            }
        }
    }
    bar.finish();
    if let Some(mut d) = daemon {
        d.stop(libc::SIGTERM, Duration::from_secs(5));
    }
    let names: Vec<String> = runs.iter().map(|(_, _, n)| n.clone()).collect();
    let forced = a.preempt_test.is_some();
    let line = apps_output::write(&a.out, a.backend, &a.size, &names, &cells, forced)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    fn check(args: &[&str]) -> Result<Vec<String>, String> {
        let cli = Cli::try_parse_from(std::iter::once("apps").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let configs: Vec<Config> = cli
            .a
            .configs
            .iter()
            .map(|c| Config::parse(c))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        check_preempt(&cli.a, &configs).map_err(|e| e.to_string())?;
        Ok(variants(cli.a.backend, &configs, &cli.a.preempt)
            .into_iter()
            .map(|(_, _, n)| n)
            .collect())
    }

    #[test]
    fn every_configuration_also_runs_under_each_method() {
        assert_eq!(
            check(&["--configs", "native,full", "--preempt", "checkpoint,auto"]).unwrap(),
            [
                "native",
                "full",
                "native+checkpoint",
                "full+checkpoint",
                "native+auto",
                "full+auto"
            ]
        );
        // On cuda, native is NVIDIA's library: no method applies to it.
        assert_eq!(
            check(&[
                "--backend",
                "cuda",
                "--configs",
                "native,inproc",
                "--preempt",
                "auto"
            ])
            .unwrap(),
            ["native", "inproc", "inproc+auto"]
        );
        assert_eq!(check(&["--configs", "full"]).unwrap(), ["full"]);
    }

    #[test]
    fn bad_preempt_options_are_refused() {
        let err = |a: &[&str]| check(a).expect_err("refused");
        assert!(err(&["--preempt", "sometimes"]).contains("unknown method"));
        assert!(err(&["--preempt", "auto,auto"]).contains("twice"));
        assert!(
            err(&[
                "--backend",
                "cuda",
                "--configs",
                "native",
                "--preempt",
                "auto"
            ])
            .contains("inproc or a VM")
        );
        assert!(err(&["--preempt-test", "3"]).contains("needs --preempt"));
        assert!(err(&["--preempt", "auto", "--preempt-test", "3:x"]).contains("SEED"));
        // Forced preemptions are the in-process library's: a VM alone, or NVIDIA's library
        // alone, has nothing to force them in.
        for configs in [["sim", "full"], ["cuda", "native,full"]] {
            assert!(
                err(&[
                    "--backend",
                    configs[0],
                    "--configs",
                    configs[1],
                    "--preempt",
                    "auto",
                    "--preempt-test",
                    "3"
                ])
                .contains("in-process"),
                "{configs:?}"
            );
        }
        assert!(
            check(&[
                "--backend",
                "cuda",
                "--configs",
                "inproc",
                "--preempt",
                "auto",
                "--preempt-test",
                "3"
            ])
            .is_ok()
        );
        assert!(
            check(&[
                "--configs",
                "native",
                "--preempt",
                "auto",
                "--preempt-test",
                "3:2"
            ])
            .is_ok()
        );
    }
}
