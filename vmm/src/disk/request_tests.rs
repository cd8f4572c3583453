//! Request parsing against well-formed and hostile descriptor chains (rust-vmm's mock queue
//! writes the rings into a real guest memory).

use std::io::Write as _;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;

const MEM: usize = 8 << 20;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x20_0000;
const STATUS: u64 = 0x7f_f000;
const DISK_SECTORS: u64 = 64;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap()
}

/// A disk file of DISK_SECTORS sectors, byte i = i % 251.
fn disk_file() -> File {
    let mut f = tempfile_in_tmp();
    let bytes: Vec<u8> = (0..DISK_SECTORS * SECTOR)
        .map(|i| (i % 251) as u8)
        .collect();
    f.write_all(&bytes).unwrap();
    f
}

fn tempfile_in_tmp() -> File {
    let p = std::env::temp_dir().join(format!(
        "vgpu-blk-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    f
}

fn header(m: &GuestMemoryMmap, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    m.write_slice(&h, GuestAddress(HDR)).unwrap();
}

fn desc(addr: u64, len: u32, write: bool) -> RawDescriptor {
    let flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
}

/// Runs one chain of `descs` (linked in order) against `file`.
fn run(m: &GuestMemoryMmap, file: &File, read_only: bool, descs: &[RawDescriptor]) -> Done {
    m.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(m, 16);
    let chain = q.build_desc_chain(descs).unwrap();
    let disk = Backend {
        file,
        sectors: DISK_SECTORS,
        read_only,
        serial: "vgpu-disk0",
    };
    handle(chain, m, &disk, &mut Vec::new())
}

fn status(m: &GuestMemoryMmap) -> u8 {
    m.read_obj(GuestAddress(STATUS)).unwrap()
}

#[test]
fn read_copies_the_sectors_and_reports_the_length() {
    let (m, f) = (mem(), disk_file());
    header(&m, VIRTIO_BLK_T_IN, 3);
    // Data split over two descriptors, as a guest's scatter list would be.
    let d = run(
        &m,
        &f,
        true,
        &[
            desc(HDR, 16, false),
            desc(DATA, 512, true),
            desc(DATA + 512, 1024, true),
            desc(STATUS, 1, true),
        ],
    );
    assert_eq!(
        d,
        Done {
            used_len: 1537,
            status: VIRTIO_BLK_S_OK as u8
        }
    );
    assert_eq!(status(&m), VIRTIO_BLK_S_OK as u8);
    let mut got = vec![0u8; 1536];
    m.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    let want: Vec<u8> = (3 * SECTOR..6 * SECTOR).map(|i| (i % 251) as u8).collect();
    assert_eq!(got, want);
}

#[test]
fn out_of_range_partial_and_oversized_requests_are_io_errors() {
    let (m, f) = (mem(), disk_file());
    let ioerr = VIRTIO_BLK_S_IOERR as u8;
    for (sector, len) in [
        (DISK_SECTORS - 1, 1024),            // runs past the end
        (DISK_SECTORS, 512),                 // starts at the end
        (u64::MAX, 512),                     // sector + count overflows
        (u64::MAX / SECTOR + 1, 512),        // sector * 512 overflows
        (0, 100),                            // not whole sectors
        (0, MAX_REQUEST_BYTES as u32 + 512), // more than advertised
    ] {
        header(&m, VIRTIO_BLK_T_IN, sector);
        m.write_slice(&[0x55; 16], GuestAddress(DATA)).unwrap();
        let d = run(
            &m,
            &f,
            true,
            &[
                desc(HDR, 16, false),
                desc(DATA, len, true),
                desc(STATUS, 1, true),
            ],
        );
        assert_eq!(
            d,
            Done {
                used_len: 1,
                status: ioerr
            },
            "sector {sector} len {len}"
        );
        assert_eq!(status(&m), ioerr);
        let mut first = [0u8; 16];
        m.read_slice(&mut first, GuestAddress(DATA)).unwrap();
        assert_eq!(first, [0x55; 16], "no data written on error");
    }
}

#[test]
fn writes_reach_a_writable_disk_and_fail_on_a_read_only_one() {
    let (m, f) = (mem(), disk_file());
    m.write_slice(&[0xab; 512], GuestAddress(DATA)).unwrap();
    header(&m, VIRTIO_BLK_T_OUT, 5);
    let chain = [
        desc(HDR, 16, false),
        desc(DATA, 512, false),
        desc(STATUS, 1, true),
    ];
    let d = run(&m, &f, true, &chain);
    assert_eq!(d.status, VIRTIO_BLK_S_IOERR as u8);
    let mut s = [0u8; 512];
    f.read_exact_at(&mut s, 5 * SECTOR).unwrap();
    assert_ne!(s, [0xab; 512], "the read-only disk is unchanged");
    let d = run(&m, &f, false, &chain);
    assert_eq!(
        d,
        Done {
            used_len: 1,
            status: VIRTIO_BLK_S_OK as u8
        }
    );
    f.read_exact_at(&mut s, 5 * SECTOR).unwrap();
    assert_eq!(s, [0xab; 512]);
}

#[test]
fn hostile_chains_never_touch_the_disk() {
    let (m, f) = (mem(), disk_file());
    header(&m, VIRTIO_BLK_T_IN, 0);
    // Data buffer outside guest RAM: nothing can be mapped, so not even the status.
    let d = run(
        &m,
        &f,
        true,
        &[
            desc(HDR, 16, false),
            desc(MEM as u64 - 256, 512, true),
            desc(STATUS, 1, true),
        ],
    );
    assert_eq!(d.used_len, 0);
    // A length that wraps the address space.
    let d = run(
        &m,
        &f,
        true,
        &[
            desc(HDR, 16, false),
            desc(u64::MAX - 10, 512, true),
            desc(STATUS, 1, true),
        ],
    );
    assert_eq!(d.used_len, 0);
    // No writable descriptor at all: no status byte to write.
    let d = run(
        &m,
        &f,
        true,
        &[desc(HDR, 16, false), desc(DATA, 512, false)],
    );
    assert_eq!(
        d,
        Done {
            used_len: 0,
            status: VIRTIO_BLK_S_IOERR as u8
        }
    );
    // A header shorter than 16 bytes.
    let d = run(&m, &f, true, &[desc(HDR, 8, false), desc(STATUS, 1, true)]);
    assert_eq!(
        d,
        Done {
            used_len: 1,
            status: VIRTIO_BLK_S_IOERR as u8
        }
    );
    assert_eq!(status(&m), VIRTIO_BLK_S_IOERR as u8);
    // No header: only the status byte.
    let d = run(&m, &f, true, &[desc(STATUS, 1, true)]);
    assert_eq!(d.status, VIRTIO_BLK_S_IOERR as u8);
    // Status outside RAM.
    let d = run(
        &m,
        &f,
        true,
        &[desc(HDR, 16, false), desc(MEM as u64 + 4096, 1, true)],
    );
    assert_eq!(d.used_len, 0);
}

#[test]
fn a_looping_chain_is_bounded() {
    let m = mem();
    let f = disk_file();
    header(&m, VIRTIO_BLK_T_IN, 0);
    // Descriptor 0 links to itself: the chain would never end.
    let q = MockSplitQueue::new(&m, 256);
    let d0 = SplitDescriptor::new(
        DATA,
        512,
        (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16,
        0,
    );
    q.add_desc_chains(&[RawDescriptor::from(d0)], 0).unwrap();
    let mut queue: Queue = q.create_queue().unwrap();
    let chain = queue.iter(&m).unwrap().next().unwrap();
    let disk = Backend {
        file: &f,
        sectors: DISK_SECTORS,
        read_only: true,
        serial: "x",
    };
    let d = handle(chain, &m, &disk, &mut Vec::new());
    assert_eq!(
        d,
        Done {
            used_len: 0,
            status: VIRTIO_BLK_S_IOERR as u8
        }
    );
}

#[test]
fn get_id_and_unknown_types() {
    let (m, f) = (mem(), disk_file());
    header(&m, VIRTIO_BLK_T_GET_ID, 0);
    let d = run(
        &m,
        &f,
        true,
        &[
            desc(HDR, 16, false),
            desc(DATA, 20, true),
            desc(STATUS, 1, true),
        ],
    );
    assert_eq!(
        d,
        Done {
            used_len: 21,
            status: VIRTIO_BLK_S_OK as u8
        }
    );
    let mut id = [0u8; 20];
    m.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id[..10], b"vgpu-disk0");
    assert_eq!(id[10..], [0; 10]);
    header(&m, 0x1234_5678, 0);
    let d = run(&m, &f, true, &[desc(HDR, 16, false), desc(STATUS, 1, true)]);
    assert_eq!(
        d,
        Done {
            used_len: 1,
            status: VIRTIO_BLK_S_UNSUPP as u8
        }
    );
}
