//! The device's use of the `shadow` crate: guest memory as the shadowing code reads it (guest
//! VRAM through the engine, guest RAM through vm-memory), the VM's layout and partition, guest
//! RAM registered with the engine for system-memory PTEs, and one shadow address space per
//! guest page directory, rebuilt after each TLB flush, retained while the VM's host memory
//! budget allows (least recently used idle spaces are evicted; see `budget`).

use std::collections::HashMap;
use std::sync::Arc;

use pgpu::{Engine, SpaceId, VaWindow};
use shadow::{
    Aperture, GpuLayout, GuestFault, GuestMem, MemError, PageSizes, Partition, Pdb, RamRegion,
    ShadowError, ShadowSpace, SyncStats, SysmemEntry, SysmemMap,
};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

use crate::VgpuError;
use crate::budget::{Class, HostBudget};
use crate::config::GpuConfig;
use crate::worker::Fault;

pub use shadow::Instance;

/// Guest memory for the shadowing code.
struct VmMem {
    engine: Arc<dyn Engine>,
    vram_base: u64,
    vram_size: u64,
    ram: GuestMemoryMmap,
}

impl GuestMem for VmMem {
    fn read_vram(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let inside = addr
            .checked_add(buf.len() as u64)
            .is_some_and(|e| e <= self.vram_size);
        if !inside {
            return Err(MemError::OutOfRange {
                aperture: Aperture::Vram,
                addr,
                len: buf.len() as u64,
            });
        }
        self.engine
            .vram_read(self.vram_base + addr, buf)
            .map_err(|_| MemError::OutOfRange {
                aperture: Aperture::Vram,
                addr,
                len: buf.len() as u64,
            })
    }

    fn read_ram(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.ram
            .read_slice(buf, GuestAddress(gpa))
            .map_err(|_| MemError::OutOfRange {
                aperture: Aperture::Sysmem,
                addr: gpa,
                len: buf.len() as u64,
            })
    }
}

/// What a rebuild did, for the worker's counters and watch set.
#[derive(Debug, Default)]
pub struct RebuildReport {
    /// The shadow was (re)built now (not a report kept from an eager rebuild).
    pub rebuilt: bool,
    pub mapped: u64,
    pub unmapped: u64,
    /// Guest VRAM pages (addr >> 12) holding the page directory and page tables.
    pub table_pages: Vec<u64>,
    /// Bad entries found (their ranges stay unmapped).
    pub faults: Vec<Fault>,
}

/// The engine space to run in, and the report if it was rebuilt.
pub struct SpaceSync {
    pub space: SpaceId,
    pub report: Option<RebuildReport>,
}

/// Evicts the least recently used idle module older than the stamp given (any if `None`),
/// charging the budget; returns whether it evicted one. The worker passes its module cache.
pub type EvictModule<'a> = dyn FnMut(&mut HostBudget, Option<u64>) -> bool + 'a;

/// One retained shadow space.
struct Entry {
    sp: ShadowSpace,
    /// The flush epoch it was built in.
    built: u64,
    /// Bytes charged to the budget for it.
    charged: u64,
    /// Use stamp of the budget's clock (least recently used spaces are evicted first).
    last_use: u64,
    /// What an eager rebuild (`opt=none`) found, for the next channel that runs in it.
    pending: Option<RebuildReport>,
}

/// Shadow state of one VM.
pub struct Shadows {
    engine: Arc<dyn Engine>,
    mem: VmMem,
    layout: GpuLayout,
    partition: Partition,
    sysmem: SysmemMap,
    /// Per guest page directory: its shadow (retained while the budget allows).
    spaces: HashMap<Pdb, Entry>,
    /// Bumped whenever a space's mappings may have changed (installed, rebuilt, dropped).
    generation: u64,
}

fn guest_fault(f: GuestFault) -> Fault {
    Fault::new(f.kind, f.addr, f.info)
}

/// FAULT_INFO of a RESOURCE_LIMIT fault for shadow page tables (ADDR = the page directory).
pub const LIMIT_SPACE: u32 = 2;

