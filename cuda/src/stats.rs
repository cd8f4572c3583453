//! The library's own per-call timing, for GPUvm's phases (`VGPU_CUDA_STATS=PATH`): written as
//! JSON at the last context's destruction and at exit (docs/architecture.md has the format).
//!
//! Phases (nanoseconds of wall time on the calling threads):
//! - `init`: from the first `cuInit` to the first context being ready;
//! - `copies_in`: inside host→device copies (`cuMemcpyHtoD*`, and `cuMemcpy` that way);
//! - `kernels`: from a launch to the completion of the launches in flight, as observed by the
//!   synchronising call that waits for them (overlapping launches counted once); on the host
//!   backend, which runs a launch before returning, to the launch call's return;
//! - `copies_out`: inside device→host copies, after the kernels before them were waited for;
//! - `close`: inside teardown (`cuCtxDestroy`, the last primary-context release or reset,
//!   `cuModuleUnload`, `cuMemFree`, `cuMemFreeHost`).
//!
//! Plus per call name: count, bytes, nanoseconds; the per-launch library overhead (from
//! `cuLaunchKernel`'s entry to the backend's `launch` call); and, in-process (`sim`, `cuda`),
//! `preempt`: the preemption method and what the engine did with it
//! (`backend::host::preempt_report`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// A phase of a program's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Init,
    CopiesIn,
    Kernels,
    CopiesOut,
    Close,
}

#[derive(Default, Clone, Copy)]
struct Call {
    count: u64,
    bytes: u64,
    ns: u64,
}

#[derive(Default)]
struct Stats {
    backend: &'static str,
    phases: [u64; 5],
    calls: BTreeMap<&'static str, Call>,
    launches: u64,
    overhead_total: u64,
    overhead_max: u64,
    init_started: Option<Instant>,
    init_done: bool,
    kernels_since: Option<Instant>,
    dirty: bool,
}

static STATS: Mutex<Option<Stats>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Stats) -> R) -> R {
    let mut g = STATS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Stats::default))
}

fn ns(since: Instant) -> u64 {
    since.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
}

/// Whether `VGPU_CUDA_STATS` asks for a report (so timing is worth taking).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("VGPU_CUDA_STATS").is_some())
}

/// `cuInit` was called (the first call starts the init phase).
pub fn init_started(backend: &'static str) {
    with(|s| {
        s.backend = backend;
        s.init_started.get_or_insert_with(Instant::now);
    });
}

/// A context is ready (the first one ends the init phase).
pub fn context_ready() {
    with(|s| {
        if !s.init_done
            && let Some(t) = s.init_started
        {
            s.phases[Phase::Init as usize] += ns(t);
            s.init_done = true;
            s.dirty = true;
        }
    });
}

/// One call of `name` that moved `bytes` and started at `t`, charged to `phase`.
pub fn call(name: &'static str, bytes: u64, t: Instant, phase: Option<Phase>) {
    let d = ns(t);
    with(|s| {
        let c = s.calls.entry(name).or_default();
        c.count += 1;
        c.bytes += bytes;
        c.ns += d;
        if let Some(p) = phase {
            s.phases[p as usize] += d;
        }
        s.dirty = true;
    });
}

/// A launch was issued at `t`, `overhead_ns` after its call began.
pub fn launched(t: Instant, overhead_ns: u64) {
    with(|s| {
        s.kernels_since.get_or_insert(t);
        s.launches += 1;
        s.overhead_total += overhead_ns;
        s.overhead_max = s.overhead_max.max(overhead_ns);
        s.dirty = true;
    });
}

/// Whether launches are in flight (not yet observed complete).
pub fn kernels_pending() -> bool {
    with(|s| s.kernels_since.is_some())
}

/// The work in flight was observed complete now.
pub fn kernels_done() {
    with(|s| {
        if let Some(t) = s.kernels_since.take() {
            s.phases[Phase::Kernels as usize] += ns(t);
        }
    });
}

/// The report as JSON.
pub fn json() -> serde_json::Value {
    // Outside the report's lock: the engine's counters take their own.
    let preempt = crate::backend::host::preempt_report();
    let mut j = with(|s| {
        let calls: serde_json::Map<String, serde_json::Value> = s
            .calls
            .iter()
            .map(|(n, c)| {
                (
                    n.to_string(),
                    serde_json::json!({"count": c.count, "bytes": c.bytes, "ns": c.ns}),
                )
            })
            .collect();
        serde_json::json!({
            "library": "vgpu-vmm libcuda.so.1",
            "backend": s.backend,
            "phases_ns": {
                "init": s.phases[Phase::Init as usize],
                "copies_in": s.phases[Phase::CopiesIn as usize],
                "kernels": s.phases[Phase::Kernels as usize],
                "copies_out": s.phases[Phase::CopiesOut as usize],
                "close": s.phases[Phase::Close as usize],
            },
            "launch_overhead_ns": {
                "launches": s.launches,
                "total": s.overhead_total,
                "mean": s.overhead_total.checked_div(s.launches).unwrap_or(0),
                "max": s.overhead_max,
            },
            "calls": calls,
        })
    });
    if let Some(p) = preempt {
        j["preempt"] = p;
    }
    j
}

/// Writes the report to `VGPU_CUDA_STATS` if set and anything changed since the last write
/// (`-`: one `vgpu-cuda-stats: {json}` line on stderr); a failure is reported on stderr.
pub fn write() {
    let Some(path) = std::env::var_os("VGPU_CUDA_STATS") else {
        return;
    };
    if !with(|s| std::mem::take(&mut s.dirty)) {
        return;
    }
    if path == "-" {
        // One line on stderr (a VM's console, an experiment's pipe): the last one is the whole.
        match serde_json::to_string(&json()) {
            Ok(t) => eprintln!("vgpu-cuda-stats: {t}"),
            Err(e) => eprintln!("libcuda (vgpu): VGPU_CUDA_STATS: {e}"),
        }
        return;
    }
    let text = match serde_json::to_string_pretty(&json()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("libcuda (vgpu): VGPU_CUDA_STATS: {e}");
            return;
        }
    };
    if let Err(e) = std::fs::write(&path, text + "\n") {
        eprintln!(
            "libcuda (vgpu): VGPU_CUDA_STATS: cannot write {}: {e}",
            std::path::Path::new(&path).display()
        );
    }
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(write);
}

/// Runs [`at_exit`] when the library is unloaded or the process exits.
#[used]
#[unsafe(link_section = ".fini_array")]
static AT_EXIT: extern "C" fn() = at_exit;
