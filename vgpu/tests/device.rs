//! The virtual GPU driven from the host as a guest would: a copy through VRAM and back with a
//! semaphore and an interrupt, and the validation rules of registers, channels, methods and
//! page tables (docs/hardware.md), each leaving the device usable.

mod common;

use common::*;
use mmio::pci::PciDevice;
use std::sync::atomic::Ordering;
use vgpu::regs::method::*;
use vgpu::regs::*;

/// Sets up VA_BASE → VRAM [0, 2M) and VA_BASE+2M → sysmem [SYS, SYS+2M), channel 0 with its
/// GPFIFO at the start of the sysmem page, and flushes.
fn setup(b: &Bench) {
    b.map_big(0, 1, 0);
    b.map_big(1, 2, SYS);
    b.bind(0, b.va_base + (2 << 20), 16);
    b.write(TLB_FLUSH, 1);
    b.write(INTR_ENABLE, INTR_SEMAPHORE | INTR_FAULT);
}

const SYS_VA_OFF: u64 = 2 << 20;

/// Writes pushbuffer `pb` at sysmem offset `pb_off`, GPFIFO entry `slot` pointing at it, and
/// rings the doorbell with GP_PUT = slot + 1.
fn submit(b: &Bench, slot: u32, pb_off: u64, pb: &[u8]) {
    b.sys_write(SYS + pb_off, pb);
    let entry = (b.va_base + SYS_VA_OFF + pb_off) | ((pb.len() as u64 / 4) << 48);
    b.sys_write(SYS + 8 * u64::from(slot), &entry.to_le_bytes());
    b.write(DOORBELL_BASE, slot + 1);
}

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

#[test]
fn identity_registers() {
    let b = Bench::new();
    assert_eq!(b.read(ID), ID_VALUE);
    assert_eq!(b.read(VERSION), VERSION_VALUE);
    assert_eq!(
        u64::from(b.read(VRAM_SIZE_HI)) << 32 | u64::from(b.read(VRAM_SIZE_LO)),
        VRAM
    );
    assert_eq!(b.read(CHANNELS), 4);
    assert_eq!(b.read(PAGE_SIZES), 3);
    assert_eq!(
        u64::from(b.read(VA_BASE_HI)) << 32 | u64::from(b.read(VA_BASE_LO)),
        b.va_base
    );
    assert_eq!(b.read(0x0fff0), 0xffff_ffff, "unknown register");
    let t1 = b.read(TIMER_LO);
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert!(b.read(TIMER_LO).wrapping_sub(t1) >= 1_000_000);
}

