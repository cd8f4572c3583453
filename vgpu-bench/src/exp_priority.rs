//! `vgpu-bench priority`: one latency-sensitive VM (HP, the `infer` guest: requests of a few
//! kernels with guest think time between them) beside N backlogged VMs (LP, the `fairness`
//! guest), through `vgpud`, in four modes run one after another: `alone` (the HP VM only),
//! `timeslice` (equal priorities), `priority` (HP priority 1, LP 0, `policy=timeslice`, no
//! filling) and `fikit` (the same with `policy=fikit`: LP kernels fill the HP VM's gaps); on
//! cuda then the native anchor (`priority_native`): the same load as plain CUDA processes, HP
//! alone and beside the LP processes under the driver's time-slicing.
//! Per mode: the HP request latency (p50/p99 and the ratio to `alone`), the LP VMs' kernels/s
//! and GPU share, and the GPU utilization from the daemon's report; figures and files in
//! `priority_output`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpud::units::{f64_in, parse_size};

use crate::error::BenchError;
use crate::fairness_calib::{self, Calibration};
use crate::fairness_guest::{self, GuestRun};
use crate::priority_guest::{self, InferRun};
use crate::priority_native;
use crate::priority_output;
use crate::procs::{self, Proc};
use crate::progress::Progress;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory (summary.json, priority.csv, priority-latency.svg, one folder per mode
    /// with vgpud.json and the logs).
    #[arg(long, default_value = "vgpu-bench-out/priority")]
    pub out: PathBuf,
    /// Number of backlogged (LP) VMs beside the HP VM.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub lp: usize,
    /// Seconds of requests of the HP VM per mode (guest time).
    #[arg(long, default_value_t = 10.0, value_parser = f64_in(0.001, 3600.0))]
    pub duration: f64,
    /// Kernel lengths in µs: HP,LP.
    #[arg(long = "kernel-us", value_delimiter = ',', default_value = "500,2000", value_parser = f64_in(1.0, 60_000_000.0))]
    pub kernel_us: Vec<f64>,
    /// Kernels per HP request.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub kernels: u32,
    /// Guest think time between HP requests in µs (guest CPU only).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=60_000_000))]
    pub think_us: u64,
    /// Kernels each LP guest keeps in flight.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub depth: u32,
    /// Threads per CTA of each kernel.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// CTAs of each kernel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub blocks: u32,
    /// VRAM partition of each VM (a power of two, e.g. 64M).
    #[arg(long, default_value = "64M")]
    pub vram_per_vm: String,
    /// Guest RAM of each VM in MiB (default: vgpu-vmm's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=1_048_576))]
    pub vm_memory: Option<u32>,
    /// Milliseconds after the HP VM registered not counted in the GPU figures.
    #[arg(long, default_value_t = 300.0, value_parser = f64_in(0.0, 3_600_000.0))]
    pub ramp_ms: f64,
    /// CI mode: 1 LP VM, 1 s per mode.
    #[arg(long)]
    pub short: bool,
    /// The physical GPU behind the VMs (`--gpu backend=`).
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
    /// Leave out the native anchor (plain CUDA processes, run on `--backend cuda` only).
    #[arg(long)]
    pub no_native: bool,
    /// More scheduler options for the `fikit` mode, appended to its `policy=fikit` (e.g.
    /// `fill_hold=100us`; `scheduler/README.md`, "Configuration").
    #[arg(long)]
    pub fikit_sched: Option<String>,
}

/// One configuration of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    pub name: &'static str,
    /// `vgpud --sched`.
    pub sched: &'static str,
    pub hp_priority: u8,
    /// Whether the LP VMs run.
    pub with_lp: bool,
    /// Plain CUDA processes instead of VMs (`priority_native`).
    pub native: bool,
}

/// The modes, in the order they run (`alone` first: the others are compared with it).
pub const MODES: [Mode; 4] = [
    Mode {
        name: "alone",
        sched: "policy=timeslice",
        hp_priority: 0,
        with_lp: false,
        native: false,
    },
    Mode {
        name: "timeslice",
        sched: "policy=timeslice",
        hp_priority: 0,
        with_lp: true,
        native: false,
    },
    Mode {
        name: "priority",
        sched: "policy=timeslice,fill=off",
        hp_priority: 1,
        with_lp: true,
        native: false,
    },
    Mode {
        name: "fikit",
        sched: "policy=fikit",
        hp_priority: 1,
        with_lp: true,
        native: false,
    },
];

