//! The checkpoint preemption method on the sim engine (`SimConfig::preempt = Checkpoint`): the
//! transformed module runs in the interpreter, one launch of the whole grid; the flag and the
//! save area live in engine-owned memory (a `ptx::FlatMemory` per job) that the kernel sees at
//! [`CK_BASE`], above any VA window; a request stores 1 into the flag (an atomic store the
//! interpreter's `ld.volatile` sees), the threads save at their next point and exit, and the
//! job is preempted if any record is not done. Also the byte form of such a context.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ptx::ckpt::EntryPlan;
use ptx::{Access, FlatMemory, GlobalMemory, HostSpan, MemFault};

use crate::ckpt::{Choice, CkParams, area_bytes, shared_per_cta, tally, threads};
use crate::engine::{EngineError, LaunchJob, ModuleId, Outcome, PreemptHandle, SpaceId};

use super::context::LiveJob;
use super::engine::SimEngine;
use super::exec;
use super::mmu::Mmu;
use super::spaces::SpaceUse;
use crate::sync::lock;

/// VA of a checkpointed job's engine-owned memory: the flag, then (at [`SAVE_OFF`]) the save
/// area. Translated before the space's MMU, so a window reaching up here is shadowed there.
pub const CK_BASE: u64 = 0xffff_f000_0000_0000;
/// Offset of the save area from [`CK_BASE`].
pub const SAVE_OFF: u64 = 256;

/// A transformed module: the interpreter's module of the transformed text and its plans.
#[derive(Debug)]
pub struct CkModule {
    pub module: Arc<ptx::Module>,
    pub plans: Vec<EntryPlan>,
    /// The checkpoint form of the same text (no entry restarts), where this form has
    /// restarting entries: a stalled restarting launch continues in it.
    pub save: Option<Arc<CkModule>>,
}

impl CkModule {
    fn plan(&self, entry: &str) -> Option<(usize, &EntryPlan)> {
        self.plans.iter().enumerate().find(|(_, p)| p.name == entry)
    }
}

/// A checkpointed launch: the guest's launch, its transformed module and its memory.
pub struct CkJob {
    pub launch: LaunchJob,
    pub ck: Arc<CkModule>,
    pub plan: usize,
    pub mem: Arc<FlatMemory>,
    /// The last run restarted its threads and finished none of them (`ckpt::stalled`): the
    /// next run escalates.
    pub stalled: bool,
    /// Set when the launch runs in the checkpoint form of a restarting entry (escalated, or
    /// not provably idempotent from its first run): the restarting form and plan it came from
    /// (its bytes say so, as `KIND_CKPT_SAVE`, and are read back into the checkpoint form).
    pub from: Option<(Arc<CkModule>, usize)>,
}

impl std::fmt::Debug for CkJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checkpointed {} in {:?}, save area {} bytes",
            self.launch.entry,
            self.launch.space,
            self.mem.size() - SAVE_OFF
        )
    }
}

/// The kernel's view of memory: the job's own memory at `CK_BASE`, the space's MMU elsewhere.
struct Overlay<'a> {
    mmu: &'a Mmu,
    mem: &'a FlatMemory,
}

impl GlobalMemory for Overlay<'_> {
    #[inline]
    fn translate(&self, va: u64, access: Access) -> Result<HostSpan, MemFault> {
        if va >= CK_BASE {
            self.mem.translate(va, access)
        } else {
            GlobalMemory::translate(self.mmu, va, access)
        }
    }
}

fn statuses(job: &CkJob) -> Vec<u32> {
    let plan = &job.ck.plans[job.plan];
    let (n, _) = threads(job.launch.grid, job.launch.block);
    let stride = plan.record_bytes.max(4) as usize;
    let area = job
        .mem
        .read(CK_BASE + SAVE_OFF, n as usize * stride)
        .unwrap_or_default();
    area.chunks_exact(stride)
        .map(|r| u32::from_le_bytes([r[0], r[1], r[2], r[3]]))
        .collect()
}

fn params_of(m: &ptx::Module, entry: &str) -> Result<CkParams, EngineError> {
    let info = m
        .entry(entry)
        .ok_or_else(|| EngineError::BadLaunch(format!("no entry {entry:?}")))?;
    let n = info.params.len();
    if n < 4 {
        return Err(EngineError::BadLaunch(
            "checkpoint parameters missing".into(),
        ));
    }
    let off = |k: usize| info.params[n - 4 + k].offset as usize;
    Ok(CkParams::new(
        [off(0), off(1), off(2), off(3)],
        info.param_size as usize,
    ))
}

