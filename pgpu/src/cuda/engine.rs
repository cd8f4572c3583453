//! `CudaEngine`: construction, shared state, the lost-context rule and teardown. The trait
//! methods are in `api.rs`, jobs in `jobs.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::sys;

use super::ckmem::{Pool, Signal};
use super::config::CudaConfig;
use super::driver::{Ctx, DrvError};
use super::hostmem::HostRegion;
use super::modules::Modules;
use super::spaces::{Reservation, Space, Targets};
use super::stream::Stream;
use super::vmm::{self, CHUNK, Loc};
use super::vram::Vram;
use crate::ckpt::CkptCounters;
use crate::engine::{EngineError, EngineInfo, HostRegionId, ModuleId, PageSize, SpaceId};
use crate::sync::lock;

/// A host region and how many pages of spaces map it. The region is shared with another
/// engine of the process after `share_host_region` (a move to another device): its memory
/// goes with the last engine holding it.
#[derive(Debug)]
pub(crate) struct RegionSlot {
    pub region: Arc<HostRegion>,
    pub maps: u64,
}

/// Spaces and host regions (one lock: map/unmap are slow driver calls anyway, jobs hold it only
/// to start and end).
#[derive(Debug, Default)]
pub(crate) struct State {
    pub spaces: HashMap<SpaceId, Space>,
    /// Reservations by window (base, size).
    pub reservations: HashMap<(u64, u64), Reservation>,
    pub regions: HashMap<HostRegionId, RegionSlot>,
    pub next_space: u64,
    pub next_region: u64,
}

pub(crate) struct StateTargets<'a> {
    pub vram: u64,
    pub regions: &'a HashMap<HostRegionId, RegionSlot>,
}

impl Targets for StateTargets<'_> {
    fn vram_size(&self) -> u64 {
        self.vram
    }
    fn region_len(&self, r: HostRegionId) -> Option<u64> {
        self.regions.get(&r).map(|s| s.region.len())
    }
}

/// Whose block throughput is measured: (module, entry, block shape).
pub(crate) type RateKey = (ModuleId, String, [u32; 3]);

/// Releases the primary context when the engine goes (declared last: dropped last).
struct CtxGuard(Ctx);

