//! `vgpu-bench fairness`: N VMs share one GPU through `vgpud`. Calibrates the `lcg_spin`
//! kernel on this host, starts the daemon with the chosen policy, starts N `vgpu-vmm --guest
//! fairness --gpu host=SOCKET,weight=W,...` processes that keep their channel backlogged for
//! `--duration`, stops the daemon (it writes its report), and turns the report and the guests'
//! lines into figures (`fairness_metrics`) and files (`fairness_output`).

use std::path::PathBuf;
use std::time::{Duration, Instant};
use vgpud::units::{f64_in, parse_size};

use crate::error::BenchError;
use crate::fairness_calib::{self, Calibration};
use crate::fairness_guest;
use crate::fairness_metrics::{self, VmSpec};
use crate::fairness_native;
use crate::fairness_output::{self, Run, VmRun};
use crate::fairness_restart::Restarter;
use crate::fairness_window;
use crate::procs::{self, Proc};
use crate::progress::Progress;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory (summary.json, fairness.csv, SVG plots, vgpud.json, logs).
    #[arg(long, default_value = "vgpu-bench-out/fairness")]
    pub out: PathBuf,
    /// Number of VMs.
    #[arg(long, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub vms: usize,
    /// GPUs of the daemon (`vgpud --gpus N`: sim, N software GPUs; cuda, devices 0..N-1). The
    /// daemon places the VMs (most free VRAM, then least load: an even spread); the figures are
    /// given per GPU as well (Jain's index within each GPU's VMs).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus: u32,
    /// Pin VM k to the daemon's GPU k mod `--gpus` (`--gpu gpu=`) instead of letting the daemon
    /// place it: the VMs register in whatever order they boot, so which VMs share a GPU is
    /// otherwise a race (e.g. `--gpus 2 --vms 4 --kernel-us 500,500,2000,2000 --pin-gpus`: one
    /// 500 µs and one 2000 µs VM per GPU).
    #[arg(long)]
    pub pin_gpus: bool,
    /// Scheduling policy of the daemon: fifo, credit, band, timeslice.
    #[arg(long, default_value = "timeslice")]
    pub policy: String,
    /// More scheduler configuration for the daemon (`key=value,...`, e.g. `slice=1ms`).
    #[arg(long, default_value = "")]
    pub sched: String,
    /// Weights, cycled over the VMs (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub weights: Vec<u32>,
    /// Kernel lengths in µs, cycled over the VMs (comma separated).
    #[arg(long = "kernel-us", value_delimiter = ',', default_value = "500,5000", value_parser = f64_in(1.0, 60_000_000.0))]
    pub kernel_us: Vec<f64>,
    /// Seconds each guest keeps its GPU busy (guest time from its first kernel).
    #[arg(long, default_value_t = 10.0, value_parser = f64_in(0.001, 3600.0))]
    pub duration: f64,
    /// VRAM partition of each VM (a power of two, e.g. 64M).
    #[arg(long, default_value = "64M")]
    pub vram_per_vm: String,
    /// Guest RAM of each VM in MiB (default: vgpu-vmm's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=1_048_576))]
    pub vm_memory: Option<u32>,
    /// Kernels each guest keeps in flight.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub depth: u32,
    /// Threads per CTA of each kernel.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// CTAs of each kernel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub blocks: u32,
    /// More guest arguments, appended to the command line (e.g. `wait=poll`, driver options).
    #[arg(long, default_value = "")]
    pub guest_args: String,
    /// Milliseconds after the first GPU use not counted in the figures (start-up ramp).
    #[arg(long, default_value_t = 300.0, value_parser = f64_in(0.0, 3_600_000.0))]
    pub ramp_ms: f64,
    /// Jain's index is also computed over windows that hold this many turns of every VM
    /// (`fairness_window`: max(daemon window, rounds × VMs × slice), in whole daemon windows).
    #[arg(long, default_value_t = crate::fairness_window::ROUNDS, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub jain_rounds: u32,
    /// CI mode: 2 VMs for 1 s.
    #[arg(long)]
    pub short: bool,
    /// The physical GPU behind the VMs (`--gpu backend=`): the built-in software GPU, or an
    /// NVIDIA GPU through CUDA (each VM process its own CUDA context; the daemon time-slices).
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: crate::backend::Backend,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
    /// The vgpud binary (default: next to this one).
    #[arg(long)]
    pub vgpud: Option<PathBuf>,
    /// More `--gpu` options for every VM (e.g. `preempt=checkpoint`), appended after the
    /// experiment's own.
    #[arg(long)]
    pub gpu_extra: Option<String>,
    /// A baseline run after the VMs: `native` = the same load as plain CUDA processes sharing
    /// the GPU under the driver's time-slicing (cuda only; weights are not applied).
    #[arg(long, value_enum, default_value = "none")]
    pub baseline: Baseline,
    /// Kill vgpud with SIGKILL this many milliseconds after every guest runs kernels, and start
    /// it again on the same socket (the VMs re-register); `restart.json` says what it cost
    /// (`fairness_restart`). The figures are then the restarted daemon's.
    #[arg(long, value_name = "MS", value_parser = f64_in(0.0, 3_600_000.0))]
    pub kill_daemon_at: Option<f64>,
    /// Run vgpud on these CPUs only (`15`, `14-15`) and every VM on the others this process
    /// may use, as a host keeps housekeeping cores for its control plane (`vgpu-bench/src/cpus.rs`).
    /// Default: every process on every CPU.
    #[arg(long, value_name = "LIST", value_parser = |s: &str| s.parse::<crate::cpus::CpuList>())]
    pub daemon_cpus: Option<crate::cpus::CpuList>,
    /// Keep these CPUs (one range, `14` or `12-13`) for the thread that holds the GPU: every
    /// VM's worker moves onto them while it waits for or holds a grant (`--gpu cpus=`,
    /// vgpu/src/host/pin.rs) and the VMs run on the other CPUs (those `--daemon-cpus` leaves),
    /// as a real GPU's processors are not the vCPUs'. Meant for sim, whose GPU is that thread.
    #[arg(long, value_name = "LIST", value_parser = |s: &str| s.parse::<crate::cpus::CpuList>())]
    pub gpu_cpus: Option<crate::cpus::CpuList>,
}

