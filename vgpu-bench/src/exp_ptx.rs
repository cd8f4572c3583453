//! `vgpu-bench ptx`: interpreter throughput in thread-instructions per second per core, through
//! the sim engine (MMU translation included), on suite workloads.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pgpu::sim::{SimConfig, SimEngine};
use vgpud::units::f64_in;

use crate::error::BenchError;
use crate::{report, runner};

/// Target from the project brief: thread-instructions per second per core.
const TARGET_PER_CORE: f64 = 2e8;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory (summary.json, ptx.csv).
    #[arg(long, default_value = "vgpu-bench-out/ptx")]
    pub out: PathBuf,
    /// Workloads (comma separated suite names).
    #[arg(long, value_delimiter = ',', default_value = "matmul,reduction")]
    pub workloads: Vec<String>,
    /// Instance size: small, medium or large.
    #[arg(long, default_value = "large", value_parser = ["small", "medium", "large"])]
    pub size: String,
    /// Worker threads of the engine (throughput is divided by this for "per core").
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub workers: usize,
    /// Measure each workload for at least this long (seconds).
    #[arg(long, default_value_t = 2.0, value_parser = f64_in(0.001, 3600.0))]
    pub seconds: f64,
}

struct Row {
    workload: String,
    runs: u64,
    thread_instructions: u64,
    seconds: f64,
}

impl Row {
    fn per_core(&self, workers: usize) -> f64 {
        self.thread_instructions as f64 / self.seconds.max(1e-12) / workers.max(1) as f64
    }
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let size = suite::Size::from_name(&a.size)
        .ok_or_else(|| BenchError::Invalid(format!("unknown size `{}`", a.size)))?;
    if !(a.seconds.is_finite() && a.seconds > 0.0) {
        return Err(BenchError::Invalid("--seconds must be positive".into()));
    }
    let mut rows = Vec::new();
    for name in &a.workloads {
        let inst = runner::workload(name)?.instance(size);
        let e = SimEngine::new(SimConfig {
            workers: a.workers,
            ..SimConfig::default()
        })?;
        let p = runner::place(&e, &inst)?;
        // One checked run first: throughput of a wrong interpreter is no figure.
        runner::run_all(&e, &p, &inst)?;
        runner::check(&e, &p, &inst)?;
        let before = e.counters().thread_instructions;
        let t0 = Instant::now();
        let mut runs = 0;
        let mut busy = Duration::ZERO;
        while t0.elapsed().as_secs_f64() < a.seconds {
            runner::reset(&e, &p, &inst)?;
            let t = Instant::now();
            runner::run_all(&e, &p, &inst)?;
            busy += t.elapsed();
            runs += 1;
        }
        rows.push(Row {
            workload: name.clone(),
            runs,
            thread_instructions: e.counters().thread_instructions - before,
            seconds: busy.as_secs_f64(),
        });
    }
    let csv: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{},{},{},{},{},{:.6},{:.0}",
                r.workload,
                a.size,
                a.workers,
                r.runs,
                r.thread_instructions,
                r.seconds,
                r.per_core(a.workers)
            )
        })
        .collect();
    let min = rows
        .iter()
        .map(|r| r.per_core(a.workers))
        .fold(f64::INFINITY, f64::min);
    let summary = serde_json::json!({
        "experiment": "ptx",
        "size": a.size,
        "workers": a.workers,
        "target_thread_instr_per_s_per_core": TARGET_PER_CORE,
        "meets_target": min >= TARGET_PER_CORE,
        "workloads": rows.iter().map(|r| serde_json::json!({
            "workload": r.workload,
            "runs": r.runs,
            "thread_instructions": r.thread_instructions,
            "seconds": r.seconds,
            "thread_instr_per_s_per_core": r.per_core(a.workers),
        })).collect::<Vec<_>>(),
    });
    report::write(
        &a.out,
        &summary,
        "ptx.csv",
        "workload,size,workers,runs,thread_instructions,seconds,thread_instr_per_s_per_core",
        &csv,
    )?;
    let parts: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {:.3e}", r.workload, r.per_core(a.workers)))
        .collect();
    Ok(format!(
        "ptx: thread-instr/s/core ({} workers, {}): {} (target {:.0e}: {})",
        a.workers,
        a.size,
        parts.join(", "),
        TARGET_PER_CORE,
        if min >= TARGET_PER_CORE {
            "met"
        } else {
            "missed"
        }
    ))
}
