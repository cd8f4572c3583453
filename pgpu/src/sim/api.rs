//! `impl Engine` and `impl EngineSnapshot for SimEngine`: the contract's entry points,
//! delegating to the engine's parts.

use std::ptr::NonNull;
use std::time::Instant;

use crate::ckpt::{self, PreemptMethod};
use crate::engine::{
    ContextRepr, CopyJob, Engine, EngineError, EngineInfo, EngineSnapshot, HostRegionId, Job,
    LiveContext, LoadLimits, LoadedModule, MapError, MapTarget, Mapping, ModuleId, Outcome,
    PreemptHandle, SavedContext, SpaceId, Translation, VaWindow,
};
use crate::ptx_load;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::ckpt::CkModule;
use super::context::{self, CopyState, Decoded, Live, LiveJob};
use super::copy;
use super::engine::{SimEngine, check_range, host_err, vram_err};
use super::vram::VramRegion;
use crate::sync::lock;

impl Engine for SimEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.vram.read(pa, buf).map_err(vram_err)
    }

    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.vram.write(pa, data).map_err(vram_err)?;
        self.mark_vram(pa, data.len() as u64);
        Ok(())
    }

    fn vram_fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), EngineError> {
        self.vram.fill(pa, len, byte).map_err(vram_err)?;
        self.mark_vram(pa, len);
        Ok(())
    }

    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError> {
        let limit = self.info.limits.max_host_regions;
        let id = lock(&self.host)
            .register(base as usize, len, limit)
            .map_err(host_err)?;
        log::debug!("host region {id:?}: {len:#x} bytes at {base:p}");
        Ok(id)
    }

    fn alloc_host_region(&self, len: u64) -> Result<(HostRegionId, NonNull<u8>), EngineError> {
        let mem = VramRegion::anonymous(len).map_err(|_| {
            EngineError::BadHostRegion("length zero or not a multiple of 2 MiB, or out of memory")
        })?;
        let base = mem.host_ptr(0, 0).map_err(vram_err)?;
        let base = NonNull::new(base).ok_or(EngineError::BadHostRegion("null mapping"))?;
        let limit = self.info.limits.max_host_regions;
        let id = lock(&self.host)
            .register_owned(mem, limit)
            .map_err(host_err)?;
        log::debug!("host region {id:?}: {len:#x} bytes allocated at {base:p}");
        Ok((id, base))
    }

    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError> {
        let mut hosts = lock(&self.host);
        let slot = hosts.target(region).map_err(host_err)?.slot;
        if self.spaces.any_maps_slot(slot) {
            return Err(EngineError::HostRegionInUse(region));
        }
        hosts.remove(region).map_err(host_err)
    }

    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError> {
        let align = self.info.largest_page().bytes();
        let bad = |why| {
            Err(EngineError::BadWindow {
                base: window.base,
                size: window.size,
                why,
            })
        };
        if window.size == 0 {
            return bad("empty");
        }
        if !window.base.is_multiple_of(align) || !window.size.is_multiple_of(align) {
            return bad("not aligned to the largest page size");
        }
        if window.base.checked_add(window.size).is_none() {
            return bad("wraps around");
        }
        if window.size > self.info.limits.max_window_size {
            return bad("larger than the limit");
        }
        self.spaces.create(window, self.info.limits.max_spaces)
    }

    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError> {
        self.spaces.destroy(space)
    }

    fn map(&self, space: SpaceId, m: &Mapping) -> Result<(), EngineError> {
        if !self.info.page_sizes.contains(&m.page_size) {
            return Err(MapError::UnsupportedPageSize(m.page_size).into());
        }
        let hosts = lock(&self.host);
        let (target, offset) = self.target_mem(&hosts, m.target)?;
        self.spaces.update(space, |mmu| {
            Ok(mmu.map(m.va, m.len, target, offset, m.perm, m.page_size)?)
        })
    }

    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError> {
        let hosts = lock(&self.host);
        let mut resolved = Vec::with_capacity(mappings.len());
        for (index, m) in mappings.iter().enumerate() {
            let entry = |e: EngineError| EngineError::BatchEntry {
                index,
                source: Box::new(e),
            };
            if !self.info.page_sizes.contains(&m.page_size) {
                return Err(entry(MapError::UnsupportedPageSize(m.page_size).into()));
            }
            resolved.push(self.target_mem(&hosts, m.target).map_err(entry)?);
        }
        self.spaces.update(space, |mmu| {
            for (index, (m, (target, offset))) in mappings.iter().zip(&resolved).enumerate() {
                if let Err(e) = mmu.map(m.va, m.len, *target, *offset, m.perm, m.page_size) {
                    // Undo the entries already made: they did not overlap anything, so
                    // unmapping exactly their ranges restores the previous tables.
                    for done in &mappings[..index] {
                        let _ = mmu.unmap(done.va, done.len);
                    }
                    return Err(EngineError::BatchEntry {
                        index,
                        source: Box::new(e.into()),
                    });
                }
            }
            Ok(())
        })
    }

    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError> {
        let _hosts = lock(&self.host);
        self.spaces.update(space, |mmu| Ok(mmu.unmap(va, len)?))
    }

    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError> {
        let hosts = lock(&self.host);
        let r = self.spaces.inspect(space, |mmu| mmu.resolve(va))?;
        Ok(r.and_then(|r| {
            let target = if r.slot == 0 {
                MapTarget::Vram {
                    pa: (r.host - self.vram.host_base()) as u64,
                }
            } else {
                let (region, base) = hosts.by_slot(r.slot)?;
                MapTarget::Host {
                    region,
                    offset: (r.host - base) as u64,
                }
            };
            Some(Translation {
                target,
                perm: r.perm,
                page_size: r.page_size,
            })
        }))
    }

    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError> {
        check_range(va, data.len() as u64)?;
        let s = self.spaces.begin(space)?;
        copy::host_to_space(s.mmu(), va, data).map_err(EngineError::CopyFault)
    }

    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        check_range(va, buf.len() as u64)?;
        let s = self.spaces.begin(space)?;
        copy::space_to_host(s.mmu(), va, buf).map_err(EngineError::CopyFault)
    }

    fn load_module(&self, text: &str, limits: &LoadLimits) -> Result<LoadedModule, EngineError> {
        if text.len() > self.info.limits.max_ptx_bytes {
            return Err(EngineError::ModuleLoad {
                log: "PTX text too large".into(),
            });
        }
        limits.check()?;
        if let Some(m) = lock(&self.modules).lookup_and_count(text) {
            return Ok(m);
        }
        // Parse outside the lock: it can take a while and other loads should not wait. The
        // engine keeps a copy of the text: the module gets the rest of the bound.
        let bound = LoadLimits {
            max_host_bytes: ptx_load::remaining(limits, text.len() as u64)?,
            ..limits.clone()
        };
        let (module, mut bytes) = ptx_load::parse(text, &bound)?;
        let ck = if self.config.preempt.transforms() {
            let left = LoadLimits {
                max_host_bytes: ptx_load::remaining(&bound, bytes)?,
                ..limits.clone()
            };
            let restart = self.config.preempt != PreemptMethod::Checkpoint;
            match transform(text, &left, self.config.ckpt_poll_interval, restart) {
                Ok(t) => {
                    let (m, b) = ptx_load::parse(&t.ptx, &left)?;
                    bytes = bytes.saturating_add(b);
                    // Restarting entries also get their checkpoint form: a restarting launch
                    // that stalls continues in it (`pgpu::ckpt::stalled`).
                    let save = if t.entries.iter().any(|p| p.restart) {
                        let left = LoadLimits {
                            max_host_bytes: ptx_load::remaining(&bound, bytes)?,
                            ..limits.clone()
                        };
                        match transform(text, &left, self.config.ckpt_poll_interval, false) {
                            Ok(c) => {
                                let (sm, sb) = ptx_load::parse(&c.ptx, &left)?;
                                bytes = bytes.saturating_add(sb);
                                Some(Arc::new(CkModule {
                                    module: Arc::new(sm),
                                    plans: c.entries,
                                    save: None,
                                }))
                            }
                            Err(e) => {
                                if let Some(err) = ckpt::limit_error(&e) {
                                    return Err(err);
                                }
                                // Stalled launches then slice (counted all the same).
                                self.ckpt.refused(&format!("checkpoint form: {e}"));
                                None
                            }
                        }
                    } else {
                        None
                    };
                    self.ckpt.transformed();
                    Some(Arc::new(CkModule {
                        module: Arc::new(m),
                        plans: t.entries,
                        save,
                    }))
                }
                Err(e) => {
                    if let Some(err) = ckpt::limit_error(&e) {
                        return Err(err);
                    }
                    self.ckpt.refused(&e.to_string());
                    None
                }
            }
        } else {
            None
        };
        let lim = &self.info.limits;
        lock(&self.modules).insert(
            text,
            module,
            bytes,
            ck,
            lim.max_modules,
            lim.max_ptx_bytes_total,
        )
    }

    fn checkpoint_stats(&self) -> Option<ckpt::CkptStats> {
        self.config.preempt.transforms().then(|| self.ckpt_stats())
    }

    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError> {
        lock(&self.modules).unload(module)
    }

    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError> {
        let t0 = Instant::now();
        match job {
            Job::Copy(CopyJob {
                space,
                src,
                dst,
                len,
            }) => {
                check_range(*src, *len)?;
                check_range(*dst, *len)?;
                let s = self.spaces.begin(*space)?;
                let c = CopyState {
                    space: *space,
                    src: *src,
                    dst: *dst,
                    len: *len,
                    done: 0,
                };
                Ok(self.run_copy(s, c, preempt, t0))
            }
            Job::Launch(l) => {
                // `Auto`'s wait (`crate::ckwait`).
                self.ckpt.waited(
                    self.config.preempt,
                    self.config.preempt_wait,
                    || crate::ckwait::Key::of(l),
                    preempt,
                    |h| self.execute_launch(l, h, t0),
                )
            }
        }
    }

    fn resume(
        &self,
        context: SavedContext,
        preempt: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let t0 = Instant::now();
        match context.into_repr() {
            ContextRepr::Bytes(b) => {
                let live = self.live_from_bytes(&b)?;
                // Free the bytes before running, not inside the next preemption's latency.
                drop(b);
                self.resume_live(live, preempt, t0)
            }
            ContextRepr::Live(l) => match l.into_any().downcast::<Live>() {
                Ok(live) => self.resume_live(*live, preempt, t0),
                Err(_) => Err(EngineError::BadContext(
                    "in-memory context of another engine".into(),
                )),
            },
        }
    }
}