/// `--baseline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Baseline {
    /// No baseline.
    None,
    /// Plain CUDA processes (`fairness_native`).
    Native,
}

/// The run as resolved from the arguments.
#[derive(Debug, Clone)]
pub struct Plan {
    pub vms: usize,
    pub duration: f64,
    pub sched: String,
    pub weights: Vec<u32>,
    pub kernel_us: Vec<f64>,
    pub vram_per_vm: u64,
}

impl Plan {
    pub fn from_args(a: &Args) -> Result<Self, BenchError> {
        let bad = |m: String| Err(BenchError::Invalid(m));
        let (vms, duration) = if a.short {
            (2, 1.0)
        } else {
            (a.vms, a.duration)
        };
        if a.baseline == Baseline::Native && a.backend != crate::backend::Backend::Cuda {
            return bad("--baseline native: needs --backend cuda (plain CUDA processes)".into());
        }
        if vms == 0 || vms > 256 {
            return bad(format!("--vms {vms}: 1 to 256"));
        }
        if !(duration.is_finite() && duration > 0.0 && duration <= 3600.0) {
            return bad(format!("--duration {duration}: 0 to 3600 s"));
        }
        if a.weights.is_empty() || a.weights.contains(&0) {
            return bad("--weights: positive integers".into());
        }
        if a.kernel_us.is_empty() || a.kernel_us.iter().any(|k| !(k.is_finite() && *k > 0.0)) {
            return bad("--kernel-us: positive lengths".into());
        }
        if !(1..=16).contains(&a.depth) || !(1..=1024).contains(&a.threads) || a.blocks == 0 {
            return bad("--depth 1..=16, --threads 1..=1024, --blocks >= 1".into());
        }
        let vram_per_vm = parse_size(&a.vram_per_vm)
            .filter(|v| v.is_power_of_two() && *v >= 2 << 20)
            .ok_or_else(|| {
                BenchError::Invalid(format!(
                    "--vram-per-vm {}: a power of two >= 2M",
                    a.vram_per_vm
                ))
            })?;
        let policy = a.policy.trim();
        if policy.is_empty() || policy.contains([',', '=']) {
            return bad(format!("--policy {policy:?}: one policy name"));
        }
        let extra = a.sched.trim().trim_matches(',');
        let sched = if extra.is_empty() {
            format!("policy={policy}")
        } else {
            format!("policy={policy},{extra}")
        };
        Ok(Plan {
            vms,
            duration,
            sched,
            weights: (0..vms).map(|k| a.weights[k % a.weights.len()]).collect(),
            kernel_us: (0..vms)
                .map(|k| a.kernel_us[k % a.kernel_us.len()])
                .collect(),
            vram_per_vm,
        })
    }

