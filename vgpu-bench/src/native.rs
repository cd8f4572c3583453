//! The native baseline of `overhead`: gpu-driver and its suite loop in this process, on the
//! virtual GPU's device model called directly (no VM, no traps). Registers and the VRAM
//! aperture are `PciDevice::bar_read`/`bar_write` calls; DMA buffers are carved out of a
//! `GuestMemoryMmap` handed to `Vgpu::new` as the "guest RAM" (gpa = offset in it); waits poll
//! the semaphore in that memory, as the `workloads` guest does by default. The engine is the
//! `--gpu` options' `backend`: sim (made by `Vgpu::new`) or cuda (made first, as `vgpu-vmm`
//! does, and backing the "guest RAM" with its `alloc_host_region`: CUDA maps only memory it
//! allocated at a chosen GPU VA).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use gpu_driver::suite_run::{self, Options, Outcome, Phase};
use gpu_driver::{Config, DmaBuf, Platform};
use mmio::pci::{MsiMessage, PciDevice};
use pgpu::{Engine, HostRegionId};
use vgpu::config::Backend;
use vgpu::device::VgpuDevice;
use vgpu::{GpuConfig, GpuCounters, IrqSink, Vgpu};
use vm_memory::mmap::{GuestRegionMmap, MmapRegion};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::error::BenchError;

/// "Guest RAM" of the native platform (as `vgpu-vmm`'s default `--memory`), at least; more
/// when the driver's pool needs it ([`ram_bytes`]).
const RAM_BYTES: usize = 256 << 20;

/// Room in the "guest RAM" next to the driver's pool (page tables, channel buffers).
const RAM_SLACK: usize = 64 << 20;

/// The "guest RAM" for a driver pool of `pool_bytes`: [`RAM_BYTES`], or the pool plus
/// [`RAM_SLACK`] where that is more (DMA buffers come only from this memory).
fn ram_bytes(pool_bytes: u64) -> usize {
    usize::try_from(pool_bytes)
        .ok()
        .and_then(|p| p.checked_add(DMA_BASE as usize + RAM_SLACK))
        .map_or(usize::MAX, |n| n.max(RAM_BYTES))
}
/// DMA buffers start here (below is left unused, like a guest's low memory).
const DMA_BASE: u64 = 1 << 20;

/// Interrupts are not used (the driver polls); the sink only drops them.
struct NoIrq;

impl IrqSink for NoIrq {
    fn msi(&self, _msg: MsiMessage) {}
    fn intx(&self, _level: bool) {}
}

/// gpu-driver's platform on the in-process device.
pub struct Native {
    dev: Arc<Mutex<VgpuDevice>>,
    ram: GuestMemoryMmap,
    aperture: u64,
    next: u64,
    /// Size of `ram`.
    ram_bytes: u64,
    t0: Instant,
}

impl Native {
    fn bar_read(&self, bar: usize, off: u64, data: &mut [u8]) {
        self.dev
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bar_read(bar, off, data);
    }

    fn bar_write(&self, bar: usize, off: u64, data: &[u8]) {
        self.dev
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bar_write(bar, off, data);
    }
}

impl Platform for Native {
    fn reg_read(&mut self, offset: u32) -> u32 {
        let mut b = [0u8; 4];
        self.bar_read(0, u64::from(offset), &mut b);
        u32::from_le_bytes(b)
    }

    fn reg_write(&mut self, offset: u32, value: u32) {
        self.bar_write(0, u64::from(offset), &value.to_le_bytes());
    }

    fn vram_read64(&mut self, addr: u64) -> u64 {
        let mut b = [0u8; 8];
        self.bar_read(1, addr, &mut b);
        u64::from_le_bytes(b)
    }

    fn vram_write64(&mut self, addr: u64, value: u64) {
        self.bar_write(1, addr, &value.to_le_bytes());
    }

    fn vram_aperture(&self) -> u64 {
        self.aperture
    }

    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        // A bump allocator over never-used (so zeroed) memory; nothing is ever freed.
        let gpa = self.next.checked_next_multiple_of(align.max(1) as u64)?;
        let end = gpa.checked_add(len as u64)?;
        if end > self.ram_bytes {
            return None;
        }
        let ptr = self.ram.get_host_address(GuestAddress(gpa)).ok()?;
        self.next = end;
        // SAFETY: `gpa .. end` lies in the single region of `ram` (checked against its size),
        // which stays mapped as long as `self.ram` (a clone kept by the platform) lives, i.e.
        // as long as the driver; the bump allocator hands out each byte once, and the device
        // reaches these bytes at exactly these guest-physical addresses.
        unsafe { DmaBuf::from_raw(ptr, gpa, len) }
    }

    fn wait_for_interrupt(&mut self, _ns: u64) {
        std::thread::yield_now();
    }

    fn now_ns(&mut self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn relax(&mut self) {
        // The device model's worker is a thread of this process: a fence poll must not keep it
        // off a core (a guest's spinning vCPU is yielded by pause-loop exiting).
        std::thread::yield_now();
    }
}

