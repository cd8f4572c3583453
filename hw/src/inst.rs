//! Instance block layout (4 KiB, 4 KiB aligned, in guest VRAM; docs/hardware.md, "Instance
//! block"), byte offsets.

/// Size and alignment of an instance block.
pub const SIZE: u64 = 4096;
/// PDB (u64): bits 1:0 target of the page directory, bits 63:12 its address.
pub const PDB: u64 = 0x00;
/// GPFIFO_BASE (u64): GPU VA of the ring, 8-byte aligned.
pub const GPFIFO_BASE: u64 = 0x08;
/// GPFIFO_ENTRIES (u32): a power of two in `GPFIFO_MIN_ENTRIES..=GPFIFO_MAX_ENTRIES`.
pub const GPFIFO_ENTRIES: u64 = 0x10;
/// Reserved (u32), must be 0.
pub const RESERVED: u64 = 0x14;
/// ENGINE_CTX (u64): GPU VA of a 4 KiB context save area (0 allowed).
pub const ENGINE_CTX: u64 = 0x18;
/// Bounds of GPFIFO_ENTRIES.
pub const GPFIFO_MIN_ENTRIES: u32 = 2;
pub const GPFIFO_MAX_ENTRIES: u32 = 65536;
