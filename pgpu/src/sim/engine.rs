//! `SimEngine`: the built-in software GPU: its state, constructors and the job runners that
//! `api.rs` (the `Engine` implementation) calls.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::ckpt::{CkptCounters, CkptStats};
use crate::engine::{
    EngineError, EngineInfo, LaunchJob, MapTarget, ModuleId, Outcome, PreemptHandle, SavedContext,
};

use super::config::SimConfig;
use super::context::{self, CopyState, Decoded, Live, LiveJob};
use super::copy::{self, CopyEnd};
use super::counters::{Counters, SimCounters};
use super::exec;
use super::hostmem::{HostMemError, HostRegions};
use super::mmu::TargetMem;
use super::modules::Modules;
use super::spaces::{SpaceUse, Spaces};
use super::vram::{VramError, VramRegion};
use crate::sync::lock;

/// The built-in software GPU.
#[derive(Debug)]
pub struct SimEngine {
    pub(super) info: EngineInfo,
    pub(super) config: SimConfig,
    pub(super) vram: VramRegion,
    /// Lock order: `host` before any space lock (map and unregister hold it across both).
    pub(super) host: Mutex<HostRegions>,
    pub(super) spaces: Spaces,
    pub(super) modules: Mutex<Modules>,
    /// Test knob: when non-zero, every run stops after this much work (see `set_step_limit`).
    pub(super) step_limit: AtomicU64,
    pub(super) counters: Counters,
    /// Counters of the checkpoint method.
    pub(super) ckpt: CkptCounters,
    /// Identity of this engine in the process (in-memory contexts resume only where made).
    pub(super) id: u64,
}

/// Source of engine identities.
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

impl SimEngine {
    /// Creates an engine with `config` and private VRAM of `config.vram_size` bytes.
    pub fn new(config: SimConfig) -> Result<Self, EngineError> {
        let vram = VramRegion::anonymous(config.vram_size).map_err(vram_err)?;
        Self::with_vram(config, vram)
    }

