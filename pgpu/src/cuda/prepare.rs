//! Preparing a job before its run (`Engine::prepared` / `Engine::prepare`, issue 25): the
//! one-time driver work a first run would do lazily — resolving the entry's functions and
//! loading them onto the device (`cuModuleGetFunction`, `cuFuncLoad`: with CUDA's lazy loading
//! the kernel is otherwise loaded at its first launch), making the signal stream and the job
//! streams, allocating a save area of the launch's size into the pool, the pinned pages of the
//! flag and status-read paths that use them (on every path a run may take: both of an adaptive
//! engine's, `ckchoice`), the signal stream's first flag write, the request
//! path's event pair — done on the VM's own thread before it asks vgpud for the GPU. Done
//! under a grant, it kept the GPU from every other VM and made the first stop of each VM
//! milliseconds late (its run started late, the slice end came before its kernel did). Nothing of the job runs; what is made is
//! what the run takes from the same pools, so a prepared run finds it there. Per module
//! (`Engine::prepare_module`: a standby's template, and the in-process library's module loads
//! under a checkpoint method, which would otherwise pay it inside the program's first timed
//! launch) the part that does not depend on a launch's grid.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::ckpath::CONTIGUOUS_MAX_BYTES;
use super::config::{EndWait, FlagWrite, StatusRead};
use super::context::{JobState, LaunchState};
use super::driver::ck;
use super::engine::CudaEngine;
use super::modules::{CkLoaded, Func, Loaded};
use super::sys;
use crate::ckpt::{area_bytes, threads};
use crate::engine::{EngineError, Job, ModuleId};
use crate::sync::lock;

/// What a launch's runs may need: its module, the transformed forms with a plan for its entry
/// and their save-area sizes (within the limit), and the streams a run takes.
struct Needs {
    loaded: Arc<Loaded>,
    forms: Vec<(Arc<CkLoaded>, Option<u64>, u64)>,
    streams: usize,
}

impl CudaEngine {
    /// Whether a run of `job` would find everything `prepare_job` makes (cheap: no driver
    /// call). A job the engine cannot run counts as prepared (its run reports why).
    pub(crate) fn job_prepared(&self, job: &Job) -> bool {
        if self.alive().is_err() {
            return true;
        }
        let l = match JobState::from_job(job) {
            JobState::Copy(_) => return self.idle_streams() >= 1,
            JobState::Launch(l) => l,
        };
        let Ok(n) = self.needs(&l) else {
            return true;
        };
        let forms = n.forms.iter().all(|(form, need, _)| {
            form.loaded.resolved(&l.entry)
                && need.is_none_or(|need| {
                    self.signal.get().is_some()
                        && (self.ck_pool.has_idle(need) || !self.ck_pool.would_keep(need))
                })
        });
        let events = n.forms.is_empty() || self.ck_events.has_idle();
        let pages = n.forms.is_empty() || self.path_pages_ready(&l);
        n.loaded.resolved(&l.entry) && forms && events && pages && self.idle_streams() >= n.streams
    }

    /// See the module documentation.
    pub(crate) fn prepare_job(&self, job: &Job) -> Result<(), EngineError> {
        self.alive()?;
        let l = match JobState::from_job(job) {
            JobState::Copy(_) => return self.prepare_streams(1),
            JobState::Launch(l) => l,
        };
        let n = self.needs(&l)?;
        n.loaded.func(&l.entry)?;
        for (form, need, span) in &n.forms {
            form.loaded.func(&l.entry)?;
            if let Some(need) = need.filter(|&n| !self.ck_pool.has_idle(n)) {
                if self.ck_pool.would_keep(need) {
                    self.prepare_area(need)?;
                } else {
                    self.signal()?;
                }
            }
            let queued = self.cfg.may_use(|p| p.status_read == StatusRead::Queued);
            if queued && *span <= CONTIGUOUS_MAX_BYTES {
                let pin = self
                    .ck_path
                    .pins
                    .take(*span as usize)
                    .map_err(|e| self.drv(e))?;
                self.ck_path.pins.give(pin);
            }
        }
        if !n.forms.is_empty() {
            self.prepare_events()?;
            self.prepare_path_pages(Some(&l))?;
        }
        self.prepare_streams(n.streams)
    }

    /// `Engine::prepare_module`: every entry of module `id` resolved and loaded onto the
    /// device (`Loaded::func`) in each form that has it, and the streams a launch of it takes;
    /// for a module with a transformed form also what every checkpointed run of the engine
    /// takes whatever its grid: the signal stream, and the pinned flag words where the
    /// configuration uses them. Only the save area stays with the launch (`prepare_job`, or
    /// the run): its size is the launch's grid times the entry's record.
    pub(crate) fn prepare_module_entries(&self, id: ModuleId) -> Result<(), EngineError> {
        self.alive()?;
        let m = lock(&self.modules);
        let (loaded, text) = (m.get(id)?, m.text(id)?);
        let (transformed, save) = (m.ck(id)?, m.ck_save(id)?);
        drop(m);
        let mut checkpointed = false;
        for entry in super::rewrite::entry_names(&text) {
            loaded.func(&entry)?;
            for form in [&transformed, &save].into_iter().flatten() {
                if form.plan(&entry).is_some() {
                    form.loaded.func(&entry)?;
                    checkpointed = true;
                }
            }
        }
        let mut streams = if loaded.sliced {
            self.cfg.pipeline_depth.max(1)
        } else {
            1
        };
        if checkpointed {
            self.signal()?;
            self.prepare_events()?;
            self.prepare_path_pages(None)?;
            streams = streams.max(self.ck_streams());
        }
        self.prepare_streams(streams)
    }