impl Shadows {
    /// Registers the VM's RAM with the engine (or takes `ram_regions`, the engine's own host
    /// regions that back it, region by region) and sets up the layout and partition.
    pub fn new(
        engine: Arc<dyn Engine>,
        cfg: &GpuConfig,
        vram_base: u64,
        ram: GuestMemoryMmap,
        ram_regions: Option<Vec<pgpu::HostRegionId>>,
    ) -> Result<Self, VgpuError> {
        let shadow_err = |e: shadow::ShadowError| VgpuError::Shadow(e.to_string());
        let mut entries = Vec::new();
        let mut regions = Vec::new();
        for (i, r) in ram.iter().enumerate() {
            let host = r
                .get_host_address(MemoryRegionAddress(0))
                .map_err(|e| VgpuError::Shadow(format!("guest RAM region: {e}")))?;
            let region = match &ram_regions {
                Some(ids) => *ids
                    .get(i)
                    .ok_or_else(|| VgpuError::Shadow("a RAM region has no engine region".into()))?,
                // SAFETY: `host` is the start of a live mapping of `r.len()` bytes of guest RAM
                // that `ram` (kept in `VmMem` for the life of these shadows, and so of the
                // engine's use of the region) owns.
                None => unsafe { engine.register_host_region(host, r.len() as usize)? },
            };
            entries.push(SysmemEntry {
                gpa: r.start_addr().0,
                len: r.len(),
                region,
                offset: 0,
            });
            regions.push(RamRegion {
                gpa: r.start_addr().0,
                len: r.len(),
            });
        }
        let layout = GpuLayout {
            vram_size: cfg.vram,
            ram: regions,
            va: VaWindow {
                base: cfg.va_base,
                size: cfg.va_size,
            },
            page_sizes: PageSizes::of_engine(&engine.info().page_sizes),
            sysmem: true,
            max_faults: 16,
        };
        layout.validate().map_err(shadow_err)?;
        let partition = Partition::new(vram_base, cfg.vram).map_err(shadow_err)?;
        let sysmem = SysmemMap::new(entries).map_err(shadow_err)?;
        let mem = VmMem {
            engine: engine.clone(),
            vram_base,
            vram_size: cfg.vram,
            ram,
        };
        Ok(Shadows {
            engine,
            mem,
            layout,
            partition,
            sysmem,
            spaces: HashMap::new(),
            generation: 0,
        })
    }

    /// The VM's GPU layout (what guest addresses are valid).
    pub fn layout(&self) -> &GpuLayout {
        &self.layout
    }

    /// The VM's VRAM partition (for the para-managed spaces).
    pub fn partition(&self) -> Partition {
        self.partition
    }

    /// Guest RAM onto registered host regions (for the para-managed spaces).
    pub fn sysmem(&self) -> &SysmemMap {
        &self.sysmem
    }

    /// Changes whenever the mappings of a space may have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The mappings installed for page directory `key` (sorted by VA), if it has a shadow.
    pub fn installed(&self, key: Pdb) -> Option<&[pgpu::Mapping]> {
        self.spaces.get(&key).map(|e| e.sp.installed())
    }

    /// Reads and validates the instance block at guest VRAM `addr`.
    pub fn read_instance(&self, addr: u64) -> Result<Instance, Fault> {
        Instance::read(&self.mem, &self.layout, addr).map_err(guest_fault)
    }

    /// The least recently used retained space other than `keep`.
    fn oldest_idle(&self, keep: Option<Pdb>) -> Option<(Pdb, u64)> {
        self.spaces
            .iter()
            .filter(|(k, _)| Some(**k) != keep)
            .map(|(k, e)| (*k, e.last_use))
            .min_by_key(|&(_, t)| t)
    }

    /// Destroys the shadow of `key` and gives back its charge.
    fn drop_space(&mut self, key: Pdb, budget: &mut HostBudget) {
        self.generation += 1;
        if let Some(mut e) = self.spaces.remove(&key) {
            if let Err(err) = e.sp.destroy(&*self.engine) {
                log::warn!("vgpu: destroy shadow space {key:?}: {err}");
            }
            budget.release(Class::Space, e.charged);
        }
    }

