//! The native anchor of `priority` on cuda: the same load as plain CUDA processes, no VMs and
//! no vgpud — the HP process (`native-load --role hp`, the `infer` guest's requests) alone, then
//! beside N LP processes (`--role lp`, the `fairness` guest's backlog), sharing the GPU under the
//! driver's own time-slicing (what FIKIT calls "default GPU sharing"). Every process starts at
//! one agreed wall-clock instant so that their time bases line up; their GPU use is estimated
//! from the work they completed (kernels × calibrated length), since no daemon accounts for it.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::BenchError;
use crate::exp_priority::{Args, Mode, ModeRun, Plan};
use crate::fairness_guest;
use crate::priority_guest;
use crate::procs::Proc;
use crate::progress::Progress;

/// The native modes, run after the VM modes on cuda.
pub const NATIVE_MODES: [Mode; 2] = [
    Mode {
        name: "native-alone",
        sched: "cuda driver",
        hp_priority: 0,
        with_lp: false,
        native: true,
    },
    Mode {
        name: "native",
        sched: "cuda driver time-slicing",
        hp_priority: 0,
        with_lp: true,
        native: true,
    },
];

/// Time every process gets to create its CUDA context before the common start.
const CONTEXT_SETUP: Duration = Duration::from_secs(3);

fn load_args(a: &Args, iters: u32, role: &str, ms: u64, start_at: u64) -> Vec<String> {
    let mut v: Vec<String> = [
        "native-load",
        "--role",
        role,
        "--iters",
        &iters.to_string(),
        "--threads",
        &a.threads.to_string(),
        "--blocks",
        &a.blocks.to_string(),
        "--ms",
        &ms.to_string(),
        "--start-at",
        &start_at.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if role == "hp" {
        v.extend([
            "--kernels".into(),
            a.kernels.to_string(),
            "--think-us".into(),
            a.think_us.to_string(),
        ]);
    } else {
        v.extend(["--depth".into(), a.depth.to_string()]);
    }
    v
}

/// Runs one native mode in `dir` with `bench` (this binary) as the processes.
pub fn run_mode(
    a: &Args,
    plan: &Plan,
    mode: Mode,
    dir: &Path,
    bench: &Path,
    iters: (u32, u32),
    p: &mut Progress,
) -> Result<ModeRun, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let start_at = now_ms + CONTEXT_SETUP.as_millis() as u64;
    let hp_ms = (plan.duration * 1e3).round().max(1.0) as u64;
    // The LP processes outlast the HP one (as the LP VMs do), so it never runs alone.
    let lp_ms = hp_ms + 1000;
    let mut lps = Vec::new();
    if mode.with_lp {
        for k in 0..plan.lp {
            let args = load_args(a, iters.1, "lp", lp_ms, start_at);
            lps.push(Proc::spawn(dir, &format!("lp{k}"), bench, &args)?);
        }
    }
    let args = load_args(a, iters.0, "hp", hp_ms, start_at);
    let mut hp = Proc::spawn(dir, "hp", bench, &args)?;
    p.update(0.5, &format!("{}: native processes running", mode.name));
    let deadline = Instant::now() + CONTEXT_SETUP + Duration::from_millis(lp_ms) + plan_slack(plan);
    while Instant::now() < deadline {
        if hp.poll() && lps.iter_mut().all(|v| v.poll()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    hp.stop(libc::SIGTERM, Duration::from_secs(2));
    for v in &mut lps {
        v.stop(libc::SIGTERM, Duration::from_secs(2));
    }
    let read = |v: &Proc| std::fs::read_to_string(&v.out).unwrap_or_default();
    let hp_run = priority_guest::parse(&read(&hp));
    if !hp_run.started {
        return Err(BenchError::Invalid(format!(
            "{}: the native HP process did not start ({}): {}",
            mode.name,
            hp.status.map_or("running".into(), |s| s.to_string()),
            hp.stderr_head()
        )));
    }
    let mut commands = vec![hp.command.clone()];
    commands.extend(lps.iter().map(|v| v.command.clone()));
    Ok(ModeRun {
        mode,
        sched: mode.sched.to_string(),
        report: None,
        hp: hp_run,
        hp_exit: hp.code(),
        lp: lps
            .iter()
            .map(|v| (fairness_guest::parse(&read(v)), v.code()))
            .collect(),
        commands,
    })
}

/// Room past the planned end before the processes are stopped.
fn plan_slack(plan: &Plan) -> Duration {
    Duration::from_secs_f64(10.0 + 0.5 * plan.lp as f64)
}
