//! `vgpu-bench preempt`: preemption latency (preempt flag set → saved context bytes in hand, the
//! GPU free) and restore latency (`resume` called → kernel running again) of running suite
//! kernels, over many random preemption points, on either engine (`--backend sim|cuda`) with
//! any preemption method (`--method slice|checkpoint|restart|auto`). Each kernel run is preempted
//! repeatedly at random delays and resumed until it completes (a launch at most
//! [`MAX_PREEMPTS_PER_LAUNCH`] times: `restart` loses a stopped thread's work, so unbounded
//! re-preemption of long threads never ends); its bytes are compared with an
//! unpreempted run's (`mismatches`, must be 0). Also per workload: the bytes the checkpoint
//! method saved (full vs incremental, from the engine's `CkptStats`) and the steady-state time
//! of the kernel never preempted under the method vs under `slice` (the original kernel on sim;
//! GPU time from CUDA events on cuda). Engine, placement and CSV/chart output: `preempt_env.rs`.
//!
//! Two paths are measured: *bytes* (the brief's definition: flag → `Outcome` + `to_bytes`, and
//! `resume(from_bytes)` → running) and *in-memory* (flag → `Outcome` with the engine's live
//! context, `resume(live)` → running), which is what a scheduler resuming on the same engine
//! pays. Every sample has both preempt figures; resumes alternate between the two paths.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pgpu::{Outcome, PreemptHandle, PreemptMethod, SavedContext};

use crate::backend::Backend;
use crate::error::BenchError;
use crate::preempt_breakdown as breakdown;
use crate::preempt_env::{self as env, Eng, Placed};
use crate::preempt_requester::Requester;
use crate::progress::Progress;
use crate::report;

/// Target for the p99 of both latencies, µs (issue 23: request → GPU free p99 ≤ 40 µs).
const TARGET_P99_US: f64 = 40.0;