    /// Seconds a VM may run before vgpu-vmm's own timeout stops it: the duration plus boot
    /// (the VMs start one after another and share the host's cores) and drain.
    pub fn vm_timeout(&self) -> f64 {
        self.duration + 30.0 + 0.5 * self.vms as f64
    }
}

/// The guest's command line.
fn guest_cmdline(a: &Args, plan: &Plan, iters: u32) -> String {
    let base = format!(
        "iters={iters} threads={} blocks={} depth={} ms={} report_ms=100",
        a.threads,
        a.blocks,
        a.depth,
        (plan.duration * 1e3).round() as u64
    );
    match a.guest_args.trim() {
        "" => base,
        extra => format!("{base} {extra}"),
    }
}

/// `,OPTIONS` for `--gpu-extra` (empty when none).
pub fn extra_opts(extra: Option<&str>) -> String {
    match extra.map(str::trim) {
        Some(e) if !e.is_empty() => format!(",{e}"),
        _ => String::new(),
    }
}

/// `,gpu=N` for VM `k` with `--pin-gpus` (GPU k mod `--gpus`; empty without).
fn pin_opt(a: &Args, k: usize) -> String {
    if a.pin_gpus {
        format!(",gpu={}", k as u32 % a.gpus)
    } else {
        String::new()
    }
}

