//! `vgpu-bench soak`: many VMs sharing a GPU through `vgpud` for a long time while things go
//! wrong on purpose (issue 25). `--vms` fairness guests run through one daemon, each with a
//! VRAM working set that is rewritten all the time and compared byte for byte at its end; a VM
//! that ends is replaced by a fresh one. Every `--action-every-ms` one random action hits the
//! system (`soak_actions.rs`): the daemon SIGKILLed and started again on the same socket, a VM
//! SIGKILLed, paused and resumed, snapshotted (paused, or live) and left running, snapshotted
//! and restored as a new process, or migrated (stop-and-copy or live) to a new `--incoming`
//! process. At the end no new VM starts, the running ones finish, and the run checks:
//! - every VM that was not killed on purpose ended with exit code 0 and every result correct
//!   (kernel outputs and the working set), wherever it was moved or restored to;
//! - the daemon leaked nothing (`soak_leak.rs`): its open descriptors and resident memory once
//!   every VM is gone, against a fresh daemon's with no VM (sampled all along: `samples` in
//!   summary.json), and its GPUs' VRAM partitions all back to free (and no channel in use, no
//!   VM registered) in the report the last daemon writes at its exit (`daemon.vram_end`).
//!
//! Writes `--out DIR/summary.json` (counts per action and outcome, the VM results, the
//! samples, the verdict) and `soak.csv` (one row per action). The exit status is non-zero when
//! the verdict fails.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::BenchError;
use crate::procs::{self, Proc};
use crate::report;
use crate::soak_actions::{Action, Soak};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU engine of the VMs (sim, or cuda).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Output directory (summary.json, soak.csv, the VMs' logs).
    #[arg(long, default_value = "vgpu-bench-out/soak")]
    pub out: PathBuf,
    /// Seconds of actions (the VMs then finish).
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub duration_s: u64,
    /// VMs running at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=128))]
    pub vms: u64,
    /// Guest seconds of kernels of each VM (then it ends and a new one takes its place).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub vm_seconds: u64,
    /// Milliseconds between two actions.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub action_every_ms: u64,
    /// Seed of the action choice (the run is reproducible in its choices, not its timing).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The actions to draw from (comma-separated; default all): daemon-restart, vm-kill,
    /// pause, snapshot, snapshot-restore, migrate.
    #[arg(long, value_delimiter = ',')]
    pub actions: Vec<Action>,
    /// The daemon's `--revoke-after-ms` (a VM that does not stop this long after a preempt
    /// loses the GPU). The daemon's default suits an idle host; on an overloaded one (more
    /// runnable threads than cores: a 2-core machine) a VM's threads can wait longer than that
    /// for a core, and the soak would count the daemon's policy, not a defect.
    #[arg(long, default_value_t = 200.0)]
    pub revoke_after_ms: f64,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
    /// The vgpud binary (default: next to this one).
    #[arg(long)]
    pub vgpud: Option<PathBuf>,
}

/// A daemon's resource use at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub t_s: f64,
    pub pid: i32,
    pub vms: usize,
    pub rss_kib: u64,
    pub fds: u64,
}

impl Sample {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"t_s": self.t_s, "pid": self.pid, "vms": self.vms,
                           "rss_kib": self.rss_kib, "fds": self.fds})
    }
}

/// `VmRSS` of `/proc/PID/status` and the entries of `/proc/PID/fd`.
pub fn sample(p: &Proc, t0: Instant, vms: usize) -> Option<Sample> {
    let pid = i32::try_from(p.child.id()).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample {
        t_s: t0.elapsed().as_secs_f64(),
        pid,
        vms,
        rss_kib,
        fds,
    })
}

/// Descriptors and resident memory a daemon may hold beyond a fresh one's once every VM is
/// gone: none, and 8 MiB (allocator caches, the report's history).
pub const RSS_SLACK_KIB: u64 = 8 << 10;

pub fn run(a: &Args) -> Result<String, BenchError> {
    let vmm = procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    let vgpud = procs::sibling(a.vgpud.as_deref(), "vgpud")?;
    let dir = a.out.join(format!("runs-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let actions = if a.actions.is_empty() {
        Action::ALL.to_vec()
    } else {
        a.actions.clone()
    };
    let mut soak = Soak::start(a, &dir, &vmm, &vgpud, actions)?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(a.duration_s);
    let every = Duration::from_millis(a.action_every_ms);
    let mut next = t0 + every;
    let mut next_sample = t0;
    while Instant::now() < end {
        soak.reap(true)?;
        if Instant::now() >= next {
            soak.act()?;
            next = Instant::now() + every;
        }
        if Instant::now() >= next_sample {
            soak.sample(t0);
            next_sample += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // No new VMs: the running ones finish their kernels.
    let until = Instant::now() + Duration::from_secs(a.vm_seconds * 4 + 120);
    while soak.running() > 0 && Instant::now() < until {
        soak.reap(false)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    soak.stop_stragglers();
    // Departed VMs' partitions are quarantined until their processes are gone: give the daemon
    // a moment, then look at it with no VM.
    std::thread::sleep(Duration::from_millis(500));
    soak.sample(t0);
    let summary = soak.finish(a, t0)?;
    report::write(
        &a.out,
        &summary,
        "soak.csv",
        "t_s,action,vm,outcome,ms,detail",
        &soak.rows,
    )?;
    let line = format!(
        "soak ({}, {} s, {} VMs): {} actions, {} VMs ended ok, {} wrong, {} killed on purpose; \
         daemon fds {} -> {}, RSS {} -> {} KiB, VRAM partitions all free at the end: {}: {}",
        a.backend.name(),
        a.duration_s,
        a.vms,
        summary["actions"]["total"],
        summary["vms"]["ok"],
        summary["vms"]["wrong"],
        summary["vms"]["killed"],
        summary["daemon"]["fresh"]["fds"],
        summary["daemon"]["end"]["fds"],
        summary["daemon"]["fresh"]["rss_kib"],
        summary["daemon"]["end"]["rss_kib"],
        summary["daemon"]["vram_end"]["all_free"],
        if summary["pass"] == true {
            "PASS"
        } else {
            "FAIL"
        }
    );
    if summary["pass"] != true {
        return Err(BenchError::Invalid(format!(
            "{line} (see {})",
            a.out.join("summary.json").display()
        )));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(line)
}