/// Preemptions of one launch: the resume after the last runs to the end unrequested. Without a
/// bound, a launch under `restart` never ends: its threads rerun from the start at every
/// resume, so when every thread runs longer than the random delay (few long CTAs, all
/// resident at once, as on a GPU) each resume is preempted with nothing done (issue 23's hang).
pub const MAX_PREEMPTS_PER_LAUNCH: u32 = 8;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory (summary.json, preempt.csv, preempt-latency.svg).
    #[arg(long, default_value = "vgpu-bench-out/preempt")]
    pub out: PathBuf,
    /// Preemptions to measure per workload.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub samples: usize,
    /// Workloads: a suite or long-kernel name, a comma-separated list, `long` (the
    /// long-running kernels) or `all` (the suite but spin, then the long kernels).
    #[arg(long, default_value = "matmul")]
    pub workload: String,
    /// The engine: sim (software GPU) or cuda (a real NVIDIA GPU).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Preemption method of the engine: slice, checkpoint, restart (idempotent kernels rerun
    /// unfinished threads, the others checkpoint) or auto (per kernel; `method_used` says
    /// which and why).
    #[arg(long, default_value = "slice", value_parser = ["slice", "checkpoint", "restart", "auto"])]
    pub method: String,
    /// Checkpoint method: a thread reads the flag at every this many point crossings (the
    /// transformation's poll_interval; 1: at every point).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub poll_interval: u32,
    /// cuda: how a request raises the flag (write-value: cuStreamWriteValue32 on a signal
    /// stream, the baseline; write-value-priority: the same on a greatest-priority stream;
    /// host-mapped: a pinned host word the kernel polls across PCIe; armed: the write
    /// enqueued at launch behind a wait on a pinned host word the request stores to (a
    /// request is one CPU store; a late one is written by the driver after 2 ms); memcpy).
    #[arg(long, default_value = "write-value", value_parser = ["write-value", "write-value-priority", "host-mapped", "armed", "memcpy"])]
    pub flag_write: String,
    /// cuda: how the engine waits for the kernel's end (sync: cuEventSynchronize, the
    /// baseline; spin: cuEventQuery busy loop; yield: cuEventQuery + sched_yield; notice:
    /// spin on a pinned host word the job stream writes behind the kernel, no driver call).
    #[arg(long, default_value = "sync", value_parser = ["sync", "spin", "yield", "notice"])]
    pub end_wait: String,
    /// cuda: how the status words come back (strided: one 2D copy, the baseline;
    /// contiguous: one copy of the whole record span; queued: that copy enqueued by the
    /// request behind the kernel, into pinned memory; mirror: the kernel stores its status
    /// words into pinned host memory too, no copy).
    #[arg(long, default_value = "strided", value_parser = ["strided", "contiguous", "queued", "mirror"])]
    pub status_read: String,
    /// cuda: how each checkpointed run's request path is chosen: fixed (the three options
    /// above for every run) or adaptive[:US] (kernels not yet measured or expected to run at
    /// least US µs, default 1000, take armed/notice/mirror; the others the three above).
    #[arg(long, default_value_t = pgpu::cuda::DEFAULT_CK_PATH, value_parser = |s: &str| s.parse::<pgpu::cuda::CkPathChoice>())]
    pub ck_path: pgpu::cuda::CkPathChoice,
    /// cuda: instructions of a strip-mined loop between two flag polls (0: counted polls).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub chunk: u32,
    /// cuda: whole chunks of strip-mined loops as constant-trip copies (on) or only the
    /// clamped inner loop (off, the transformation before issue 23's overhead work).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub fast_chunks: String,
    /// cuda: what a global atomic or reduction counts as (instructions) when a strip-mined
    /// loop's chunk is sized: larger, shorter chunks in loops of atomics.
    #[arg(long, default_value_t = pgpu::cuda::CUDA_ATOMIC_WEIGHT, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub atomic_weight: u32,
    /// auto: a request for a kernel expected (from its earlier runs) to end within this many
    /// µs is not acted on, the kernel completes (`wait`; such requests are samples too, their
    /// latency request → job completed); 0: never wait.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub wait_us: u64,
    /// Who requests preemption: a fresh thread per request (fresh, the baseline) or one
    /// long-lived thread for the whole run (warm: its driver calls after the first are a
    /// warm thread's, as a scheduler's are).
    #[arg(long, default_value = "fresh", value_parser = ["fresh", "warm"])]
    pub requester: String,
    /// CI mode: every workload, small size, 4 samples each, 1 uninterrupted repetition.
    #[arg(long)]
    pub short: bool,
    /// Instance size: small, medium, large or xl (cuda only; the long kernels run 1-100 ms).
    #[arg(long, default_value = "large", value_parser = ["small", "medium", "large", "xl"])]
    pub size: String,
    /// Worker threads of the engine (0: available parallelism).
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=256))]
    pub workers: usize,
    /// Seed of the random preemption delays (non-zero).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub seed: u64,
}

struct Sample {
    workload: &'static str,
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
    /// Bytes the checkpointed kernel stored at this preemption: as full saves, incrementally.
    saved_full: u64,
    saved_incremental: u64,
    /// Where the time went (cuda).
    breakdown: Option<pgpu::cuda::CkBreakdown>,
    /// `auto` waited on the request: the job completed (no context, no resume); the
    /// preempt figures are request → job completed.
    waited: bool,
}

/// Figures of one workload.
struct PerWorkload {
    name: &'static str,
    runs: u64,
    mismatches: u64,
    /// Median unpreempted time under the method, under `slice`, and of the untransformed
    /// kernel launched whole, µs.
    method_us: f64,
    slice_us: f64,
    original_us: f64,
    /// Thread-instructions of one unpreempted run: original, under the method (sim only).
    instructions: Option<(u64, u64)>,
    /// The method the engine ran the kernel with (`auto`'s choice), and why.
    used: &'static str,
    why: &'static str,
    /// Requests `auto` waited on (`CkptStats::waited_preemptions`) and of them the launches
    /// that outlasted their estimate, while sampling this workload; the latest expected
    /// remaining time and budget, ns.
    waited: u64,
    overruns: u64,
    wait_last: (u64, u64),
    /// Launches (timed and sampled) that took the fast request path and the fixed one.
    paths: (u64, u64),
    samples: Vec<Sample>,
}