/// Snapshots: the bulk bitmap scans VRAM in place, the dirty log is exact, saved contexts are
/// re-targeted in memory where they can be.
impl EngineSnapshot for SimEngine {
    // ---- Bulk VRAM access: the bitmap scans VRAM in place (no copy); batched reads and page
    // writes go through 64 MiB batches copied on several threads (`bulk_par`); vram_zero is the
    // trait's default (it fills only non-zero pages, leaving untouched memory alone).
    fn vram_nonzero_pages(
        &self,
        pa: u64,
        pages: u64,
        bitmap: &mut [u64],
    ) -> Result<(), EngineError> {
        crate::engine::bulk::check_bitmap(pa, pages, bitmap.len(), self.info.vram_size)?;
        self.vram.nonzero_pages(pa, pages, bitmap).map_err(vram_err)
    }

    fn vram_read_runs_batched(
        &self,
        runs: &[(u64, u64)],
        sink: &mut crate::engine::bulk::BatchSink<'_>,
    ) -> Result<std::ops::ControlFlow<()>, EngineError> {
        crate::engine::bulk_par::read_runs_batched(self, runs, sink)
    }

    fn vram_write_pages(
        &self,
        source: &mut crate::engine::bulk::PageSource<'_>,
    ) -> Result<std::ops::ControlFlow<()>, EngineError> {
        crate::engine::bulk_par::write_pages(self, source)
    }
    // ---- end of bulk VRAM access

