//! The bare-metal platform for gpu-driver: BARs through the VMM's identity map, GPU-visible
//! memory from the identity-mapped heap (address = guest-physical address), `hlt` on the MSI
//! (local APIC vector) with the APIC timer as backstop, and the TSC as clock.

use alloc::format;
use alloc::string::String;
use gpu_driver::{Config, DmaBuf, Gpu, Platform, TablePlacement};
use guest_rt::io::{mmio_read32, mmio_write32};
use guest_rt::pci::{self, Bar};
use guest_rt::{apic, time};

/// PCI identity of the virtual GPU.
pub const VENDOR_ID: u16 = 0x1234;
pub const DEVICE_ID: u16 = 0x9a01;
/// Size of BAR0 (registers and PRAMIN window).
const BAR0_SIZE: u64 = 0x2_0000;
/// Size of the para-virtual BAR3.
const PARA_BAR_SIZE: u64 = 0x1000;
/// The VMM identity-maps the start of the 64-bit PCI window (and 0–4 GiB).
const MAPPED_64: (u64, u64) = (
    guest_rt::abi::PCI_MMIO64_START,
    guest_rt::abi::PCI_MMIO64_START + guest_rt::abi::PCI_MMIO64_MAPPED,
);

/// The machine as gpu-driver sees it.
#[derive(Debug)]
pub struct BareMetal {
    bar0: u64,
    bar1: u64,
    bar1_size: u64,
    /// The para-virtual BAR3 (`--gpu mode=para`), if present and identity-mapped.
    bar3: Option<u64>,
    irq: bool,
}

fn mapped(addr: u64, size: u64) -> bool {
    let Some(end) = addr.checked_add(size) else {
        return false;
    };
    end <= 0x1_0000_0000 || (addr >= MAPPED_64.0 && end <= MAPPED_64.1)
}

impl BareMetal {
    /// Finds the GPU on bus 0, enables memory decode and bus mastering, and (with `irq`) the
    /// local APIC and the GPU's MSI.
    pub fn find(irq: bool) -> Result<Self, String> {
        let f = pci::find(VENDOR_ID, DEVICE_ID)
            .ok_or_else(|| String::from("virtual GPU 1234:9a01 not found (run with --gpu)"))?;
        let (
            Some(Bar::Mem {
                addr: bar0,
                size: s0,
                ..
            }),
            Some(Bar::Mem {
                addr: bar1,
                size: s1,
                ..
            }),
        ) = (f.bars[0], f.bars[1])
        else {
            return Err(format!("unexpected BARs {:?}", f.bars));
        };
        if s0 < BAR0_SIZE || !mapped(bar0, BAR0_SIZE) || !mapped(bar1, s1) {
            return Err(format!(
                "BARs outside the identity map: BAR0 {bar0:#x}+{s0:#x} BAR1 {bar1:#x}+{s1:#x}"
            ));
        }
        let bar3 = match f.bars[3] {
            Some(Bar::Mem { addr, size, .. }) if size >= PARA_BAR_SIZE && mapped(addr, size) => {
                Some(addr)
            }
            _ => None,
        };
        pci::command_set(f.dev, f.func, 0x6);
        let irq = irq && {
            apic::enable();
            pci::enable_msi(
                f.dev,
                f.func,
                apic::MSI_ADDRESS,
                u16::from(apic::DEVICE_VECTOR),
            )
        };
        Ok(Self {
            bar0,
            bar1,
            bar1_size: s1,
            bar3,
            irq,
        })
    }

    /// Guest-physical address of BAR1 (for messages).
    pub fn bar1(&self) -> u64 {
        self.bar1
    }
}

impl Platform for BareMetal {
    fn reg_read(&mut self, offset: u32) -> u32 {
        if u64::from(offset) + 4 > BAR0_SIZE {
            return u32::MAX;
        }
        // SAFETY: inside BAR0, which `find` checked is identity-mapped MMIO.
        unsafe { mmio_read32(self.bar0 + u64::from(offset & !3)) }
    }

    fn reg_write(&mut self, offset: u32, value: u32) {
        if u64::from(offset) + 4 <= BAR0_SIZE {
            // SAFETY: as for `reg_read`.
            unsafe { mmio_write32(self.bar0 + u64::from(offset & !3), value) }
        }
    }

    fn vram_read64(&mut self, addr: u64) -> u64 {
        if addr.checked_add(8).is_none_or(|e| e > self.bar1_size) {
            return u64::MAX;
        }
        // SAFETY: inside BAR1 (checked), identity-mapped MMIO; 8-byte aligned by contract
        // (misaligned addresses are rounded down).
        unsafe { core::ptr::read_volatile((self.bar1 + (addr & !7)) as *const u64) }
    }