impl SimEngine {
    /// The checkpointed form of `l`, if its module was transformed and its save area fits the
    /// configured limit (otherwise counted as a fallback and `None`: run it plainly), and the
    /// method chooses it (`crate::ckpt::choose`): a restarting entry's launch that is not
    /// provably idempotent runs in the entry's checkpoint form (`CkModule::save`) from its
    /// first run, or sliced where there is none within the limit.
    pub(super) fn ck_job(&self, l: &LaunchJob) -> Result<Option<CkJob>, EngineError> {
        let Some(ck) = lock(&self.modules).ck(l.module)? else {
            return Ok(None);
        };
        let Some((idx, plan)) = ck.plan(&l.entry) else {
            return Ok(None);
        };
        let need = area_bytes(plan, l.grid, l.block, l.dynamic_shared);
        let limit = self.config.max_save_area_bytes;
        if need > limit {
            self.ckpt.launch_fallback(&l.entry, need, limit);
            return Ok(None);
        }
        // Auto and restart: the interpreter runs one CTA per worker at a time.
        let blocks: u64 = l.grid.iter().map(|&g| u64::from(g)).product();
        let wave = self.config.workers.max(1) as u64;
        let (ck, idx, need, from) =
            match self
                .ckpt
                .choose(self.config.preempt, plan, &l.params, blocks, wave)
            {
                Choice::Restart | Choice::Checkpoint => (ck.clone(), idx, need, None),
                Choice::Slice(_) => return Ok(None),
                Choice::SaveForm(why) => {
                    let save = ck.save.as_ref().and_then(|s| {
                        let (i, p) = s.plan(&l.entry)?;
                        let need = area_bytes(p, l.grid, l.block, l.dynamic_shared);
                        (need <= limit).then(|| (s.clone(), i, need))
                    });
                    self.ckpt.unproven(&l.entry, &why, save.is_none());
                    let Some((save, i, need)) = save else {
                        return Ok(None);
                    };
                    (save, i, need, Some((ck.clone(), idx)))
                }
            };
        // Validate the launch (shape, parameters) before allocating its memory.
        let p = params_of(&ck.module, &l.entry)?;
        p.buffer(&l.params, 0, 0, false, 0)?;
        self.validate_shape(&ck.module, l)?;
        let mem = Arc::new(FlatMemory::new(CK_BASE, (SAVE_OFF + need) as usize));
        Ok(Some(CkJob {
            launch: l.clone(),
            ck,
            plan: idx,
            mem,
            stalled: false,
            from,
        }))
    }

    /// The next run of a stalled restarting launch (see `ckpt::stalled`): the same launch in
    /// the entry's checkpoint form, its threads that are not done starting afresh (`Ok(Ok)`),
    /// or, where there is no such form or its save area is over the limit, the launch run
    /// sliced from the start (`Ok(Err)`: the interpreter's own preemption keeps progress; the
    /// entry is idempotent, so rerunning its finished threads writes the same bytes).
    pub(super) fn escalate(&self, job: CkJob) -> Result<Result<CkJob, LaunchJob>, EngineError> {
        let l = &job.launch;
        let save = job
            .ck
            .save
            .as_ref()
            .and_then(|s| s.plan(&l.entry).map(|(i, p)| (s.clone(), i, p)));
        let Some((save, idx, plan)) = save else {
            self.ckpt.escalated(&l.entry, "sliced (no checkpoint form)");
            return Ok(Err(job.launch));
        };
        let need = area_bytes(plan, l.grid, l.block, l.dynamic_shared);
        if need > self.config.max_save_area_bytes {
            self.ckpt
                .escalated(&l.entry, "sliced (checkpoint save area over the limit)");
            return Ok(Err(job.launch));
        }
        let area = crate::ckpt::status_area(&statuses(&job), plan.record_bytes, need);
        let mem = Arc::new(FlatMemory::new(CK_BASE, (SAVE_OFF + need) as usize));
        mem.write(CK_BASE + SAVE_OFF, &area);
        self.ckpt
            .escalated(&l.entry, "continues in its checkpoint form");
        Ok(Ok(CkJob {
            from: Some((job.ck.clone(), job.plan)),
            launch: job.launch,
            ck: save.clone(),
            plan: idx,
            mem,
            stalled: false,
        }))
    }

    fn validate_shape(&self, m: &Arc<ptx::Module>, l: &LaunchJob) -> Result<(), EngineError> {
        let cfg = ptx::LaunchConfig {
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.dynamic_shared,
            params: params_of(m, &l.entry)?.buffer(&l.params, 0, 0, false, 0)?,
        };
        ptx::Launch::new(m.clone(), &l.entry, cfg, &self.ptx_limits())
            .map(|_| ())
            .map_err(|e| EngineError::BadLaunch(e.to_string()))
    }

