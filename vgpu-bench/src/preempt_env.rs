//! The engines and helpers of `vgpu-bench preempt`: a sim or cuda engine with a preemption
//! method, suite instances placed on the engine's largest page size in a 4 GiB window (the
//! vGPU's, which CUDA reserves at its address), unpreempted timed runs (the engine's GPU time:
//! CUDA events on cuda), read-back, the checkpoint counters, and the latency CDF chart.

use std::path::Path;
use std::sync::Mutex;

use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{
    CkptStats, Engine, Job, LaunchJob, MapTarget, Mapping, ModuleId, Outcome, PreemptHandle,
    PreemptMethod, SpaceId, VaWindow,
};
use plotters::style::RGBColor;

use crate::backend::Backend;
use crate::error::BenchError;
use crate::preempt_breakdown::CudaKnobs;

/// Base and size of the address space of every instance.
const BASE: u64 = 0x10_0000_0000;
const WINDOW: u64 = 4 << 30;
/// VRAM of the engine.
const VRAM: u64 = 1 << 30;

enum Kind {
    Sim(Box<SimEngine>),
    Cuda(Box<CudaEngine>),
}

/// An engine of either backend, with the checkpoint bytes already reported.
pub struct Eng {
    kind: Kind,
    reported: Mutex<(u64, u64)>,
}

impl Eng {
    pub fn new(
        backend: Backend,
        method: PreemptMethod,
        workers: usize,
        poll_interval: u32,
        knobs: &CudaKnobs,
    ) -> Result<Eng, BenchError> {
        let kind = match backend {
            Backend::Sim => {
                let mut c = SimConfig {
                    vram_size: VRAM,
                    preempt: method,
                    ckpt_poll_interval: poll_interval,
                    preempt_wait: std::time::Duration::from_micros(knobs.wait_us),
                    ..SimConfig::default()
                };
                if workers > 0 {
                    c.workers = workers;
                }
                Kind::Sim(Box::new(SimEngine::new(c)?))
            }
            Backend::Cuda => Kind::Cuda(Box::new(CudaEngine::new(CudaConfig {
                vram_size: VRAM,
                preempt: method,
                ckpt_poll_interval: poll_interval,
                flag_write: knobs.flag_write,
                end_wait: knobs.end_wait,
                status_read: knobs.status_read,
                ck_path: knobs.ck_path,
                ckpt_chunk_instructions: knobs.chunk,
                ckpt_fast_chunks: knobs.fast_chunks,
                ckpt_atomic_weight: knobs.atomic_weight,
                preempt_wait: std::time::Duration::from_micros(knobs.wait_us),
                ..CudaConfig::default()
            })?)),
        };
        Ok(Eng {
            kind,
            reported: Mutex::new((0, 0)),
        })
    }

    /// The untransformed kernels, each launch whole: the baseline of the steady-state
    /// overheads (on sim the interpreter runs the original module; on cuda modules load
    /// unmodified, `CudaConfig::whole_launches`).
    pub fn original(backend: Backend, workers: usize) -> Result<Eng, BenchError> {
        match backend {
            Backend::Sim => Eng::new(
                backend,
                PreemptMethod::Slice,
                workers,
                1,
                &CudaKnobs::default(),
            ),
            Backend::Cuda => Ok(Eng {
                kind: Kind::Cuda(Box::new(CudaEngine::new(CudaConfig {
                    vram_size: VRAM,
                    whole_launches: true,
                    ..CudaConfig::default()
                })?)),
                reported: Mutex::new((0, 0)),
            }),
        }
    }

    /// Thread-instructions the sim interpreter has executed (`None` on cuda).
    pub fn thread_instructions(&self) -> Option<u64> {
        match &self.kind {
            Kind::Sim(e) => Some(e.counters().thread_instructions),
            Kind::Cuda(_) => None,
        }
    }

    pub fn dyn_engine(&self) -> &dyn Engine {
        match &self.kind {
            Kind::Sim(e) => e.as_ref(),
            Kind::Cuda(e) => e.as_ref(),
        }
    }

    pub fn workers(&self) -> usize {
        match &self.kind {
            Kind::Sim(e) => e.config().workers,
            Kind::Cuda(_) => 1,
        }
    }

    pub fn device(&self) -> String {
        match &self.kind {
            Kind::Sim(_) => "sim".into(),
            Kind::Cuda(e) => e.device_name(),
        }
    }

    pub fn ckpt_stats(&self) -> CkptStats {
        match &self.kind {
            Kind::Sim(e) => e.ckpt_stats(),
            Kind::Cuda(e) => e.ckpt_stats(),
        }
    }

    /// The latest preemption's breakdown since the last call (cuda only).
    pub fn take_breakdown(&self) -> Option<pgpu::cuda::CkBreakdown> {
        match &self.kind {
            Kind::Sim(_) => None,
            Kind::Cuda(e) => e.take_ck_breakdowns().pop(),
        }
    }

    /// Checkpoint bytes (full, incremental) saved since the last call.
    pub fn take_saved(&self) -> (u64, u64) {
        let s = self.ckpt_stats();
        let mut r = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let d = (
            s.saved_full_bytes.saturating_sub(r.0),
            s.saved_incremental_bytes.saturating_sub(r.1),
        );
        *r = (s.saved_full_bytes, s.saved_incremental_bytes);
        d
    }
}

/// An instance placed in an address space.
pub struct Placed {
    pub space: SpaceId,
    pub module: ModuleId,
    pub addrs: Vec<u64>,
}

