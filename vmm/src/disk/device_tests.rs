//! The transport as a driver programs it: feature negotiation, queue set-up, a request by
//! notify with its interrupt, hostile register writes, and a save/restore in the middle.

use std::io::Write as _;

use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::persist::Persist;

const RING: u64 = 0x1_0000;

fn setup() -> (GuestMemoryMmap, BlockDevice, EventFd) {
    let m = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
    let (d, irq) = device_on(&m);
    (m, d, irq)
}

/// A device over a fresh 16-sector disk, byte i = i % 253, on guest memory `m`.
fn device_on(m: &GuestMemoryMmap) -> (BlockDevice, EventFd) {
    let p = std::env::temp_dir().join(format!(
        "vgpu-blkdev-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    let bytes: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8).collect();
    f.write_all(&bytes).unwrap();
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let dev = BlockDevice::new(
        Arc::new(f),
        8192,
        true,
        "d".into(),
        m.clone(),
        irq.try_clone().unwrap(),
    );
    (dev, irq)
}

fn rd(d: &mut BlockDevice, off: u32) -> u32 {
    let mut b = [0u8; 4];
    d.read(u64::from(off), &mut b);
    u32::from_le_bytes(b)
}

fn wr(d: &mut BlockDevice, off: u32, v: u32) {
    d.write(u64::from(off), &v.to_le_bytes());
}

/// Negotiates VERSION_1 and sets queue 0 up at the mock queue's rings.
fn driver_init(d: &mut BlockDevice, q: &MockSplitQueue<'_, GuestMemoryMmap>) {
    assert_eq!(rd(d, reg::VIRTIO_MMIO_MAGIC_VALUE), MAGIC);
    assert_eq!(rd(d, reg::VIRTIO_MMIO_VERSION), 2);
    assert_eq!(rd(d, reg::VIRTIO_MMIO_DEVICE_ID), VIRTIO_ID_BLOCK);
    wr(
        d,
        reg::VIRTIO_MMIO_STATUS,
        VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
    );
    wr(d, reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(rd(d, reg::VIRTIO_MMIO_DEVICE_FEATURES), 1, "VERSION_1");
    wr(d, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    wr(d, reg::VIRTIO_MMIO_DRIVER_FEATURES, 1);
    wr(d, reg::VIRTIO_MMIO_STATUS, 0xb);
    assert_ne!(
        rd(d, reg::VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK,
        0
    );
    wr(d, reg::VIRTIO_MMIO_QUEUE_SEL, 0);
    assert_eq!(rd(d, reg::VIRTIO_MMIO_QUEUE_NUM_MAX), u32::from(QUEUE_SIZE));
    wr(d, reg::VIRTIO_MMIO_QUEUE_NUM, 16);
    let (desc, avail, used) = (q.desc_table_addr().0, q.avail_addr().0, q.used_addr().0);
    wr(d, reg::VIRTIO_MMIO_QUEUE_DESC_LOW, desc as u32);
    wr(d, reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, (desc >> 32) as u32);
    wr(d, reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW, avail as u32);
    wr(d, reg::VIRTIO_MMIO_QUEUE_USED_LOW, used as u32);
    wr(d, reg::VIRTIO_MMIO_QUEUE_READY, 1);
    assert_eq!(rd(d, reg::VIRTIO_MMIO_QUEUE_READY), 1);
    wr(d, reg::VIRTIO_MMIO_STATUS, 0xf);
}

/// Puts a one-sector read of `sector` at descriptor `at` (header, data, status).
fn add_read(m: &GuestMemoryMmap, q: &MockSplitQueue<'_, GuestMemoryMmap>, at: u16, sector: u64) {
    let base = 0x20_0000 + u64::from(at) * 0x1000;
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    m.write_slice(&h, GuestAddress(base)).unwrap();
    let w = VRING_DESC_F_WRITE as u16;
    let descs = [
        SplitDescriptor::new(base, 16, 1, at + 1),
        SplitDescriptor::new(base + 0x100, 512, w | 1, at + 2),
        SplitDescriptor::new(base + 0x800, 1, w, 0),
    ];
    let raw: Vec<RawDescriptor> = descs.iter().map(|d| RawDescriptor::from(*d)).collect();
    q.add_desc_chains(&raw, at).unwrap();
}

#[test]
fn a_read_by_notify_completes_and_interrupts() {
    let (m, mut d, irq) = setup();
    let q = MockSplitQueue::create(&m, GuestAddress(RING), 16);
    driver_init(&mut d, &q);
    // Capacity in the configuration space: 16 sectors; RO offered.
    assert_eq!(rd(&mut d, reg::VIRTIO_MMIO_CONFIG), 16);
    wr(&mut d, reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
    assert_ne!(
        rd(&mut d, reg::VIRTIO_MMIO_DEVICE_FEATURES) & (1 << VIRTIO_BLK_F_RO),
        0
    );
    add_read(&m, &q, 0, 2);
    wr(&mut d, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    assert_eq!(irq.read().unwrap(), 1);
    assert_eq!(rd(&mut d, reg::VIRTIO_MMIO_INTERRUPT_STATUS), 1);
    wr(&mut d, reg::VIRTIO_MMIO_INTERRUPT_ACK, 1);
    assert_eq!(rd(&mut d, reg::VIRTIO_MMIO_INTERRUPT_STATUS), 0);
    assert_eq!(q.used().idx().load(), 1);
    let s: u8 = m.read_obj(GuestAddress(0x20_0800)).unwrap();
    assert_eq!(s, VIRTIO_BLK_S_OK as u8);
    let b: u8 = m.read_obj(GuestAddress(0x20_0100)).unwrap();
    assert_eq!(b, (1024 % 253) as u8);
    assert_eq!(d.completed, 1);
}

#[test]
fn hostile_register_use_is_contained() {
    let (_m, mut d, irq) = setup();
    // Notify before the driver is ready: nothing happens.
    wr(&mut d, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    assert!(irq.read().is_err());
    // Features beyond the offer, or without VERSION_1: FEATURES_OK is refused.
    wr(&mut d, reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    wr(&mut d, reg::VIRTIO_MMIO_DRIVER_FEATURES, 1 << 28);
    wr(&mut d, reg::VIRTIO_MMIO_STATUS, 0xb);
    assert_eq!(
        rd(&mut d, reg::VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK,
        0
    );
    // A queue outside guest RAM never becomes ready.
    wr(&mut d, reg::VIRTIO_MMIO_STATUS, 0);
    wr(&mut d, reg::VIRTIO_MMIO_QUEUE_DESC_HIGH, 0x10);
    wr(&mut d, reg::VIRTIO_MMIO_QUEUE_READY, 1);
    assert_eq!(rd(&mut d, reg::VIRTIO_MMIO_QUEUE_READY), 0);
    // Odd widths and offsets, config writes, out-of-range registers: ignored, no panic.
    d.write(0x71, &[1, 2]);
    d.write(0x100, &[9; 4]);
    d.write(u64::MAX - 3, &[0; 4]);
    let mut b = [0u8; 8];
    d.read(u64::MAX - 3, &mut b);
    d.read(0x102, &mut b);
    // A ready queue whose avail index runs more than a queue ahead: the device stops.
    let (m, mut d, irq) = setup();
    let q = MockSplitQueue::create(&m, GuestAddress(RING), 16);
    driver_init(&mut d, &q);
    q.avail().idx().store(1000);
    wr(&mut d, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    assert_ne!(
        rd(&mut d, reg::VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET,
        0
    );
    assert_eq!(irq.read().unwrap(), 1);
    // Only a reset brings it back.
    wr(&mut d, reg::VIRTIO_MMIO_STATUS, 0);
    assert_eq!(rd(&mut d, reg::VIRTIO_MMIO_STATUS), 0);
}

#[test]
fn state_round_trip_continues_the_queue() {
    let (m, mut d, _irq) = setup();
    let q = MockSplitQueue::create(&m, GuestAddress(RING), 16);
    driver_init(&mut d, &q);
    add_read(&m, &q, 0, 1);
    wr(&mut d, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    // Through the device contract: state, section bytes, state.
    let saved = crate::persist::encode::<BlockDevice>(&Persist::save(&d));
    let state = |b: &[u8]| crate::persist::decode::<BlockDevice>(1, b).unwrap();
    // A new device over the same disk takes the state and serves the next request.
    let (mut d2, irq2) = device_on(&m);
    Persist::restore(&mut d2, &state(&saved)).unwrap();
    assert_eq!(
        rd(&mut d2, reg::VIRTIO_MMIO_STATUS),
        rd(&mut d, reg::VIRTIO_MMIO_STATUS)
    );
    add_read(&m, &q, 3, 4);
    wr(&mut d2, reg::VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    assert_eq!(irq2.read().unwrap(), 1);
    assert_eq!(q.used().idx().load(), 2);
    assert_eq!(
        crate::persist::encode::<BlockDevice>(&Persist::save(&d2)),
        {
            let mut s = saved.clone();
            // next_avail and next_used moved by one.
            let at = 4 + 8 + 20 + 2;
            s[at..at + 2].copy_from_slice(&2u16.to_le_bytes());
            s[at + 2..at + 4].copy_from_slice(&2u16.to_le_bytes());
            s
        }
    );
    // Rings outside this guest's RAM are refused at restore.
    let small = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
    let (mut d3, _) = device_on(&small);
    assert!(Persist::restore(&mut d3, &state(&saved)).is_err());
}