    /// Streams a checkpointed run may take: its job stream, and an `Armed` run's arming one
    /// (on every path the run may take, `ckchoice`).
    fn ck_streams(&self) -> usize {
        1 + usize::from(self.cfg.may_use(|p| p.flag_write == FlagWrite::Armed))
    }

    /// Whether what `prepare_path_pages(Some(l))` makes is there (no driver call).
    fn path_pages_ready(&self, l: &LaunchState) -> bool {
        let host = !self.needs_host_flags() || self.ck_path.host_flags.get().is_some();
        let span = threads(l.grid, l.block).0.saturating_mul(4);
        let mirror = !self.cfg.may_use(|p| p.status_read == StatusRead::Mirror)
            || span > CONTIGUOUS_MAX_BYTES
            || self.ck_path.mirrors.has_idle(span as usize);
        host && mirror
    }

    /// Whether some run may use the host flag words (`HostMapped`, `Armed`, `Notice`).
    fn needs_host_flags(&self) -> bool {
        self.cfg.may_use(|p| {
            matches!(p.flag_write, FlagWrite::HostMapped | FlagWrite::Armed)
                || p.end_wait == EndWait::Notice
        })
    }

    /// The pinned pages of the request paths some run may take (`ckchoice`): the host flag
    /// words (`HostMapped`, `Armed`, `Notice`), and for a launch `l` a status mirror of its
    /// threads (`Mirror`), so that neither is made inside a run.
    fn prepare_path_pages(&self, l: Option<&LaunchState>) -> Result<(), EngineError> {
        if self.needs_host_flags() {
            let _ = self.host_flags();
        }
        if let Some(l) = l.filter(|_| self.cfg.may_use(|p| p.status_read == StatusRead::Mirror)) {
            let span = threads(l.grid, l.block).0.saturating_mul(4);
            if span <= CONTIGUOUS_MAX_BYTES {
                // Zeroed when made; an idle mirror is all zero (`PathState::mirrors`).
                let pin = self
                    .ck_path
                    .mirrors
                    .take(span as usize)
                    .map_err(|e| self.drv(e))?;
                self.ck_path.mirrors.give(pin);
            }
        }
        Ok(())
    }

    /// The function of `entry` in `loaded` for a run, counting a resolution the run does
    /// itself (`funcs_in_runs`: the kernel then reaches the device inside the run).
    pub(crate) fn run_func(&self, loaded: &Loaded, entry: &str) -> Result<Func, EngineError> {
        if !loaded.resolved(entry) {
            self.funcs_in_runs.fetch_add(1, Ordering::Relaxed);
        }
        loaded.func(entry)
    }

    /// The forms, save areas and streams of launch `l` (`Needs`).
    fn needs(&self, l: &LaunchState) -> Result<Needs, EngineError> {
        self.check_launch(l)?;
        let m = lock(&self.modules);
        let loaded = m.get(l.module)?;
        let (transformed, save) = (m.ck(l.module)?, m.ck_save(l.module)?);
        drop(m);
        let mut streams = if loaded.sliced {
            self.cfg.pipeline_depth.max(1)
        } else {
            1
        };
        // Every form the launch may run in: sliced (a fallback, or an escalated launch without
        // a checkpoint form), transformed, and the checkpoint form of a restarting entry.
        let mut forms = Vec::new();
        for form in [transformed, save].into_iter().flatten() {
            let Some((_, plan)) = form.plan(&l.entry) else {
                continue;
            };
            let need = area_bytes(plan, l.grid, l.block, l.dynamic_shared);
            let (n, _) = threads(l.grid, l.block);
            let span = n.saturating_mul(u64::from(plan.record_bytes));
            let need = (need <= self.cfg.max_save_area_bytes).then_some(need);
            forms.push((form.clone(), need, span));
            // The job's stream, and the arming one.
            streams = streams.max(self.ck_streams());
        }
        Ok(Needs {
            loaded,
            forms,
            streams,
        })
    }

    /// The signal stream, its first flag write, and a zeroed save area of `need` bytes in the
    /// pool.
    fn prepare_area(&self, need: u64) -> Result<(), EngineError> {
        let sig = self.signal()?;
        // Back to the pool at once (`clean`): the run's `take` finds it.
        let mut buf = self.ck_pool.take(need).map_err(|e| self.drv(e))?;
        if sig.1 {
            // The signal stream's first memory operation (the driver sets them up on first
            // use) here rather than in the first request: a 0 to the idle buffer's flag, down
            // already (a fresh buffer is zeroed).
            // SAFETY: the engine's live stream; the flag word of a buffer taken from the pool
            // (no job uses it), kept alive until the stream is synchronised.
            ck("cuStreamWriteValue32_v2", unsafe {
                sys::cuStreamWriteValue32_v2(sig.0.stream, buf.flag(), 0, 0)
            })
            .and_then(|_| {
                // SAFETY: as above.
                ck("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(sig.0.stream)
                })
            })
            .map_err(|e| self.drv(e))?;
        }
        buf.clean = true;
        drop(buf);
        Ok(())
    }

    /// An idle event pair of the request path (`ckevents`) for the next checkpointed run.
    fn prepare_events(&self) -> Result<(), EngineError> {
        if !self.ck_events.has_idle() {
            let ev = self.ck_events.take().map_err(|e| self.drv(e))?;
            self.ck_events.give(ev);
        }
        Ok(())
    }

    fn idle_streams(&self) -> usize {
        lock(&self.streams).len()
    }

    /// At least `n` idle streams in the pool.
    fn prepare_streams(&self, n: usize) -> Result<(), EngineError> {
        let mut taken = Vec::with_capacity(n);
        let mut out = Ok(());
        for _ in 0..n {
            match self.take_stream() {
                Ok(s) => taken.push(s),
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        taken.into_iter().for_each(|s| self.give_stream(s));
        out
    }
}