/// Creates a space, maps every buffer on the engine's largest page (a guard page after each),
/// fills it and loads the module.
pub fn place(e: &Eng, inst: &suite::Instance) -> Result<Placed, BenchError> {
    let e = e.dyn_engine();
    let page = e
        .info()
        .page_sizes
        .iter()
        .max()
        .copied()
        .ok_or_else(|| BenchError::Invalid("engine without page sizes".into()))?;
    let space = e.create_space(VaWindow {
        base: BASE,
        size: WINDOW,
    })?;
    let (mut va, mut pa) = (BASE, 0u64);
    let mut maps = Vec::new();
    let mut addrs = Vec::new();
    for b in &inst.buffers {
        let len = (b.init.len().max(1) as u64).next_multiple_of(page.bytes());
        maps.push(Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: pgpu::Perm::ReadWrite,
            page_size: page,
        });
        addrs.push(va);
        va += len + page.bytes();
        pa += len;
    }
    if pa > VRAM {
        return Err(BenchError::Invalid(format!(
            "{}: buffers need {pa} bytes of VRAM, the engine has {VRAM}",
            inst.workload
        )));
    }
    e.map_batch(space, &maps)?;
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)?;
    let p = Placed {
        space,
        module,
        addrs,
    };
    reset_dyn(e, &p, inst)?;
    Ok(p)
}

/// Unloads the module and destroys the space.
pub fn release(e: &Eng, p: &Placed) -> Result<(), BenchError> {
    let e = e.dyn_engine();
    e.unload_module(p.module)?;
    e.destroy_space(p.space)?;
    Ok(())
}

/// The engine job of launch `i`.
pub fn job(p: &Placed, inst: &suite::Instance, i: usize) -> Result<Job, BenchError> {
    let l = inst
        .launches
        .get(i)
        .ok_or_else(|| BenchError::Invalid(format!("no launch {i}")))?;
    let params = suite::layout_params(&l.params, &p.addrs)
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    Ok(Job::Launch(LaunchJob {
        space: p.space,
        module: p.module,
        entry: l.entry.to_string(),
        grid: l.grid,
        block: l.block,
        dynamic_shared: l.shared_bytes,
        params,
    }))
}

fn reset_dyn(e: &dyn Engine, p: &Placed, inst: &suite::Instance) -> Result<(), BenchError> {
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        e.copy_to_space(p.space, va, &b.init)?;
    }
    Ok(())
}

/// Restores every buffer's initial contents.
pub fn reset(e: &Eng, p: &Placed, inst: &suite::Instance) -> Result<(), BenchError> {
    reset_dyn(e.dyn_engine(), p, inst)
}

/// Every buffer's bytes, after checking them against the instance's reference.
pub fn read_back(e: &Eng, p: &Placed, inst: &suite::Instance) -> Result<Vec<Vec<u8>>, BenchError> {
    let mut outs = Vec::new();
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        let mut buf = vec![0u8; b.init.len()];
        e.dyn_engine().copy_from_space(p.space, va, &mut buf)?;
        outs.push(buf);
    }
    let slices: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&slices).map_err(|m| BenchError::Check {
        workload: inst.workload.to_string(),
        msg: m.to_string(),
    })?;
    Ok(outs)
}

/// Unpreempted runs of an instance.
pub struct Timed {
    /// Median GPU time of a run (summed over launches), µs.
    pub us: f64,
    /// Bytes of the last run.
    pub bytes: Vec<Vec<u8>>,
    /// Thread-instructions of one run (sim only).
    pub thread_instructions: Option<u64>,
}

/// `reps` unpreempted runs: the median of their GPU time (summed over launches, µs) and the
/// bytes of the last.
pub fn timed_runs(
    e: &Eng,
    p: &Placed,
    inst: &suite::Instance,
    reps: usize,
) -> Result<Timed, BenchError> {
    let before = e.thread_instructions();
    let t = timed_runs_inner(e, p, inst, reps)?;
    let per_run = match (before, e.thread_instructions()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) / reps.max(1) as u64),
        _ => None,
    };
    Ok(Timed {
        us: t.0,
        bytes: t.1,
        thread_instructions: per_run,
    })
}

fn timed_runs_inner(
    e: &Eng,
    p: &Placed,
    inst: &suite::Instance,
    reps: usize,
) -> Result<(f64, Vec<Vec<u8>>), BenchError> {
    let h = PreemptHandle::new();
    let mut times = Vec::new();
    let mut last = Vec::new();
    for _ in 0..reps.max(1) {
        reset(e, p, inst)?;
        let mut t = 0.0;
        for i in 0..inst.launches.len() {
            match e.dyn_engine().execute(&job(p, inst, i)?, &h)? {
                Outcome::Completed { gpu_time } => t += gpu_time.as_secs_f64() * 1e6,
                Outcome::Faulted { fault, .. } => {
                    return Err(BenchError::Fault {
                        workload: inst.workload.to_string(),
                        fault,
                    });
                }
                Outcome::Preempted { .. } => {
                    return Err(BenchError::Invalid("unexpected preemption".into()));
                }
            }
        }
        times.push(t);
        last = read_back(e, p, inst)?;
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], last))
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(110, 110, 110),
    RGBColor(240, 228, 66),
];

/// The CDF chart of each workload's preemption latencies (ns).
pub fn chart(path: &Path, title: &str, series: &[(String, Vec<u64>)]) -> Result<(), BenchError> {
    let s: Vec<crate::chart_cdf::Series> = series
        .iter()
        .enumerate()
        .map(|(i, (name, ns))| crate::chart_cdf::Series {
            name: name.clone(),
            ns,
            color: PALETTE[i % PALETTE.len()],
        })
        .collect();
    if s.is_empty() {
        return Ok(());
    }
    crate::chart_cdf::draw(
        path,
        title,
        &s,
        "one step line per workload; request → Outcome::Preempted returned (context in hand)",
    )
}
