//! Two drivers sharing one (fake) device, as two CUDA processes of a guest do (`Gpu::attach`):
//! only the first does the device-wide set-up; each allocates VRAM only in its own range and
//! creates only its own channels; the runlist each submits keeps the other's channels; a fault
//! record of one driver's channel is left for that driver; a dead driver's channel is taken
//! back.

use gpu_driver::{Attach, Config, DmaBuf, Error, Gpu, Platform, PushBuf, regs};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Default)]
struct Dev {
    regs: HashMap<u32, u32>,
    /// (driver, offset, value) of every register write.
    writes: Vec<(usize, u32, u32)>,
    vram: HashMap<u64, u64>,
    locks: i32,
}

/// One driver's platform: a handle on the shared device.
struct Handle {
    dev: Rc<RefCell<Dev>>,
    who: usize,
    clock: u64,
}

fn device() -> Rc<RefCell<Dev>> {
    let mut d = Dev::default();
    for (r, v) in [
        (regs::ID, regs::ID_VALUE),
        (regs::VERSION, 0x0001_0000),
        (regs::VRAM_SIZE_LO, 256 << 20),
        (regs::CHANNELS, 8),
        (regs::PAGE_SIZES, 3),
        (regs::VA_BASE_HI, 0x10),
        (regs::VA_SIZE_HI, 1),
        (regs::CAPS, 0xf | regs::CAP_BELL),
        (regs::MAX_PUSH_WORDS, 65536),
    ] {
        d.regs.insert(r, v);
    }
    Rc::new(RefCell::new(d))
}