    /// Runs (`resume` false) or resumes a checkpointed launch until its kernel ends.
    pub(super) fn run_ckpt(
        &self,
        space: SpaceUse,
        job: CkJob,
        resume: bool,
        preempt: &PreemptHandle,
        t0: Instant,
    ) -> Result<Outcome, EngineError> {
        let l = &job.launch;
        let plan = &job.ck.plans[job.plan];
        let before = if resume { statuses(&job) } else { Vec::new() };
        let flag = CK_BASE;
        job.mem.write(flag, &0u32.to_le_bytes());
        let params = params_of(&job.ck.module, &l.entry)?.buffer(
            &l.params,
            flag,
            CK_BASE + SAVE_OFF,
            resume,
            l.dynamic_shared,
        )?;
        let cfg = ptx::LaunchConfig {
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.dynamic_shared,
            params,
        };
        let mut launch = ptx::Launch::new(job.ck.module.clone(), &l.entry, cfg, &self.ptx_limits())
            .map_err(|e| EngineError::BadLaunch(e.to_string()))?;
        let overlay = Overlay {
            mmu: space.mmu(),
            mem: &job.mem,
        };
        // A request stores the flag and also stops the interpreter; so do the deadline and the
        // test knob. The engine then (re)raises the flag and lets the kernel run to its points,
        // for at most `max_checkpoint_drain`.
        let mut first = ptx::RunControl::new(self.config.workers.max(1));
        first.step_limit = self.steps();
        first.deadline = preempt.deadline();
        let mut ctl = Arc::new(first);
        let (mem, hook_ctl) = (job.mem.clone(), ctl.clone());
        let _hook = preempt.attach(Arc::new(move || {
            mem.write(flag, &1u32.to_le_bytes());
            hook_ctl.preempt.store(true, Ordering::SeqCst);
        }));
        // A request (or a passed deadline) there before the run: every thread stops at its
        // entry point, which shows nothing of the restart hazard (`ckpt::stalled`).
        let early = preempt.is_requested();
        let mut draining = false;
        preempt.mark_running();
        let c = &self.counters;
        let out = loop {
            let run = launch.run(&overlay, &ctl);
            if let ptx::RunOutcome::Completed(st) | ptx::RunOutcome::Preempted(st) = &run {
                c.thread_instructions
                    .fetch_add(st.thread_instructions, Ordering::Relaxed);
                c.warp_instructions
                    .fetch_add(st.warp_instructions, Ordering::Relaxed);
            }
            match run {
                ptx::RunOutcome::Completed(_) => break None,
                ptx::RunOutcome::Preempted(_) if draining => {
                    let limit = self.config.max_checkpoint_drain;
                    log::info!("checkpointed {} did not drain within {limit:?}", l.entry);
                    break Some(Outcome::Faulted {
                        fault: crate::engine::JobFault {
                            kind: crate::engine::FaultKind::Kernel(format!(
                                "{}: threads did not reach a preemption point within {limit:?} of the request",
                                l.entry
                            )),
                            va: 0,
                            access: None,
                            site: None,
                        },
                        gpu_time: t0.elapsed(),
                    });
                }
                ptx::RunOutcome::Preempted(_) => {
                    job.mem.write(flag, &1u32.to_le_bytes());
                    draining = true;
                    let mut next = ptx::RunControl::new(self.config.workers.max(1));
                    next.deadline = Some(Instant::now() + self.config.max_checkpoint_drain);
                    ctl = Arc::new(next);
                }
                ptx::RunOutcome::Faulted(f) => {
                    let fault = exec::job_fault(&f, launch.entry_name(), space.mmu());
                    log::info!("launch in {:?} faulted: {fault}", space.id());
                    break Some(Outcome::Faulted {
                        fault,
                        gpu_time: t0.elapsed(),
                    });
                }
            }
        };
        drop(_hook);
        let out = match out {
            Some(f) => f,
            None => {
                let after = statuses(&job);
                let (_, per_cta) = threads(l.grid, l.block);
                let t = tally(
                    plan,
                    &before,
                    &after,
                    per_cta,
                    shared_per_cta(plan, l.dynamic_shared),
                );
                if t.pending == 0 {
                    Outcome::Completed {
                        gpu_time: t0.elapsed(),
                    }
                } else {
                    self.ckpt.preempted(&t);
                    let stalled = plan.restart && !early && crate::ckpt::stalled(&before, &after);
                    let mut job = job;
                    job.stalled = stalled;
                    let context = self.live(LiveJob::Ckpt(job));
                    Outcome::Preempted {
                        context,
                        gpu_time: t0.elapsed(),
                    }
                }
            }
        };
        c.outcome(&out);
        Ok(out)
    }