/// One native run of the suite.
pub struct NativeRun {
    pub init: Phase,
    /// Where init's time went (`gpu_driver::InitParts`).
    pub init_parts: gpu_driver::InitParts,
    pub results: Vec<(String, Outcome)>,
    pub counters: GpuCounters,
}

/// The "guest RAM" in one host region of `engine` (as `vgpu-vmm`'s `memory::create` with an
/// allocator): the region is the engine's, freed when the engine is dropped.
fn engine_ram(
    engine: &dyn Engine,
    bytes: usize,
) -> Result<(GuestMemoryMmap, HostRegionId), BenchError> {
    let (id, ptr) = engine.alloc_host_region(bytes as u64)?;
    // SAFETY: `ptr` is a readable and writable mapping of `bytes` bytes that the engine
    // keeps alive as long as itself; `run` keeps the engine alive past every user of the
    // memory (the virtual GPU and the driver are dropped first), and a raw region is never
    // unmapped by vm-memory.
    let region = unsafe {
        MmapRegion::build_raw(
            ptr.as_ptr(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
    }
    .map_err(|e| BenchError::NativeRam(e.to_string()))?;
    let region = GuestRegionMmap::new(region, GuestAddress(0))
        .ok_or_else(|| BenchError::NativeRam("region overflows".into()))?;
    let ram = GuestMemoryMmap::from_regions(vec![region])
        .map_err(|e| BenchError::NativeRam(e.to_string()))?;
    Ok((ram, id))
}

/// Runs `workloads` (suite names) of `size` through gpu-driver on a fresh in-process virtual
/// GPU configured by `gpu_opts` (the `--gpu` syntax; `backend=cuda` runs on a fresh
/// `CudaEngine`, an error without a CUDA driver); `sys_mib` sizes the driver's system-memory
/// pool as the guest's `sys_mib=` does (None: what `size` needs, as the guest does).
pub fn run(
    gpu_opts: &str,
    size: suite::Size,
    workloads: &[&'static suite::Workload],
    sys_mib: Option<u64>,
) -> Result<NativeRun, BenchError> {
    let cfg = GpuConfig::parse(gpu_opts).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let aperture = cfg.vram;
    let mut driver = Config::default();
    // As the `workloads` guest: `sys_mib`, else what `size` needs.
    driver.sys_pool_bytes = match sys_mib {
        Some(m) => m.clamp(2, 2048) << 20,
        None => driver.sys_pool_bytes.max(size.sys_pool_mib() << 20),
    };
    let ram_len = ram_bytes(driver.sys_pool_bytes);
    // Declared before the RAM and the virtual GPU, so it is dropped after them.
    let cuda = match cfg.backend {
        Backend::Cuda => Some(
            Vgpu::cuda_engine(&cfg)
                .map_err(|e| BenchError::Invalid(format!("native (backend=cuda): {e}")))?
                .0,
        ),
        Backend::Sim => None,
    };
    let (ram, vgpu) = match &cuda {
        Some(engine) => {
            let (ram, id) = engine_ram(engine.as_ref(), ram_len)?;
            let v = Vgpu::with_engine(
                cfg,
                engine.clone(),
                ram.clone(),
                vec![id],
                Arc::new(NoIrq),
                None,
            );
            (ram, v)
        }
        None => {
            let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram_len)])
                .map_err(|e| BenchError::NativeRam(e.to_string()))?;
            let v = Vgpu::new(cfg, ram.clone(), Arc::new(NoIrq));
            (ram, v)
        }
    };
    let vgpu = vgpu.map_err(|e| BenchError::Invalid(format!("native vgpu: {e}")))?;
    let p = Native {
        dev: vgpu.device(),
        ram,
        aperture,
        next: DMA_BASE,
        ram_bytes: ram_len as u64,
        t0: Instant::now(),
    };
    let (mut gpu, mut ch, init) = suite_run::open(p, driver)
        .map_err(|e| BenchError::Invalid(format!("native driver init: {e}")))?;
    let init_parts = gpu.init_parts();
    let mut results = Vec::with_capacity(workloads.len());
    for w in workloads {
        let inst = w.instance(size);
        let out = suite_run::run_instance(&mut gpu, &mut ch, &inst, Options::default());
        results.push((w.name.to_string(), out));
    }
    drop(gpu);
    let counters = vgpu.stats().counters;
    drop(vgpu);
    drop(cuda);
    Ok(NativeRun {
        init,
        init_parts,
        results,
        counters,
    })
}
