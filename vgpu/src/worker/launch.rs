//! The worker's launch path: reading a launch's code, entry and parameters from guest memory,
//! its kernel identity, and the module it runs — from the VM's module cache, or loaded under
//! the job's time limit and the VM's host memory budget, evicting idle modules and shadow spaces
//! when that budget is full.

use std::time::Instant;

use pgpu::{EngineError, Job, LaunchJob, LoadLimits, ModuleId, SpaceId};

use super::{Fault, LIMIT_MODULE, Worker};
use crate::budget::Class;
use crate::methods::LaunchDesc;
use crate::regs::{self, Access, FaultKind};
use crate::snapshot::writes::Checked;
impl Worker {
    /// The launch `d` describes, and its kernel identity (`vgpu_proto::kernel::KernelKey`: what the
    /// daemon of a shared GPU learns kernel times under).
    pub(super) fn launch_job(
        &mut self,
        space: SpaceId,
        d: &LaunchDesc,
    ) -> Result<(LaunchJob, u64), Fault> {
        let bad = |info| Fault::new(FaultKind::BadLaunch, 0, info);
        if d.code_len == 0 || d.code_len > regs::MAX_CODE_LEN {
            return Err(bad(regs::method::CODE_LEN));
        }
        if d.entry_len == 0 || d.entry_len > regs::MAX_ENTRY_LEN {
            return Err(bad(regs::method::ENTRY_LEN));
        }
        if d.param_len > regs::MAX_PARAM_LEN {
            return Err(bad(regs::method::PARAM_LEN));
        }
        let mut code = vec![0u8; d.code_len as usize];
        self.read(space, d.code_va, &mut code, Access::Read)?;
        let mut entry = vec![0u8; d.entry_len as usize];
        self.read(space, d.entry_va, &mut entry, Access::Read)?;
        let mut params = vec![0u8; d.param_len as usize];
        if !params.is_empty() {
            self.read(space, d.param_va, &mut params, Access::Read)?;
        }
        let text = String::from_utf8(code).map_err(|e| {
            Fault::new(
                FaultKind::PtxError,
                d.code_va,
                e.utf8_error().valid_up_to() as u32,
            )
        })?;
        let entry = String::from_utf8(entry).map_err(|_| bad(regs::method::ENTRY_LO))?;
        let (module, hash) = self.module_for(&text, d.code_va)?;
        let key = vgpu_proto::kernel::KernelKey::of(hash, &entry, d.grid, d.block, d.shared_bytes);
        let job = LaunchJob {
            space,
            module,
            entry,
            grid: d.grid,
            block: d.block,
            dynamic_shared: d.shared_bytes,
            params,
        };
        if let Some(l) = self.jobs.write_log.as_ref() {
            // Remembered for the twins' preparation before a live copy's first round.
            l.note_launch(&job, &text);
            if l.on() {
                let t = Instant::now();
                l.note_kernel(module, &job.entry, &text);
                l.note_worker(t.elapsed().as_nanos() as u64, false);
            }
        }
        Ok((job, key.0))
    }

    /// The bounds-checked twin of launch `l` while live write sets log
    /// (`snapshot::writes::Checked`), loaded through the module cache; `None` when it runs as
    /// it is (a launch that cannot run checked is marked as writing everything).
    pub(super) fn checked_twin(&mut self, l: &LaunchJob) -> Option<Job> {
        let log = self.jobs.write_log.clone()?;
        match log.checked_launch(&*self.engine, l) {
            Checked::Twin { twin, params } => {
                // Found by the twin's address (no hashing of its PTX per launch) once the
                // first launch named it; a load only when it is not cached.
                let module = match self.modules.lookup_shared(&twin.ptx, &mut self.budget) {
                    Some((module, _)) => module,
                    None => {
                        let module = match self.modules.lookup(&twin.ptx, &mut self.budget) {
                            Some((module, _)) => module,
                            None => match self.module_for(&twin.ptx, 0) {
                                Ok((module, _)) => {
                                    log.note_twin_load(&twin, module);
                                    module
                                }
                                Err(f) => {
                                    log::info!(
                                        "vgpu: write sets: the checked module did not load: {f:?}"
                                    );
                                    return None;
                                }
                            },
                        };
                        self.modules.alias(&twin.ptx, module);
                        module
                    }
                };
                Some(Job::Launch(LaunchJob {
                    module,
                    params,
                    ..l.clone()
                }))
            }
            Checked::Plain | Checked::Unchecked => None,
        }
    }

