//! Para-virtual helpers shared by the para tests (vgpu/tests/para.rs, para_snapshot.rs): a
//! bench in `mode=para` with its argument area registered, hypercalls, a standard setup and a
//! copy through the mappings it makes.

use mmio::pci::PciDevice;
use vgpu::config::Mode;
use vgpu::para::*;
use vgpu::regs::method::*;
use vgpu::regs::*;

use super::*;
/// The argument area (guest RAM).
pub const ARGS: u64 = 0x100_0000;
pub const BIG: u64 = 1 << 2;
pub const RO: u64 = 1 << 3;

pub fn para_bench() -> Bench {
    let b = Bench::with(|c| c.mode = Mode::Para);
    b.para_write(ARGS_LO, ARGS as u32);
    b.para_write(ARGS_HI, 0);
    b
}

pub trait ParaBench {
    fn para_read(&self, off: u32) -> u32;
    fn para_write(&self, off: u32, v: u32);
    /// Runs `op` with `arg` and `entries` (va, pte, pages); returns (status, index, kind, addr).
    fn call(&self, op: u32, arg: u64, entries: &[(u64, u64, u32)]) -> (u32, u32, u32, u64);
}

impl ParaBench for Bench {
    fn para_read(&self, off: u32) -> u32 {
        let mut b = [0u8; 4];
        self.dev.lock().unwrap().bar_read(3, u64::from(off), &mut b);
        u32::from_le_bytes(b)
    }

    fn para_write(&self, off: u32, v: u32) {
        self.dev
            .lock()
            .unwrap()
            .bar_write(3, u64::from(off), &v.to_le_bytes());
    }

    fn call(&self, op: u32, arg: u64, entries: &[(u64, u64, u32)]) -> (u32, u32, u32, u64) {
        self.sys_write(ARGS, &arg.to_le_bytes());
        self.sys_write(ARGS + 8, &(entries.len() as u64).to_le_bytes());
        let mut bytes = Vec::new();
        for (va, pte, pages) in entries {
            bytes.extend_from_slice(&va.to_le_bytes());
            bytes.extend_from_slice(&pte.to_le_bytes());
            bytes.extend_from_slice(&u64::from(*pages).to_le_bytes());
        }
        self.sys_write(ARGS + 0x40, &bytes);
        self.sys_write(ARGS + 0x10, &[0xee; 24]);
        self.para_write(CALL, op);
        let r = self.sys_read(ARGS + 0x10, 24);
        let u = |o: usize| u32::from_le_bytes([r[o], r[o + 1], r[o + 2], r[o + 3]]);
        let addr = u64::from(u(16)) | u64::from(u(20)) << 32;
        let st = self.para_read(STATUS);
        assert_eq!(st & 0xff, u(0), "STATUS register agrees with the area");
        (u(0), u(4), u(8), addr)
    }
}

/// SET_PD on the bench's PD; VA_BASE → VRAM [0, 2M) (BIG), VA_BASE + 2M → sysmem SYS (4 KiB
/// pages), channel 0 bound with its GPFIFO at the start of the sysmem range.
pub fn setup(b: &Bench) {
    assert_eq!(b.call(OP_SET_PD, PD | 1, &[]).0, ST_OK);
    let entries = [
        (b.va_base, BIG | 1, 1),
        (b.va_base + (2 << 20), SYS | 2, 512),
    ];
    assert_eq!(b.call(OP_MAP_BATCH, 0, &entries), (ST_OK, 2, 0, 0));
    b.bind(0, b.va_base + (2 << 20), 16);
}

pub fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

/// Copies 64 bytes from `src` to `dst` with a release of `payload` after it; returns whether
/// the release arrived (the channel did not fault).
pub fn copy(b: &Bench, slot: u32, src: u64, dst: u64, payload: u32) -> bool {
    submit_copy(b, slot, src, dst, payload);
    copied(b, payload)
}

/// Submits the copy of `copy` (GPFIFO entry `slot`) without waiting for it.
pub fn submit_copy(b: &Bench, slot: u32, src: u64, dst: u64, payload: u32) {
    let sem = b.va_base + (2 << 20) + 0x3000;
    let pb = push(&[
        (COPY_SRC_HI, &[hi(src), src as u32, hi(dst), dst as u32, 64]),
        (COPY_LAUNCH, &[0]),
        (SEM_ADDR_HI, &[hi(sem), sem as u32, payload, SEM_OP_RELEASE]),
    ]);
    let off = 0x1000 + 0x100 * u64::from(slot);
    b.sys_write(SYS + off, &pb);
    let entry = (b.va_base + (2 << 20) + off) | ((pb.len() as u64 / 4) << 48);
    b.sys_write(SYS + 8 * u64::from(slot), &entry.to_le_bytes());
    b.write(DOORBELL_BASE, slot + 1);
}

/// Waits for the release of `payload` (true) or a channel fault (false).
pub fn copied(b: &Bench, payload: u32) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(5) {
        if b.sys_read(SYS + 0x3000, 4) == payload.to_le_bytes() {
            return true;
        }
        if b.read(CHAN_BASE + 4) & 0xf == CHAN_FAULTED {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("neither release nor fault");
}
