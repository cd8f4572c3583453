//! Page directory and page table entries (docs/hardware.md, "Page tables"); the PDB of an
//! instance block uses the same target/address encoding.

/// Bytes of a small page and of a big (PDE-mapped) page.
pub const PAGE_4K: u64 = 4096;
pub const PAGE_2M: u64 = 2 << 20;
/// PTEs per page table, and bytes per entry.
pub const PTES_PER_TABLE: usize = 512;
pub const ENTRY_BYTES: u64 = 8;

/// Bits 1:0: the target aperture.
pub const TARGET_MASK: u64 = 0b11;
pub const TARGET_INVALID: u64 = 0;
pub const TARGET_VRAM: u64 = 1;
pub const TARGET_SYSMEM: u64 = 2;
/// Target 3 is reserved.
pub const TARGET_RESERVED: u64 = 3;
/// PDE bit 2: the PDE maps a 2 MiB page directly (reserved, 0, in a PTE).
pub const BIG: u64 = 1 << 2;
/// Bit 3: read-only (a PDE only with BIG).
pub const READ_ONLY: u64 = 1 << 3;
/// Bits 11:4 are reserved (0).
pub const RESERVED: u64 = 0xff0;
/// PDE bits that must be 0.
pub const PDE_RESERVED: u64 = RESERVED;
/// PTE bits that must be 0: 2 (BIG) and 11:4.
pub const PTE_RESERVED: u64 = RESERVED | BIG;
/// Bits 63:12: the address (page table, page or page directory).
pub const ADDR_MASK: u64 = !0xfff;
/// PDB bits 11:2 are reserved (0).
pub const PDB_RESERVED: u64 = 0xffc;

/// An entry's fields: (target, address, BIG, READ_ONLY).
pub const fn fields(entry: u64) -> (u64, u64, bool, bool) {
    (
        entry & TARGET_MASK,
        entry & ADDR_MASK,
        entry & BIG != 0,
        entry & READ_ONLY != 0,
    )
}

/// An entry for `addr` with `target` and flag bits (`BIG`, `READ_ONLY`).
pub const fn entry(target: u64, addr: u64, flags: u64) -> u64 {
    (addr & ADDR_MASK) | (flags & (BIG | READ_ONLY)) | (target & TARGET_MASK)
}