    /// Creates an engine on a given VRAM region (e.g. this VM's partition of a shared memory
    /// object, `VramRegion::from_fd`); `config.vram_size` is ignored.
    pub fn with_vram(config: SimConfig, vram: VramRegion) -> Result<Self, EngineError> {
        let mut page_sizes = config.page_sizes.clone();
        page_sizes.sort();
        page_sizes.dedup();
        if page_sizes.is_empty() {
            return Err(EngineError::Backend("no page size configured".into()));
        }
        let info = EngineInfo {
            name: "sim".into(),
            vram_size: vram.size(),
            page_sizes,
            limits: config.limits.clone(),
        };
        log::info!(
            "sim engine: {} MiB VRAM, {} workers",
            vram.size() >> 20,
            config.workers
        );
        Ok(Self {
            info,
            config,
            vram,
            host: Mutex::default(),
            spaces: Spaces::default(),
            modules: Mutex::default(),
            step_limit: AtomicU64::new(0),
            counters: Counters::default(),
            ckpt: CkptCounters::default(),
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The VRAM region (for its shared memory object, if any).
    pub fn vram(&self) -> &VramRegion {
        &self.vram
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Deterministic preemption for tests and experiments: with `Some(n)`, every `execute` or
    /// `resume` call stops after `n` units of work (warp-instructions per worker for kernels,
    /// chunks for copies) and returns `Preempted` as if requested.
    pub fn set_step_limit(&self, steps: Option<u64>) {
        self.step_limit.store(steps.unwrap_or(0), Ordering::Relaxed);
    }

    /// Work counters since the engine was created.
    pub fn counters(&self) -> SimCounters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SimCounters {
            thread_instructions: get(&c.thread_instructions),
            warp_instructions: get(&c.warp_instructions),
            runs: get(&c.runs),
            preemptions: get(&c.preemptions),
            faults: get(&c.faults),
            copy_bytes: get(&c.copy_bytes),
        }
    }

    /// Counters of the checkpoint preemption method (transformed modules, fallbacks and their
    /// reasons, preemptions and the bytes they saved).
    pub fn ckpt_stats(&self) -> CkptStats {
        self.ckpt.snapshot()
    }

    /// Modules loaded now and the host bytes they hold (decoded code, variables, text).
    pub fn module_usage(&self) -> (usize, u64) {
        let m = lock(&self.modules);
        (m.len(), m.host_bytes())
    }

    pub(super) fn steps(&self) -> Option<u64> {
        match self.step_limit.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    pub(super) fn ptx_limits(&self) -> ptx::Limits {
        let l = &self.info.limits;
        ptx::Limits {
            max_threads_per_block: l.max_threads_per_block,
            max_block: l.max_block,
            max_grid: l.max_grid,
            max_shared_bytes: l.max_shared_per_block,
            max_local_bytes_per_thread: l.max_local_per_thread,
        }
    }

    pub(super) fn target_mem(
        &self,
        hosts: &HostRegions,
        t: MapTarget,
    ) -> Result<(TargetMem, u64), EngineError> {
        match t {
            MapTarget::Vram { pa } => Ok((
                TargetMem {
                    slot: 0,
                    host_base: self.vram.host_base(),
                    size: self.vram.size(),
                },
                pa,
            )),
            MapTarget::Host { region, offset } => {
                Ok((hosts.target(region).map_err(host_err)?, offset))
            }
        }
    }

    /// Marks VRAM `[pa, pa + len)` written in the dirty log (the range was checked).
    pub(super) fn mark_vram(&self, pa: u64, len: u64) {
        let log = self.spaces.log();
        if log.on() && len > 0 {
            log.mark(0, self.vram.host_base() + pa as usize, len as usize);
        }
    }

    pub(super) fn live(&self, job: LiveJob) -> SavedContext {
        SavedContext::live(Box::new(Live {
            engine: self.id,
            job,
        }))
    }

    pub(super) fn run_copy(
        &self,
        space: SpaceUse,
        c: CopyState,
        preempt: &PreemptHandle,
        t0: Instant,
    ) -> Outcome {
        let chunk = self.config.copy_chunk.max(1);
        // A forced preemption after `n` chunks (test knob) is a shorter copy that ends preempted.
        let stop = match self.steps() {
            Some(n) => c.done.saturating_add(n.saturating_mul(chunk)).min(c.len),
            None => c.len,
        };
        preempt.mark_running();
        let end = match copy::run(
            space.mmu(),
            c.src,
            c.dst,
            stop,
            c.done,
            chunk,
            preempt.flag(),
        ) {
            CopyEnd::Done if stop < c.len => CopyEnd::Preempted { done: stop },
            other => other,
        };
        let gpu_time = t0.elapsed();
        let moved = match &end {
            CopyEnd::Done => c.len - c.done,
            CopyEnd::Preempted { done } => done - c.done,
            CopyEnd::Faulted(_) => 0,
        };
        self.counters.copy_bytes.fetch_add(moved, Ordering::Relaxed);
        let out = match end {
            CopyEnd::Done => Outcome::Completed { gpu_time },
            CopyEnd::Preempted { done } => {
                log::debug!(
                    "copy in {:?} preempted at {done:#x}/{:#x}",
                    space.id(),
                    c.len
                );
                let context = self.live(LiveJob::Copy(CopyState { done, ..c }));
                Outcome::Preempted { context, gpu_time }
            }
            CopyEnd::Faulted(fault) => {
                log::info!("copy in {:?} faulted: {fault}", space.id());
                Outcome::Faulted { fault, gpu_time }
            }
        };
        self.counters.outcome(&out);
        out
    }

    pub(super) fn run_launch(
        &self,
        space: SpaceUse,
        module: ModuleId,
        mut launch: Box<ptx::Launch>,
        preempt: &PreemptHandle,
        t0: Instant,
    ) -> Outcome {
        let steps = self.steps();
        let run = exec::run(
            &mut launch,
            space.mmu(),
            preempt,
            self.config.workers,
            steps,
        );
        let c = &self.counters;
        if let ptx::RunOutcome::Completed(st) | ptx::RunOutcome::Preempted(st) = &run {
            c.thread_instructions
                .fetch_add(st.thread_instructions, Ordering::Relaxed);
            c.warp_instructions
                .fetch_add(st.warp_instructions, Ordering::Relaxed);
        }
        let out = match run {
            ptx::RunOutcome::Completed(_) => Outcome::Completed {
                gpu_time: t0.elapsed(),
            },
            ptx::RunOutcome::Preempted(_) => {
                let context = self.live(LiveJob::Launch {
                    space: space.id(),
                    module,
                    launch,
                });
                log::debug!("launch preempted: {context:?}");
                Outcome::Preempted {
                    context,
                    gpu_time: t0.elapsed(),
                }
            }
            ptx::RunOutcome::Faulted(f) => {
                let fault = exec::job_fault(&f, launch.entry_name(), space.mmu());
                log::info!("launch in {:?} faulted: {fault}", space.id());
                Outcome::Faulted {
                    fault,
                    gpu_time: t0.elapsed(),
                }
            }
        };
        c.outcome(&out);
        out
    }

    pub(super) fn resume_live(
        &self,
        live: Live,
        preempt: &PreemptHandle,
        t0: Instant,
    ) -> Result<Outcome, EngineError> {
        if live.engine != self.id {
            return Err(EngineError::BadContext(
                "in-memory context of another engine".into(),
            ));
        }
        match live.job {
            LiveJob::Copy(c) => {
                let s = self.spaces.begin(c.space)?;
                Ok(self.run_copy(s, c, preempt, t0))
            }
            LiveJob::Launch {
                space,
                module,
                launch,
            } => {
                // The module must still be loaded, as for a context in bytes.
                lock(&self.modules).get(module)?;
                let s = self.spaces.begin(space)?;
                Ok(self.run_launch(s, module, launch, preempt, t0))
            }
            LiveJob::Ckpt(job) => {
                lock(&self.modules).get(job.launch.module)?;
                let job = if job.stalled {
                    match self.escalate(job)? {
                        Ok(job) => job,
                        Err(l) => {
                            let launch = self.new_launch(&l)?;
                            let s = self.spaces.begin(l.space)?;
                            return Ok(self.run_launch(s, l.module, Box::new(launch), preempt, t0));
                        }
                    }
                } else {
                    job
                };
                let s = self.spaces.begin(job.launch.space)?;
                self.run_ckpt(s, job, true, preempt, t0)
            }
        }
    }

    /// Decodes and validates context bytes into the in-memory form (the bytes can then go).
    pub(super) fn live_from_bytes(&self, bytes: &[u8]) -> Result<Live, EngineError> {
        if bytes.len() > self.info.limits.max_context_bytes {
            return Err(EngineError::BadContext("too large".into()));
        }
        let decoded = context::decode(bytes).map_err(|e| EngineError::BadContext(e.to_string()))?;
        let job = match decoded {
            Decoded::Copy(c) => {
                check_range(c.src, c.len)?;
                check_range(c.dst, c.len)?;
                LiveJob::Copy(c)
            }
            Decoded::Launch {
                space,
                module,
                state,
            } => {
                let m = lock(&self.modules).get(module)?;
                let launch = ptx::Launch::restore(m, state, &self.ptx_limits())
                    .map_err(|e| EngineError::BadContext(e.to_string()))?;
                LiveJob::Launch {
                    space,
                    module,
                    launch: Box::new(launch),
                }
            }
            Decoded::Ckpt {
                space,
                body,
                escalated,
            } => LiveJob::Ckpt(self.ck_from_bytes(space, body, escalated)?),
        };
        Ok(Live {
            engine: self.id,
            job,
        })
    }

    pub(super) fn new_launch(&self, l: &LaunchJob) -> Result<ptx::Launch, EngineError> {
        let lim = &self.info.limits;
        if l.entry.len() > lim.max_entry_name {
            return Err(EngineError::BadLaunch("entry name too long".into()));
        }
        if l.params.len() > lim.max_param_bytes {
            return Err(EngineError::BadLaunch("parameter buffer too large".into()));
        }
        let module = lock(&self.modules).get(l.module)?;
        let cfg = ptx::LaunchConfig {
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.dynamic_shared,
            params: l.params.clone(),
        };
        ptx::Launch::new(module, &l.entry, cfg, &self.ptx_limits())
            .map_err(|e| EngineError::BadLaunch(e.to_string()))
    }
}

pub(super) fn vram_err(e: VramError) -> EngineError {
    match e {
        VramError::OutOfRange { pa, len, .. } => EngineError::VramRange { pa, len },
        other => EngineError::Backend(other.to_string()),
    }
}

pub(super) fn host_err(e: HostMemError) -> EngineError {
    match e {
        HostMemError::Misaligned => EngineError::BadHostRegion("base or length not 4 KiB aligned"),
        HostMemError::TooMany(_) => EngineError::TooMany("host regions"),
        HostMemError::Unknown(id) => EngineError::UnknownHostRegion(id),
    }
}

pub(super) fn check_range(va: u64, len: u64) -> Result<(), EngineError> {
    va.checked_add(len)
        .map(|_| ())
        .ok_or(EngineError::BadCopy("range wraps around"))
}
