//! gpu-driver's [`Platform`] in Linux user space: BAR0 (registers), BAR1 (VRAM aperture) and
//! the para-virtual BAR3 mapped from sysfs, GPU-visible memory from a [`DmaPool`], polling
//! instead of interrupts, and the vDSO clock (the TSC: no system call per reading).

use std::time::Instant;

use gpu_driver::{DmaBuf, Platform};

use crate::ToolError;
use crate::dma::DmaPool;
use crate::pci::{self, Function, Mapping};
use crate::share::DeviceLock;

/// PCI identity of the virtual GPU.
pub const VENDOR_ID: u16 = 0x1234;
pub const DEVICE_ID: u16 = 0x9a01;
/// The para-virtual BAR.
const PARA_BAR: usize = 3;

/// The virtual GPU as the driver sees it from a Linux process.
#[derive(Debug)]
pub struct LinuxGpu {
    pub function: Function,
    bar0: Mapping,
    bar1: Mapping,
    bar3: Option<Mapping>,
    dma: Option<DmaPool>,
    /// With several drivers on the device (CUDA processes): the lock of its shared state.
    lock: Option<DeviceLock>,
    epoch: Instant,
}

impl LinuxGpu {
    /// Finds the GPU, enables it and maps its BARs. With `dma`, also maps the GPU-visible
    /// memory pool (needed by the driver, not by register reads).
    pub fn open(dma: bool) -> Result<Self, ToolError> {
        let function = pci::find(VENDOR_ID, DEVICE_ID)?;
        function.enable()?;
        let bar0 = function.map_bar(0)?;
        let bar1 = function.map_bar(1)?;
        let bar3 = if function.bar_size(PARA_BAR) > 0 {
            Some(function.map_bar(PARA_BAR)?)
        } else {
            None
        };
        let dma = if dma { Some(DmaPool::open()?) } else { None };
        Ok(Self {
            function,
            bar0,
            bar1,
            bar3,
            dma,
            lock: None,
            epoch: Instant::now(),
        })
    }

    /// Gives the driver this pool of GPU-visible memory (a process's own share of the
    /// `memmap=` range) instead of the whole range.
    pub fn set_dma(&mut self, pool: DmaPool) {
        self.dma = Some(pool);
    }

    /// Makes [`Platform::lock_device`] take `lock` (several drivers on one device).
    pub fn set_lock(&mut self, lock: DeviceLock) {
        self.lock = Some(lock);
    }

    /// Whether the device has the para-virtual BAR.
    pub fn has_para_bar(&self) -> bool {
        self.bar3.is_some()
    }

    /// The DMA pool: (bytes used, size).
    pub fn dma_usage(&self) -> Option<(usize, usize)> {
        self.dma.as_ref().map(|d| (d.used(), d.len()))
    }
}

impl Platform for LinuxGpu {
    fn reg_read(&mut self, offset: u32) -> u32 {
        self.bar0.read32(u64::from(offset & !3))
    }

    fn reg_write(&mut self, offset: u32, value: u32) {
        self.bar0.write32(u64::from(offset & !3), value);
    }

    fn vram_read64(&mut self, addr: u64) -> u64 {
        self.bar1.read64(addr & !7)
    }

    fn vram_write64(&mut self, addr: u64, value: u64) {
        self.bar1.write64(addr & !7, value);
    }

    fn vram_aperture(&self) -> u64 {
        self.bar1.len() as u64
    }

    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        self.dma.as_mut()?.alloc(len, align)
    }

    fn wait_for_interrupt(&mut self, _ns: u64) {
        std::hint::spin_loop();
    }

    fn now_ns(&mut self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn para_read(&mut self, offset: u32) -> u32 {
        self.bar3
            .as_mut()
            .map_or(u32::MAX, |b| b.read32(u64::from(offset & !3)))
    }

    fn para_write(&mut self, offset: u32, value: u32) {
        if let Some(b) = &mut self.bar3 {
            b.write32(u64::from(offset & !3), value);
        }
    }

    fn lock_device(&mut self) {
        if let Some(l) = &mut self.lock {
            l.lock();
        }
    }

    fn unlock_device(&mut self) {
        if let Some(l) = &mut self.lock {
            l.unlock();
        }
    }
}