    fn vram_write64(&mut self, addr: u64, value: u64) {
        if addr.checked_add(8).is_some_and(|e| e <= self.bar1_size) {
            // SAFETY: as for `vram_read64`.
            unsafe { core::ptr::write_volatile((self.bar1 + (addr & !7)) as *mut u64, value) }
        }
    }

    fn vram_aperture(&self) -> u64 {
        self.bar1_size
    }

    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        let layout = core::alloc::Layout::from_size_align(len.max(1), align.max(8)).ok()?;
        // SAFETY: a non-zero-size layout.
        let ptr = unsafe { alloc::alloc::alloc_zeroed(layout) };
        // SAFETY: fresh heap memory, never freed, used only through the DmaBuf; the heap is
        // identity-mapped RAM, so the guest-physical address is the pointer.
        unsafe { DmaBuf::from_raw(ptr, ptr as u64, len) }
    }

    fn wait_for_interrupt(&mut self, ns: u64) {
        if self.irq {
            apic::wait(ns);
        } else {
            core::hint::spin_loop();
        }
    }

    fn has_interrupts(&self) -> bool {
        self.irq
    }

    fn para_read(&mut self, offset: u32) -> u32 {
        match self.bar3 {
            // SAFETY: inside BAR3 (checked), which `find` checked is identity-mapped MMIO.
            Some(b) if u64::from(offset) + 4 <= PARA_BAR_SIZE => unsafe {
                mmio_read32(b + u64::from(offset & !3))
            },
            _ => u32::MAX,
        }
    }

    fn para_write(&mut self, offset: u32, value: u32) {
        if let Some(b) = self.bar3
            && u64::from(offset) + 4 <= PARA_BAR_SIZE
        {
            // SAFETY: as for `para_read`.
            unsafe { mmio_write32(b + u64::from(offset & !3), value) }
        }
    }

    fn now_ns(&mut self) -> u64 {
        let t = time::rdtsc();
        match time::ticks_to_ns(t) {
            0 => t / 3,
            ns => ns,
        }
    }
}

/// Driver settings from the command line: `tables=vram|sysmem`, `wait=poll|irq`, `mode=full`,
/// `para_batch=1` (naive para-virtualization: one hypercall per page), `sys_mib=N`, `timeout_s=N`,
/// `vpool_mib=N` (the driver's VRAM pool; default half the VRAM),
/// `doorbell=mmio` (trapped doorbells even where the device offers the doorbell page), `warm=0`
/// (no first touch of the system-memory pool at init).
pub fn config_from_args() -> Config {
    let mut cfg = Config::default();
    if guest_rt::arg("tables") == Some("sysmem") {
        cfg.tables = TablePlacement::Sysmem;
    }
    cfg.use_interrupts = guest_rt::arg("wait") == Some("irq");
    // `mode=full` keeps the table-writing path even where the device offers para-virtualization.
    cfg.para = guest_rt::arg("mode") != Some("full");
    cfg.para_per_page = guest_rt::arg("para_batch") == Some("1");
    // `doorbell=mmio` keeps trapped doorbells where the device offers the doorbell page.
    cfg.exitless = guest_rt::arg("doorbell") != Some("mmio");
    // `warm=0`: leave the system-memory pool cold (first touch paid by the workloads).
    cfg.warm_pool = guest_rt::arg("warm") != Some("0");
    if let Some(m) = guest_rt::arg("sys_mib").and_then(|v| v.parse::<u64>().ok()) {
        cfg.sys_pool_bytes = m.clamp(2, 2048) << 20;
    }
    if let Some(m) = guest_rt::arg("vpool_mib").and_then(|v| v.parse::<u64>().ok()) {
        cfg.vram_pool_bytes = m.clamp(2, 1 << 20) << 20;
    }
    if let Some(s) = guest_rt::arg("timeout_s").and_then(|v| v.parse::<u64>().ok()) {
        cfg.wait_timeout_ns = s.clamp(1, 3600) * 1_000_000_000;
    }
    cfg
}

/// Finds the GPU and initialises the driver.
pub fn open(cfg: Config) -> Result<Gpu<BareMetal>, String> {
    let p = BareMetal::find(cfg.use_interrupts)?;
    Gpu::new(p, cfg).map_err(|e| format!("driver init: {e}"))
}