impl Drop for CtxGuard {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// The physical GPU through the CUDA driver API (see `pgpu/README.md`, "The cuda engine").
///
/// One per process: it uses the device's primary context. A kernel fault poisons that context
/// (CUDA's sticky errors): the job returns `Outcome::Faulted` and every later call fails with
/// `EngineError::Backend` ("CUDA context lost ..."); the process must exit to get a GPU back.
pub struct CudaEngine {
    pub(crate) ctx: Ctx,
    pub(crate) id: u64,
    pub(crate) cfg: CudaConfig,
    pub(crate) info: EngineInfo,
    /// Streaming multiprocessors of the device.
    pub(crate) sms: u32,
    pub(crate) vram: Vram,
    pub(crate) state: Mutex<State>,
    /// Signalled when a space's last use ends (a space waiting to become resident retries).
    pub(crate) idle: Condvar,
    pub(crate) modules: Mutex<Modules>,
    pub(crate) streams: Mutex<Vec<Stream>>,
    /// Job streams made so far (the pool was empty).
    pub(crate) streams_made: AtomicU64,
    /// Functions a run resolved itself (`CudaEngine::run_func`): loaded onto the device
    /// inside the run, where `Engine::prepare_module` or `Engine::prepare` had not.
    pub(crate) funcs_in_runs: AtomicU64,
    /// Measured block throughput (blocks per second) per (module, entry, block shape).
    pub(crate) rates: Mutex<HashMap<RateKey, f64>>,
    /// Why the context is lost, once it is.
    pub(crate) lost: Mutex<Option<String>>,
    /// Sub-launches issued (for experiments), and the host time their calls took (start event,
    /// `cuLaunchKernel`, end event), ns: whether a launch waits in the driver behind another
    /// thread's calls (issue 24: the guest's kernels beside a live copy's bulk transfers).
    pub(crate) sub_launches: AtomicU64,
    pub(crate) launch_call_ns: AtomicU64,
    /// Device time of the sub-launches (start to end event each), ns.
    pub(crate) kernel_ns: AtomicU64,
    /// Host time from a launch's origin event to its first sub-launch's start event, ns.
    pub(crate) origin_gap_ns: AtomicU64,
    /// Host time of the copy jobs' copy calls and of their waits for the copies, ns.
    pub(crate) copy_call_ns: AtomicU64,
    pub(crate) copy_wait_ns: AtomicU64,
    /// Device buffers (flag + save area) of checkpointed launches.
    pub(crate) ck_pool: Arc<Pool>,
    /// Flag words of write-set validation (`flags`).
    pub(crate) flags: super::flags::Flags,
    /// Stream of the checkpoint flag writes (made on first use).
    pub(crate) signal: OnceLock<Signal>,
    /// Host flag words and preemption breakdowns (`ckpath`).
    pub(crate) ck_path: super::ckpath::PathState,
    /// Counters of the checkpoint method.
    pub(crate) ckpt: CkptCounters,
    /// Kernels and stream of the bulk VRAM calls (made with the engine) and their pinned
    /// slots (made on first use, sized to the calls).
    pub(crate) bulk: Mutex<Option<super::bulk::Bulk>>,
    /// Request-path event pairs of checkpointed launches, reused (`ckevents`).
    pub(crate) ck_events: super::ckevents::EventPool,
    /// Completed plain (sliced or whole) runs and their driver calls (`hostcost`).
    pub(crate) plain_calls: super::hostcost::RunCalls,
    _ctx: CtxGuard,
}

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl CudaEngine {
    /// Opens device `cfg.device` (loading libcuda at run time) and creates `cfg.vram_size` bytes
    /// of VRAM. Without a driver or device this returns `EngineError::Backend` with the reason
    /// ("CUDA driver not found: ..."); it never panics.
    pub fn new(cfg: CudaConfig) -> Result<CudaEngine, EngineError> {
        if cfg.vram_size == 0 || !cfg.vram_size.is_multiple_of(CHUNK) {
            return Err(EngineError::Backend(
                "VRAM size must be a non-zero multiple of 2 MiB".into(),
            ));
        }
        let ctx = Ctx::open(cfg.device)?;
        let guard = CtxGuard(ctx);
        let gran = vmm::granularity(Loc::Device(cfg.device))?;
        if gran > CHUNK || !CHUNK.is_multiple_of(gran) {
            return Err(EngineError::Backend(format!(
                "device mapping granularity {gran:#x} does not divide 2 MiB"
            )));
        }
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as u32;
        let vram = Vram::new(cfg.device, cfg.vram_size)?;
        let info = EngineInfo {
            name: "cuda".into(),
            vram_size: cfg.vram_size,
            page_sizes: vec![PageSize::Size2M],
            limits: cfg.limits.clone(),
        };
        log::info!(
            "cuda: {} ({sms} SMs), {} MiB VRAM",
            ctx.name(),
            cfg.vram_size >> 20
        );
        // The bulk calls' kernels and stream now, not in the first snapshot or live copy
        // (where the module load would wait for the guest's kernels and stall them); the
        // pinned slots come with the first call, sized to it, unless `bulk_slot_bytes` makes
        // them now (that allocation stalls the guest's copy jobs for tens of ms: the driver's
        // pinned allocation holds up their `cuMemcpy` calls). A failure to load is retried in
        // the first call. Slots that cannot be made now (pinned memory or VRAM short) are a
        // warning, not a failure of the engine (a VM restored or moved here still runs): the
        // first call then makes them, sized to it.
        let mut bulk = super::bulk::Bulk::new(ctx, sms)
            .inspect_err(|e| {
                let why = if cfg.bulk_slot_bytes > 0 {
                    "; the copy slots (--gpu copy_slots) come with the first snapshot or live copy"
                } else {
                    ""
                };
                log::warn!("cuda: bulk kernels not loaded yet: {e}{why}")
            })
            .ok();
        if cfg.bulk_slot_bytes > 0
            && let Some(b) = bulk.as_mut()
            && let Err(e) = b.reserve_fixed(cfg.bulk_slot_bytes)
        {
            log::warn!(
                "cuda: the copy slots (--gpu copy_slots, 2 x {} KiB pinned and on the device) \
                 could not be made: {e}; they come with the first snapshot or live copy",
                cfg.bulk_slot_bytes >> 10
            );
        }
        let ck_pool = Pool::new(ctx, cfg.max_save_area_bytes);
        Ok(CudaEngine {
            ctx,
            id: NEXT_ENGINE.fetch_add(1, Ordering::Relaxed),
            cfg,
            info,
            sms,
            vram,
            state: Mutex::new(State::default()),
            idle: Condvar::new(),
            modules: Mutex::new(Modules::default()),
            streams: Mutex::new(Vec::new()),
            streams_made: AtomicU64::new(0),
            funcs_in_runs: AtomicU64::new(0),
            rates: Mutex::new(HashMap::new()),
            lost: Mutex::new(None),
            sub_launches: AtomicU64::new(0),
            launch_call_ns: AtomicU64::new(0),
            kernel_ns: AtomicU64::new(0),
            origin_gap_ns: AtomicU64::new(0),
            copy_call_ns: AtomicU64::new(0),
            copy_wait_ns: AtomicU64::new(0),
            ck_pool,
            flags: super::flags::Flags::new(ctx),
            signal: OnceLock::new(),
            ck_path: super::ckpath::PathState::new(ctx),
            ckpt: CkptCounters::default(),
            bulk: Mutex::new(bulk),
            ck_events: super::ckevents::EventPool::default(),
            plain_calls: super::hostcost::RunCalls::default(),
            _ctx: guard,
        })
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        self.ctx.name()
    }

    /// The configuration.
    pub fn config(&self) -> &CudaConfig {
        &self.cfg
    }

    /// Kernel sub-launches issued so far (a sliced launch issues several).
    pub fn sub_launches(&self) -> u64 {
        self.sub_launches.load(Ordering::Relaxed)
    }

    /// Host time the sub-launches' driver calls took so far (their events and
    /// `cuLaunchKernel`), ns.
    pub fn launch_call_ns(&self) -> u64 {
        self.launch_call_ns.load(Ordering::Relaxed)
    }

    /// Why the engine's context is lost (after a kernel fault), if it is.
    pub fn lost(&self) -> Option<String> {
        lock(&self.lost).clone()
    }

    /// Makes host region `id` of `from` (another cuda engine of this process, on another
    /// device) a region of this engine too: the same memory at the same CPU address, now
    /// accessible from this device; it stays allocated while either engine holds it. What a
    /// move to another GPU does with guest RAM (`switch::Handover`).
    pub fn share_host_region(
        &self,
        from: &CudaEngine,
        id: HostRegionId,
    ) -> Result<HostRegionId, EngineError> {
        self.alive()?;
        let region = lock(&from.state)
            .regions
            .get(&id)
            .map(|s| s.region.clone())
            .ok_or(EngineError::UnknownHostRegion(id))?;
        if let Some((base, len)) = region.private_range() {
            vmm::set_access(
                base,
                len,
                &[Loc::Device(self.cfg.device), Loc::HostNuma(0)],
                true,
            )
            .map_err(|e| self.drv(e))?;
        }
        let mut st = lock(&self.state);
        if st.regions.len() >= self.info.limits.max_host_regions {
            return Err(EngineError::TooMany("host regions"));
        }
        st.next_region += 1;
        let new = HostRegionId(st.next_region);
        st.regions.insert(new, RegionSlot { region, maps: 0 });
        Ok(new)
    }

    /// Makes this engine's context current on the calling thread (fails once it is lost).
    /// For a caller that runs another engine's CUDA calls inside one of this engine's
    /// callbacks (a move's pre-copy writes the new device's VRAM from the old one's bulk
    /// read, which goes on with its own stream after the callback).
    pub fn make_current(&self) -> Result<(), EngineError> {
        self.alive()
    }

    /// Fails once the context is lost; makes the context current on this thread.
    pub(crate) fn alive(&self) -> Result<(), EngineError> {
        if let Some(why) = lock(&self.lost).as_ref() {
            return Err(EngineError::Backend(format!(
                "CUDA context lost after a kernel fault ({why}); this process's GPU is gone"
            )));
        }
        self.ctx.bind().map_err(Into::into)
    }

    /// Records a sticky error: the context is lost for good.
    pub(crate) fn poison(&self, why: &DrvError) {
        log::error!("cuda: context lost: {why}");
        lock(&self.lost).get_or_insert_with(|| why.to_string());
    }

    /// Maps an error of a driver call that may be sticky (poisons the engine if it is).
    pub(crate) fn drv(&self, e: DrvError) -> EngineError {
        if e.is_sticky() {
            self.poison(&e);
        }
        e.into()
    }

    pub(crate) fn take_stream(&self) -> Result<Stream, EngineError> {
        if let Some(s) = lock(&self.streams).pop() {
            return Ok(s);
        }
        let s = Stream::new().map_err(|e| self.drv(e))?;
        self.streams_made.fetch_add(1, Ordering::Relaxed);
        Ok(s)
    }

    /// Driver objects made so far: job streams and save-area buffers (a run of a job
    /// `Engine::prepare` prepared makes none): for tests on a GPU.
    #[doc(hidden)]
    pub fn made_counts(&self) -> (u64, u64) {
        (
            self.streams_made.load(Ordering::Relaxed),
            self.ck_pool.allocs.load(Ordering::Relaxed),
        )
    }

    /// Functions resolved inside runs so far (`run_func`), and whether the checkpoint
    /// method's signal stream exists: for tests on a GPU.
    #[doc(hidden)]
    pub fn lazy_counts(&self) -> (u64, bool) {
        (
            self.funcs_in_runs.load(Ordering::Relaxed),
            self.signal.get().is_some(),
        )
    }

    pub(crate) fn give_stream(&self, s: Stream) {
        lock(&self.streams).push(s);
    }

    /// Realises every page of `space` (resident from now on); on error none stays mapped.
    pub(crate) fn realise_all(&self, st: &State, space: SpaceId) -> Result<(), EngineError> {
        let s = st
            .spaces
            .get(&space)
            .ok_or(EngineError::UnknownSpace(space))?;
        let mut done = Vec::new();
        for (&va, page) in &s.pages {
            if let Err(e) = self.realise(st, va, page) {
                for &va in &done {
                    let _ = vmm::unmap(va, CHUNK);
                }
                return Err(e);
            }
            done.push(va);
        }
        Ok(())
    }

    /// Unmaps every page of `space` from the process's VA (it stops being resident).
    pub(crate) fn evict(&self, st: &State, space: SpaceId) -> Result<(), EngineError> {
        if let Some(s) = st.spaces.get(&space) {
            for &va in s.pages.keys() {
                vmm::unmap(va, CHUNK).map_err(|e| self.drv(e))?;
            }
        }
        Ok(())
    }

    /// Realises page `va` → `page` in the process's VA (map + access).
    pub(crate) fn realise(
        &self,
        st: &State,
        va: u64,
        page: &super::spaces::Page,
    ) -> Result<(), EngineError> {
        use crate::engine::{MapTarget, Perm};
        let h = match page.target {
            MapTarget::Vram { pa } => self.vram.chunk(pa),
            MapTarget::Host { region, offset } => st
                .regions
                .get(&region)
                .ok_or(EngineError::UnknownHostRegion(region))?
                .region
                .chunk(offset)
                .ok_or(EngineError::BadHostRegion(
                    "registered host memory cannot be mapped at a chosen GPU VA (use alloc_host_region)",
                ))?,
        };
        vmm::map(va, h).map_err(|e| self.drv(e))?;
        let write = page.perm == Perm::ReadWrite;
        if let Err(e) = vmm::set_access(va, CHUNK, &[Loc::Device(self.cfg.device)], write) {
            let _ = vmm::unmap(va, CHUNK);
            return Err(self.drv(e));
        }
        Ok(())
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        let st = std::mem::take(&mut *lock(&self.state));
        for (&(base, size), r) in &st.reservations {
            if let Some(s) = r.resident.and_then(|id| st.spaces.get(&id)) {
                for &va in s.pages.keys() {
                    let _ = vmm::unmap(va, CHUNK);
                }
            }
            vmm::free(base, size);
        }
        drop(st.regions);
        lock(&self.modules).clear();
        lock(&self.streams).clear();
        lock(&self.bulk).take();
    }
}
