//! `SwitchEngine`: an engine whose backing engine can be replaced while its callers keep their
//! ids — moving a VM's GPU to another device of the host (issue 25). Every caller (the device
//! model, shadows, worker, guards) holds the one `SwitchEngine`; it forwards each call to the
//! current engine with the ids translated (callers see virtual ids that never change) and
//! records what it built there (spaces and their mappings, module texts, host regions:
//! `record`). A move is:
//!
//! 1. [`SwitchEngine::stage`], with the guest running: the new engine (another device) gets
//!    the host regions (registered caller memory again, engine-owned memory adopted through
//!    a `Handover`) and every module (the JIT compile happens here, not in the pause);
//! 2. the caller pre-copies VRAM into [`Staged::engine`] (bulk writes) in rounds of what the
//!    current engine's dirty log reports, as live migration does;
//! 3. with the device paused (no job or call in flight), the last dirty pages, then
//!    [`SwitchEngine::commit`]: modules loaded since the stage, the spaces rebuilt on the new
//!    engine (the old one's torn down first: on cuda both would reserve the same VAs; on an
//!    error they are rebuilt on the old one and it stays), the ids re-pointed, the engine
//!    swapped. Jobs preempted before the swap resume on the new engine: their saved contexts
//!    carry which virtual space and module they ran in and are re-targeted there
//!    (`EngineSnapshot::retarget_context`); each holds the engine that made it, so an old
//!    engine (on cuda: its context and device memory) goes when the caller drops it and its
//!    last preempted job has moved on.
//!
//! The engines must agree on VRAM size and page sizes (checked at the stage). Write-set flag
//! words live in an engine's own memory: a commit with flag words outstanding is refused.

mod forward;
mod record;
#[cfg(test)]
mod tests;

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::engine::{
    ContextRepr, EngineError, EngineInfo, EngineSnapshot, HostRegionId, LiveContext, LoadLimits,
    ModuleId, SavedContext, SpaceId,
};
use crate::sync::lock;
use record::Record;

/// Gives a new engine the host regions of the old one (needed for engine-owned
/// `alloc_host_region` memory, e.g. guest RAM a cuda engine allocated; when given, it is used
/// for every region): called with the old engine's real id, it makes the same memory a region
/// of the new engine and returns that one's id (`CudaEngine::share_host_region`). The memory
/// must stay where it is (guest RAM is mapped into the VM at that address). Without one,
/// registered caller memory is registered again and engine-owned memory refused.
pub type Handover<'a> = &'a mut dyn FnMut(HostRegionId) -> Result<HostRegionId, EngineError>;

/// A new engine made ready for a switch (regions and modules there), not yet in use.
pub struct Staged {
    engine: Arc<dyn EngineSnapshot>,
    regions: HashMap<HostRegionId, HostRegionId>,
    modules: HashMap<ModuleId, ModuleId>,
    limits: LoadLimits,
}

impl Staged {
    /// The new engine: the caller writes VRAM into it (pre-copy) before the commit.
    pub fn engine(&self) -> &Arc<dyn EngineSnapshot> {
        &self.engine
    }
}

/// An engine whose backing engine can be switched (module documentation).
pub struct SwitchEngine {
    current: RwLock<Arc<dyn EngineSnapshot>>,
    rec: Mutex<Record>,
    info: EngineInfo,
    /// Jobs and host copies in flight (a commit waits for none).
    busy: AtomicU32,
    /// Switches made.
    generation: AtomicU64,
    /// Flag words handed out and not freed (virtual space of each).
    flags: Mutex<HashMap<u64, SpaceId>>,
    /// The launch timing of the engines switched away from, as of their switch (the counters
    /// the VM reports keep growing across a switch, as its launches do).
    retired: Mutex<crate::engine::LaunchTiming>,
}

/// A saved context of a job run through the switch: the engine's own, with the engine that
/// made it and the job's virtual space and module (a resume after a switch re-targets it).
/// It holds that engine alive: an engine's in-memory context may refer to its device memory
/// (a checkpointed launch's save area), read when the context is turned into bytes for the
/// new engine — so an old engine goes only when its last preempted job has moved on.
pub(crate) struct Tagged {
    inner: SavedContext,
    engine: Arc<dyn EngineSnapshot>,
    space: SpaceId,
    module: Option<ModuleId>,
}

impl std::fmt::Debug for Tagged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tagged")
            .field("inner", &self.inner)
            .field("engine", &self.engine.info().name)
            .field("space", &self.space)
            .field("module", &self.module)
            .finish()
    }
}