    // ---- Dirty logging (issue 17): exact, `sim::dirty`. ----

    fn dirty_log_kind(&self) -> crate::dirty::DirtyLogKind {
        crate::dirty::DirtyLogKind::Exact
    }

    fn dirty_log_start(&self) -> Result<crate::dirty::DirtyLogKind, EngineError> {
        let hosts = lock(&self.host);
        let mut targets = vec![(0u16, self.vram.host_base(), self.vram.size())];
        targets.extend(
            hosts
                .targets()
                .iter()
                .map(|t| (t.slot, t.host_base, t.size)),
        );
        self.spaces.log().start(&targets);
        Ok(crate::dirty::DirtyLogKind::Exact)
    }

    fn dirty_log_stop(&self) {
        self.spaces.log().stop();
    }

    fn alloc_flag(&self, space: SpaceId) -> Result<Option<u64>, EngineError> {
        Ok(self.spaces.flags().alloc(space.0))
    }

    fn take_flag(&self, va: u64) -> Result<bool, EngineError> {
        self.spaces
            .flags()
            .take(va)
            .ok_or_else(|| EngineError::Backend(format!("no flag word at {va:#x}")))
    }

    fn free_flag(&self, va: u64) {
        self.spaces.flags().free(va);
    }

    fn dirty_log_harvest(
        &self,
        at: MapTarget,
        len: u64,
        bits: &mut [u64],
    ) -> Result<(), EngineError> {
        let hosts = lock(&self.host);
        let (target, offset) = self.target_mem(&hosts, at)?;
        crate::dirty::check_request(offset, len, bits)?;
        if offset.checked_add(len).is_none_or(|e| e > target.size) {
            return Err(EngineError::Backend(format!(
                "dirty log: {offset:#x}+{len:#x} outside the target's {:#x} bytes",
                target.size
            )));
        }
        self.spaces
            .log()
            .harvest(target.slot, target.host_base, offset, len, bits);
        Ok(())
    }