#[test]
fn copy_round_trip_with_semaphore_and_interrupt() {
    let b = Bench::new();
    setup(&b);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    b.sys_write(SYS + 0x10000, &data);
    let sys_va = b.va_base + SYS_VA_OFF;
    let vram_va = b.va_base + 0x1000;
    let sem = sys_va + 0x3000;
    let pb = push(&[
        (
            COPY_SRC_HI,
            &[
                hi(sys_va),
                (sys_va + 0x10000) as u32,
                hi(vram_va),
                vram_va as u32,
                8192,
            ],
        ),
        (COPY_LAUNCH, &[0]),
        (
            COPY_SRC_HI,
            &[
                hi(vram_va),
                vram_va as u32,
                hi(sys_va),
                (sys_va + 0x20000) as u32,
                8192,
            ],
        ),
        (COPY_LAUNCH, &[0]),
        (
            SEM_ADDR_HI,
            &[
                hi(sem),
                sem as u32,
                42,
                SEM_OP_RELEASE | SEM_FLAG_INTERRUPT | SEM_FLAG_TIMESTAMP,
            ],
        ),
    ]);
    submit(&b, 0, 0x1000, &pb);
    b.wait("the semaphore", |b| {
        b.sys_read(SYS + 0x3000, 4) == 42u32.to_le_bytes()
    });
    assert_eq!(
        b.sys_read(SYS + 0x20000, 8192),
        data,
        "data came back through VRAM"
    );
    assert_eq!(
        b.vram_read_u64(0x1000),
        u64::from_le_bytes(data[..8].try_into().unwrap()),
        "and is in VRAM"
    );
    assert_ne!(b.sys_read(SYS + 0x3008, 8), [0; 8], "timestamp written");
    assert_eq!(b.read(DOORBELL_BASE + 4), 1, "GP_GET advanced");
    b.wait("idle", |b| b.read(CHAN_BASE + 4) & 0xf == CHAN_IDLE);
    assert_eq!(b.read(INTR_STATUS) & INTR_SEMAPHORE, INTR_SEMAPHORE);
    assert_eq!(b.read(INTR_CHANNELS), 1);
    assert_eq!(b.irq.0.load(Ordering::SeqCst), 1, "one MSI");
    b.write(INTR_STATUS, INTR_SEMAPHORE);
    b.write(INTR_CHANNELS, 1);
    assert_eq!(b.read(INTR_STATUS), 0);
    assert!(
        !b.irq.1.load(Ordering::SeqCst),
        "INTA stays low while MSI is on"
    );
    let s = b.gpu.stats();
    assert_eq!(
        (
            s.counters.copies,
            s.counters.releases,
            s.counters.shadow_rebuilds
        ),
        (2, 1, 1)
    );
    assert!(s.guard_intact && s.fault.is_none());
}

#[test]
fn without_msi_the_interrupt_is_a_level_on_inta() {
    let b = Bench::new();
    {
        let mut d = b.dev.lock().unwrap();
        let mut cap = [0u8; 1];
        d.config().read(0x34, &mut cap);
        d.config_mut().write(usize::from(cap[0]) + 2, &[0, 0]);
        d.config_written(usize::from(cap[0]), 2);
    }
    b.write(INTR_ENABLE, INTR_FAULT);
    b.write(PRAMIN_BASE, u32::MAX);
    assert!(b.irq.1.load(Ordering::SeqCst), "asserted by the fault");
    b.write(FAULT_CLEAR, 1);
    assert!(!b.irq.1.load(Ordering::SeqCst), "released when cleared");
    assert_eq!(b.irq.0.load(Ordering::SeqCst), 0, "no MSI");
}

#[test]
fn register_values_are_validated() {
    let b = Bench::new();
    b.write(PRAMIN_BASE, (VRAM >> 16) as u32);
    let (st, ch, addr, _) = b.fault();
    assert_eq!(
        (st & 0xff, ch, addr),
        (FaultKind::BadRegister.code().into(), 0xffff, VRAM)
    );
    assert_eq!(b.read(PRAMIN_BASE), 0, "refused value not taken");
    b.write(FAULT_CLEAR, 1);
    assert_eq!(b.read(FAULT_STATUS), 0);
    // Instance block past VRAM; channel beyond the quota; doorbell of an unbound channel.
    b.write(CHAN_BASE, CHAN_INST_VALID | (VRAM >> 12) as u32);
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::BadRegister.code()));
    b.write(FAULT_CLEAR, 1);
    b.write(CHAN_BASE + 8 * 7, CHAN_INST_VALID | 0x500);
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::BadChannel.code()));
    b.write(FAULT_CLEAR, 1);
    b.write(DOORBELL_BASE + 8, 1);
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::BadChannel.code()));
    b.write(FAULT_CLEAR, 1);
    // A runlist naming an unbound channel.
    b.dev
        .lock()
        .unwrap()
        .bar_write(1, RUNLIST, &2u32.to_le_bytes());
    b.write(RUNLIST_BASE, (RUNLIST >> 12) as u32);
    b.write(RUNLIST_SUBMIT, 1);
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::BadRunlist.code()));
    b.write(FAULT_CLEAR, 1);
    // PRAMIN: a window onto VRAM.
    b.write(PRAMIN_BASE, 0x10);
    b.dev
        .lock()
        .unwrap()
        .bar_write(0, 0x1_0008, &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(b.vram_read_u64(0x10_0008), 0x1122_3344_5566_7788);
    assert!(b.gpu.stats().guard_intact);
}

