//! The driver's para-virtual path against a fake device (host test): detection, SET_PD and
//! batched MAP/UNMAP calls instead of table writes and TLB flushes, and how refusals come back.

use gpu_driver::para::{self, BIG};
use gpu_driver::{Config, DmaBuf, Error, Gpu, Platform, TablePlacement, Target, regs};
use std::collections::HashMap;

/// One call the fake saw: op, ARG, entries (va, pte, pages).
type Call = (u32, u64, Vec<(u64, u64, u32)>);

#[derive(Default)]
struct Fake {
    regs: HashMap<u32, u32>,
    writes: Vec<(u32, u32)>,
    vram_writes: usize,
    para: bool,
    args: u64,
    calls: Vec<Call>,
    /// STATUS and INDEX the next MAP_BATCH call returns.
    refuse: Option<(u32, u32)>,
    /// The last call's STATUS, and every ARGS address registered.
    status: u32,
    areas: Vec<u64>,
    clock: u64,
}

impl Fake {
    fn new(para: bool) -> Self {
        let mut f = Fake {
            para,
            ..Fake::default()
        };
        for (r, v) in [
            (regs::ID, regs::ID_VALUE),
            (regs::VERSION, 0x0001_0000),
            (regs::VRAM_SIZE_LO, 256 << 20),
            (regs::CHANNELS, 8),
            (regs::PAGE_SIZES, 3),
            (regs::VA_BASE_HI, 0x10),
            (regs::VA_SIZE_HI, 1),
            (regs::CAPS, if para { 0x1f } else { 0xf }),
            (regs::MAX_PUSH_WORDS, 65536),
        ] {
            f.regs.insert(r, v);
        }
        f
    }

    fn area(&self, off: u64, len: usize) -> &[u8] {
        // SAFETY: `args` is the address of a live 64 KiB DmaBuf this fake allocated (its
        // guest-physical address is its host address); `off + len` stays inside it.
        unsafe { std::slice::from_raw_parts((self.args + off) as *const u8, len) }
    }

    fn u64_at(&self, off: u64) -> u64 {
        u64::from_le_bytes(self.area(off, 8).try_into().unwrap())
    }

    fn set_result(&self, status: u32, index: u32) {
        let p = (self.args + 0x10) as *mut u32;
        // SAFETY: inside the live argument area (see `area`), 4-byte aligned.
        unsafe {
            p.write_volatile(status);
            p.add(1).write_volatile(index);
        }
    }
}

impl Platform for Fake {
    fn reg_read(&mut self, offset: u32) -> u32 {
        self.regs.get(&offset).copied().unwrap_or(0)
    }
    fn reg_write(&mut self, offset: u32, value: u32) {
        self.writes.push((offset, value));
    }
    fn vram_read64(&mut self, _addr: u64) -> u64 {
        0
    }
    fn vram_write64(&mut self, _addr: u64, _value: u64) {
        self.vram_writes += 1;
    }
    fn vram_aperture(&self) -> u64 {
        256 << 20
    }
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        // SAFETY: fresh memory, leaked for the test's life, used only through the DmaBuf.
        unsafe { DmaBuf::from_raw(p, p as u64, len) }
    }
    fn wait_for_interrupt(&mut self, _ns: u64) {}
    fn now_ns(&mut self) -> u64 {
        self.clock += 1_000_000;
        self.clock
    }
    fn para_read(&mut self, offset: u32) -> u32 {
        match (self.para, offset) {
            (true, para::PARA_ID) => para::PARA_ID_VALUE,
            (true, para::MAX_BATCH_REG) => 2048,
            (true, para::STATUS) => self.status,
            _ => u32::MAX,
        }
    }
    fn para_write(&mut self, offset: u32, value: u32) {
        match offset {
            para::ARGS_LO => self.args = (self.args & !0xffff_ffff) | u64::from(value),
            para::ARGS_HI => {
                self.args = (self.args & 0xffff_ffff) | u64::from(value) << 32;
                self.areas.push(self.args);
            }
            para::CALL => {
                if self.areas.last() != self.areas.first() {
                    // A foreign area (attack test): refuse without reading it.
                    self.calls.push((value, 0, Vec::new()));
                    self.status = 1;
                    return;
                }
                let count = if value == para::OP_SET_PD {
                    0
                } else {
                    self.u64_at(8) as u32
                };
                let entries = (0..u64::from(count))
                    .map(|i| {
                        let o = 0x40 + 24 * i;
                        (
                            self.u64_at(o),
                            self.u64_at(o + 8),
                            self.u64_at(o + 16) as u32,
                        )
                    })
                    .collect();
                self.calls.push((value, self.u64_at(0), entries));
                let (status, index) = match self.refuse.take() {
                    Some(r) if value == para::OP_MAP_BATCH => r,
                    other => {
                        self.refuse = other;
                        (para::ST_OK, count)
                    }
                };
                self.set_result(status, index);
                self.status = status;
            }
            _ => {}
        }
    }
}