/// Waits for the VMs to finish (or the deadline), showing progress.
fn watch(
    vms: &mut [Proc],
    daemon: &mut Proc,
    plan: &Plan,
    p: &mut Progress,
    mut restart: Option<&mut Restarter>,
) -> Result<(), BenchError> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(plan.vm_timeout() + 5.0);
    let dur_ms = plan.duration * 1e3;
    let mut last_scan: Option<Instant> = None;
    loop {
        let mut running = 0;
        for v in vms.iter_mut() {
            running += usize::from(!v.poll());
        }
        if running == 0 || daemon.poll() || Instant::now() >= deadline {
            break;
        }
        if last_scan.is_none_or(|t| t.elapsed() >= Duration::from_millis(500)) {
            last_scan = Some(Instant::now());
            let (mut frac, mut done, mut started) = (0.0, 0, 0);
            for v in vms.iter() {
                let g = fairness_guest::parse(&std::fs::read_to_string(&v.out).unwrap_or_default());
                started += usize::from(g.started);
                done += g.done();
                frac += if v.status.is_some() || g.end.is_some() {
                    1.0
                } else {
                    g.progress.last().map_or(0.0, |x| x.0 as f64 / dur_ms)
                };
            }
            if let Some(r) = restart.as_deref_mut() {
                r.tick(started, vms.len(), daemon)?;
            }
            p.update(
                frac / vms.len() as f64,
                &format!(
                    "{started}/{} guests running kernels, {done} kernels, {:.0} s",
                    vms.len(),
                    start.elapsed().as_secs_f64()
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    p.finish();
    Ok(())
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let plan = Plan::from_args(a)?;
    let vmm = procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    let vgpud = procs::sibling(a.vgpud.as_deref(), "vgpud")?;
    std::fs::create_dir_all(&a.out).map_err(|source| BenchError::Io {
        path: a.out.display().to_string(),
        source,
    })?;
    let mut p = Progress::new("fairness");
    p.note(&format!(
        "calibrating lcg_spin on the {} engine",
        a.backend.name()
    ));
    let cal: Calibration =
        fairness_calib::calibrate(a.backend, a.threads, a.blocks, &plan.kernel_us)?;
    let iters: Vec<u32> = plan.kernel_us.iter().map(|&us| cal.iters_for(us)).collect();
    let socket = a.out.join("vgpud.sock");
    let report_path = a.out.join("vgpud.json");
    for f in [&socket, &report_path] {
        let _ = std::fs::remove_file(f);
    }
    // A VM asks for its VRAM plus the guard bands on both sides of its partition (2 MiB each
    // by default): 8 MiB of slack per VM covers them.
    // Per GPU: room for its share of the VMs (placement spreads them evenly).
    let per_gpu_vms = plan.vms.div_ceil(a.gpus as usize) as u64;
    let vram_total = ((plan.vram_per_vm + (8 << 20)) * per_gpu_vms).next_multiple_of(2 << 20);
    let dargs = vec![
        "--socket".into(),
        socket.display().to_string(),
        "--sched".into(),
        plan.sched.clone(),
        "--report".into(),
        report_path.display().to_string(),
        "--vram".into(),
        format!("{}M", vram_total >> 20),
        "--gpus".into(),
        a.gpus.to_string(),
    ];
    let (daemon_cpus, vm_cpus) = match &a.daemon_cpus {
        Some(d) => {
            let (d, v) = crate::cpus::split(&crate::cpus::allowed()?, &d.0)
                .map_err(|e| BenchError::Invalid(format!("--daemon-cpus: {e}")))?;
            (Some(d), Some(v))
        }
        None => (None, None),
    };
    let (gpu_cpus_key, vm_cpus) = match &a.gpu_cpus {
        Some(g) => {
            // One grant holder per GPU: a CPU each (the VMs' `cpus=` is one set).
            if g.0.len() < a.gpus as usize {
                return Err(BenchError::Invalid(format!(
                    "--gpu-cpus: {} CPU(s) for {} GPUs (one per GPU)",
                    g.0.len(),
                    a.gpus
                )));
            }
            let allowed = crate::cpus::allowed()?;
            let vms = vm_cpus.unwrap_or_else(|| allowed.clone());
            let (key, rest) = crate::cpus::reserve_gpu(&allowed, &vms, &g.0)
                .map_err(|e| BenchError::Invalid(format!("--gpu-cpus: {e}")))?;
            (format!(",cpus={key}"), Some(rest))
        }
        None => (String::new(), vm_cpus),
    };
    let mut daemon = Proc::spawn_on(&a.out, "vgpud", &vgpud, &dargs, &[], daemon_cpus.as_deref())?;
    procs::wait_socket(&mut daemon, &socket, Duration::from_secs(10))?;
    p.note(&format!(
        "vgpud up ({}); starting {} VMs",
        plan.sched, plan.vms
    ));
    let mut vms = Vec::with_capacity(plan.vms);
    for (k, it) in iters.iter().enumerate() {
        let pin = pin_opt(a, k);
        let mut args = vec![
            "--guest".into(),
            "fairness".into(),
            "--gpu".into(),
            format!(
                "host={},weight={},name=vm{k},vram={}M,backend={}{pin}{gpu_cpus_key}{}",
                socket.display(),
                plan.weights[k],
                plan.vram_per_vm >> 20,
                a.backend.name(),
                extra_opts(a.gpu_extra.as_deref())
            ),
            "--cmdline".into(),
            guest_cmdline(a, &plan, *it),
            "--timeout".into(),
            format!("{}", plan.vm_timeout()),
        ];
        if let Some(m) = a.vm_memory {
            args.extend(["--memory".into(), m.to_string()]);
        }
        vms.push(Proc::spawn_on(
            &a.out,
            &format!("vm{k}"),
            &vmm,
            &args,
            &[],
            vm_cpus.as_deref(),
        )?);
    }
    let mut restarter = a
        .kill_daemon_at
        .map(|ms| Restarter::new(ms, &a.out, &vgpud, &dargs, &socket, daemon_cpus.clone()));
    watch(&mut vms, &mut daemon, &plan, &mut p, restarter.as_mut())?;
    // Guests that have not ended by now will not: stop them, then the daemon.
    for v in &mut vms {
        v.stop(libc::SIGTERM, Duration::from_secs(2));
    }
    daemon.stop(libc::SIGTERM, Duration::from_secs(10));
    let text = std::fs::read_to_string(&report_path).map_err(|source| BenchError::Io {
        path: report_path.display().to_string(),
        source,
    })?;
    let report: vgpud::Report = serde_json::from_str(&text)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", report_path.display())))?;
    if report.vms.is_empty() {
        return Err(BenchError::Invalid(format!(
            "no VM registered with vgpud; vm0 ({}): {}",
            vms[0].status.map_or("running".into(), |s| s.to_string()),
            vms[0].stderr_head()
        )));
    }
    if let Some(r) = &restarter {
        let line = crate::fairness_restart::summarize(r, &a.out, &vms, &report)?;
        p.note(&line);
    }
    let specs: Vec<VmSpec> = (0..plan.vms)
        .map(|k| VmSpec {
            name: format!("vm{k}"),
            weight: plan.weights[k],
        })
        .collect();
    let ramp_ns = (a.ramp_ms.max(0.0) * 1e6) as u64;
    let figures = fairness_metrics::compute(&report, &specs, ramp_ns)?;
    let slice_window = fairness_window::choose(
        report.window_ns,
        plan.vms,
        &plan.sched,
        &plan.kernel_us,
        a.jain_rounds,
    )?;
    let slice_figures = fairness_metrics::compute(
        &fairness_window::regroup(&report, slice_window.daemon_windows),
        &specs,
        ramp_ns,
    )?;
    let gpus = fairness_metrics::per_gpu(&report, &specs, ramp_ns)?;
    let native = match a.baseline {
        Baseline::None => None,
        Baseline::Native => {
            p.note("baseline: the same load as plain CUDA processes");
            let bench = std::env::current_exe().map_err(|source| BenchError::Io {
                path: "the vgpu-bench executable".into(),
                source,
            })?;
            Some(fairness_native::run(a, &plan, &bench, &iters, &a.out)?)
        }
    };
    let vm_runs: Vec<VmRun> = vms
        .iter()
        .enumerate()
        .map(|(k, v)| VmRun {
            name: v.name.clone(),
            weight: plan.weights[k],
            kernel_us: plan.kernel_us[k],
            iters: iters[k],
            guest: fairness_guest::parse(&std::fs::read_to_string(&v.out).unwrap_or_default()),
            exit_code: v.code(),
            command: v.command.clone(),
        })
        .collect();
    fairness_output::write(
        &a.out,
        &Run {
            policy: a.policy.trim(),
            plan: &plan,
            args: a,
            calibration: &cal,
            daemon_command: &daemon.command,
            report: &report,
            vms: &vm_runs,
            figures: &figures,
            slices: (&slice_window, &slice_figures),
            gpus: &gpus,
            native: native.as_ref(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn args(extra: &[&str]) -> Args {
        T::parse_from(std::iter::once("t").chain(extra.iter().copied())).a
    }

    #[test]
    fn lists_are_cycled_and_sched_is_built() {
        let a = args(&[
            "--vms",
            "5",
            "--weights",
            "1,2",
            "--kernel-us",
            "500",
            "--policy",
            "credit",
            "--sched",
            "credit_period=50ms",
        ]);
        let p = Plan::from_args(&a).unwrap();
        assert_eq!(p.weights, [1, 2, 1, 2, 1]);
        assert_eq!(p.kernel_us, [500.0; 5]);
        assert_eq!(p.sched, "policy=credit,credit_period=50ms");
        assert_eq!(p.vram_per_vm, 64 << 20);
        assert_eq!(
            guest_cmdline(&a, &p, 77),
            "iters=77 threads=32 blocks=1 depth=2 ms=10000 report_ms=100"
        );
        let g = args(&["--guest-args", " wait=poll "]);
        assert!(guest_cmdline(&g, &p, 5).ends_with("report_ms=100 wait=poll"));
        let s = Plan::from_args(&args(&["--short", "--vms", "9"])).unwrap();
        assert_eq!(
            (s.vms, s.duration, s.sched.as_str()),
            (2, 1.0, "policy=timeslice")
        );
    }

    #[test]
    fn pinned_vms_go_round_the_gpus() {
        let a = args(&["--gpus", "2", "--vms", "4", "--pin-gpus"]);
        let pins: Vec<String> = (0..4).map(|k| pin_opt(&a, k)).collect();
        assert_eq!(pins, [",gpu=0", ",gpu=1", ",gpu=0", ",gpu=1"]);
        assert_eq!(pin_opt(&args(&["--gpus", "2"]), 1), "");
    }

    #[test]
    fn extra_gpu_options_are_appended() {
        assert_eq!(extra_opts(None), "");
        assert_eq!(extra_opts(Some("  ")), "");
        assert_eq!(
            extra_opts(Some("preempt=checkpoint")),
            ",preempt=checkpoint"
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        use clap::Parser;
        for bad in [
            &["--vms", "0"][..],
            &["--weights", "1,0"],
            &["--kernel-us=-5"],
            &["--duration", "0"],
            &["--vram-per-vm", "3M"],
            &["--policy", "timeslice,slice=1ms"],
            &["--depth", "17"],
        ] {
            // Out-of-range numbers are refused by the parser, the rest by the plan.
            let refused = match T::try_parse_from(std::iter::once("t").chain(bad.iter().copied())) {
                Err(e) => e.kind() == clap::error::ErrorKind::ValueValidation,
                Ok(t) => matches!(Plan::from_args(&t.a), Err(BenchError::Invalid(_))),
            };
            assert!(refused, "{bad:?}");
        }
    }
}