/// The run as resolved from the arguments.
#[derive(Debug, Clone)]
pub struct Plan {
    pub lp: usize,
    pub duration: f64,
    pub hp_kernel_us: f64,
    pub lp_kernel_us: f64,
    pub vram_per_vm: u64,
}

impl Plan {
    pub fn from_args(a: &Args) -> Result<Self, BenchError> {
        let bad = |m: String| Err(BenchError::Invalid(m));
        let (lp, duration) = if a.short {
            (1, 1.0)
        } else {
            (a.lp, a.duration)
        };
        if lp == 0 || lp > 64 {
            return bad(format!("--lp {lp}: 1 to 64"));
        }
        if let Some(extra) = &a.fikit_sched
            && let Err(e) = scheduler::Config::parse(&format!("policy=fikit,{extra}"))
        {
            return bad(format!("--fikit-sched {extra}: {e}"));
        }
        if !(duration.is_finite() && duration > 0.0 && duration <= 3600.0) {
            return bad(format!("--duration {duration}: 0 to 3600 s"));
        }
        let [hp_kernel_us, lp_kernel_us] = a.kernel_us[..] else {
            return bad(format!("--kernel-us {:?}: two lengths, HP,LP", a.kernel_us));
        };
        if ![hp_kernel_us, lp_kernel_us]
            .iter()
            .all(|k| k.is_finite() && *k > 0.0)
        {
            return bad("--kernel-us: positive lengths".into());
        }
        let vram_per_vm = parse_size(&a.vram_per_vm)
            .filter(|v| v.is_power_of_two() && *v >= 2 << 20)
            .ok_or_else(|| {
                BenchError::Invalid(format!(
                    "--vram-per-vm {}: a power of two >= 2M",
                    a.vram_per_vm
                ))
            })?;
        Ok(Plan {
            lp,
            duration,
            hp_kernel_us,
            lp_kernel_us,
            vram_per_vm,
        })
    }

    /// Milliseconds the LP guests run: the HP VM's duration plus room for its boot (the LP VMs
    /// start first and must still be backlogged when the HP VM stops).
    pub fn lp_ms(&self) -> u64 {
        (self.duration * 1e3 * 1.2 + 2000.0).round() as u64
    }

    /// Seconds a VM may run before vgpu-vmm's own timeout stops it.
    pub fn vm_timeout(&self) -> f64 {
        self.lp_ms() as f64 / 1e3 + 30.0 + 0.5 * self.lp as f64
    }
}

/// The HP guest's command line.
pub fn hp_cmdline(a: &Args, plan: &Plan, iters: u32) -> String {
    format!(
        "iters={iters} threads={} blocks={} kernels={} think_us={} ms={} lines=2000",
        a.threads,
        a.blocks,
        a.kernels,
        a.think_us,
        (plan.duration * 1e3).round().max(1.0) as u64
    )
}

/// An LP guest's command line.
pub fn lp_cmdline(a: &Args, plan: &Plan, iters: u32) -> String {
    format!(
        "iters={iters} threads={} blocks={} depth={} ms={} report_ms=100",
        a.threads,
        a.blocks,
        a.depth,
        plan.lp_ms()
    )
}

/// `vgpud --sched` of `mode`: its own, with `--fikit-sched` appended for `fikit`.
pub fn mode_sched(a: &Args, mode: Mode) -> String {
    match (&a.fikit_sched, mode.name) {
        (Some(extra), "fikit") => format!("{},{extra}", mode.sched),
        _ => mode.sched.to_string(),
    }
}

/// What one mode produced.
pub struct ModeRun {
    pub mode: Mode,
    /// The scheduler configuration it ran under (`mode_sched`).
    pub sched: String,
    /// vgpud's report (`None` for the native modes: no daemon).
    pub report: Option<vgpud::Report>,
    pub hp: InferRun,
    pub hp_exit: Option<i32>,
    pub lp: Vec<(GuestRun, Option<i32>)>,
    pub commands: Vec<String>,
}

