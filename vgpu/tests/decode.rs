//! The virtual GPU on a real PCI root and MMIO bus while the guest turns memory decode off and
//! on (issue 25: a hostile guest toggling decode once had its job hang until the time limit).
//! Accesses go through the bus as a vCPU's exits would, so a register write while decode is
//! off really reaches no device.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use mmio::Bus;
use mmio::BusDevice;
use mmio::pci::{PciRoot, PciWindows};
use vgpu::regs::method::*;
use vgpu::regs::*;
use vgpu_hw::bell;

const SYS_VA_OFF: u64 = 2 << 20;
/// The doorbell page (guest RAM outside the bench's GPU-visible sysmem).
const PAGE: u64 = 0x1000;
const CMD_MEM: u32 = 1 << 1;

/// The device at 00:01.0 of a PCI root over its own MMIO bus.
struct OnBus {
    root: Mutex<PciRoot>,
    mmio: Arc<Bus>,
    bar0: u64,
}

impl OnBus {
    fn new(b: &Bench) -> Self {
        let mmio = Arc::new(Bus::new("mmio"));
        let pio = Arc::new(Bus::new("pio"));
        let mut root = PciRoot::new(
            mmio.clone(),
            pio,
            PciWindows {
                mmio32: 0xc000_0000..0xfeb0_0000,
                mmio64: 0x100_0000_0000..0x200_0000_0000,
                pio: 0xc000..0x1_0000,
            },
        );
        root.add_device("vgpu", b.dev.clone()).unwrap();
        let bar0 = mmio.base_of("00:01.0 vgpu BAR0").expect("BAR0 decodes");
        OnBus {
            root: Mutex::new(root),
            mmio,
            bar0,
        }
    }

    /// A guest config write (mechanism #1: address port, then data port).
    fn config_write(&self, reg: u32, v: u32) {
        let mut r = self.root.lock().unwrap();
        r.write(0, &(0x8000_0000u32 | 1 << 11 | reg).to_le_bytes());
        r.write(4, &v.to_le_bytes());
    }

    fn config_read(&self, reg: u32) -> u32 {
        let mut r = self.root.lock().unwrap();
        r.write(0, &(0x8000_0000u32 | 1 << 11 | reg).to_le_bytes());
        let mut d = [0u8; 4];
        r.read(4, &mut d);
        u32::from_le_bytes(d)
    }

    /// A guest register write through the bus; whether a device took it.
    fn reg_write(&self, off: u32, v: u32) -> bool {
        self.mmio
            .write(self.bar0 + u64::from(off), &v.to_le_bytes())
    }

    fn reg_read(&self, off: u32) -> u32 {
        let mut d = [0u8; 4];
        self.mmio.read(self.bar0 + u64::from(off), &mut d);
        u32::from_le_bytes(d)
    }
}

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

fn page_u32(b: &Bench, off: u64) -> u32 {
    u32::from_le_bytes(b.sys_read(PAGE + off, 4).try_into().unwrap())
}