    /// Rebuilds a checkpointed job from context bytes (hostile: every length checked against
    /// the module's plan and the engine's limits).
    /// `escalated`: the area is in the checkpoint form of a restarting entry.
    pub(super) fn ck_from_bytes(
        &self,
        space: SpaceId,
        body: &[u8],
        escalated: bool,
    ) -> Result<CkJob, EngineError> {
        let bad = |m: String| EngineError::BadContext(m);
        let d = decode_body(body, &self.info.limits).map_err(bad)?;
        let launch = LaunchJob { space, ..d.launch };
        let restarting = lock(&self.modules)
            .ck(launch.module)?
            .ok_or_else(|| bad("module is not checkpointed".into()))?;
        let (ck, from) = if escalated {
            let from = restarting
                .plan(&launch.entry)
                .filter(|(_, p)| p.restart)
                .map(|(i, _)| i)
                .ok_or_else(|| bad("escalated context of an entry that does not restart".into()))?;
            let save = restarting
                .save
                .clone()
                .ok_or_else(|| bad("escalated context, no checkpoint form loaded".into()))?;
            (save, Some((restarting, from)))
        } else {
            (restarting, None)
        };
        let (idx, plan) = ck
            .plan(&launch.entry)
            .ok_or_else(|| bad("no such entry".into()))?;
        let need = area_bytes(plan, launch.grid, launch.block, launch.dynamic_shared);
        if need != d.area.len() as u64 || need > self.config.max_save_area_bytes {
            return Err(bad(format!(
                "save area is {} bytes, the launch needs {need}",
                d.area.len()
            )));
        }
        self.validate_shape(&ck.module, &launch)?;
        let mem = Arc::new(FlatMemory::new(CK_BASE, (SAVE_OFF + need) as usize));
        mem.write(CK_BASE + SAVE_OFF, d.area);
        Ok(CkJob {
            launch,
            ck: ck.clone(),
            plan: idx,
            mem,
            // A context that left the engine as bytes has lost the record of its last runs:
            // a restarting one continues in its checkpoint form (which keeps progress).
            stalled: plan.restart,
            from,
        })
    }
}

/// Body bytes of a checkpointed context (its job section names the space): module (u64), grid and
/// block (3 × u32 each), dynamic shared (u32), entry and parameters (u32 length + bytes each),
/// save-area length (u64) + its bytes.
pub fn encode_body(job: &CkJob) -> Vec<u8> {
    let l = &job.launch;
    let area_len = job.mem.size() - SAVE_OFF;
    let area = job
        .mem
        .read(CK_BASE + SAVE_OFF, area_len as usize)
        .unwrap_or_default();
    let mut o = Vec::with_capacity(area.len() + 64 + l.params.len() + l.entry.len());
    o.extend_from_slice(&l.module.0.to_le_bytes());
    for v in l.grid.iter().chain(&l.block).chain([&l.dynamic_shared]) {
        o.extend_from_slice(&v.to_le_bytes());
    }
    for b in [l.entry.as_bytes(), &l.params] {
        o.extend_from_slice(&(b.len() as u32).to_le_bytes());
        o.extend_from_slice(b);
    }
    o.extend_from_slice(&(area.len() as u64).to_le_bytes());
    o.extend_from_slice(&area);
    o
}

struct Decoded<'a> {
    launch: LaunchJob,
    area: &'a [u8],
}

fn decode_body<'a>(b: &'a [u8], lim: &crate::engine::EngineLimits) -> Result<Decoded<'a>, String> {
    let mut d = snapfmt::Dec::new(b, "checkpointed context");
    let e = |e: snapfmt::FrameError| match e {
        snapfmt::FrameError::Truncated { .. } => "context truncated".to_string(),
        e => e.to_string(),
    };
    let module = d.u64().map_err(e)?;
    let mut dims = [0u32; 7];
    for x in &mut dims {
        *x = d.u32().map_err(e)?;
    }
    let entry = d
        .at("entry name")
        .string(lim.max_entry_name)
        .map_err(e)?
        .to_string();
    let params = d
        .at("parameter buffer")
        .bytes(lim.max_param_bytes)
        .map_err(e)?
        .to_vec();
    let area = d.at("save area").bytes_u64(u64::MAX).map_err(e)?;
    if d.left() != 0 {
        return Err("trailing bytes".into());
    }
    Ok(Decoded {
        launch: LaunchJob {
            space: SpaceId(0),
            module: ModuleId(module),
            entry,
            grid: [dims[0], dims[1], dims[2]],
            block: [dims[3], dims[4], dims[5]],
            dynamic_shared: dims[6],
            params,
        },
        area,
    })
}