    fn retarget_context(
        &self,
        context: SavedContext,
        space: SpaceId,
        module: Option<ModuleId>,
        patch: Option<crate::engine::ParamPatch>,
    ) -> Result<SavedContext, EngineError> {
        let bytes = match context.into_repr() {
            ContextRepr::Live(l) => match l.into_any().downcast::<Live>() {
                // Our own in-memory state, same module: only the space changes.
                Ok(mut live) if live.engine == self.id => match &mut live.job {
                    LiveJob::Copy(c) => {
                        c.space = space;
                        return Ok(self.live(live.job));
                    }
                    LiveJob::Launch {
                        space: s,
                        module: m,
                        ..
                    } if module.is_none_or(|n| n == *m) => {
                        *s = space;
                        patch_live(&mut live.job, patch)?;
                        return Ok(self.live(live.job));
                    }
                    LiveJob::Launch { .. } => live.to_bytes(),
                    LiveJob::Ckpt(j) if module.is_none_or(|n| n == j.launch.module) => {
                        j.launch.space = space;
                        patch_live(&mut live.job, patch)?;
                        return Ok(self.live(live.job));
                    }
                    LiveJob::Ckpt(_) => live.to_bytes(),
                },
                Ok(live) => live.to_bytes(),
                Err(_) => {
                    return Err(EngineError::BadContext(
                        "in-memory context of another engine".into(),
                    ));
                }
            },
            ContextRepr::Bytes(b) => b,
        };
        if bytes.len() > self.info.limits.max_context_bytes {
            return Err(EngineError::BadContext("too large".into()));
        }
        let re =
            match context::decode(&bytes).map_err(|e| EngineError::BadContext(e.to_string()))? {
                Decoded::Copy(c) => context::encode_copy(&CopyState { space, ..c }),
                Decoded::Launch {
                    module: m, state, ..
                } => context::encode_launch(space, module.unwrap_or(m), state),
                Decoded::Ckpt {
                    body, escalated, ..
                } => context::encode_ckpt(space, module, body, escalated),
            };
        drop(bytes);
        // Validates (a launch's interpreter state against the module) into the in-memory form.
        let mut live = self.live_from_bytes(&re)?;
        patch_live(&mut live.job, patch)?;
        Ok(SavedContext::live(Box::new(live)))
    }
}

/// Applies `patch` to the parameters of a suspended launch (`retarget_context`).
fn patch_live(
    job: &mut LiveJob,
    patch: Option<crate::engine::ParamPatch>,
) -> Result<(), EngineError> {
    let Some(p) = patch else {
        return Ok(());
    };
    match job {
        LiveJob::Copy(_) => Err(EngineError::BadContext(
            "a parameter patch for a copy".into(),
        )),
        LiveJob::Launch { launch, .. } => {
            if launch.patch_param_u64(p.offset as usize, p.value) {
                Ok(())
            } else {
                Err(EngineError::BadContext(format!(
                    "parameter patch at {} outside the launch's {} parameter bytes",
                    p.offset,
                    launch.config().params.len()
                )))
            }
        }
        LiveJob::Ckpt(j) => p.apply(&mut j.launch.params),
    }
}

/// `text` transformed for preemption with the transformation's default chunking (the cuda
/// engine's chunk is configurable; the interpreter's cost does not depend on it).
fn transform(
    text: &str,
    limits: &LoadLimits,
    poll_interval: u32,
    restart: bool,
) -> Result<ptx::ckpt::Transformed, ptx::ckpt::Unsupported> {
    ckpt::transform(
        text,
        limits,
        poll_interval,
        ckpt::Chunking::default(),
        restart,
    )
}

impl SimEngine {
    /// A fresh run of launch `l` under `preempt`, checkpointed where the method chooses.
    fn execute_launch(
        &self,
        l: &crate::engine::LaunchJob,
        preempt: &PreemptHandle,
        t0: Instant,
    ) -> Result<Outcome, EngineError> {
        if let Some(job) = self.ck_job(l)? {
            self.ckpt.launches.fetch_add(1, Ordering::Relaxed);
            let s = self.spaces.begin(l.space)?;
            return self.run_ckpt(s, job, false, preempt, t0);
        }
        let launch = self.new_launch(l)?;
        let s = self.spaces.begin(l.space)?;
        Ok(self.run_launch(s, l.module, Box::new(launch), preempt, t0))
    }
}