/// Polls `f` for at most `limit`; whether it came true.
fn within(limit: Duration, f: impl Fn() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

/// Waits until the worker sleeps with WAKE set (it went to sleep and stayed there 50 ms).
fn asleep(b: &Bench) {
    let sleeps = || b.gpu.stats().counters.bell.sleeps;
    assert!(
        within(Duration::from_secs(2), || sleeps() > 0),
        "the idle device goes to sleep"
    );
    loop {
        let n = sleeps();
        std::thread::sleep(Duration::from_millis(50));
        if sleeps() == n {
            break;
        }
    }
    assert_eq!(page_u32(b, bell::WAKE), 1, "asleep with WAKE set");
}

/// Channel 0 bound, its GPFIFO at the start of sysmem, the doorbell page in use, through the
/// bus (decode on).
fn setup(b: &Bench, bus: &OnBus) {
    b.map_big(0, 1, 0);
    b.map_big(1, 2, SYS);
    b.bind(0, b.va_base + SYS_VA_OFF, 16);
    assert!(bus.reg_write(TLB_FLUSH, 1));
    assert!(bus.reg_write(BELL_PAGE_HI, 0));
    assert!(bus.reg_write(BELL_PAGE_LO, PAGE as u32 | BELL_ENABLE));
    assert_eq!(bus.reg_read(BELL_PAGE_LO), PAGE as u32 | BELL_ENABLE);
}

/// Writes GPFIFO entry `slot` for a pushbuffer releasing `payload` at sysmem `SYS + 0x3000`.
fn queue_release(b: &Bench, slot: u32, payload: u32) {
    let sem = b.va_base + SYS_VA_OFF + 0x3000;
    let pb = push(&[(SEM_ADDR_HI, &[hi(sem), sem as u32, payload, SEM_OP_RELEASE])]);
    let pb_off = 0x1000 + 0x100 * u64::from(slot);
    b.sys_write(SYS + pb_off, &pb);
    let entry = (b.va_base + SYS_VA_OFF + pb_off) | ((pb.len() as u64 / 4) << 48);
    b.sys_write(SYS + 8 * u64::from(slot), &entry.to_le_bytes());
}

fn released(b: &Bench) -> u32 {
    u32::from_le_bytes(b.sys_read(SYS + 0x3000, 4).try_into().unwrap())
}

/// Exitless submission while another vCPU (or process) of the guest has memory decode off: the
/// guest stores PUT[0] in its doorbell page, sees WAKE (the device sleeps) and writes GP_PUT[0]
/// — which reaches no device, BAR0 does not decode. The doorbell page still says PUT[0]
/// changed: once decode is back, the device must look at it and run the work, not sleep on
/// until some other doorbell (the job hung until the guest's time limit).
#[test]
fn a_doorbell_rung_while_decode_is_off_runs_when_decode_comes_back() {
    let b = Bench::with(|c| c.spin = Duration::ZERO);
    let bus = OnBus::new(&b);
    setup(&b, &bus);
    asleep(&b);
    queue_release(&b, 0, 7);
    let cmd = bus.config_read(0x04);
    assert_ne!(cmd & CMD_MEM, 0);
    bus.config_write(0x04, cmd & !CMD_MEM);
    assert_eq!(bus.reg_read(ID), 0xffff_ffff, "BAR0 silent with decode off");
    // The guest's doorbell: PUT[0] in the page, then (WAKE set) the trapped register.
    b.sys_write(PAGE + bell::put(0), &1u32.to_le_bytes());
    assert_eq!(page_u32(&b, bell::WAKE), 1);
    assert!(
        !bus.reg_write(DOORBELL_BASE, 1),
        "the GP_PUT write reaches no device while decode is off"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(released(&b), 0, "nothing ran while decode was off");
    bus.config_write(0x04, cmd);
    assert_eq!(bus.reg_read(ID), ID_VALUE, "BAR0 decodes again");
    assert!(
        within(Duration::from_secs(2), || released(&b) == 7),
        "the doorbell in the page ran once decode came back (GP_GET {}, status {:#x}, doorbells {})",
        bus.reg_read(DOORBELL_BASE + 4),
        bus.reg_read(CHAN_BASE + 4),
        b.gpu.stats().counters.doorbells
    );
    assert_eq!(b.gpu.stats().counters.bell.polled, 1, "taken from the page");
}

/// Long copies run while the guest turns decode off and on many times, with the aperture
/// remapped (the mapping follows each toggle): the job and the next one finish, the registers
/// answer after each toggle, and the aperture is mapped again at the end.
#[test]
fn jobs_finish_while_decode_is_toggled_and_the_aperture_follows() {
    #[derive(Default)]
    struct Mapper(
        Mutex<std::collections::BTreeMap<u32, (u64, u64)>>,
        Mutex<u32>,
    );
    impl vgpu::remap::ApertureMapper for Mapper {
        unsafe fn map(&self, gpa: u64, _host: *mut u8, len: u64) -> Result<u32, String> {
            let mut n = self.1.lock().unwrap();
            *n += 1;
            self.0.lock().unwrap().insert(*n, (gpa, len));
            Ok(*n)
        }
        fn unmap(&self, handle: u32) {
            assert!(self.0.lock().unwrap().remove(&handle).is_some());
        }
    }
    let m = Arc::new(Mapper::default());
    let b = Bench::with_mapper(m.clone());
    let bus = OnBus::new(&b);
    let bar1 = bus.mmio.base_of("00:01.0 vgpu BAR1").expect("BAR1 decodes");
    setup(&b, &bus);
    for i in 0..8 {
        b.map_big(2 + i, 1, (16 << 20) + (i << 21));
    }
    assert!(bus.reg_write(TLB_FLUSH, 1));
    let src = b.va_base + (4 << 20);
    let dst = src + (8 << 20);
    let copy = [hi(src), src as u32, hi(dst), dst as u32, 8 << 20];
    let sem = b.va_base + SYS_VA_OFF + 0x3000;
    let mut methods: Vec<(u32, &[u32])> = Vec::new();
    for _ in 0..8 {
        methods.push((COPY_SRC_HI, &copy));
        methods.push((COPY_LAUNCH, &[0]));
    }
    let rel = [hi(sem), sem as u32, 9, SEM_OP_RELEASE];
    methods.push((SEM_ADDR_HI, &rel));
    let pb = push(&methods);
    b.sys_write(SYS + 0x1000, &pb);
    let entry = (b.va_base + SYS_VA_OFF + 0x1000) | ((pb.len() as u64 / 4) << 48);
    b.sys_write(SYS, &entry.to_le_bytes());
    b.sys_write(PAGE + bell::put(0), &1u32.to_le_bytes());
    if page_u32(&b, bell::WAKE) != 0 {
        assert!(bus.reg_write(DOORBELL_BASE, 1));
    }
    let cmd = bus.config_read(0x04);
    let mut toggles = 0;
    while released(&b) != 9 && toggles < 2000 {
        bus.config_write(0x04, cmd & !CMD_MEM);
        assert_eq!(bus.reg_read(ID), 0xffff_ffff);
        assert!(m.0.lock().unwrap().is_empty(), "aperture unmapped");
        bus.config_write(0x04, cmd);
        assert_eq!(bus.reg_read(ID), ID_VALUE);
        toggles += 1;
    }
    assert!(
        within(Duration::from_secs(5), || released(&b) == 9),
        "the copies finished (fault {:x?})",
        b.fault()
    );
    assert!(toggles > 0, "decode was toggled while the job ran");
    // The next job, rung with decode on, runs too; the aperture is mapped at BAR1 again.
    queue_release(&b, 1, 10);
    b.sys_write(PAGE + bell::put(0), &2u32.to_le_bytes());
    if page_u32(&b, bell::WAKE) != 0 {
        assert!(bus.reg_write(DOORBELL_BASE, 2));
    }
    assert!(within(Duration::from_secs(2), || released(&b) == 10));
    let maps = m.0.lock().unwrap();
    assert!(!maps.is_empty() && maps.values().all(|(g, _)| *g >= bar1));
}