/// Waits until every process in `vms` exited or `deadline`; false when the daemon died.
fn wait_all(vms: &mut [Proc], daemon: &mut Proc, deadline: Instant) {
    while Instant::now() < deadline && !daemon.poll() {
        if vms.iter_mut().all(|v| v.poll()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one mode in `dir`: the daemon, the LP VMs (until each runs kernels), the HP VM; then
/// waits for all of them and reads the daemon's report.
fn run_mode(
    a: &Args,
    plan: &Plan,
    mode: Mode,
    dir: &Path,
    bins: (&Path, &Path),
    iters: (u32, u32),
    p: &mut Progress,
) -> Result<ModeRun, BenchError> {
    let (vmm, vgpud) = bins;
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let socket = dir.join("vgpud.sock");
    let report_path = dir.join("vgpud.json");
    for f in [&socket, &report_path] {
        let _ = std::fs::remove_file(f);
    }
    let nvm = 1 + if mode.with_lp { plan.lp } else { 0 };
    let vram_total = ((plan.vram_per_vm + (8 << 20)) * nvm as u64).next_multiple_of(2 << 20);
    let dargs = vec![
        "--socket".into(),
        socket.display().to_string(),
        "--sched".into(),
        mode_sched(a, mode),
        "--report".into(),
        report_path.display().to_string(),
        "--vram".into(),
        format!("{}M", vram_total >> 20),
    ];
    let mut daemon = Proc::spawn(dir, "vgpud", vgpud, &dargs)?;
    procs::wait_socket(&mut daemon, &socket, Duration::from_secs(10))?;
    let vm_args = |name: &str, guest: &str, priority: u8, cmdline: String| {
        let mut v = vec![
            "--guest".into(),
            guest.into(),
            "--gpu".into(),
            format!(
                "host={},priority={priority},weight=1,name={name},vram={}M,backend={}{}",
                socket.display(),
                plan.vram_per_vm >> 20,
                a.backend.name(),
                crate::exp_fairness::extra_opts(a.gpu_extra.as_deref())
            ),
            "--cmdline".into(),
            cmdline,
            "--timeout".into(),
            format!("{}", plan.vm_timeout()),
        ];
        if let Some(m) = a.vm_memory {
            v.extend(["--memory".into(), m.to_string()]);
        }
        v
    };
    let mut lps = Vec::new();
    if mode.with_lp {
        for k in 0..plan.lp {
            let args = vm_args(
                &format!("lp{k}"),
                "fairness",
                0,
                lp_cmdline(a, plan, iters.1),
            );
            lps.push(Proc::spawn(dir, &format!("lp{k}"), vmm, &args)?);
        }
        // The HP VM starts once every LP VM keeps the GPU busy.
        let until = Instant::now() + Duration::from_secs_f64(30.0 + plan.lp as f64);
        while Instant::now() < until && !daemon.poll() {
            let mut started = 0;
            for v in lps.iter_mut() {
                let out = std::fs::read_to_string(&v.out).unwrap_or_default();
                started += usize::from(v.poll() || fairness_guest::parse(&out).started);
            }
            p.update(
                0.0,
                &format!(
                    "{}: {started}/{} LP VMs running kernels",
                    mode.name, plan.lp
                ),
            );
            if started == lps.len() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let args = vm_args(
        "hp",
        "infer",
        mode.hp_priority,
        hp_cmdline(a, plan, iters.0),
    );
    let mut hp = Proc::spawn(dir, "hp", vmm, &args)?;
    p.update(0.5, &format!("{}: HP VM running", mode.name));
    let deadline = Instant::now() + Duration::from_secs_f64(plan.vm_timeout() + 5.0);
    wait_all(std::slice::from_mut(&mut hp), &mut daemon, deadline);
    wait_all(&mut lps, &mut daemon, deadline);
    hp.stop(libc::SIGTERM, Duration::from_secs(2));
    for v in &mut lps {
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
            "{}: no VM registered with vgpud; hp ({}): {}",
            mode.name,
            hp.status.map_or("running".into(), |s| s.to_string()),
            hp.stderr_head()
        )));
    }
    let read = |v: &Proc| std::fs::read_to_string(&v.out).unwrap_or_default();
    let mut commands = vec![daemon.command.clone(), hp.command.clone()];
    commands.extend(lps.iter().map(|v| v.command.clone()));
    Ok(ModeRun {
        mode,
        sched: mode_sched(a, mode),
        hp: priority_guest::parse(&read(&hp)),
        hp_exit: hp.code(),
        lp: lps
            .iter()
            .map(|v| (fairness_guest::parse(&read(v)), v.code()))
            .collect(),
        report: Some(report),
        commands,
    })
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let plan = Plan::from_args(a)?;
    let vmm = procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    let vgpud = procs::sibling(a.vgpud.as_deref(), "vgpud")?;
    let mut p = Progress::new("priority");
    p.note(&format!(
        "calibrating lcg_spin on the {} engine",
        a.backend.name()
    ));
    let cal: Calibration = fairness_calib::calibrate(
        a.backend,
        a.threads,
        a.blocks,
        &[plan.hp_kernel_us, plan.lp_kernel_us],
    )?;
    let iters = (
        cal.iters_for(plan.hp_kernel_us),
        cal.iters_for(plan.lp_kernel_us),
    );
    let mut runs = Vec::with_capacity(MODES.len());
    for mode in MODES {
        p.note(&format!("mode {} ({})", mode.name, mode.sched));
        let r = run_mode(
            a,
            &plan,
            mode,
            &a.out.join(mode.name),
            (&vmm, &vgpud),
            iters,
            &mut p,
        )?;
        runs.push(r);
    }
    if a.backend == crate::backend::Backend::Cuda && !a.no_native {
        let bench = std::env::current_exe().map_err(|source| BenchError::Io {
            path: "the vgpu-bench executable".into(),
            source,
        })?;
        for mode in priority_native::NATIVE_MODES {
            p.note(&format!("mode {} ({})", mode.name, mode.sched));
            let dir = a.out.join(mode.name);
            let r = priority_native::run_mode(a, &plan, mode, &dir, &bench, iters, &mut p)?;
            runs.push(r);
        }
    }
    p.finish();
    priority_output::write(
        &a.out,
        &priority_output::Run {
            args: a,
            plan: &plan,
            calibration: &cal,
            iters,
            modes: &runs,
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
    fn plan_and_command_lines() {
        let a = args(&["--lp", "3", "--duration", "2", "--think-us", "700"]);
        let p = Plan::from_args(&a).unwrap();
        assert_eq!((p.lp, p.hp_kernel_us, p.lp_kernel_us), (3, 500.0, 2000.0));
        assert_eq!(
            hp_cmdline(&a, &p, 9),
            "iters=9 threads=32 blocks=1 kernels=2 think_us=700 ms=2000 lines=2000"
        );
        assert_eq!(
            lp_cmdline(&a, &p, 7),
            "iters=7 threads=32 blocks=1 depth=2 ms=4400 report_ms=100"
        );
        let s = Plan::from_args(&args(&["--short", "--lp", "9"])).unwrap();
        assert_eq!((s.lp, s.duration), (1, 1.0));
        assert_eq!(
            MODES.map(|m| m.name),
            ["alone", "timeslice", "priority", "fikit"]
        );
        let t = args(&["--fikit-sched", "fill_hold=100us"]);
        assert!(Plan::from_args(&t).is_ok());
        assert_eq!(mode_sched(&t, MODES[3]), "policy=fikit,fill_hold=100us");
        assert_eq!(mode_sched(&t, MODES[2]), MODES[2].sched);
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--lp", "0"][..],
            &["--kernel-us", "500"],
            &["--kernel-us", "1,2,3"],
            &["--duration", "0"],
            &["--vram-per-vm", "3M"],
            &["--kernels", "17"],
            &["--fikit-sched", "fill_hold=soon"],
            &["--fikit-sched", "nonsense=1"],
        ] {
            let refused = match T::try_parse_from(std::iter::once("t").chain(bad.iter().copied())) {
                Err(e) => e.kind() == clap::error::ErrorKind::ValueValidation,
                Ok(t) => matches!(Plan::from_args(&t.a), Err(BenchError::Invalid(_))),
            };
            assert!(refused, "{bad:?}");
        }
    }
}