#[test]
fn bad_method_faults_the_channel_and_rebinding_recovers() {
    let b = Bench::new();
    setup(&b);
    let sem = b.va_base + SYS_VA_OFF + 0x3000;
    let mut bad = push(&[(SEM_ADDR_HI, &[hi(sem), sem as u32, 1])]);
    bad.extend_from_slice(&vgpu::pushbuf::incr(0x300, 1).to_le_bytes());
    bad.extend_from_slice(&0u32.to_le_bytes());
    submit(&b, 0, 0x1000, &bad);
    b.wait("the fault", |b| b.read(FAULT_STATUS) != 0);
    let (st, ch, _, info) = b.fault();
    assert_eq!(
        (st & 0xff, ch, info),
        (u32::from(FaultKind::BadMethod.code()), 0, 0x300)
    );
    assert_eq!(b.read(CHAN_BASE + 4) & 0xf, CHAN_FAULTED);
    assert_eq!(b.read(INTR_STATUS) & INTR_FAULT, INTR_FAULT);
    b.write(FAULT_CLEAR, 1);
    // Rebind: the channel runs again.
    b.bind(0, b.va_base + SYS_VA_OFF, 16);
    let good = push(&[(SEM_ADDR_HI, &[hi(sem), sem as u32, 7, SEM_OP_RELEASE])]);
    submit(&b, 0, 0x2000, &good);
    b.wait("the release", |b| {
        b.sys_read(SYS + 0x3000, 4) == 7u32.to_le_bytes()
    });
}

#[test]
fn bad_page_table_entries_are_reported_and_never_mapped() {
    let b = Bench::new();
    setup(&b);
    // PDE 2 points past the partition, PDE 3 past guest RAM.
    b.map_big(2, 1, VRAM);
    b.map_big(3, 2, RAM);
    b.write(TLB_FLUSH, 1);
    let sem = b.va_base + SYS_VA_OFF + 0x3000;
    // Copy from the bad VRAM range: the rebuild reports kind 3, the copy faults UNMAPPED.
    let bad_va = b.va_base + (4 << 20);
    let pb = push(&[
        (
            COPY_SRC_HI,
            &[hi(bad_va), bad_va as u32, hi(sem), sem as u32, 64],
        ),
        (COPY_LAUNCH, &[0]),
    ]);
    submit(&b, 0, 0x1000, &pb);
    b.wait("the fault", |b| b.read(CHAN_BASE + 4) & 0xf == CHAN_FAULTED);
    let (st, _, addr, _) = b.fault();
    assert_eq!(
        (st & 0xff, addr),
        (u32::from(FaultKind::PteVramRange.code()), bad_va)
    );
    assert_eq!(
        b.read(CHAN_BASE + 4) >> 8 & 0xff,
        u32::from(FaultKind::Unmapped.code())
    );
    assert!(b.gpu.stats().counters.faults >= 3);
    assert!(b.gpu.stats().guard_intact);
}

#[test]
fn unmapped_gpfifo_and_bad_ring_positions_fault() {
    let b = Bench::new();
    b.map_big(1, 2, SYS);
    b.bind(0, b.va_base + (8 << 20), 16);
    b.write(TLB_FLUSH, 1);
    b.write(DOORBELL_BASE, 1);
    b.wait("the fault", |b| b.read(FAULT_STATUS) != 0);
    let (st, _, addr, _) = b.fault();
    assert_eq!(
        (st & 0xff, st >> 16 & 0xff, addr),
        (
            u32::from(FaultKind::Unmapped.code()),
            Access::Fetch as u32,
            b.va_base + (8 << 20)
        )
    );
    b.write(FAULT_CLEAR, 1);
    b.bind(0, b.va_base + SYS_VA_OFF, 16);
    b.write(DOORBELL_BASE, 40);
    b.wait("the fault", |b| b.read(FAULT_STATUS) != 0);
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::BadGpfifo.code()));
}

