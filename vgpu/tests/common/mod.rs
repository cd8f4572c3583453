//! A host-side test bench for the virtual GPU: the device with guest RAM but no VM, driven
//! through its BARs as a guest driver would, per docs/hardware.md.

#![allow(dead_code)]

pub mod daemon;
pub mod para;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mmio::pci::{MsiMessage, PciDevice};
use vgpu::device::VgpuDevice;
use vgpu::regs::*;
use vgpu::{GpuConfig, IrqSink, Vgpu};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

#[derive(Default)]
pub struct CountingIrq(pub AtomicU64, pub std::sync::atomic::AtomicBool);

impl IrqSink for CountingIrq {
    fn msi(&self, _msg: MsiMessage) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn intx(&self, level: bool) {
        self.1.store(level, Ordering::SeqCst);
    }
}

pub const RAM: u64 = 64 << 20;
pub const VRAM: u64 = 64 << 20;
/// Guest VRAM addresses of the bench's structures.
pub const PD: u64 = 0x40_0000;
pub const INST: u64 = 0x50_0000;
pub const RUNLIST: u64 = 0x50_1000;
/// Where the remap tests place BAR1.
pub const BAR1: u64 = 0x100_0000_0000;
/// Guest RAM (sysmem) addresses.
pub const SYS: u64 = 0x20_0000;

pub struct Bench {
    pub gpu: Vgpu,
    pub dev: Arc<Mutex<VgpuDevice>>,
    pub ram: GuestMemoryMmap,
    pub irq: Arc<CountingIrq>,
    pub va_base: u64,
}

impl Bench {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// A bench whose configuration `tweak` adjusts.
    pub fn with(tweak: impl FnOnce(&mut GpuConfig)) -> Self {
        Self::build(tweak, None)
    }

    /// A bench whose aperture is remapped through `mapper` (BAR1 placed at `BAR1`).
    pub fn with_mapper(mapper: Arc<dyn vgpu::remap::ApertureMapper>) -> Self {
        let b = Self::build(|_| {}, Some(mapper));
        b.dev.lock().unwrap().bar_moved(1, Some(BAR1));
        b
    }

    fn build(
        tweak: impl FnOnce(&mut GpuConfig),
        mapper: Option<Arc<dyn vgpu::remap::ApertureMapper>>,
    ) -> Self {
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
        Self::build_in(tweak, mapper, ram)
    }

    /// A bench whose guest RAM starts as a copy of `ram_bytes` (a restored VM's RAM).
    pub fn with_ram(tweak: impl FnOnce(&mut GpuConfig), ram_bytes: &[u8]) -> Self {
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
        ram.write_slice(ram_bytes, GuestAddress(0)).unwrap();
        Self::build_in(tweak, None, ram)
    }

    fn build_in(
        tweak: impl FnOnce(&mut GpuConfig),
        mapper: Option<Arc<dyn vgpu::remap::ApertureMapper>>,
        ram: GuestMemoryMmap,
    ) -> Self {
        let irq = Arc::new(CountingIrq::default());
        let mut cfg = GpuConfig {
            vram: VRAM,
            channels: 4,
            job_timeout: Duration::from_millis(300),
            ..GpuConfig::default()
        };
        tweak(&mut cfg);
        let va_base = cfg.va_base;
        let gpu = Vgpu::with_mapper(cfg, ram.clone(), irq.clone(), mapper).unwrap();
        let dev = gpu.device();
        {
            // Enable MSI as a driver would: address, data, then the enable bit.
            let mut d = dev.lock().unwrap();
            let mut cap = [0u8; 1];
            d.config().read(0x34, &mut cap);
            let off = usize::from(cap[0]);
            d.config_mut().write(off + 4, &0xfee0_0000u32.to_le_bytes());
            d.config_mut().write(off + 12, &0x41u16.to_le_bytes());
            d.config_mut().write(off + 2, &[1, 0]);
            d.config_written(off, 14);
        }
        Bench {
            gpu,
            dev,
            ram,
            irq,
            va_base,
        }
    }

    pub fn read(&self, off: u32) -> u32 {
        let mut b = [0u8; 4];
        self.dev.lock().unwrap().bar_read(0, u64::from(off), &mut b);
        u32::from_le_bytes(b)
    }

    pub fn write(&self, off: u32, v: u32) {
        self.dev
            .lock()
            .unwrap()
            .bar_write(0, u64::from(off), &v.to_le_bytes());
    }

    pub fn vram_write_u64(&self, addr: u64, v: u64) {
        self.dev
            .lock()
            .unwrap()
            .bar_write(1, addr, &v.to_le_bytes());
    }

    pub fn vram_read_u64(&self, addr: u64) -> u64 {
        let mut b = [0u8; 8];
        self.dev.lock().unwrap().bar_read(1, addr, &mut b);
        u64::from_le_bytes(b)
    }

    pub fn sys_write(&self, gpa: u64, data: &[u8]) {
        self.ram.write_slice(data, GuestAddress(gpa)).unwrap();
    }

    pub fn sys_read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.ram.read_slice(&mut v, GuestAddress(gpa)).unwrap();
        v
    }

    /// PDE i: a 2 MiB page (BIG) at `addr` in VRAM (target 1) or sysmem (target 2).
    pub fn map_big(&self, i: u64, target: u64, addr: u64) {
        self.vram_write_u64(PD + 8 * i, addr | 1 << 2 | target);
    }

    /// Binds channel `ch` with a GPFIFO of `entries` at VA `gpfifo` and puts it on the runlist.
    pub fn bind(&self, ch: u32, gpfifo: u64, entries: u32) {
        let inst = INST + 0x1000 * u64::from(ch);
        self.vram_write_u64(inst, PD | 1);
        self.vram_write_u64(inst + 8, gpfifo);
        self.vram_write_u64(inst + 16, u64::from(entries));
        self.vram_write_u64(inst + 24, 0);
        self.write(CHAN_BASE + 8 * ch, CHAN_INST_VALID | (inst >> 12) as u32);
        self.dev
            .lock()
            .unwrap()
            .bar_write(1, RUNLIST, &ch.to_le_bytes());
        self.write(RUNLIST_BASE, (RUNLIST >> 12) as u32);
        self.write(RUNLIST_SUBMIT, 1);
    }

    pub fn fault(&self) -> (u32, u32, u64, u32) {
        let st = self.read(FAULT_STATUS);
        let addr = u64::from(self.read(FAULT_ADDR_HI)) << 32 | u64::from(self.read(FAULT_ADDR_LO));
        (st, self.read(FAULT_CHANNEL), addr, self.read(FAULT_INFO))
    }

    /// Waits until `f` holds (5 s at most).
    pub fn wait(&self, what: &str, f: impl Fn(&Bench) -> bool) {
        let t = Instant::now();
        while !f(self) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "timed out waiting for {what}; fault {:x?}",
                self.fault()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Encodes methods as INCR headers (one per (addr, data) run).
pub fn push(methods: &[(u32, &[u32])]) -> Vec<u8> {
    let mut words = Vec::new();
    for (addr, data) in methods {
        words.push(vgpu::pushbuf::incr(*addr, data.len() as u32));
        words.extend_from_slice(data);
    }
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
