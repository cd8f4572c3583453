//! The device's use of the `shadow` crate: guest memory as the shadowing code reads it (guest
//! VRAM through the engine, guest RAM through vm-memory), the VM's layout and partition, guest
//! RAM registered with the engine for system-memory PTEs, and one shadow address space per
//! guest page directory, rebuilt after each TLB flush (naive full virtualization).

use std::collections::HashMap;
use std::sync::Arc;

use pgpu::{Engine, SpaceId, VaWindow};
use shadow::{
    Aperture, GpuLayout, GuestFault, GuestMem, MemError, PageSizes, Partition, Pdb, RamRegion,
    ShadowSpace, SysmemEntry, SysmemMap,
};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

use crate::VgpuError;
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

/// Shadow state of one VM.
pub struct Shadows {
    engine: Arc<dyn Engine>,
    mem: VmMem,
    layout: GpuLayout,
    partition: Partition,
    sysmem: SysmemMap,
    /// Per guest page directory: its shadow and the flush epoch it was built in.
    spaces: HashMap<Pdb, (ShadowSpace, u64)>,
}

fn guest_fault(f: GuestFault) -> Fault {
    Fault::new(f.kind, f.addr, f.info)
}

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

    /// Reads and validates the instance block at guest VRAM `addr`.
    pub fn read_instance(&self, addr: u64) -> Result<Instance, Fault> {
        Instance::read(&self.mem, &self.layout, addr).map_err(guest_fault)
    }

    /// Rebuilds every shadow space from scratch (a fresh engine space, every mapping made
    /// again) and marks it current for `epoch`. Spaces whose page directory became invalid are
    /// dropped (the next run of their channel reports the fault).
    pub fn rebuild_all(&mut self, epoch: u64) -> Vec<RebuildReport> {
        let keys: Vec<Pdb> = self.spaces.keys().copied().collect();
        let mut reports = Vec::new();
        for key in keys {
            if let Some((mut sp, _)) = self.spaces.remove(&key)
                && let Err(e) = sp.destroy(&*self.engine)
            {
                log::warn!("vgpu: destroy shadow space {key:?}: {e}");
            }
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
            let built =
                ShadowSpace::create(&*self.engine, key, self.layout.va).and_then(|mut sp| {
                    let stats = sp.sync(&*self.engine, &plan.mappings)?;
                    Ok((sp, stats))
                });
            match built {
                Ok((sp, stats)) => {
                    self.spaces.insert(key, (sp, epoch));
                    reports.push(RebuildReport {
                        mapped: stats.mapped_pages,
                        unmapped: stats.unmapped_pages,
                        ..RebuildReport::default()
                    });
                }
                Err(e) => log::error!("vgpu: eager rebuild of {key:?}: {e}"),
            }
        }
        reports
    }

    /// The shadow space for `inst`'s page directory, rebuilt if the guest flushed since it was
    /// built (or it is new).
    pub fn space_for(&mut self, inst: &Instance, epoch: u64) -> Result<SpaceSync, Fault> {
        let key = inst.pdb;
        if let Some((sp, built)) = self.spaces.get(&key)
            && *built == epoch
            && let Some(space) = sp.space()
        {
            return Ok(SpaceSync {
                space,
                report: None,
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
        let host_fault = |e: shadow::ShadowError| {
            log::error!("vgpu: shadow space for {key:?}: {e}");
            Fault::new(shadow::FaultKind::BadInstance, inst.addr, 0)
        };
        if !self.spaces.contains_key(&key) {
            let sp = ShadowSpace::create(&*self.engine, key, self.layout.va).map_err(host_fault)?;
            self.spaces.insert(key, (sp, epoch));
        }
        let (sp, built) = self.spaces.get_mut(&key).ok_or(Fault::new(
            shadow::FaultKind::BadInstance,
            inst.addr,
            0,
        ))?;
        let stats = sp.sync(&*self.engine, &plan.mappings).map_err(host_fault)?;
        *built = epoch;
        let space = sp
            .space()
            .ok_or(Fault::new(shadow::FaultKind::BadInstance, inst.addr, 0))?;
        let table_pages = plan
            .watch
            .iter()
            .filter(|k| k.aperture == Aperture::Vram)
            .map(|k| k.page >> 12)
            .collect();
        let report = RebuildReport {
            mapped: stats.mapped_pages,
            unmapped: stats.unmapped_pages,
            table_pages,
            faults: plan.faults.into_iter().map(guest_fault).collect(),
        };
        Ok(SpaceSync {
            space,
            report: Some(report),
        })
    }
}

impl Drop for Shadows {
    fn drop(&mut self) {
        for (sp, _) in self.spaces.values_mut() {
            if let Err(e) = sp.destroy(&*self.engine) {
                log::warn!("vgpu: destroy shadow space {:?}: {e}", sp.key());
            }
        }
    }
}