    /// For a suspended run of a bounds-checked twin about to resume (`twin`): its flag
    /// parameter re-pointed at 0, no flag. The word it was given belongs to the engine that
    /// ran it: after a restore or a migration, another process's address (a store there
    /// faulted the run on cuda). No flag is lost: a resumed run is not checked, it marks
    /// everything (`snapshot::writes`). `None` when the module's text does not name a flag
    /// parameter (not a twin).
    pub(super) fn twin_flag_patch(&self, twin: &Job) -> Option<pgpu::ParamPatch> {
        let Job::Launch(l) = twin else {
            return None;
        };
        let text = self.modules.text_of(l.module)?;
        let offset = ptx::ckpt::bounds::flag_offset(&text, &l.entry)?;
        if text.contains("%__ws_flag") {
            // A twin of a build before the flag was read per store: a checkpointed run of it
            // (cuda) may hold the old address in its saved registers, which no patch reaches.
            log::warn!(
                "vgpu: a suspended write-set twin of an older build resumes: if its saved \
                 registers hold another device's flag word, its next store outside its \
                 extents faults"
            );
        }
        Some(pgpu::ParamPatch { offset, value: 0 })
    }

    /// The engine module for `text`: cached, or loaded under the job's time limit, the device's
    /// cancel flag and the VM's host memory budget (evicting idle modules and shadow spaces,
    /// least recently used first, when it does not fit).
    fn module_for(&mut self, text: &str, code_va: u64) -> Result<(ModuleId, u64), Fault> {
        if let Some(found) = self.modules.lookup(text, &mut self.budget) {
            return Ok(found);
        }
        // A load (the JIT on cuda: tens of ms) needs no GPU: a grant kept from the turn's
        // previous job goes back first (issue 25).
        self.jobs.yield_grant();
        let deadline = Instant::now() + self.cfg.job_timeout;
        let mut evicted = false;
        loop {
            // The cache keeps its own copy of the text.
            let limits = LoadLimits {
                max_host_bytes: self.budget.free().saturating_sub(text.len() as u64),
                deadline: Some(deadline),
                cancel: Some(self.jobs.cancel.clone()),
            };
            let err = match self.engine.load_module(text, &limits) {
                Ok(m) => {
                    let bytes = m.host_bytes.saturating_add(text.len() as u64);
                    if self.budget.charge(Class::Module, bytes) {
                        let hash =
                            self.modules
                                .insert(&*self.engine, text, m.id, bytes, &mut self.budget);
                        self.budget.count(|s| &mut s.module_loads);
                        return Ok((m.id, hash));
                    }
                    if let Err(e) = self.engine.unload_module(m.id) {
                        log::warn!("vgpu: unload module {:?}: {e}", m.id);
                    }
                    EngineError::HostBudget {
                        what: "module",
                        used: bytes,
                        limit: self.budget.free(),
                    }
                }
                Err(e) => e,
            };
            match err {
                EngineError::HostBudget { .. } | EngineError::TooMany(_)
                    if !evicted && self.evict_all_idle() =>
                {
                    // All the room there is was made (once): try again.
                    evicted = true;
                }
                e @ (EngineError::HostBudget { .. } | EngineError::TooMany(_)) => {
                    self.budget.count(|s| &mut s.refused);
                    log::info!(
                        "vgpu: guest PTX from VA {code_va:#x}: over the host memory budget: {e}"
                    );
                    return Err(Fault::new(FaultKind::ResourceLimit, code_va, LIMIT_MODULE));
                }
                e @ (EngineError::LoadDeadline | EngineError::LoadCancelled) => {
                    log::info!("vgpu: guest PTX from VA {code_va:#x}: {e}");
                    return Err(Fault::new(
                        FaultKind::Timeout,
                        code_va,
                        self.cfg.job_timeout.as_millis() as u32,
                    ));
                }
                e => {
                    let log = match &e {
                        EngineError::ModuleLoad { log } => log.clone(),
                        other => other.to_string(),
                    };
                    log::info!("vgpu: guest PTX from VA {code_va:#x} refused: {log}");
                    return Err(Fault::new(
                        FaultKind::PtxError,
                        code_va,
                        first_line_number(&log),
                    ));
                }
            }
        }
    }

    /// Evicts every idle module and shadow space (not the current turn's); returns whether
    /// that freed anything (or the engine's tables: a module was unloaded).
    pub(super) fn evict_all_idle(&mut self) -> bool {
        let before = (self.budget.free(), self.budget.stats().modules_evicted);
        let keep = self.current_pdb;
        let (modules, engine) = (&mut self.modules, &self.engine);
        self.shadows
            .make_room(u64::MAX, keep, &mut self.budget, &mut |b, older| {
                modules.evict_older(&**engine, b, older)
            });
        (self.budget.free(), self.budget.stats().modules_evicted) != before
    }
}

/// The first `line N` / `N:` number in a loader log (0 if none).
fn first_line_number(log: &str) -> u32 {
    log.split(|c: char| !c.is_ascii_digit())
        .find_map(|n| n.parse().ok())
        .unwrap_or(0)
}
