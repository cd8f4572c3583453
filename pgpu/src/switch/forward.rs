//! The `Engine` and `EngineSnapshot` calls of a [`SwitchEngine`]: each forwarded to the current
//! engine with virtual ids made real (and real ones made virtual on the way back), and what
//! builds state (spaces, mappings, modules, host regions) recorded after the engine accepted
//! it. Calls that change the record hold its lock across the engine call, so the record is
//! always what the engine has.

use std::ops::ControlFlow;
use std::ptr::NonNull;
use std::sync::Arc;

use super::record::{self, ModuleRec, RegionRec, SpaceRec};
use super::{SwitchEngine, Tag};
use crate::engine::{
    Engine, EngineError, EngineInfo, EngineSnapshot, HostRegionId, Job, LoadLimits, LoadedModule,
    MapTarget, Mapping, ModuleId, Outcome, PreemptHandle, SavedContext, SpaceId, Translation,
    VaWindow, bulk,
};
use crate::sync::lock;

impl SwitchEngine {
    /// A job with real ids, and its tag (virtual ids).
    fn real_job(&self, job: &Job) -> Result<(Job, Tag), EngineError> {
        let rec = lock(&self.rec);
        let mut j = job.clone();
        let module = match &mut j {
            Job::Copy(c) => {
                c.space = rec.space(c.space)?;
                None
            }
            Job::Launch(l) => {
                l.space = rec.space(l.space)?;
                let v = l.module;
                l.module = rec.module(v)?;
                Some(v)
            }
        };
        Ok((
            j,
            Tag {
                space: job.space(),
                module,
            },
        ))
    }

    /// Tags the context of a preempted outcome.
    fn tag_outcome(
        &self,
        out: Outcome,
        engine: Arc<dyn EngineSnapshot>,
        tag: Option<Tag>,
    ) -> Outcome {
        match (out, tag) {
            (Outcome::Preempted { context, gpu_time }, Some(tag)) => Outcome::Preempted {
                context: self.wrap_context(context, engine, tag),
                gpu_time,
            },
            (o, _) => o,
        }
    }
}

impl Engine for SwitchEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.current().vram_read(pa, buf)
    }
    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.current().vram_write(pa, data)
    }
    fn vram_fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), EngineError> {
        self.current().vram_fill(pa, len, byte)
    }

    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError> {
        let mut rec = lock(&self.rec);
        // SAFETY: the caller's contract, passed on unchanged.
        let real = unsafe { self.current().register_host_region(base, len) }?;
        let v = HostRegionId(rec.next_id());
        rec.regions.insert(
            v,
            RegionRec {
                real,
                registered: Some((base as usize, len)),
            },
        );
        Ok(v)
    }
    fn alloc_host_region(&self, len: u64) -> Result<(HostRegionId, NonNull<u8>), EngineError> {
        let mut rec = lock(&self.rec);
        let (real, ptr) = self.current().alloc_host_region(len)?;
        let v = HostRegionId(rec.next_id());
        rec.regions.insert(
            v,
            RegionRec {
                real,
                registered: None,
            },
        );
        Ok((v, ptr))
    }
    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError> {
        let mut rec = lock(&self.rec);
        let r = rec
            .regions
            .get(&region)
            .ok_or(EngineError::UnknownHostRegion(region))?;
        self.current().unregister_host_region(r.real)?;
        rec.regions.remove(&region);
        Ok(())
    }

    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError> {
        let mut rec = lock(&self.rec);
        let real = self.current().create_space(window)?;
        let v = SpaceId(rec.next_id());
        rec.spaces.insert(
            v,
            SpaceRec {
                real,
                window,
                maps: Default::default(),
            },
        );
        Ok(v)
    }
    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError> {
        let mut rec = lock(&self.rec);
        self.current().destroy_space(rec.space(space)?)?;
        rec.spaces.remove(&space);
        Ok(())
    }
    fn map(&self, space: SpaceId, mapping: &Mapping) -> Result<(), EngineError> {
        self.map_batch(space, std::slice::from_ref(mapping))
    }
    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError> {
        let mut rec = lock(&self.rec);
        let real = rec.space(space)?;
        let maps = mappings
            .iter()
            .map(|m| rec.real_mapping(m))
            .collect::<Result<Vec<_>, _>>()?;
        let e = self.current();
        if maps.len() == 1 {
            e.map(real, &maps[0])?;
        } else {
            e.map_batch(real, &maps)?;
        }
        if let Some(s) = rec.spaces.get_mut(&space) {
            for m in mappings {
                s.maps.insert(m.va, *m);
            }
        }
        Ok(())
    }
    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError> {
        let mut rec = lock(&self.rec);
        let n = self.current().unmap(rec.space(space)?, va, len)?;
        if let Some(s) = rec.spaces.get_mut(&space) {
            record::cut(&mut s.maps, va, len);
        }
        Ok(n)
    }
    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError> {
        let rec = lock(&self.rec);
        let t = self.current().lookup(rec.space(space)?, va)?;
        Ok(t.map(|t| Translation {
            target: rec.virtual_target(t.target),
            ..t
        }))
    }

    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError> {
        // Counted before the ids are read: a commit sees it, or comes before the read.
        let _busy = self.busy();
        let real = lock(&self.rec).space(space)?;
        self.current().copy_to_space(real, va, data)
    }
    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        let _busy = self.busy();
        let real = lock(&self.rec).space(space)?;
        self.current().copy_from_space(real, va, buf)
    }

    fn load_module(&self, ptx: &str, limits: &LoadLimits) -> Result<LoadedModule, EngineError> {
        let mut rec = lock(&self.rec);
        // Identical text: the same module, one more load (the engine holds one load of it).
        if let Some((v, m)) = rec.modules.iter_mut().find(|(_, m)| m.ptx == ptx) {
            m.loads += 1;
            return Ok(LoadedModule {
                id: *v,
                host_bytes: m.host_bytes,
            });
        }
        let loaded = self.current().load_module(ptx, limits)?;
        let id = ModuleId(rec.next_id());
        // The switch keeps the text (to load it on another engine): charged with the load.
        let host_bytes = loaded.host_bytes.saturating_add(ptx.len() as u64);
        rec.modules.insert(
            id,
            ModuleRec {
                real: loaded.id,
                ptx: ptx.to_string(),
                loads: 1,
                host_bytes,
            },
        );
        Ok(LoadedModule { id, host_bytes })
    }
    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError> {
        let mut rec = lock(&self.rec);
        let m = rec
            .modules
            .get_mut(&module)
            .ok_or(EngineError::UnknownModule(module))?;
        if m.loads > 1 {
            m.loads -= 1;
            return Ok(());
        }
        let real = m.real;
        self.current().unload_module(real)?;
        rec.modules.remove(&module);
        Ok(())
    }

    fn prepare_module(&self, module: ModuleId) -> Result<(), EngineError> {
        let real = lock(&self.rec).module(module)?;
        self.current().prepare_module(real)
    }
    fn prepare(&self, job: &Job) -> Result<(), EngineError> {
        let (real, _) = self.real_job(job)?;
        self.current().prepare(&real)
    }
    fn prepared(&self, job: &Job) -> bool {
        self.real_job(job)
            .map_or(true, |(real, _)| self.current().prepared(&real))
    }
    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError> {
        let _busy = self.busy();
        let (real, tag) = self.real_job(job)?;
        let e = self.current();
        let out = e.execute(&real, preempt)?;
        Ok(self.tag_outcome(out, e, Some(tag)))
    }
    fn checkpoint_stats(&self) -> Option<crate::ckpt::CkptStats> {
        self.current().checkpoint_stats()
    }
    fn launch_timing(&self) -> crate::engine::LaunchTiming {
        self.launch_timing_total()
    }
    fn resume(
        &self,
        context: SavedContext,
        preempt: &PreemptHandle,
    ) -> Result<Outcome, EngineError> {
        let _busy = self.busy();
        let (ctx, tag) = self.unwrap_context(context)?;
        let e = self.current();
        let out = e.resume(ctx, preempt)?;
        Ok(self.tag_outcome(out, e, tag))
    }
}

