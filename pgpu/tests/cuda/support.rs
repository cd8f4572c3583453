//! Helpers of the cuda engine tests: engines, child processes for what loses the CUDA context,
//! suite instances placed on 2 MiB pages and run (optionally preempted from another thread),
//! conformance set-ups and the vGPU's VA window.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpu::conformance::Setup;
use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

pub const MIB: u64 = 1 << 20;
pub const PAGE: u64 = 2 * MIB;
/// The GPU VA window the vGPU advertises.
pub const VGPU_BASE: u64 = 0x10_0000_0000;
pub const VGPU_SIZE: u64 = 4 << 30;

pub fn cuda(cfg: CudaConfig) -> CudaEngine {
    CudaEngine::new(cfg).expect("a CUDA device")
}

pub fn sim() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 512 * MIB,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Runs the ignored test `name` in a child process (for what loses the CUDA context or may
/// crash), passing its output through.
pub fn in_child(name: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PGPU_CUDA_CHILD", name)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child {name}: {:?}", out.status);
}

pub fn is_child(name: &str) -> bool {
    std::env::var("PGPU_CUDA_CHILD").as_deref() == Ok(name)
}

#[path = "../common/placed.rs"]
mod placed;
pub use placed::Placed;

/// Maps every buffer on 2 MiB pages (an unmapped 2 MiB guard after each) from `window.base`,
/// VRAM from 0, fills it and loads the PTX.
pub fn place(e: &dyn Engine, inst: &suite::Instance, window: VaWindow) -> Placed {
    let space = e.create_space(window).unwrap();
    let (mut va, mut pa) = (window.base, 0);
    let mut maps = Vec::new();
    let mut addrs = Vec::new();
    for b in &inst.buffers {
        let len = (b.init.len().max(1) as u64).next_multiple_of(PAGE);
        maps.push(Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        });
        addrs.push(va);
        va += len + PAGE;
        pa += len;
    }
    e.map_batch(space, &maps).unwrap();
    for (b, &va) in inst.buffers.iter().zip(&addrs) {
        e.copy_to_space(space, va, &b.init).unwrap();
    }
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    Placed {
        space,
        module,
        addrs,
    }
}

/// How long after a run started running (`every` times these, cycled run by run) the
/// preempter requests: the short offsets for kernels of tens of µs, the long ones let a run
/// whose kernel starts long after the handle's running mark progress (below).
const OFFSETS: [f64; 6] = [0.0, 0.5, 1.0, 2.0, 8.0, 64.0];

