//! The `Engine` and `EngineSnapshot` traits on the cuda engine: memory, spaces, copies,
//! modules, bulk VRAM access; jobs are in `jobs.rs`.

use std::ptr::NonNull;
use std::sync::PoisonError;

use super::sys;

use super::driver::{ck, sync_legacy};
use super::engine::{CudaEngine, RegionSlot, StateTargets};
use super::hostmem::HostRegion;
use super::spaces::{Reservation, Space};
use super::vmm::{self, CHUNK};
use crate::engine::*;
use crate::sync::lock;

/// A job's or host copy's hold on a space (mappings frozen while it lives).
pub(crate) struct SpaceUse<'a> {
    pub engine: &'a CudaEngine,
    pub space: SpaceId,
}

impl Drop for SpaceUse<'_> {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.engine.state).spaces.get_mut(&self.space) {
            s.running = s.running.saturating_sub(1);
        }
        self.engine.idle.notify_all();
    }
}

fn key(w: VaWindow) -> (u64, u64) {
    (w.base, w.size)
}

impl CudaEngine {
    fn vram_range(&self, pa: u64, len: u64) -> Result<(), EngineError> {
        match pa.checked_add(len) {
            Some(end) if end <= self.info.vram_size => Ok(()),
            _ => Err(EngineError::VramRange { pa, len }),
        }
    }

