//! Driver init, channel creation and submission against a fake register file (host test): the
//! values it programs, and no panic whatever the identity registers say.

use gpu_driver::{Config, DmaBuf, Error, Gpu, Platform, PushBuf, TablePlacement, regs};
use std::collections::HashMap;

#[derive(Default)]
struct Fake {
    regs: HashMap<u32, u32>,
    writes: Vec<(u32, u32)>,
    vram: HashMap<u64, u64>,
    clock: u64,
}

impl Fake {
    fn sane() -> Self {
        let mut f = Fake::default();
        for (r, v) in [
            (regs::ID, regs::ID_VALUE),
            (regs::VERSION, 0x0001_0000),
            (regs::VRAM_SIZE_LO, 256 << 20),
            (regs::CHANNELS, 8),
            (regs::PAGE_SIZES, 3),
            (regs::VA_BASE_HI, 0x10),
            (regs::VA_SIZE_HI, 1),
            (regs::CAPS, 0xf),
            (regs::MAX_PUSH_WORDS, 65536),
        ] {
            f.regs.insert(r, v);
        }
        f
    }
}

impl Platform for Fake {
    fn reg_read(&mut self, offset: u32) -> u32 {
        self.regs.get(&offset).copied().unwrap_or(0)
    }
    fn reg_write(&mut self, offset: u32, value: u32) {
        self.writes.push((offset, value));
    }
    fn vram_read64(&mut self, addr: u64) -> u64 {
        self.vram.get(&addr).copied().unwrap_or(0)
    }
    fn vram_write64(&mut self, addr: u64, value: u64) {
        self.vram.insert(addr, value);
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
}

#[test]
fn refuses_a_wrong_device_without_panicking() {
    let mut f = Fake::sane();
    f.regs.insert(regs::ID, 0xffff_ffff);
    assert!(matches!(
        Gpu::new(f, Config::default()),
        Err(Error::BadId(_))
    ));
    let mut f = Fake::sane();
    f.regs.insert(regs::VERSION, 0x0002_0000);
    assert!(matches!(
        Gpu::new(f, Config::default()),
        Err(Error::BadVersion(_))
    ));
    for (r, v) in [
        (regs::CHANNELS, 0),
        (regs::VA_SIZE_HI, 0),
        (regs::VA_BASE_HI, u32::MAX),
        (regs::VA_BASE_LO, 0x1234),
        (regs::MAX_PUSH_WORDS, 3),
        (regs::CAPS, 0),
        (regs::PAGE_SIZES, 0),
    ] {
        let mut f = Fake::sane();
        f.regs.insert(r, v);
        assert!(
            Gpu::new(f, Config::default()).is_err(),
            "reg {r:#x} = {v:#x}"
        );
    }
    // All-ones everywhere (a device that vanished) is refused too.
    let mut f = Fake::sane();
    for r in [
        regs::VRAM_SIZE_LO,
        regs::VRAM_SIZE_HI,
        regs::VA_SIZE_LO,
        regs::VA_SIZE_HI,
    ] {
        f.regs.insert(r, u32::MAX);
    }
    let _ = Gpu::new(f, Config::default());
}

#[test]
fn init_channel_and_submit_program_the_spec_values() {
    let cfg = Config {
        tables: TablePlacement::Sysmem,
        wait_timeout_ns: 50_000_000,
        ..Config::default()
    };
    let mut gpu = Gpu::new(Fake::sane(), cfg).unwrap();
    assert!(gpu.platform().writes.contains(&(regs::TLB_FLUSH, 1)));
    let mut ch = gpu.create_channel(0).unwrap();
    assert!(matches!(gpu.create_channel(0), Err(Error::BadChannel(0))));
    assert!(matches!(gpu.create_channel(8), Err(Error::BadChannel(8))));
    let inst = ch.instance();
    let w = gpu.platform().writes.clone();
    assert!(w.contains(&(
        regs::chan_inst(0),
        regs::CHAN_INST_VALID | (inst >> 12) as u32
    )));
    assert!(w.contains(&(regs::RUNLIST_SUBMIT, 1)));
    // Instance block: PDB targets system memory (tables placed there), ring VA, entries.
    let vram = gpu.platform().vram.clone();
    assert_eq!(vram[&inst] & 3, 2);
    assert_eq!(vram[&(inst + 8)], ch.ring_va());
    assert_eq!(vram[&(inst + 16)], 512);
    let mut pb = PushBuf::new();
    pb.copy(0x10_0000_0000, 0x10_0000_1000, 64);
    let fence = ch.submit(&mut gpu, &mut pb).unwrap();
    assert_eq!(fence.seq, 1);
    assert_eq!(gpu.platform().writes.last(), Some(&(regs::gp_put(0), 1)));
    // Nothing completes the fence: the wait ends with a timeout, not a hang or panic.
    assert!(matches!(
        ch.wait(&mut gpu, fence),
        Err(Error::Timeout { .. })
    ));
    // A channel whose status says FAULTED ends the wait with the fault record.
    for (r, v) in [
        (regs::chan_status(0), 4 | 11 << 8),
        (regs::FAULT_STATUS, 0x8002_000b),
        (regs::FAULT_ADDR_LO, 0x5000),
        (regs::FAULT_INFO, 7),
    ] {
        gpu.platform().regs.insert(r, v);
    }
    match ch.wait(&mut gpu, fence) {
        Err(Error::Fault(f)) => {
            assert_eq!(f.kind, gpu_driver::FaultKind::KernelFault);
            assert_eq!((f.addr, f.info, f.channel), (0x5000, 7, Some(0)));
        }
        other => panic!("{other:?}"),
    }
}
