//! The para-virtual BAR (BAR3, `mode=para`; docs/hardware.md, "Para-virtual interface"): its
//! registers, the layout of the argument area in guest RAM, operations and status codes.

/// BAR3 size.
pub const BAR_SIZE: u64 = 4096;
/// Value of `PARA_ID` and `PARA_VERSION`.
pub const PARA_ID_VALUE: u32 = 0x5041_5241;
pub const PARA_VERSION_VALUE: u32 = 0x0001_0000;

crate::named_consts! { u32;
    PARA_ID = 0x00;
    PARA_VERSION = 0x04;
    ARGS_LO = 0x08;
    ARGS_HI = 0x0c;
    MAX_BATCH_REG = 0x10;
    STATUS = 0x14;
    CALL = 0x18;
}

/// Bytes of the argument area (4 KiB aligned, inside one RAM region).
pub const ARGS_BYTES: u64 = 64 << 10;
/// Argument area fields (byte offsets).
pub const OFF_ARG: u64 = 0x00;
pub const OFF_COUNT: u64 = 0x08;
pub const OFF_STATUS: u64 = 0x10;
pub const OFF_INDEX: u64 = 0x14;
pub const OFF_KIND: u64 = 0x18;
pub const OFF_ADDR: u64 = 0x20;
pub const OFF_ENTRIES: u64 = 0x40;
/// One batch entry: VA (u64), PTE (u64), PAGES (u32), reserved (u32).
pub const ENTRY_BYTES: usize = 24;
/// Most entries one call takes (the `MAX_BATCH` register's value).
pub const MAX_BATCH: u32 = 2048;
/// Most page directories (address spaces) a VM may name with SET_PD.
pub const MAX_SPACES: usize = 8;
/// Most separate mapped runs one space may hold (LIMIT beyond).
pub const MAX_RUNS: usize = 1 << 16;

/// Operations (`CALL` bits 7:0).
pub const OP_SET_PD: u32 = 1;
pub const OP_MAP: u32 = 2;
pub const OP_MAP_BATCH: u32 = 3;
pub const OP_UNMAP_BATCH: u32 = 4;
pub const OP_TLB_FLUSH: u32 = 5;
pub const OP_VRAM_ALLOC: u32 = 6;
pub const OP_VRAM_FREE: u32 = 7;

/// Call results (`STATUS` bits 7:0 and the area's STATUS).
pub const ST_OK: u32 = 0;
pub const ST_BAD_CALL: u32 = 1;
pub const ST_ENTRY_FAULT: u32 = 2;
pub const ST_LIMIT: u32 = 3;
pub const ST_HOST_ERROR: u32 = 4;
pub const ST_NO_MEMORY: u32 = 5;