/// Preempts each run of the job from a helper thread while alive, at an offset after the run
/// started running (the handle's `running_since`: a fresh launch or a resume) that cycles
/// through [`OFFSETS`] × `every` (a run already requested, by [`run`] before it started, gets
/// no other request). Why: a request on a fixed clock could land between a resume's clear of
/// the flag and its kernel's start every time (the H200 run of 2026-11-27: under the
/// host-mapped flag, whose resumes take ~1 ms of host work, vecadd was still preempted after
/// 120 s with no thread having run); so could one a fixed `every` after the running mark,
/// which that path sets ~1 ms before its kernel starts (session 13, same test). Each sixth
/// run gets 64 × `every` and progresses.
pub struct Preempter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Preempter {
    fn start(h: &PreemptHandle, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, h) = (stop.clone(), h.clone());
        let thread = std::thread::spawn(move || {
            let mut last = None;
            let mut i = 0usize;
            while !s.load(Ordering::Relaxed) {
                match h.running_since() {
                    Some(t) if last != Some(t) => {
                        last = Some(t);
                        if h.is_requested() {
                            continue;
                        }
                        let at = t + every.mul_f64(OFFSETS[i % OFFSETS.len()]);
                        i += 1;
                        if let Some(left) = at.checked_duration_since(Instant::now()) {
                            std::thread::sleep(left);
                        }
                        h.request();
                    }
                    _ => std::thread::sleep(Duration::from_micros(5)),
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Preempter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The job of `l`, one of `p`'s instance's launches (its pointer parameters at the placed
/// buffers).
pub fn launch_job(p: &Placed, l: &suite::Launch) -> Result<Job, String> {
    Ok(Job::Launch(LaunchJob {
        space: p.space,
        module: p.module,
        entry: l.entry.to_string(),
        grid: l.grid,
        block: l.block,
        dynamic_shared: l.shared_bytes,
        params: suite::layout_params(&l.params, &p.addrs).map_err(|e| e.to_string())?,
    }))
}

/// Most resumes of one launch in `run`, and the most time one launch may take there: a
/// launch whose resumes all start with the flag already raised (a request between the handle's
/// clear and the kernel's start) never starts its not-started threads, so a run that does not
/// progress is bounded and reported rather than left to hang.
pub const RUN_MAX_RESUMES: u32 = 1_000_000;
pub const RUN_MAX_LAUNCH_TIME: Duration = Duration::from_secs(120);

/// Runs every launch; with `preempt_every`, each launch's fresh run is requested before it
/// starts (it stops at its first point: on a real GPU nothing else preempts a kernel of a few
/// µs, which has ended before a request after its start lands — session 13: 0 preemptions in
/// 50 launches of the suite's medium sizes) and a helper thread preempts every run ([`Preempter`]);
/// the run resumes (alternately from memory and from bytes). Returns buffers and preemption
/// count; a launch over `RUN_MAX_RESUMES` or `RUN_MAX_LAUNCH_TIME` is an error.
pub fn run(
    e: &dyn Engine,
    p: &Placed,
    inst: &suite::Instance,
    preempt_every: Option<Duration>,
) -> Result<(Vec<Vec<u8>>, u32), String> {
    let h = PreemptHandle::new();
    let _p = preempt_every.map(|d| Preempter::start(&h, d));
    let mut n = 0;
    for l in &inst.launches {
        let job = launch_job(p, l)?;
        h.clear();
        if preempt_every.is_some() {
            h.request();
        }
        let t0 = std::time::Instant::now();
        let mut out = e.execute(&job, &h).map_err(|e| e.to_string())?;
        let mut resumes = 0u32;
        while let Outcome::Preempted { context, .. } = out {
            n += 1;
            resumes += 1;
            if resumes > RUN_MAX_RESUMES || t0.elapsed() > RUN_MAX_LAUNCH_TIME {
                return Err(format!(
                    "{}: still preempted after {resumes} resumes in {:?}",
                    l.entry,
                    t0.elapsed()
                ));
            }
            let context = if n % 2 == 0 {
                SavedContext::from_bytes(context.into_bytes())
            } else {
                context
            };
            h.clear();
            out = e.resume(context, &h).map_err(|e| e.to_string())?;
        }
        if let Outcome::Faulted { fault, .. } = out {
            return Err(format!("{}: {fault}", l.entry));
        }
    }
    let mut outs = Vec::new();
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        let mut buf = vec![0u8; b.init.len()];
        e.copy_from_space(p.space, va, &mut buf)
            .map_err(|e| e.to_string())?;
        outs.push(buf);
    }
    Ok((outs, n))
}

pub fn check(inst: &suite::Instance, outs: &[Vec<u8>]) -> Result<(), String> {
    let slices: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&slices).map(|_| ()).map_err(|m| m.to_string())
}

/// The `spin` workload's first buffer judged by what a preempted and resumed run can promise:
/// every thread wrote an elapsed time of at least its duration (none skipped: the buffer starts
/// zero) and at most `span`, the wall time of the calls that ran it, plus 1 ms for the two
/// clocks (a start time restored wrong reads as more). Its values are `%globaltimer` differences, and a checkpointed thread
/// keeps its start time while stopped (the stop counts as spun time), so they are never
/// compared with another run's bytes.
pub fn spin_ok(inst: &suite::Instance, out: &[u8], span: Duration) -> Result<(), String> {
    let Some(suite::Expect::U64AtLeast { count, min }) = inst.buffers.first().map(|b| &b.expect)
    else {
        return Err(format!("{}: not a spin instance", inst.workload));
    };
    let v: Vec<u64> = out
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let max_ns = (span + Duration::from_millis(1)).as_nanos() as u64;
    let low = v.iter().filter(|&&x| x < *min).count();
    let high = v.iter().filter(|&&x| x > max_ns).count();
    if v.len() != *count || low > 0 || high > 0 {
        return Err(format!(
            "spin: {} values (want {count}): {low} below {min} ns ({} zero), {high} above the run's {max_ns} ns; min {:?} max {:?}",
            v.len(),
            v.iter().filter(|&&x| x == 0).count(),
            v.iter().min(),
            v.iter().max()
        ));
    }
    Ok(())
}

/// Conformance set-up for the cuda engine: 1 GiB windows (CUDA honours large reservations at
/// their address) above the vGPU's window, kernel faults fatal; `distinct` gives spaces alive
/// at once disjoint windows (else they share one, time-shared by the engine).
pub fn cuda_setup_with(distinct: bool) -> Setup {
    Setup {
        window_base: VGPU_BASE + VGPU_SIZE,
        window_size: 1 << 30,
        distinct_windows: distinct,
        fatal_kernel_faults: true,
    }
}

pub fn cuda_setup() -> Setup {
    cuda_setup_with(true)
}

pub fn window() -> VaWindow {
    VaWindow {
        base: VGPU_BASE,
        size: VGPU_SIZE,
    }
}

// ---- CPU: the rewrite, checked on sim ----