impl PerWorkload {
    /// The method(s) used and why: `wait` where requests were waited on, with the method that
    /// stopped the others.
    fn method(&self) -> (String, String) {
        if self.waited == 0 {
            return (self.used.to_string(), self.why.to_string());
        }
        let stopped = self.samples.iter().filter(|s| !s.waited).count();
        let wait = format!(
            "wait: expected to end in {:.1} µs ≤ budget {:.1} µs ({} of {} requests waited, {} \
             outlasted their estimate)",
            self.wait_last.0 as f64 / 1e3,
            self.wait_last.1 as f64 / 1e3,
            self.waited,
            self.samples.len(),
            self.overruns
        );
        if stopped == 0 {
            ("wait".into(), wait)
        } else {
            (
                format!("wait+{}", self.used),
                format!("{wait}; the others {}: {}", self.used, self.why),
            )
        }
    }
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

/// Runs `f` while a helper thread requests preemption on `h` after `delay` (`None`: no
/// request, the call runs to its end). Timestamps and the serialization are taken on this
/// thread before the helper is joined.
fn step(
    h: &PreemptHandle,
    delay: Option<Duration>,
    req: Option<&Requester>,
    f: impl FnOnce() -> Result<Outcome, pgpu::EngineError>,
) -> Step {
    if delay == Some(Duration::ZERO) {
        // Pending before the call: the engine stops the kernel at its first chance.
        h.request();
    }
    let finish = |out: Result<Outcome, pgpu::EngineError>| {
        let returned = Instant::now();
        let bytes = match &out {
            Ok(Outcome::Preempted { context, .. }) => Some((context.to_bytes(), Instant::now())),
            _ => None,
        };
        Step {
            out,
            returned,
            bytes,
        }
    };
    if let Some(r) = req {
        // The long-lived requester (`--requester warm`).
        let asked = delay
            .filter(|d| !d.is_zero())
            .is_some_and(|d| r.request_after(h, d));
        let st = finish(f());
        if asked {
            r.wait();
        }
        return st;
    }
    std::thread::scope(|s| {
        let h2 = h.clone();
        let helper = s.spawn(move || {
            if let Some(delay) = delay.filter(|d| !d.is_zero()) {
                std::thread::sleep(delay);
                h2.request();
            }
        });
        let st = finish(f());
        let _ = helper.join();
        st
    })
}

/// Which method the engine used for the runs between two counter snapshots, and why (from
/// the counters `pgpu::ckpt::choose` and the engines keep: see its rule).
fn method_used(
    method: PreemptMethod,
    a: &pgpu::CkptStats,
    b: &pgpu::CkptStats,
) -> (&'static str, &'static str) {
    if method == PreemptMethod::Slice {
        return ("slice", "selected");
    }
    let unproven = b.unproven_launches > a.unproven_launches;
    if b.sliced_launches > a.sliced_launches {
        if unproven {
            (
                "slice",
                "not provably idempotent (a written buffer is also read) and no checkpoint form within the limits",
            )
        } else {
            ("slice", "many short CTAs (at least 4 waves): sub-launches")
        }
    } else if b.restart_launches > a.restart_launches {
        (
            "restart",
            "idempotent: no global atomics, no buffer both read and written",
        )
    } else if b.launches > a.launches {
        match method {
            PreemptMethod::Checkpoint => ("checkpoint", "selected"),
            _ if unproven => (
                "checkpoint",
                "few long CTAs, not provably idempotent: a written buffer is also read",
            ),
            _ => ("checkpoint", "few long CTAs, not idempotent"),
        }
    } else {
        (
            "slice",
            "not transformable or save area over the limit (fallback)",
        )
    }
}

/// The workloads `--workload` names: `all` (the suite but `spin`, then the long kernels),
/// `long` (`suite::long`), or a comma-separated list of either's names.
fn workloads(a: &Args) -> Result<Vec<&'static suite::Workload>, BenchError> {
    let short_suite = || suite::all().filter(|w| w.name != "spin");
    Ok(match a.workload.as_str() {
        _ if a.short => short_suite().chain(suite::long::all()).collect(),
        "all" => short_suite().chain(suite::long::all()).collect(),
        "long" => suite::long::all().iter().collect(),
        list => list
            .split(',')
            .map(|n| {
                let n = n.trim();
                suite::long::find(n).map_or_else(|| crate::runner::workload(n), Ok)
            })
            .collect::<Result<_, _>>()?,
    })
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let size_name = if a.short { "small" } else { a.size.as_str() };
    let size = suite::Size::from_name(size_name)
        .ok_or_else(|| BenchError::Invalid(format!("unknown size `{}`", a.size)))?;
    if size.real_gpu_only() && a.backend == Backend::Sim {
        return Err(BenchError::Invalid(
            "size xl is for real GPUs (--backend cuda): the interpreter would take minutes".into(),
        ));
    }
    let method: PreemptMethod = a.method.parse().map_err(BenchError::Invalid)?;
    let knobs = breakdown::knobs(a)?;
    let names = workloads(a)?;
    let samples_per = if a.short { 4 } else { a.samples };
    let reps = if a.short { 1 } else { 5 };
    // Phase 0, the untransformed kernels launched whole: reference bytes and the baseline of
    // the steady-state overheads.
    let mut bar = Progress::new("preempt");
    let mut original = Vec::new();
    {
        let e = Eng::original(a.backend, a.workers)?;
        for w in &names {
            bar.note(&format!("{}: the original kernel, unpreempted", w.name));
            let inst = w.instance(size);
            let p = env::place(&e, &inst)?;
            original.push(env::timed_runs(&e, &p, &inst, reps)?);
            env::release(&e, &p)?;
        }
    }
    // Phase 1, the `slice` engine (on sim the same as phase 0: the interpreter runs the
    // original and stops it between instructions).
    let mut slice = Vec::new();
    if a.backend == Backend::Cuda {
        let e = Eng::new(
            a.backend,
            PreemptMethod::Slice,
            a.workers,
            a.poll_interval,
            &knobs,
        )?;
        for w in &names {
            bar.note(&format!("{}: sliced, unpreempted", w.name));
            let inst = w.instance(size);
            let p = env::place(&e, &inst)?;
            slice.push(env::timed_runs(&e, &p, &inst, reps)?);
            env::release(&e, &p)?;
        }
    }
    // Phase 2, the method's engine.
    let e = Eng::new(a.backend, method, a.workers, a.poll_interval, &knobs)?;
    let workers = e.workers();
    let mut seed = a.seed.max(1);
    let requester = (a.requester == "warm").then(Requester::new);
    let mut per = Vec::new();
    for (k, (w, orig)) in names.iter().zip(&original).enumerate() {
        let want = &orig.bytes;
        let slice_us = slice.get(k).map_or(orig.us, |s: &env::Timed| s.us);
        let slice_bad = slice.get(k).is_some_and(|s| &s.bytes != want);
        bar.note(&format!("{}: {method}, unpreempted then preempted", w.name));
        let inst = w.instance(size);
        let p = env::place(&e, &inst)?;
        let before = e.ckpt_stats();
        let timed = env::timed_runs(&e, &p, &inst, reps)?;
        let (used, why) = method_used(method, &before, &e.ckpt_stats());
        let mut pw = PerWorkload {
            used,
            why,
            name: w.name,
            runs: 0,
            mismatches: u64::from(&timed.bytes != want) + u64::from(slice_bad),
            method_us: timed.us,
            slice_us,
            original_us: orig.us,
            instructions: orig.thread_instructions.zip(timed.thread_instructions),
            waited: 0,
            overruns: 0,
            wait_last: (0, 0),
            paths: (0, 0),
            samples: Vec::new(),
        };
        let waits_before = e.ckpt_stats();
        let max_delay_us = ((timed.us / 4.0) as u64).max(1);
        // Kernels too short to be caught get a bounded number of tries.
        let max_runs = 50 * samples_per as u64 + 8;
        while pw.samples.len() < samples_per && pw.runs < max_runs {
            pw.runs += 1;
            sample_runs(
                &e,
                &p,
                &inst,
                &mut pw,
                &mut seed,
                (max_delay_us, MAX_PREEMPTS_PER_LAUNCH),
                requester.as_ref(),
            )?;
            if &env::read_back(&e, &p, &inst)? != want {
                pw.mismatches += 1;
            }
            bar.update(
                (k as f64 + pw.samples.len() as f64 / samples_per as f64) / names.len() as f64,
                &format!("{} {} samples, {} runs", w.name, pw.samples.len(), pw.runs),
            );
        }
        bar.finish();
        let waits_after = e.ckpt_stats();
        pw.waited = waits_after.waited_preemptions - waits_before.waited_preemptions;
        pw.overruns = waits_after.wait_overruns - waits_before.wait_overruns;
        pw.wait_last = (
            waits_after.wait_last_expected_ns,
            waits_after.wait_budget_ns,
        );
        pw.paths = (
            waits_after.fast_path_launches - before.fast_path_launches,
            waits_after.fixed_path_launches - before.fixed_path_launches,
        );
        env::release(&e, &p)?;
        per.push(pw);
    }
    output(a, &e, size_name, method, workers, &per)
}

