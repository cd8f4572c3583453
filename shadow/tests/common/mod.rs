//! Shared test fixtures: a small virtual GPU layout, guest memory matching it and encoders for
//! instance blocks, PDEs and PTEs.
#![allow(dead_code)]

use pgpu::VaWindow;
use shadow::{Aperture, GpuLayout, PageSizes, Pdb, RamRegion, VecGuestMem};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
/// Guest VRAM size.
pub const VRAM: u64 = 64 * MIB;
/// VA window base and size (32 PDEs, a 256-byte page directory).
pub const VA: u64 = 0x1_0000_0000;
pub const VA_SIZE: u64 = 64 * MIB;
/// Guest RAM: [0, 16 MiB), then two adjacent regions [32, 35) and [35, 40) MiB.
pub const RAM: [(u64, u64); 3] = [(0, 16 * MIB), (32 * MIB, 3 * MIB), (35 * MIB, 5 * MIB)];
/// Where the tests put the page directory (guest VRAM).
pub const PD: u64 = 0x10_0000;

pub fn layout() -> GpuLayout {
    GpuLayout {
        vram_size: VRAM,
        ram: RAM
            .iter()
            .map(|&(gpa, len)| RamRegion { gpa, len })
            .collect(),
        va: VaWindow {
            base: VA,
            size: VA_SIZE,
        },
        page_sizes: PageSizes {
            small: true,
            big: true,
        },
        sysmem: true,
        max_faults: 64,
    }
}

pub fn mem() -> VecGuestMem {
    let mut m = VecGuestMem::new(VRAM as usize);
    for (gpa, len) in RAM {
        m.add_ram(gpa, len as usize);
    }
    m
}

pub fn pdb() -> Pdb {
    Pdb {
        aperture: Aperture::Vram,
        addr: PD,
    }
}

fn target(a: Aperture) -> u64 {
    a.target_bits()
}

/// A PDE pointing at a page table.
pub fn pde_pt(a: Aperture, addr: u64) -> u64 {
    addr | target(a)
}

/// A BIG PDE mapping a 2 MiB page.
pub fn pde_big(a: Aperture, addr: u64, read_only: bool) -> u64 {
    addr | target(a) | 4 | if read_only { 8 } else { 0 }
}

/// A PTE.
pub fn pte(a: Aperture, addr: u64, read_only: bool) -> u64 {
    addr | target(a) | if read_only { 8 } else { 0 }
}

/// Writes PDE `i` of the page directory at `PD` (guest VRAM).
pub fn set_pde(m: &mut VecGuestMem, i: u64, v: u64) {
    m.write_u64(Aperture::Vram, PD + i * 8, v).unwrap();
}

/// Writes PTE `j` of the page table at `pt` in `a`.
pub fn set_pte(m: &mut VecGuestMem, a: Aperture, pt: u64, j: u64, v: u64) {
    m.write_u64(a, pt + j * 8, v).unwrap();
}

/// VA of PDE `i`, PTE `j`.
pub fn va(i: u64, j: u64) -> u64 {
    VA + i * 2 * MIB + j * 4 * KIB
}

/// The 32 bytes of an instance block.
pub fn instance_bytes(pdb: u64, gpfifo: u64, entries: u32, reserved: u32, ctx: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&pdb.to_le_bytes());
    b[8..16].copy_from_slice(&gpfifo.to_le_bytes());
    b[16..20].copy_from_slice(&entries.to_le_bytes());
    b[20..24].copy_from_slice(&reserved.to_le_bytes());
    b[24..32].copy_from_slice(&ctx.to_le_bytes());
    b
}

/// A valid instance block: PD at `PD` in VRAM, 256-entry GPFIFO at VA, context area after it.
pub fn good_instance() -> [u8; 32] {
    instance_bytes(PD | 1, VA, 256, 0, VA + 64 * KIB)
}