    /// Starts a use of `space` (a job or host copy), making it resident first: if another
    /// space of the same window is resident, waits until nothing uses it, unmaps its pages and
    /// maps this space's (the cost of time-sharing a window). `check` sees the space under the
    /// lock (access checks).
    pub(crate) fn begin<T>(
        &self,
        space: SpaceId,
        check: impl FnOnce(&Space) -> T,
    ) -> Result<(SpaceUse<'_>, T), EngineError> {
        let mut st = lock(&self.state);
        loop {
            let w = st
                .spaces
                .get(&space)
                .ok_or(EngineError::UnknownSpace(space))?
                .window;
            let resident = st.reservations.get(&key(w)).and_then(|r| r.resident);
            match resident {
                Some(r) if r == space => break,
                Some(r) if st.spaces.get(&r).is_some_and(|o| o.running > 0) => {
                    st = self.idle.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
                other => {
                    if let Some(r) = other {
                        self.evict(&st, r)?;
                    }
                    if let Some(res) = st.reservations.get_mut(&key(w)) {
                        res.resident = None;
                    }
                    self.realise_all(&st, space)?;
                    if let Some(res) = st.reservations.get_mut(&key(w)) {
                        res.resident = Some(space);
                    }
                    break;
                }
            }
        }
        let s = st
            .spaces
            .get_mut(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        s.running += 1;
        let t = check(s);
        Ok((
            SpaceUse {
                engine: self,
                space,
            },
            t,
        ))
    }

    fn map_all(&self, space: SpaceId, ms: &[Mapping], batch: bool) -> Result<(), EngineError> {
        self.alive()?;
        let mut st = lock(&self.state);
        let st = &mut *st;
        let s = st
            .spaces
            .get(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        if s.running > 0 {
            return Err(EngineError::SpaceBusy(space));
        }
        let t = StateTargets {
            vram: self.info.vram_size,
            regions: &st.regions,
        };
        for (i, m) in ms.iter().enumerate() {
            let r = s.validate(m, &t, &ms[..i]).and_then(|_| match m.target {
                MapTarget::Host { region, .. } if st.regions[&region].region.chunk(0).is_none() => {
                    Err(EngineError::BadHostRegion(
                        "registered host memory cannot be mapped at a chosen GPU VA (use alloc_host_region)",
                    ))
                }
                _ => Ok(()),
            });
            if let Err(e) = r {
                return Err(if batch {
                    EngineError::BatchEntry {
                        index: i,
                        source: Box::new(e),
                    }
                } else {
                    e
                });
            }
        }
        let resident = st.reservations.get(&key(s.window)).and_then(|r| r.resident) == Some(space);
        let mut done: Vec<u64> = Vec::new();
        for m in ms.iter().filter(|_| resident) {
            for (va, page) in Space::pages_of(m) {
                if let Err(e) = self.realise(st, va, &page) {
                    for &va in &done {
                        let _ = vmm::unmap(va, CHUNK);
                    }
                    return Err(e);
                }
                done.push(va);
            }
        }
        let s = st
            .spaces
            .get_mut(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        for m in ms {
            for (va, page) in Space::pages_of(m) {
                if let MapTarget::Host { region, .. } = page.target
                    && let Some(r) = st.regions.get_mut(&region)
                {
                    r.maps += 1;
                }
                s.pages.insert(va, page);
            }
        }
        Ok(())
    }
}

impl Engine for CudaEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.alive()?;
        self.vram_range(pa, buf.len() as u64)?;
        self.vram.read(pa, buf).map_err(|e| self.drv(e))
    }

    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.alive()?;
        self.vram_range(pa, data.len() as u64)?;
        self.vram.write(pa, data).map_err(|e| self.drv(e))
    }

    fn vram_fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), EngineError> {
        self.alive()?;
        self.vram_range(pa, len)?;
        self.vram.fill(pa, len, byte).map_err(|e| self.drv(e))
    }

    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError> {
        self.alive()?;
        if len == 0 || !(base as usize).is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(EngineError::BadHostRegion("empty or not 4 KiB aligned"));
        }
        let mut st = lock(&self.state);
        if st.regions.len() >= self.info.limits.max_host_regions {
            return Err(EngineError::TooMany("host regions"));
        }
        // SAFETY: the caller guarantees the range stays valid until unregistered.
        let region = unsafe { HostRegion::register(base, len) }.map_err(|e| self.drv(e))?;
        st.next_region += 1;
        let id = HostRegionId(st.next_region);
        st.regions.insert(
            id,
            RegionSlot {
                region: std::sync::Arc::new(region),
                maps: 0,
            },
        );
        Ok(id)
    }

    fn alloc_host_region(&self, len: u64) -> Result<(HostRegionId, NonNull<u8>), EngineError> {
        self.alive()?;
        if len == 0 || !len.is_multiple_of(CHUNK) {
            return Err(EngineError::BadHostRegion(
                "length is not a non-zero multiple of 2 MiB",
            ));
        }
        let mut st = lock(&self.state);
        if st.regions.len() >= self.info.limits.max_host_regions {
            return Err(EngineError::TooMany("host regions"));
        }
        let (region, ptr) = HostRegion::allocate(self.cfg.device, len).map_err(|e| self.drv(e))?;
        st.next_region += 1;
        let id = HostRegionId(st.next_region);
        st.regions.insert(
            id,
            RegionSlot {
                region: std::sync::Arc::new(region),
                maps: 0,
            },
        );
        Ok((id, ptr))
    }

    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError> {
        self.alive()?;
        let mut st = lock(&self.state);
        let slot = st
            .regions
            .get(&region)
            .ok_or(EngineError::UnknownHostRegion(region))?;
        if slot.maps > 0 {
            return Err(EngineError::HostRegionInUse(region));
        }
        st.regions.remove(&region);
        Ok(())
    }

    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError> {
        self.alive()?;
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
        if !window.base.is_multiple_of(CHUNK) || !window.size.is_multiple_of(CHUNK) {
            return bad("not aligned to the largest page size");
        }
        let Some(end) = window.base.checked_add(window.size) else {
            return bad("wraps around");
        };
        if window.size > self.info.limits.max_window_size {
            return bad("larger than the limit");
        }
        let mut st = lock(&self.state);
        if st.spaces.len() >= self.info.limits.max_spaces {
            return Err(EngineError::TooMany("address spaces"));
        }
        let overlap = st.spaces.values().any(|s| {
            s.window != window && s.window.base < end && window.base < s.window.base + s.window.size
        });
        if overlap {
            return bad(
                "overlaps another space's different window (one CUDA context: spaces share one VA space; identical windows are time-shared)",
            );
        }
        st.next_space += 1;
        let id = SpaceId(st.next_space);
        if let Some(r) = st.reservations.get_mut(&key(window)) {
            r.users += 1;
        } else {
            let got = vmm::reserve(window.size, window.base).map_err(|e| self.drv(e))?;
            if got != window.base {
                vmm::free(got, window.size);
                log::error!(
                    "cuda: cuMemAddressReserve({:#x}, {:#x}) returned {got:#x}",
                    window.base,
                    window.size
                );
                return bad(
                    "CUDA did not reserve the window at its base (address taken or refused)",
                );
            }
            st.reservations.insert(
                key(window),
                Reservation {
                    users: 1,
                    resident: Some(id),
                },
            );
        }
        st.spaces.insert(id, Space::new(window));
        Ok(id)
    }

    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError> {
        self.alive()?;
        let mut st = lock(&self.state);
        let s = st
            .spaces
            .get(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        if s.running > 0 {
            return Err(EngineError::SpaceBusy(space));
        }
        let k = key(s.window);
        let resident = st.reservations.get(&k).and_then(|r| r.resident) == Some(space);
        if resident {
            self.evict(&st, space)?;
        }
        let Some(s) = st.spaces.remove(&space) else {
            return Err(EngineError::UnknownSpace(space));
        };
        for p in s.pages.values() {
            if let MapTarget::Host { region, .. } = p.target
                && let Some(r) = st.regions.get_mut(&region)
            {
                r.maps -= 1;
            }
        }
        let last = match st.reservations.get_mut(&k) {
            Some(r) => {
                r.users -= 1;
                if resident {
                    r.resident = None;
                }
                r.users == 0
            }
            None => false,
        };
        if last {
            st.reservations.remove(&k);
            vmm::free(s.window.base, s.window.size);
        }
        Ok(())
    }

    fn map(&self, space: SpaceId, mapping: &Mapping) -> Result<(), EngineError> {
        self.map_all(space, std::slice::from_ref(mapping), false)
    }

    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError> {
        self.map_all(space, mappings, true)
    }

    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError> {
        self.alive()?;
        let mut st = lock(&self.state);
        let st = &mut *st;
        let s = st
            .spaces
            .get_mut(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        if s.running > 0 {
            return Err(EngineError::SpaceBusy(space));
        }
        let pages = s.unmap_pages(va, len)?;
        let resident = st.reservations.get(&key(s.window)).and_then(|r| r.resident) == Some(space);
        for &p in &pages {
            if resident {
                vmm::unmap(p, CHUNK).map_err(|e| self.drv(e))?;
            }
            if let Some(page) = s.pages.remove(&p)
                && let MapTarget::Host { region, .. } = page.target
                && let Some(r) = st.regions.get_mut(&region)
            {
                r.maps -= 1;
            }
        }
        Ok(pages.len() as u64 * CHUNK)
    }

    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError> {
        let st = lock(&self.state);
        let s = st
            .spaces
            .get(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        Ok(s.lookup(va))
    }

    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError> {
        self.alive()?;
        if va.checked_add(data.len() as u64).is_none() {
            return Err(EngineError::BadCopy("range wraps around"));
        }
        let (_use, (ok, fault)) = self.begin(space, |s| {
            s.check_access(va, data.len() as u64, AccessKind::Write)
        })?;
        if ok > 0 {
            // SAFETY: `va..va+ok` is mapped writable in this space (page model), which is frozen
            // while `_use` lives; the source is `data`.
            ck("cuMemcpyHtoD", unsafe {
                sys::cuMemcpyHtoD_v2(va, data.as_ptr().cast(), ok as usize)
            })
            .and_then(|_| sync_legacy())
            .map_err(|e| self.drv(e))?;
        }
        fault.map_or(Ok(()), |f| Err(EngineError::CopyFault(f)))
    }

    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.alive()?;
        if va.checked_add(buf.len() as u64).is_none() {
            return Err(EngineError::BadCopy("range wraps around"));
        }
        let (_use, (ok, fault)) = self.begin(space, |s| {
            s.check_access(va, buf.len() as u64, AccessKind::Read)
        })?;
        if ok > 0 {
            // SAFETY: `va..va+ok` is mapped in this space and frozen while `_use` lives; the
            // destination is `buf`.
            ck("cuMemcpyDtoH", unsafe {
                sys::cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), va, ok as usize)
            })
            .map_err(|e| self.drv(e))?;
        }
        fault.map_or(Ok(()), |f| Err(EngineError::CopyFault(f)))
    }

    fn load_module(&self, ptx: &str, limits: &LoadLimits) -> Result<LoadedModule, EngineError> {
        self.alive()?;
        let lim = &self.info.limits;
        if ptx.len() > lim.max_ptx_bytes {
            return Err(EngineError::ModuleLoad {
                log: "PTX text too large".into(),
            });
        }
        limits.check()?;
        {
            let mut m = lock(&self.modules);
            if let Some(loaded) = m.lookup_and_count(ptx) {
                return Ok(loaded);
            }
            m.room(ptx.len(), lim.max_modules, lim.max_ptx_bytes_total)?;
        }
        // The rewrites and the JITs run outside the table's lock: the guest's launches look
        // their modules up in it meanwhile (a live copy prepares its checked twins on another
        // thread while the guest's kernels run, `vgpu::snapshot::writes::twins`). The JIT
        // runs inside the driver and cannot be interrupted: the bounds are checked around it.
        // Host memory: the text kept and an estimate of the driver's copy (module variables
        // live in the context's device memory, not in host memory).
        let built = super::modules::Modules::build(self.ctx, ptx, !self.cfg.whole_launches)?;
        let (mut ck, mut ck_save) = (None, None);
        if self.cfg.preempt.transforms() {
            let restart = self.cfg.preempt != crate::ckpt::PreemptMethod::Checkpoint;
            ck = self.load_ck(ptx, limits, restart)?;
            // Restarting entries also get their checkpoint form: a restarting launch that
            // stalls continues in it (`escalate.rs`).
            if ck
                .as_ref()
                .is_some_and(|(c, _)| c.plans.iter().any(|p| p.restart))
            {
                ck_save = self.load_ck(ptx, limits, false)?;
            }
        }
        let mut m = lock(&self.modules);
        // Another thread loaded the same text meanwhile: its module serves (ours are
        // dropped, unloaded).
        if let Some(loaded) = m.lookup_and_count(ptx) {
            return Ok(loaded);
        }
        let mut loaded = m.insert(ptx, built, lim.max_modules, lim.max_ptx_bytes_total)?;
        if let Some((c, bytes)) = ck
            && let Some(b) = m.set_ck(loaded.id, c, bytes)
        {
            loaded.host_bytes = b;
        }
        if let Some((c, bytes)) = ck_save
            && let Some(b) = m.set_ck_save(loaded.id, c, bytes)
        {
            loaded.host_bytes = b;
        }
        let over = limits.check().err().or_else(|| {
            (loaded.host_bytes > limits.max_host_bytes).then_some(EngineError::HostBudget {
                what: "module",
                used: loaded.host_bytes,
                limit: limits.max_host_bytes,
            })
        });
        if let Some(e) = over {
            m.unload(loaded.id)?;
            return Err(e);
        }
        Ok(loaded)
    }

    fn checkpoint_stats(&self) -> Option<crate::ckpt::CkptStats> {
        self.cfg.preempt.transforms().then(|| self.ckpt_stats())
    }

    fn launch_timing(&self) -> crate::engine::LaunchTiming {
        crate::engine::LaunchTiming {
            sub_launches: self.sub_launches(),
            kernel_ns: self.kernel_ns.load(std::sync::atomic::Ordering::Relaxed),
            launch_call_ns: self.launch_call_ns(),
            origin_gap_ns: self
                .origin_gap_ns
                .load(std::sync::atomic::Ordering::Relaxed),
            copy_call_ns: self.copy_call_ns.load(std::sync::atomic::Ordering::Relaxed),
            copy_wait_ns: self.copy_wait_ns.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError> {
        lock(&self.modules).unload(module)
    }

    fn prepared(&self, job: &Job) -> bool {
        self.job_prepared(job)
    }

    fn prepare(&self, job: &Job) -> Result<(), EngineError> {
        self.prepare_job(job)
    }

    fn prepare_module(&self, module: ModuleId) -> Result<(), EngineError> {
        self.prepare_module_entries(module)
    }

    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError> {
        let run = |h: &PreemptHandle| self.run_job(super::context::JobState::from_job(job), h);
        match job {
            // `Auto`'s wait (`crate::ckwait`), and the durations an adaptive request path
            // reads (`ckchoice`) where the wait does not keep them.
            Job::Launch(l) if !self.cfg.whole_launches => {
                let out = self.ckpt.waited(
                    self.cfg.preempt,
                    self.cfg.preempt_wait,
                    || crate::ckwait::Key::of(l),
                    preempt,
                    run,
                );
                if self.cfg.ck_path.is_adaptive() {
                    self.ckpt.record_unwaited(
                        self.cfg.preempt,
                        self.cfg.preempt_wait,
                        || crate::ckwait::Key::of(l),
                        out.as_ref().ok(),
                    );
                }
                out
            }
            _ => run(preempt),
        }
    }

    fn resume(
        &self,
        context: SavedContext,
        preempt: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let max_area = self.cfg.max_save_area_bytes;
        let decode = |b: &[u8]| {
            super::context::decode_ck(b, &self.info.limits, max_area)
                .map_err(EngineError::BadContext)
        };
        let (job, ck) = match context.into_repr() {
            ContextRepr::Live(l) => match l.into_any().downcast::<super::context::Live>() {
                Ok(live) if live.engine == self.id => (live.job, live.ck.map(Ok)),
                Ok(live) => {
                    let (job, area) = decode(&live.to_bytes())?;
                    (job, area.map(Err))
                }
                Err(_) => {
                    return Err(EngineError::BadContext(
                        "in-memory context of another engine".into(),
                    ));
                }
            },
            ContextRepr::Bytes(b) => {
                if b.len() > self.info.limits.max_context_bytes {
                    return Err(EngineError::BadContext("context too large".into()));
                }
                let (job, area) = decode(&b)?;
                (job, area.map(Err))
            }
        };
        match (job, ck) {
            (super::context::JobState::Launch(l), Some(ck)) => {
                self.alive()?;
                let (module, plan, state) = match ck {
                    Ok(state) => {
                        let m = lock(&self.modules);
                        let module = if state.escalated {
                            m.ck_save(l.module)?
                        } else {
                            m.ck(l.module)?
                        };
                        drop(m);
                        let module = module.ok_or_else(|| {
                            EngineError::BadContext("module not checkpointed".into())
                        })?;
                        let plan = module
                            .plan(&l.entry)
                            .ok_or_else(|| EngineError::BadContext("no such entry".into()))?
                            .0;
                        (module, plan, state)
                    }
                    Err(area) => self.ck_from_area(&l, area.bytes, area.escalated)?,
                };
                let (module, plan, state) = if state.stalled {
                    match self.escalate(l.clone(), state)? {
                        super::escalate::Escalated::Checkpoint(m, p, s) => (m, p, s),
                        super::escalate::Escalated::Sliced(l) => {
                            self.alive()?;
                            return self.run_sliced(l, preempt);
                        }
                    }
                } else {
                    (module, plan, state)
                };
                let start = super::context::CkStart::Resume(state);
                self.run_ck(l, module, plan, start, preempt)
            }
            (job, _) => self.run_job(job, preempt),
        }
    }
}

/// Snapshots: bulk VRAM access through GPU kernels and pinned copies; saved contexts are
/// re-targeted through their bytes; no dirty log (every page reported dirty).
impl EngineSnapshot for CudaEngine {
    // ---- Bulk VRAM access: GPU kernels and pinned double-buffered copies (bulk.rs).
    fn vram_nonzero_pages(
        &self,
        pa: u64,
        pages: u64,
        bitmap: &mut [u64],
    ) -> Result<(), EngineError> {
        self.bulk_nonzero(pa, pages, bitmap)
    }

    fn vram_read_runs(
        &self,
        runs: &[(u64, u64)],
        sink: &mut crate::engine::bulk::PageSink<'_>,
    ) -> Result<std::ops::ControlFlow<()>, EngineError> {
        self.bulk_read_runs(runs, &mut |pieces: &[&[u8]]| {
            for p in pieces {
                if sink(p).is_break() {
                    return std::ops::ControlFlow::Break(());
                }
            }
            std::ops::ControlFlow::Continue(())
        })
    }

    fn vram_read_runs_batched(
        &self,
        runs: &[(u64, u64)],
        sink: &mut crate::engine::bulk::BatchSink<'_>,
    ) -> Result<std::ops::ControlFlow<()>, EngineError> {
        self.bulk_read_runs(runs, sink)
    }

    fn vram_write_pages(
        &self,
        source: &mut crate::engine::bulk::PageSource<'_>,
    ) -> Result<std::ops::ControlFlow<()>, EngineError> {
        self.bulk_write_pages(source)
    }

    fn vram_zero(&self, pa: u64, len: u64) -> Result<(), EngineError> {
        self.bulk_zero(pa, len)
    }

    fn vram_reserve_writes(&self, bytes: u64) -> Result<(), EngineError> {
        self.bulk_reserve_writes(bytes)
    }

    fn alloc_flag(&self, _space: SpaceId) -> Result<Option<u64>, EngineError> {
        self.alive()?;
        self.flags.alloc().map_err(|e| self.drv(e))
    }

    fn take_flag(&self, va: u64) -> Result<bool, EngineError> {
        self.alive()?;
        self.flags
            .take(va)
            .map_err(|e| self.drv(e))?
            .ok_or_else(|| EngineError::Backend(format!("no flag word at {va:#x}")))
    }

    fn free_flag(&self, va: u64) {
        self.flags.free(va);
    }

    fn retarget_context(
        &self,
        context: SavedContext,
        space: SpaceId,
        module: Option<ModuleId>,
        patch: Option<crate::engine::ParamPatch>,
    ) -> Result<SavedContext, EngineError> {
        let bytes = context.into_bytes();
        if bytes.len() > self.info.limits.max_context_bytes {
            return Err(EngineError::BadContext("context too large".into()));
        }
        let (mut job, area) =
            super::context::decode_ck(&bytes, &self.info.limits, self.cfg.max_save_area_bytes)
                .map_err(EngineError::BadContext)?;
        match &mut job {
            super::context::JobState::Copy(_) if patch.is_some() => {
                return Err(EngineError::BadContext(
                    "a parameter patch for a copy".into(),
                ));
            }
            super::context::JobState::Copy(c) => c.space = space,
            super::context::JobState::Launch(l) => {
                l.space = space;
                if let Some(m) = module {
                    l.module = m;
                }
                if let Some(p) = patch {
                    p.apply(&mut l.params)?;
                }
            }
        }
        Ok(SavedContext::from_bytes(match area {
            // A checkpointed launch keeps its save area (the kernel's registers and shared
            // memory), re-targeted with the launch.
            Some(a) => super::context::encode_ck(&job, &a.bytes, a.escalated),
            None => super::context::encode(&job),
        }))
    }
}