    /// Evicts the least recently used idle space other than `keep`; false if there is none.
    pub fn evict_oldest(&mut self, keep: Option<Pdb>, budget: &mut HostBudget) -> bool {
        match self.oldest_idle(keep) {
            Some((key, _)) => {
                log::debug!("vgpu: evicting the shadow of {key:?} (host memory budget)");
                self.drop_space(key, budget);
                budget.count(|s| &mut s.spaces_evicted);
                true
            }
            None => false,
        }
    }

    /// Evicts idle modules and spaces (other than `keep`), least recently used first, until
    /// `need` bytes are free; false if they cannot be.
    pub fn make_room(
        &mut self,
        need: u64,
        keep: Option<Pdb>,
        budget: &mut HostBudget,
        evict_module: &mut EvictModule<'_>,
    ) -> bool {
        while budget.free() < need {
            let oldest = self.oldest_idle(keep);
            if evict_module(budget, oldest.map(|(_, t)| t)) {
                continue;
            }
            if !self.evict_oldest(keep, budget) {
                return false;
            }
        }
        true
    }

    /// Creates the engine space for `key`, evicting an idle space if the engine has too many.
    fn create(&mut self, key: Pdb, budget: &mut HostBudget) -> Result<ShadowSpace, ShadowError> {
        match ShadowSpace::create(&*self.engine, key, self.layout.va) {
            Err(ShadowError::Engine(pgpu::EngineError::TooMany(_)))
                if self.evict_oldest(Some(key), budget) =>
            {
                ShadowSpace::create(&*self.engine, key, self.layout.va)
            }
            other => other,
        }
    }

    /// Builds (or brings up to date) the shadow of `key` from `plan` under the budget.
    /// `Ok(None)`: it does not fit even with everything idle evicted (nothing of it is kept).
    fn install(
        &mut self,
        key: Pdb,
        plan: &shadow::Plan,
        epoch: u64,
        budget: &mut HostBudget,
        evict_module: &mut EvictModule<'_>,
    ) -> Result<Option<(SpaceId, SyncStats)>, ShadowError> {
        let want = shadow::host_bytes_of(self.layout.va, &plan.mappings);
        let held = self.spaces.get(&key).map_or(0, |e| e.charged);
        if want > held && !self.make_room(want - held, Some(key), budget, evict_module) {
            self.drop_space(key, budget);
            return Ok(None);
        }
        let tick = budget.tick();
        if !self.spaces.contains_key(&key) {
            let sp = match self.create(key, budget) {
                // The engine's table of spaces is full of live ones: over the limit too.
                Err(ShadowError::Engine(pgpu::EngineError::TooMany(_))) => return Ok(None),
                other => other?,
            };
            self.spaces.insert(
                key,
                Entry {
                    sp,
                    built: epoch,
                    charged: 0,
                    last_use: tick,
                    pending: None,
                },
            );
        }
        self.generation += 1;
        let e = self.spaces.get_mut(&key).ok_or(ShadowError::Destroyed)?;
        let synced = e.sp.sync(&*self.engine, &plan.mappings);
        // What is installed never exceeds what was wanted, for which room was made.
        budget.release(Class::Space, e.charged);
        e.charged = e.sp.host_bytes();
        if !budget.charge(Class::Space, e.charged) {
            log::error!("vgpu: shadow of {key:?} outgrew its estimate");
            e.charged = 0;
            self.drop_space(key, budget);
            return Ok(None);
        }
        e.built = epoch;
        e.last_use = tick;
        let stats = synced?;
        let space = e.sp.space().ok_or(ShadowError::Destroyed)?;
        Ok(Some((space, stats)))
    }

