//! `vgpu-bench preempt`: preemption latency (preempt flag set → saved context bytes in hand) and
//! restore latency (`resume` called with the bytes → kernel running again) for a running matmul,
//! over many random preemption points. Each kernel run is preempted repeatedly at random delays
//! and resumed until it completes; its result is checked.
//!
//! Two paths are measured: *bytes* (the brief's definition: flag → `Outcome` + `to_bytes`, and
//! `resume(from_bytes)` → running) and *in-memory* (flag → `Outcome` with the engine's live
//! context, `resume(live)` → running), which is what a scheduler resuming on the same engine
//! pays. Every sample has both preempt figures; resumes alternate between the two paths.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{Engine, Outcome, PreemptHandle, SavedContext};

use crate::error::BenchError;
use crate::{report, runner};

/// Target from the project brief for the p99 of both latencies, µs.
const TARGET_P99_US: f64 = 50.0;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory (summary.json, preempt.csv).
    #[arg(long, default_value = "vgpu-bench-out/preempt")]
    pub out: PathBuf,
    /// Preemptions to measure.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub samples: usize,
    /// Workload (suite name).
    #[arg(long, default_value = "matmul")]
    pub workload: String,
    /// Instance size: small, medium or large.
    #[arg(long, default_value = "large", value_parser = ["small", "medium", "large"])]
    pub size: String,
    /// Worker threads of the engine (0: available parallelism).
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=256))]
    pub workers: usize,
    /// Seed of the random preemption delays (non-zero).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub seed: u64,
}

struct Sample {
    run: u64,
    /// Flag → `Outcome::Preempted` returned (in-memory context in hand).
    preempt_live_us: f64,
    /// Flag → context bytes in hand.
    preempt_bytes_us: f64,
    /// Whether the following resume used bytes.
    resumed_from_bytes: bool,
    /// `resume` called → running.
    restore_us: f64,
    context_bytes: usize,
}

fn since_us(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e6
}

fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// One `execute`/`resume` call under a delayed preemption request.
struct Step {
    out: Result<Outcome, pgpu::EngineError>,
    /// When the call returned.
    returned: Instant,
    /// The context serialized right after, and when that was done (if preempted).
    bytes: Option<(Vec<u8>, Instant)>,
}