#[test]
fn instance_blocks_are_validated_when_bound() {
    let b = Bench::new();
    b.map_big(1, 2, SYS);
    // A ring size that is not a power of two: refused at the CHAN_INST write.
    b.vram_write_u64(INST, PD | 1);
    b.vram_write_u64(INST + 8, b.va_base + SYS_VA_OFF);
    b.vram_write_u64(INST + 16, 3);
    b.write(CHAN_BASE, CHAN_INST_VALID | (INST >> 12) as u32);
    let (st, ch, addr, _) = b.fault();
    assert_eq!(
        (st & 0xff, ch, addr),
        (u32::from(FaultKind::BadGpfifo.code()), 0, INST)
    );
    assert_eq!(b.read(CHAN_BASE + 4) & 0xf, CHAN_FAULTED);
    // A page directory with a reserved target.
    b.write(FAULT_CLEAR, 1);
    b.vram_write_u64(INST, PD | 3);
    b.vram_write_u64(INST + 16, 16);
    b.write(CHAN_BASE, CHAN_INST_VALID | (INST >> 12) as u32);
    assert_eq!(b.fault().0 & 0xff, u32::from(FaultKind::BadInstance.code()));
    // Fixed: binds cleanly.
    b.write(FAULT_CLEAR, 1);
    b.vram_write_u64(INST, PD | 1);
    b.write(CHAN_BASE, CHAN_INST_VALID | (INST >> 12) as u32);
    assert_eq!(
        (b.read(FAULT_STATUS), b.read(CHAN_BASE + 4) & 0xf),
        (0, CHAN_IDLE)
    );
}

/// Runs one release on channel 0 (slot `slot`) and waits for it.
fn release(b: &Bench, slot: u32, payload: u32) {
    let sem = b.va_base + SYS_VA_OFF + 0x3000;
    let pb = push(&[(SEM_ADDR_HI, &[hi(sem), sem as u32, payload, SEM_OP_RELEASE])]);
    submit(b, slot, 0x1000 + 0x100 * u64::from(slot), &pb);
    b.wait("the release", |b| {
        b.sys_read(SYS + 0x3000, 4) == payload.to_le_bytes()
    });
}

#[test]
fn lazy_shadowing_defers_rebuilds_to_the_next_run_and_naive_rebuilds_at_every_flush() {
    for lazy in [true, false] {
        let b = Bench::with(|c| c.lazy_shadowing = lazy);
        setup(&b);
        release(&b, 0, 1);
        assert_eq!(b.gpu.stats().counters.shadow_rebuilds, 1);
        for _ in 0..3 {
            b.write(TLB_FLUSH, 1);
        }
        if lazy {
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(
                b.gpu.stats().counters.shadow_rebuilds,
                1,
                "flushes only mark the shadow stale"
            );
            release(&b, 1, 2);
            assert_eq!(
                b.gpu.stats().counters.shadow_rebuilds,
                2,
                "one rebuild, at the next run"
            );
        } else {
            b.wait("three eager rebuilds", |b| {
                b.gpu.stats().counters.shadow_rebuilds == 4
            });
            let shadowed = b.gpu.stats().counters.pages_shadowed;
            release(&b, 1, 2);
            let s = b.gpu.stats().counters;
            assert_eq!(s.shadow_rebuilds, 4, "nothing left to do at the run");
            assert!(
                shadowed >= 4 * 512 * 2 / 512,
                "each rebuild maps everything again: {shadowed}"
            );
        }
    }
}

/// Records the aperture mappings the device asks for.
#[derive(Default)]
struct FakeMapper(
    std::sync::Mutex<std::collections::BTreeMap<u32, (u64, u64)>>,
    std::sync::atomic::AtomicU32,
);