impl Platform for Handle {
    fn reg_read(&mut self, offset: u32) -> u32 {
        self.dev.borrow().regs.get(&offset).copied().unwrap_or(0)
    }
    fn reg_write(&mut self, offset: u32, value: u32) {
        let mut d = self.dev.borrow_mut();
        d.writes.push((self.who, offset, value));
        // The registers the drivers read back behave as the device's do.
        if offset == regs::BELL_PAGE_LO || offset == regs::FAULT_CLEAR {
            if offset == regs::FAULT_CLEAR {
                d.regs.insert(regs::FAULT_STATUS, 0);
            } else {
                d.regs.insert(offset, value);
            }
        }
    }
    fn vram_read64(&mut self, addr: u64) -> u64 {
        self.dev.borrow().vram.get(&addr).copied().unwrap_or(0)
    }
    fn vram_write64(&mut self, addr: u64, value: u64) {
        self.dev.borrow_mut().vram.insert(addr, value);
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
    fn lock_device(&mut self) {
        self.dev.borrow_mut().locks += 1;
    }
    fn unlock_device(&mut self) {
        self.dev.borrow_mut().locks -= 1;
    }
}

fn bell_page() -> DmaBuf {
    Handle {
        dev: device(),
        who: 9,
        clock: 0,
    }
    .dma_alloc(4096, 4096)
    .unwrap()
}

fn attach(dev: &Rc<RefCell<Dev>>, who: usize, first: bool, bell: DmaBuf) -> Gpu<Handle> {
    let h = Handle {
        dev: dev.clone(),
        who,
        clock: 0,
    };
    let mib = 1u64 << 20;
    let a = Attach {
        first,
        channels: 1 << who,
        vram_base: 2 * mib + who as u64 * 64 * mib,
        vram_len: 64 * mib,
        runlist_vram: 0,
        bell: Some(bell),
    };
    let cfg = Config {
        vram_pool_bytes: 32 * mib,
        wait_timeout_ns: 50_000_000,
        ..Config::default()
    };
    Gpu::attach(h, cfg, a).unwrap()
}

fn runlist(dev: &Rc<RefCell<Dev>>) -> Vec<u32> {
    let d = dev.borrow();
    let n = d
        .writes
        .iter()
        .rev()
        .find(|w| w.1 == regs::RUNLIST_SUBMIT)
        .map_or(0, |w| w.2);
    let w = d.vram.get(&0).copied().unwrap_or(0);
    let mut v = vec![w as u32, (w >> 32) as u32];
    v.truncate(n as usize);
    v.sort_unstable();
    v
}

#[test]
fn two_drivers_share_a_device_without_touching_each_other() {
    let dev = device();
    let bell = bell_page();
    let bell_gpa = bell.gpa();
    // SAFETY: the same page again (the fake's guest-physical address is its host address),
    // as a second process maps the shared doorbell page.
    let bell2 = unsafe { DmaBuf::from_raw(bell.as_ptr(), bell.gpa(), bell.len()) }.unwrap();
    let mut a = attach(&dev, 0, true, bell);
    let a_writes: Vec<u32> = dev.borrow().writes.iter().map(|w| w.1).collect();
    assert!(a_writes.contains(&regs::FAULT_CLEAR));
    assert!(a_writes.contains(&regs::BELL_PAGE_LO));
    assert!(a.exitless(), "the first driver enabled the doorbell page");
    let mut b = attach(&dev, 1, false, bell2);
    let b_writes: Vec<u32> = dev
        .borrow()
        .writes
        .iter()
        .filter(|w| w.0 == 1)
        .map(|w| w.1)
        .collect();
    for r in [regs::FAULT_CLEAR, regs::INTR_ENABLE, regs::BELL_PAGE_LO] {
        assert!(!b_writes.contains(&r), "a later driver leaves {r:#x} alone");
    }
    assert!(b.exitless(), "the later driver uses the enabled page");
    assert_eq!(dev.borrow().regs[&regs::BELL_PAGE_LO] & !1, bell_gpa as u32);
    // Channels: only one's own.
    assert!(matches!(b.create_channel(0), Err(Error::BadChannel(0))));
    let ca = a.create_channel(0).unwrap();
    assert_eq!(runlist(&dev), [0]);
    b.set_peers(&[0, 1, 99]);
    let mut cb = b.create_channel(1).unwrap();
    assert_eq!(runlist(&dev), [0, 1], "b keeps a's channel in the runlist");
    assert_eq!(dev.borrow().locks, 0, "every device lock released");
    // VRAM: inside each driver's range (instance blocks and pool buffers).
    let mib = 1u64 << 20;
    let (ra, rb) = (2 * mib..66 * mib, 66 * mib..130 * mib);
    assert!(ra.contains(&ca.instance()) && rb.contains(&cb.instance()));
    for _ in 0..4 {
        let x = a.vram_alloc(mib).unwrap();
        let y = b.vram_alloc(mib).unwrap();
        assert!(ra.contains(&x.vram) && ra.contains(&(x.vram + x.len - 1)));
        assert!(rb.contains(&y.vram) && rb.contains(&(y.vram + y.len - 1)));
    }
    assert!(
        b.vram_alloc(64 * mib).is_err(),
        "no more than its own range"
    );
    // A fault record of a's channel stays for a.
    for (r, v) in [
        (regs::FAULT_STATUS, 0x8002_000b),
        (regs::FAULT_CHANNEL, 0),
        (regs::chan_status(0), 4 | 11 << 8),
    ] {
        dev.borrow_mut().regs.insert(r, v);
    }
    assert_eq!(b.take_fault(), None);
    assert_eq!(dev.borrow().regs[&regs::FAULT_STATUS], 0x8002_000b);
    // b's own work goes on (its wait times out here: nothing completes it in the fake).
    let mut pb = PushBuf::new();
    pb.copy(0x10_0000_0000, 0x10_0000_1000, 64);
    let f = cb.submit(&mut b, &mut pb).unwrap();
    assert!(matches!(cb.wait(&mut b, f), Err(Error::Timeout { .. })));
    let fa = a.take_fault().expect("a gets its own record");
    assert_eq!(fa.channel, Some(0));
    // a dies: b takes its channel back.
    dev.borrow_mut()
        .regs
        .insert(regs::FAULT_STATUS, 0x8002_000b);
    assert!(matches!(
        b.release_peer_channel(1),
        Err(Error::BadChannel(1))
    ));
    b.release_peer_channel(0).unwrap();
    assert!(dev.borrow().writes.contains(&(1, regs::chan_inst(0), 0)));
    assert_eq!(
        dev.borrow().regs[&regs::FAULT_STATUS],
        0,
        "dead one's record cleared"
    );
    b.runlist_submit().unwrap();
    assert_eq!(runlist(&dev), [1]);
    assert_eq!(ca.id(), 0);
}

#[test]
fn attach_refuses_a_vram_range_outside_the_aperture() {
    let dev = device();
    let h = Handle {
        dev,
        who: 0,
        clock: 0,
    };
    let a = Attach {
        first: true,
        channels: 1,
        vram_base: 250 << 20,
        vram_len: 64 << 20,
        runlist_vram: 0,
        bell: None,
    };
    assert!(matches!(
        Gpu::attach(h, Config::default(), a),
        Err(Error::OutOfRange(_))
    ));
}