impl EngineSnapshot for SwitchEngine {
    fn vram_nonzero_pages(
        &self,
        pa: u64,
        pages: u64,
        bitmap: &mut [u64],
    ) -> Result<(), EngineError> {
        self.current().vram_nonzero_pages(pa, pages, bitmap)
    }
    fn vram_read_runs(
        &self,
        runs: &[(u64, u64)],
        sink: &mut bulk::PageSink<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        self.current().vram_read_runs(runs, sink)
    }
    fn vram_read_runs_batched(
        &self,
        runs: &[(u64, u64)],
        sink: &mut bulk::BatchSink<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        self.current().vram_read_runs_batched(runs, sink)
    }
    fn vram_write_pages(
        &self,
        source: &mut bulk::PageSource<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        self.current().vram_write_pages(source)
    }
    fn vram_zero(&self, pa: u64, len: u64) -> Result<(), EngineError> {
        self.current().vram_zero(pa, len)
    }
    fn vram_reserve_writes(&self, bytes: u64) -> Result<(), EngineError> {
        self.current().vram_reserve_writes(bytes)
    }

    fn retarget_context(
        &self,
        context: SavedContext,
        space: SpaceId,
        module: Option<ModuleId>,
        patch: Option<crate::engine::ParamPatch>,
    ) -> Result<SavedContext, EngineError> {
        let (real_space, real_module) = {
            let rec = lock(&self.rec);
            let m = match module {
                Some(m) => Some(rec.module(m)?),
                None => None,
            };
            (rec.space(space)?, m)
        };
        let (ctx, _) = self.unwrap_context(context)?;
        let e = self.current();
        let out = e.retarget_context(ctx, real_space, real_module, patch)?;
        Ok(self.wrap_context(out, e, Tag { space, module }))
    }

    fn dirty_log_kind(&self) -> crate::dirty::DirtyLogKind {
        self.current().dirty_log_kind()
    }
    fn dirty_log_start(&self) -> Result<crate::dirty::DirtyLogKind, EngineError> {
        self.current().dirty_log_start()
    }
    fn dirty_log_stop(&self) {
        self.current().dirty_log_stop()
    }
    fn dirty_log_harvest(
        &self,
        at: MapTarget,
        len: u64,
        bits: &mut [u64],
    ) -> Result<(), EngineError> {
        let at = lock(&self.rec).target(at)?;
        self.current().dirty_log_harvest(at, len, bits)
    }

    fn alloc_flag(&self, space: SpaceId) -> Result<Option<u64>, EngineError> {
        let real = lock(&self.rec).space(space)?;
        let va = self.current().alloc_flag(real)?;
        if let Some(va) = va {
            lock(&self.flags).insert(va, space);
        }
        Ok(va)
    }
    fn take_flag(&self, va: u64) -> Result<bool, EngineError> {
        self.current().take_flag(va)
    }
    fn free_flag(&self, va: u64) {
        if lock(&self.flags).remove(&va).is_some() {
            self.current().free_flag(va)
        }
    }
}