impl vgpu::remap::ApertureMapper for FakeMapper {
    unsafe fn map(&self, gpa: u64, _host: *mut u8, len: u64) -> Result<u32, String> {
        let h = self.1.fetch_add(1, Ordering::SeqCst);
        self.0.lock().unwrap().insert(h, (gpa, len));
        Ok(h)
    }
    fn unmap(&self, handle: u32) {
        self.0.lock().unwrap().remove(&handle);
    }
}

impl FakeMapper {
    /// Whether guest VRAM `addr` is mapped (accesses would not trap).
    fn mapped(&self, addr: u64) -> bool {
        let gpa = BAR1 + addr;
        self.0
            .lock()
            .unwrap()
            .values()
            .any(|(g, l)| (*g..g + l).contains(&gpa))
    }
}

#[test]
fn bar_remap_maps_the_aperture_and_retraps_instance_and_table_pages() {
    let fake = std::sync::Arc::new(FakeMapper::default());
    let b = Bench::with_mapper(fake.clone());
    assert!(
        fake.mapped(0) && fake.mapped(INST) && fake.mapped(PD) && fake.mapped(VRAM - 1),
        "whole aperture mapped"
    );
    setup(&b);
    // CHAN_INST made INST an instance block: trapped from that write on.
    assert!(!fake.mapped(INST), "instance block page traps again");
    assert!(
        fake.mapped(INST + 0x1000) && fake.mapped(PD),
        "neighbours stay mapped until they hold tables"
    );
    // The first run rebuilds the shadow from the page directory at PD: its pages trap from then on.
    release(&b, 0, 5);
    assert!(
        !fake.mapped(PD) && !fake.mapped(PD + 0x3000),
        "page-directory pages trap (16 KiB PD)"
    );
    assert!(
        fake.mapped(0x1000) && fake.mapped(PD + 0x4000),
        "data pages stay mapped"
    );
    let s = b.gpu.stats();
    let remap = s.remap.expect("remap stats");
    assert!(remap.trapped_pages >= 5, "{remap:?}");
    // Moving the BAR moves the mappings; dropping the device unmaps everything.
    b.dev.lock().unwrap().bar_moved(1, None);
    assert!(fake.0.lock().unwrap().is_empty());
}

/// The guest re-binds a channel (CHAN_INST) while the worker is in the middle of a turn of the
/// old binding, then submits on the new one: the old turn's end must not move the new
/// binding's GP_GET (it once did, skipping the new binding's first entry — a lost launch whose
/// fence a later release then satisfied).
#[test]
fn rebinding_during_a_turn_keeps_the_new_binding_s_first_entry() {
    let b = Bench::new();
    setup(&b);
    for i in 0..16 {
        b.map_big(2 + i, 1, (16 << 20) + (i << 21));
    }
    b.write(TLB_FLUSH, 1);
    let src = b.va_base + (4 << 20);
    let dst = src + (16 << 20);
    let copy = [hi(src), src as u32, hi(dst), dst as u32, 16 << 20];
    let mut methods: Vec<(u32, &[u32])> = Vec::new();
    for _ in 0..4 {
        methods.push((COPY_SRC_HI, &copy));
        methods.push((COPY_LAUNCH, &[0]));
    }
    submit(&b, 0, 0x1000, &push(&methods));
    b.wait("the long copies to start", |b| {
        b.read(CHAN_BASE + 4) & 0xf == CHAN_RUNNING
    });
    b.bind(0, b.va_base + SYS_VA_OFF, 16);
    let sem = b.va_base + SYS_VA_OFF + 0x3000;
    let pb = push(&[(SEM_ADDR_HI, &[hi(sem), sem as u32, 7, SEM_OP_RELEASE])]);
    submit(&b, 0, 0x2000, &pb);
    b.wait("the new binding's first entry", |b| {
        b.sys_read(SYS + 0x3000, 4) == 7u32.to_le_bytes()
    });
}