/// Whether two engine handles are the same engine.
fn same(a: &Arc<dyn EngineSnapshot>, b: &Arc<dyn EngineSnapshot>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

impl LiveContext for Tagged {
    fn to_bytes(&self) -> Vec<u8> {
        self.inner.to_bytes()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
    fn is_switch_tagged(&self) -> bool {
        true
    }
}

/// Counts a job or copy in flight while it lives.
struct Busy<'a>(&'a AtomicU32);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SwitchEngine {
    /// Wraps `engine` (the first backing engine). It should be fresh: state made on it
    /// before is not known to the switch.
    pub fn new(engine: Arc<dyn EngineSnapshot>) -> Self {
        Self {
            info: engine.info().clone(),
            current: RwLock::new(engine),
            rec: Mutex::new(Record::default()),
            busy: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            flags: Mutex::new(HashMap::new()),
            retired: Mutex::new(crate::engine::LaunchTiming::default()),
        }
    }

    /// The backing engine now.
    /// The launch timing of every engine this one has been backed by (`Engine::launch_timing`).
    pub fn launch_timing_total(&self) -> crate::engine::LaunchTiming {
        lock(&self.retired).plus(self.current().launch_timing())
    }

    pub fn current(&self) -> Arc<dyn EngineSnapshot> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many switches were made.
    pub fn switches(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(&self.busy)
    }

    /// Step 1 of a switch (the guest may run): host regions and modules made on `new`.
    /// `handover` adopts engine-owned regions (`None`: refused if there are any); `limits`
    /// bound the module loads there. On error nothing changes in use (`new` is the caller's
    /// to drop).
    pub fn stage(
        &self,
        new: Arc<dyn EngineSnapshot>,
        handover: Option<Handover<'_>>,
        limits: &LoadLimits,
    ) -> Result<Staged, EngineError> {
        let ni = new.info();
        if ni.vram_size != self.info.vram_size || ni.page_sizes != self.info.page_sizes {
            return Err(EngineError::Backend(format!(
                "switch: the new engine ({}, {} bytes of VRAM, pages {:?}) does not match ({}, {} \
                 bytes, pages {:?})",
                ni.name,
                ni.vram_size,
                ni.page_sizes,
                self.info.name,
                self.info.vram_size,
                self.info.page_sizes
            )));
        }
        let (regions, modules) = {
            let rec = lock(&self.rec);
            let mut handover = handover;
            let mut regions = HashMap::new();
            for (v, r) in &rec.regions {
                let real = match (handover.as_mut(), r.registered) {
                    (Some(h), _) => h(r.real)?,
                    (None, Some((base, len))) => {
                        // SAFETY: the caller registered `base..base+len` through this switch
                        // with the same contract (valid until unregistered), and it stays
                        // registered here until `unregister_host_region`.
                        unsafe { new.register_host_region(base as *mut u8, len) }?
                    }
                    (None, None) => {
                        return Err(EngineError::BadHostRegion(
                            "switch: engine-owned host memory cannot move without a handover",
                        ));
                    }
                };
                regions.insert(*v, real);
            }
            let snapshot = Record {
                modules: rec.modules.clone(),
                ..Record::default()
            };
            (regions, snapshot)
        };
        // The loads (a JIT compile each on cuda) run without the record's lock.
        let mut loaded = HashMap::new();
        record::load_modules(&*new, &modules, limits, &mut loaded)?;
        Ok(Staged {
            engine: new,
            regions,
            modules: loaded,
            limits: limits.clone(),
        })
    }

    /// Step 3 of a switch, with the device paused (no job, copy or map call in flight): the
    /// spaces rebuilt on the staged engine and the engine swapped. Returns the old engine
    /// (the caller drops it when its VRAM is no longer needed). On error the old engine stays
    /// in use with its spaces as they were.
    pub fn commit(&self, mut staged: Staged) -> Result<Arc<dyn EngineSnapshot>, EngineError> {
        let mut rec = lock(&self.rec);
        if self.busy.load(Ordering::SeqCst) != 0 {
            return Err(EngineError::Backend(
                "switch: a job or copy is in flight (pause the device first)".into(),
            ));
        }
        if !lock(&self.flags).is_empty() {
            return Err(EngineError::Backend(
                "switch: write-set flag words are in use (free them first)".into(),
            ));
        }
        // Modules loaded since the stage; those unloaded since are dropped there.
        record::load_modules(&*staged.engine, &rec, &staged.limits, &mut staged.modules)?;
        staged.modules.retain(|v, real| {
            let keep = rec.modules.contains_key(v);
            if !keep {
                let _ = staged.engine.unload_module(*real);
            }
            keep
        });
        if let Some(v) = rec.regions.keys().find(|v| !staged.regions.contains_key(v)) {
            return Err(EngineError::Backend(format!(
                "switch: host region {v:?} was added after the stage (stage again)"
            )));
        }
        let old = self.current();
        // The old engine's spaces go first (a cuda engine reserves each window's VAs).
        let mut gone = Vec::new();
        for (v, sp) in &rec.spaces {
            if let Err(e) = old.destroy_space(sp.real) {
                restore_spaces(&mut rec, &*old, &gone);
                return Err(e);
            }
            gone.push(*v);
        }
        let spaces = match record::build_spaces(&*staged.engine, &rec, &staged.regions) {
            Ok(s) => s,
            Err(e) => {
                restore_spaces(&mut rec, &*old, &gone);
                return Err(e);
            }
        };
        for (v, real) in spaces {
            if let Some(s) = rec.spaces.get_mut(&v) {
                s.real = real;
            }
        }
        for (v, real) in &staged.modules {
            if let Some(m) = rec.modules.get_mut(v) {
                m.real = *real;
            }
        }
        for (v, real) in &staged.regions {
            if let Some(r) = rec.regions.get_mut(v) {
                r.real = *real;
            }
        }
        old.dirty_log_stop();
        {
            let mut r = lock(&self.retired);
            *r = r.plus(old.launch_timing());
        }
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = staged.engine.clone();
        self.generation.fetch_add(1, Ordering::SeqCst);
        log::info!(
            "switch: now on a new {} engine ({} spaces, {} modules, {} host regions)",
            staged.engine.info().name,
            rec.spaces.len(),
            rec.modules.len(),
            rec.regions.len()
        );
        Ok(old)
    }

    /// A saved context as the current engine takes it: its own if made by it, re-targeted at the rebuilt space and module if made before a switch, or
    /// passed through (bytes: a restore's, already re-targeted by the caller).
    fn unwrap_context(
        &self,
        ctx: SavedContext,
    ) -> Result<(SavedContext, Option<Tag>), EngineError> {
        let live = match ctx.into_repr() {
            ContextRepr::Bytes(b) => return Ok((SavedContext::from_bytes(b), None)),
            ContextRepr::Live(l) if !l.is_switch_tagged() => {
                return Ok((SavedContext::live(l), None));
            }
            ContextRepr::Live(l) => l,
        };
        let t = match live.into_any().downcast::<Tagged>() {
            Ok(t) => *t,
            Err(_) => return Err(EngineError::BadContext("a mislabelled live context".into())),
        };
        let tag = Tag {
            space: t.space,
            module: t.module,
        };
        let current = self.current();
        if same(&t.engine, &current) {
            return Ok((t.inner, Some(tag)));
        }
        let (space, module) = {
            let rec = lock(&self.rec);
            let m = match t.module {
                Some(m) => Some(rec.module(m)?),
                None => None,
            };
            (rec.space(t.space)?, m)
        };
        // Serialized while the engine that made it is still held (`t.engine`).
        let bytes = SavedContext::from_bytes(t.inner.into_bytes());
        drop(t.engine);
        let ctx = current.retarget_context(bytes, space, module, None)?;
        Ok((ctx, Some(tag)))
    }

    /// Wraps a context `engine` made with its tag.
    fn wrap_context(
        &self,
        inner: SavedContext,
        engine: Arc<dyn EngineSnapshot>,
        tag: Tag,
    ) -> SavedContext {
        SavedContext::live(Box::new(Tagged {
            inner,
            engine,
            space: tag.space,
            module: tag.module,
        }))
    }
}

/// Rebuilds the spaces `which` (virtual ids) on the old engine after a failed commit, the
/// record re-pointed at the new real ids (a failure here is logged: those spaces are lost).
fn restore_spaces(rec: &mut Record, old: &dyn EngineSnapshot, which: &[SpaceId]) {
    let part = Record {
        spaces: which
            .iter()
            .filter_map(|v| rec.spaces.get(v).map(|s| (*v, s.clone())))
            .collect(),
        ..Record::default()
    };
    let regions: HashMap<_, _> = rec.regions.iter().map(|(v, r)| (*v, r.real)).collect();
    match record::build_spaces(old, &part, &regions) {
        Ok(again) => {
            for (v, real) in again {
                if let Some(s) = rec.spaces.get_mut(&v) {
                    s.real = real;
                }
            }
        }
        Err(e) => log::error!("switch: rebuilding the old engine's spaces: {e}"),
    }
}

/// The virtual space and module of a job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tag {
    space: SpaceId,
    module: Option<ModuleId>,
}