/// One run of every launch of `inst`, each call preempted after a random delay below
/// `max_delay_us`, resumed (alternately from bytes and from memory) until it completes; after
/// `max_preempts` preemptions of a launch its resume runs to the end unrequested.
fn sample_runs(
    e: &Eng,
    p: &Placed,
    inst: &suite::Instance,
    pw: &mut PerWorkload,
    seed: &mut u64,
    (max_delay_us, max_preempts): (u64, u32),
    req: Option<&Requester>,
) -> Result<(), BenchError> {
    env::reset(e, p, inst)?;
    let h = PreemptHandle::new();
    for i in 0..inst.launches.len() {
        let job = env::job(p, inst, i)?;
        h.clear();
        let waited_before = e.ckpt_stats().waited_preemptions;
        let mut st = step(
            &h,
            Some(Duration::from_micros(next(seed) % max_delay_us)),
            req,
            || e.dyn_engine().execute(&job, &h),
        );
        let mut preempts = 0u32;
        loop {
            let (out, returned, bytes) = (st.out?, st.returned, st.bytes);
            match out {
                Outcome::Completed { .. } => {
                    // `auto` waited on a request that came while the launch ran: a sample
                    // whose GPU was free when the job completed.
                    let requested = h.requested_at().filter(|&r| r <= returned);
                    if let Some(requested) = requested
                        && preempts == 0
                        && e.ckpt_stats().waited_preemptions > waited_before
                    {
                        let us = since_us(requested, returned);
                        pw.samples.push(Sample {
                            workload: pw.name,
                            run: pw.runs,
                            preempt_live_us: us,
                            preempt_bytes_us: us,
                            resumed_from_bytes: false,
                            restore_us: f64::NAN,
                            context_bytes: 0,
                            saved_full: 0,
                            saved_incremental: 0,
                            breakdown: None,
                            waited: true,
                        });
                    }
                    break;
                }
                Outcome::Faulted { fault, .. } => {
                    return Err(BenchError::Fault {
                        workload: inst.workload.to_string(),
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
                    let (saved_full, saved_incremental) = e.take_saved();
                    let resumed_from_bytes = pw.samples.len().is_multiple_of(2);
                    let context = if resumed_from_bytes {
                        SavedContext::from_bytes(bytes)
                    } else {
                        context
                    };
                    h.clear();
                    preempts += 1;
                    let delay = (preempts < max_preempts)
                        .then(|| Duration::from_micros(next(seed) % max_delay_us));
                    let mut restore_us = f64::NAN;
                    st = step(&h, delay, req, || {
                        let called = Instant::now();
                        let r = e.dyn_engine().resume(context, &h);
                        if let Some(running) = h.running_since() {
                            restore_us = since_us(called, running);
                        }
                        r
                    });
                    pw.samples.push(Sample {
                        workload: pw.name,
                        run: pw.runs,
                        preempt_live_us,
                        preempt_bytes_us,
                        resumed_from_bytes,
                        restore_us,
                        context_bytes,
                        saved_full,
                        saved_incremental,
                        breakdown: e.take_breakdown(),
                        waited: false,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The breakdowns of `set`'s samples.
fn parts<'a>(set: &[&'a Sample]) -> Vec<&'a pgpu::cuda::CkBreakdown> {
    set.iter().filter_map(|s| s.breakdown.as_ref()).collect()
}

fn output(
    a: &Args,
    e: &Eng,
    size: &str,
    method: PreemptMethod,
    workers: usize,
    per: &[PerWorkload],
) -> Result<String, BenchError> {
    let all: Vec<&Sample> = per.iter().flat_map(|w| &w.samples).collect();
    let pct = |f: &dyn Fn(&Sample) -> Option<f64>, set: &[&Sample]| {
        report::Percentiles::of(&set.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
    };
    let pre_bytes = pct(&|s| Some(s.preempt_bytes_us), &all);
    let pre_live = pct(&|s| Some(s.preempt_live_us), &all);
    // A waited sample has no context and no resume.
    let res_bytes = pct(
        &|s| (!s.waited && s.resumed_from_bytes).then_some(s.restore_us),
        &all,
    );
    let res_live = pct(
        &|s| (!s.waited && !s.resumed_from_bytes).then_some(s.restore_us),
        &all,
    );
    let ctx = pct(&|s| (!s.waited).then_some(s.context_bytes as f64), &all);
    let meets = pre_bytes.p99 <= TARGET_P99_US && res_bytes.p99 <= TARGET_P99_US;
    let mismatches: u64 = per.iter().map(|w| w.mismatches).sum();
    let runs: u64 = per.iter().map(|w| w.runs).sum();
    let workloads: Vec<serde_json::Value> = per
        .iter()
        .map(|w| {
            let s: Vec<&Sample> = w.samples.iter().collect();
            let full: u64 = s.iter().map(|x| x.saved_full).sum();
            let inc: u64 = s.iter().map(|x| x.saved_incremental).sum();
            let (used, why) = w.method();
            serde_json::json!({
                "workload": w.name,
                "samples": s.len(),
                "kernel_runs": w.runs,
                "mismatches": w.mismatches,
                "preempt_to_live_context_us": pct(&|x| Some(x.preempt_live_us), &s).json(),
                "preempt_to_saved_bytes_us": pct(&|x| Some(x.preempt_bytes_us), &s).json(),
                "restore_to_running_us": pct(&|x| (!x.waited).then_some(x.restore_us), &s).json(),
                "context_bytes": pct(&|x| (!x.waited).then_some(x.context_bytes as f64), &s).json(),
                "waited_preemptions": w.waited,
                "wait_overruns": w.overruns,
                "fast_path_launches": w.paths.0,
                "fixed_path_launches": w.paths.1,
                "waited_request_to_completed_us": pct(&|x| x.waited.then_some(x.preempt_live_us), &s).json(),
                "saved_full_bytes": full,
                "saved_incremental_bytes": inc,
                "method_used": used,
                "why": why,
                "unpreempted_us": w.method_us,
                "unpreempted_slice_us": w.slice_us,
                "unpreempted_original_us": w.original_us,
                "overhead_vs_slice": w.method_us / w.slice_us.max(1e-9),
                "overhead_vs_original": w.method_us / w.original_us.max(1e-9),
                "slice_overhead_vs_original": w.slice_us / w.original_us.max(1e-9),
                "thread_instructions_original": w.instructions.map(|x| x.0),
                "thread_instructions_method": w.instructions.map(|x| x.1),
                "instruction_overhead": w.instructions.map(|(o, m)| m as f64 / o.max(1) as f64),
                "breakdown": breakdown::summary(&parts(&s)),
            })
        })
        .collect();
    let ck = e.ckpt_stats();
    let geo = |v: Vec<f64>| crate::overhead_output::geomean(&v);
    let time_geo = geo(per
        .iter()
        .map(|w| w.method_us / w.original_us.max(1e-9))
        .collect());
    let instr_geo = geo(per
        .iter()
        .filter_map(|w| w.instructions.map(|(o, m)| m as f64 / o.max(1) as f64))
        .collect());
    let summary = serde_json::json!({
        "experiment": "preempt",
        "backend": a.backend.name(),
        "method": method.to_string(),
        "poll_interval": a.poll_interval,
        "device": e.device(),
        "workload": a.workload,
        "size": size,
        "workers": workers,
        "samples": all.len(),
        "kernel_runs": runs,
        "mismatches": mismatches,
        "preempt_to_saved_bytes_us": pre_bytes.json(),
        "restore_from_bytes_to_running_us": res_bytes.json(),
        "preempt_to_live_context_us": pre_live.json(),
        "restore_from_live_context_to_running_us": res_live.json(),
        "context_bytes": ctx.json(),
        "overhead_vs_original_geomean": time_geo,
        "instruction_overhead_geomean": instr_geo,
        "checkpoint": {
            "modules_transformed": ck.modules_transformed,
            "fallback_modules": ck.fallback_modules,
            "fallback_launches": ck.fallback_launches,
            "fallback_reasons": ck.fallback_reasons,
            "saved_full_bytes": ck.saved_full_bytes,
            "saved_incremental_bytes": ck.saved_incremental_bytes,
            "restart_launches": ck.restart_launches,
            "sliced_launches": ck.sliced_launches,
            "unproven_launches": ck.unproven_launches,
            "waited_preemptions": ck.waited_preemptions,
            "wait_overruns": ck.wait_overruns,
            "wait_budget_us": a.wait_us,
            "fast_path_launches": ck.fast_path_launches,
            "fixed_path_launches": ck.fixed_path_launches,
        },
        "cuda_path": {
            "flag_write": a.flag_write,
            "end_wait": a.end_wait,
            "status_read": a.status_read,
            "ck_path": a.ck_path.to_string(),
            "chunk_instructions": a.chunk,
            "fast_chunks": a.fast_chunks,
            "atomic_weight": a.atomic_weight,
            "requester": a.requester,
        },
        "breakdown": breakdown::summary(&parts(&all)),
        "per_workload": workloads,
        "target_p99_us": TARGET_P99_US,
        "meets_target": meets,
    });
    let csv: Vec<String> = all
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{i},{},{},{:.3},{:.3},{},{:.3},{},{},{}",
                s.workload,
                s.run,
                s.preempt_live_us,
                s.preempt_bytes_us,
                if s.waited {
                    "waited"
                } else if s.resumed_from_bytes {
                    "bytes"
                } else {
                    "live"
                },
                s.restore_us,
                s.context_bytes,
                s.saved_full,
                s.saved_incremental
            )
        })
        .collect();
    report::write(
        &a.out,
        &summary,
        "preempt.csv",
        "sample,workload,run,preempt_live_us,preempt_bytes_us,resume_path,restore_us,context_bytes,saved_full_bytes,saved_incremental_bytes",
        &csv,
    )?;
    let series: Vec<(String, Vec<u64>)> = per
        .iter()
        .filter(|w| !w.samples.is_empty())
        .map(|w| {
            let ns = w
                .samples
                .iter()
                .map(|s| (s.preempt_live_us * 1e3) as u64)
                .collect();
            (w.name.to_string(), ns)
        })
        .collect();
    env::chart(
        &a.out.join("preempt-latency.svg"),
        &format!(
            "Preemption latency (request → context in hand), {} / {method}",
            a.backend.name()
        ),
        &series,
    )?;
    if mismatches > 0 {
        return Err(BenchError::Invalid(format!(
            "{mismatches} runs gave bytes different from the unpreempted run"
        )));
    }
    let lines: Vec<String> = per
        .iter()
        .map(|w| {
            let s: Vec<&Sample> = w.samples.iter().collect();
            let live = pct(&|x| Some(x.preempt_live_us), &s);
            let (used, why) = w.method();
            format!(
                "\n  {}: {} ({}), request→context (waited: →completed) p50/p99/max {:.1}/{:.1}/{:.1} µs over {}, never \
                 preempted {:.3}x the original; launches on the fast/fixed path {}/{}; {}",
                w.name,
                used,
                why,
                live.p50,
                live.p99,
                live.max,
                s.len(),
                w.method_us / w.original_us.max(1e-9),
                w.paths.0,
                w.paths.1,
                breakdown::line(&parts(&s))
            )
        })
        .collect();
    Ok(format!(
        "preempt: {} samples of {} workload(s) ({}, {method}, {size}, {} workers), p50/p99/max µs: \
         flag→bytes {:.1}/{:.1}/{:.1}, bytes→running {:.1}/{:.1}/{:.1}; in-memory: flag→context \
         {:.1}/{:.1}/{:.1}, context→running {:.1}/{:.1}/{:.1}; context {:.0} B; saved full {} B, \
         incremental {} B; never preempted: {:.3}x the original's time, {:.3}x its instructions \
         (geomean); mismatches {mismatches} (target p99 ≤ {TARGET_P99_US} µs: {}); {}{}",
        all.len(),
        per.len(),
        a.backend.name(),
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
        ck.saved_full_bytes,
        ck.saved_incremental_bytes,
        time_geo,
        instr_geo,
        if meets { "met" } else { "missed" },
        breakdown::line(&parts(&all)),
        lines.concat()
    ))
}

#[cfg(test)]
#[path = "exp_preempt_tests.rs"]
mod tests;