/// Runs `f` while a helper thread requests preemption on `h` after `delay`. Timestamps and the
/// serialization are taken on this thread before the helper is joined.
fn step(
    h: &PreemptHandle,
    delay: Duration,
    f: impl FnOnce() -> Result<Outcome, pgpu::EngineError>,
) -> Step {
    std::thread::scope(|s| {
        let h2 = h.clone();
        let helper = s.spawn(move || {
            std::thread::sleep(delay);
            h2.request();
        });
        let out = f();
        let returned = Instant::now();
        let bytes = match &out {
            Ok(Outcome::Preempted { context, .. }) => Some((context.to_bytes(), Instant::now())),
            _ => None,
        };
        let _ = helper.join();
        Step {
            out,
            returned,
            bytes,
        }
    })
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let size = suite::Size::from_name(&a.size)
        .ok_or_else(|| BenchError::Invalid(format!("unknown size `{}`", a.size)))?;
    let mut cfg = SimConfig::default();
    if a.workers > 0 {
        cfg.workers = a.workers;
    }
    let workers = cfg.workers;
    let e = SimEngine::new(cfg)?;
    let inst = runner::workload(&a.workload)?.instance(size);
    let p = runner::place(&e, &inst)?;
    let job = runner::job(&p, &inst, 0)?;
    // Uninterrupted time of one run, to spread the preemption points over it.
    let t = Instant::now();
    runner::run_all(&e, &p, &inst)?;
    let full = t.elapsed();
    runner::check(&e, &p, &inst)?;
    let max_delay_us = (full.as_micros() as u64 / 4).max(1);

    let mut seed = a.seed.max(1);
    let mut samples = Vec::new();
    let mut runs = 0u64;
    let h = PreemptHandle::new();
    while samples.len() < a.samples {
        runs += 1;
        runner::reset(&e, &p, &inst)?;
        h.clear();
        let mut st = step(
            &h,
            Duration::from_micros(next(&mut seed) % max_delay_us),
            || e.execute(&job, &h),
        );
        loop {
            let (out, returned, bytes) = (st.out?, st.returned, st.bytes);
            match out {
                Outcome::Completed { .. } => break,
                Outcome::Faulted { fault, .. } => {
                    return Err(BenchError::Fault {
                        workload: a.workload.clone(),
                        fault,
                    });
                }
                Outcome::Preempted { context, .. } => {
                    let requested = h.requested_at().unwrap_or(returned);
                    let preempt_live_us = since_us(requested, returned);
                    let (bytes, bytes_at) =
                        bytes.unwrap_or_else(|| (context.to_bytes(), Instant::now()));
                    let preempt_bytes_us = since_us(requested, bytes_at);
                    let context_bytes = bytes.len();
                    // Alternate the resume path.
                    let resumed_from_bytes = samples.len() % 2 == 0;
                    let context = if resumed_from_bytes {
                        SavedContext::from_bytes(bytes)
                    } else {
                        context
                    };
                    h.clear();
                    let delay = Duration::from_micros(next(&mut seed) % max_delay_us);
                    let mut restore_us = f64::NAN;
                    st = step(&h, delay, || {
                        let called = Instant::now();
                        let r = e.resume(context, &h);
                        if let Some(running) = h.running_since() {
                            restore_us = since_us(called, running);
                        }
                        r
                    });
                    samples.push(Sample {
                        run: runs,
                        preempt_live_us,
                        preempt_bytes_us,
                        resumed_from_bytes,
                        restore_us,
                        context_bytes,
                    });
                }
            }
        }
        runner::check(&e, &p, &inst)?;
    }
    let pct = |f: &dyn Fn(&Sample) -> Option<f64>| {
        report::Percentiles::of(&samples.iter().filter_map(f).collect::<Vec<_>>())
    };
    let pre_bytes = pct(&|s| Some(s.preempt_bytes_us));
    let pre_live = pct(&|s| Some(s.preempt_live_us));
    let res_bytes = pct(&|s| s.resumed_from_bytes.then_some(s.restore_us));
    let res_live = pct(&|s| (!s.resumed_from_bytes).then_some(s.restore_us));
    let ctx = pct(&|s| Some(s.context_bytes as f64));
    let meets = pre_bytes.p99 <= TARGET_P99_US && res_bytes.p99 <= TARGET_P99_US;
    let summary = serde_json::json!({
        "experiment": "preempt",
        "workload": a.workload,
        "size": a.size,
        "workers": workers,
        "samples": samples.len(),
        "kernel_runs": runs,
        "uninterrupted_run_us": full.as_secs_f64() * 1e6,
        "preempt_to_saved_bytes_us": pre_bytes.json(),
        "restore_from_bytes_to_running_us": res_bytes.json(),
        "preempt_to_live_context_us": pre_live.json(),
        "restore_from_live_context_to_running_us": res_live.json(),
        "context_bytes": ctx.json(),
        "target_p99_us": TARGET_P99_US,
        "meets_target": meets,
    });
    let csv: Vec<String> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{i},{},{:.3},{:.3},{},{:.3},{}",
                s.run,
                s.preempt_live_us,
                s.preempt_bytes_us,
                if s.resumed_from_bytes {
                    "bytes"
                } else {
                    "live"
                },
                s.restore_us,
                s.context_bytes
            )
        })
        .collect();
    report::write(
        &a.out,
        &summary,
        "preempt.csv",
        "sample,run,preempt_live_us,preempt_bytes_us,resume_path,restore_us,context_bytes",
        &csv,
    )?;
    Ok(format!(
        "preempt: {} samples of {} {} ({} workers), p50/p99/max µs: flag→bytes {:.1}/{:.1}/{:.1}, \
         bytes→running {:.1}/{:.1}/{:.1}; in-memory: flag→context {:.1}/{:.1}/{:.1}, \
         context→running {:.1}/{:.1}/{:.1}; context {:.0} B (target p99 ≤ {TARGET_P99_US} µs: {})",
        samples.len(),
        a.workload,
        a.size,
        workers,
        pre_bytes.p50,
        pre_bytes.p99,
        pre_bytes.max,
        res_bytes.p50,
        res_bytes.p99,
        res_bytes.max,
        pre_live.p50,
        pre_live.p99,
        pre_live.max,
        res_live.p50,
        res_live.p99,
        res_live.max,
        ctx.p50,
        if meets { "met" } else { "missed" }
    ))
}