    /// Rebuilds every shadow space from scratch (a fresh engine space, every mapping made
    /// again) and marks it current for `epoch` (`opt=none`). What each rebuild finds (bad
    /// entries, table pages) is kept for the next channel that runs in the space, which reports
    /// it as a lazy rebuild would. Spaces whose page directory became invalid, or that no longer
    /// fit the budget, are dropped (the next run of their channel rebuilds or reports them).
    pub fn rebuild_all(
        &mut self,
        epoch: u64,
        budget: &mut HostBudget,
        evict_module: &mut EvictModule<'_>,
    ) -> Vec<RebuildReport> {
        let keys: Vec<Pdb> = self.spaces.keys().copied().collect();
        let mut reports = Vec::new();
        for key in keys {
            let last_use = self.spaces.get(&key).map_or(0, |e| e.last_use);
            self.drop_space(key, budget);
            let plan = match shadow::plan(
                &self.mem,
                &self.layout,
                &self.partition,
                &self.sysmem,
                &self.engine.info().page_sizes,
                key,
            ) {
                Ok(p) => p,
                Err(f) => {
                    log::debug!("vgpu: eager rebuild of {key:?}: {f}");
                    continue;
                }
            };
            match self.install(key, &plan, epoch, budget, evict_module) {
                Ok(Some((_, stats))) => {
                    if let Some(e) = self.spaces.get_mut(&key) {
                        // An eager rebuild is no use: the LRU order stays the guest's.
                        e.last_use = last_use;
                        e.pending = Some(RebuildReport {
                            rebuilt: false,
                            table_pages: table_pages(&plan),
                            faults: plan.faults.iter().copied().map(guest_fault).collect(),
                            ..RebuildReport::default()
                        });
                    }
                    reports.push(RebuildReport {
                        rebuilt: true,
                        mapped: stats.mapped_pages,
                        unmapped: stats.unmapped_pages,
                        ..RebuildReport::default()
                    });
                }
                Ok(None) => log::debug!("vgpu: eager rebuild of {key:?}: over the budget"),
                Err(e) => {
                    log::error!("vgpu: eager rebuild of {key:?}: {e}");
                    self.drop_space(key, budget);
                }
            }
        }
        reports
    }

    /// The shadow space for `inst`'s page directory, rebuilt if the guest flushed since it was
    /// built (or it is new), under the host memory budget.
    pub fn space_for(
        &mut self,
        inst: &Instance,
        epoch: u64,
        budget: &mut HostBudget,
        evict_module: &mut EvictModule<'_>,
    ) -> Result<SpaceSync, Fault> {
        let key = inst.pdb;
        if let Some(e) = self.spaces.get_mut(&key)
            && e.built == epoch
            && let Some(space) = e.sp.space()
        {
            e.last_use = budget.tick();
            return Ok(SpaceSync {
                space,
                report: e.pending.take(),
            });
        }
        let plan = shadow::plan(
            &self.mem,
            &self.layout,
            &self.partition,
            &self.sysmem,
            &self.engine.info().page_sizes,
            key,
        )
        .map_err(guest_fault)?;
        // The worker runs one job at a time, so the engine never reports the space busy here;
        // any error is a host-side failure, reported to the guest as a bad instance.
        let host_fault = |e: ShadowError| {
            log::error!("vgpu: shadow space for {key:?}: {e}");
            Fault::new(shadow::FaultKind::BadInstance, inst.addr, 0)
        };
        let Some((space, stats)) = self
            .install(key, &plan, epoch, budget, evict_module)
            .map_err(host_fault)?
        else {
            budget.count(|s| &mut s.refused);
            log::warn!(
                "vgpu: the shadow of {key:?} needs {} bytes: over the host memory budget ({} bytes)",
                shadow::host_bytes_of(self.layout.va, &plan.mappings),
                budget.limit()
            );
            return Err(Fault::new(
                shadow::FaultKind::ResourceLimit,
                key.addr,
                LIMIT_SPACE,
            ));
        };
        let report = RebuildReport {
            rebuilt: true,
            mapped: stats.mapped_pages,
            unmapped: stats.unmapped_pages,
            table_pages: table_pages(&plan),
            faults: plan.faults.into_iter().map(guest_fault).collect(),
        };
        Ok(SpaceSync {
            space,
            report: Some(report),
        })
    }
}

/// Guest VRAM pages (addr >> 12) holding the page directory and tables a plan read.
fn table_pages(plan: &shadow::Plan) -> Vec<u64> {
    plan.watch
        .iter()
        .filter(|k| k.aperture == Aperture::Vram)
        .map(|k| k.page >> 12)
        .collect()
}

impl Drop for Shadows {
    fn drop(&mut self) {
        for e in self.spaces.values_mut() {
            if let Err(err) = e.sp.destroy(&*self.engine) {
                log::warn!("vgpu: destroy shadow space {:?}: {err}", e.sp.key());
            }
        }
    }
}