#[test]
fn init_in_para_mode_uses_hypercalls_not_tables() {
    let gpu = Gpu::new(Fake::new(true), Config::default()).unwrap();
    assert!(gpu.is_para());
    let mut gpu = gpu;
    let f = gpu.platform();
    assert_eq!(
        f.vram_writes, 0,
        "no table (or anything) written through BAR1"
    );
    assert!(
        !f.writes.iter().any(|w| w.0 == regs::TLB_FLUSH),
        "no TLB flush"
    );
    assert_eq!(f.calls.len(), 3, "SET_PD, then one batch per pool");
    let (op, pdb, _) = &f.calls[0];
    assert_eq!(*op, para::OP_SET_PD);
    assert_eq!(pdb & 3, 2, "the directory is a name in system memory");
    // The 8 MiB system-memory pool and the VRAM pool: one BIG entry each.
    assert_eq!(f.calls[1].0, para::OP_MAP_BATCH);
    assert_eq!(f.calls[1].2.len(), 1);
    let (_, pte, pages) = f.calls[1].2[0];
    assert_eq!((pte & 7, pages), (2 | BIG, 4));
    let (_, pte, pages) = f.calls[2].2[0];
    assert_eq!((pte & 7, pages), (1 | BIG, 64));
    // Map and unmap more: one call each; the driver's translation agrees.
    let va = gpu.va_alloc(0x3000, 0x1000).unwrap();
    gpu.map(va, 0x3000, Target::Sysmem, 0x7000, true).unwrap();
    assert_eq!(
        gpu.translate(va + 0x1004),
        Some((Target::Sysmem, 0x8004, true))
    );
    gpu.unmap(va, 0x3000).unwrap();
    let f = gpu.platform();
    assert_eq!(f.calls.len(), 5);
    assert_eq!(f.calls[3].2, [(va, 0x7000 | 2 | 8, 3)]);
    assert_eq!(
        (f.calls[4].0, f.calls[4].2.clone()),
        (para::OP_UNMAP_BATCH, vec![(va, 0, 3)])
    );
}

#[test]
fn refusals_come_back_as_errors_or_fault_records() {
    let mut gpu = Gpu::new(Fake::new(true), Config::default()).unwrap();
    let va = gpu.va_alloc(0x1000, 0x1000).unwrap();
    // ENTRY_FAULT with a fault record: map returns the fault.
    gpu.platform().refuse = Some((para::ST_ENTRY_FAULT, 0));
    gpu.platform().regs.insert(regs::FAULT_STATUS, 1 << 31 | 3);
    assert!(matches!(
        gpu.map(va, 0x1000, Target::Vram, 1 << 40, false),
        Err(Error::Fault(_))
    ));
    assert_eq!(
        gpu.translate(va),
        None,
        "the record does not keep a refused mapping"
    );
    gpu.platform().regs.insert(regs::FAULT_STATUS, 0);
    // A raw entry leaves the verdict in the fault record (the caller drains it).
    gpu.platform().refuse = Some((para::ST_ENTRY_FAULT, 0));
    assert_eq!(gpu.set_pte_raw(va, 3), Ok(()));
    // A call refused as a whole is an error.
    gpu.platform().refuse = Some((para::ST_LIMIT, 0));
    assert_eq!(
        gpu.map(va, 0x1000, Target::Vram, 0, false),
        Err(Error::ParaRefused {
            status: 3,
            index: 0
        })
    );
    // PDEs: BIG ones and invalid ones only.
    assert!(gpu.set_pde_raw(va, 0x5000 | 1).is_err());
    let before = gpu.platform().calls.len();
    gpu.set_pde_raw(va, 0).unwrap();
    let c = &gpu.platform().calls[before];
    assert_eq!(c.2, [(va - va % (2 << 20), BIG, 1)]);
}

#[test]
fn without_the_para_bar_or_with_para_off_tables_are_written() {
    for (device, want) in [(false, true), (true, false)] {
        let cfg = Config {
            para: want,
            tables: TablePlacement::Sysmem,
            ..Config::default()
        };
        let mut gpu = Gpu::new(Fake::new(device), cfg).unwrap();
        assert!(!gpu.is_para());
        let f = gpu.platform();
        assert!(f.calls.is_empty());
        assert!(f.writes.iter().any(|w| w.0 == regs::TLB_FLUSH));
    }
}

#[test]
fn raw_calls_restore_the_drivers_area_and_directory() {
    let mut gpu = Gpu::new(Fake::new(true), Config::default()).unwrap();
    let own = gpu.platform().args;
    let pdb = gpu.platform().calls[0].1;
    let n = gpu.platform().calls.len();
    assert_eq!(
        gpu.para_raw(Some(0xfee0_0000), para::OP_SET_PD, 0, 0),
        Ok(Some(1))
    );
    let f = gpu.platform();
    assert_eq!(
        f.areas[1..],
        [0xfee0_0000, own],
        "the foreign area, then the driver's again"
    );
    assert_eq!(f.calls.len(), n + 2);
    assert_eq!((f.calls[n + 1].0, f.calls[n + 1].1), (para::OP_SET_PD, pdb));
    assert_eq!(gpu.para_raw(None, para::OP_MAP_BATCH, 0, 0), Ok(Some(0)));
    let full = Gpu::new(Fake::new(false), Config::default());
    assert_eq!(full.unwrap().para_raw(None, 1, 0, 0), Ok(None));
}
