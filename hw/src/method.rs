//! Methods (byte addresses a pushbuffer writes) and the pushbuffer header format
//! (docs/hardware.md, "GPFIFO and pushbuffers", "Methods").

crate::named_consts! { u32;
    NOP = 0x000;
    SEM_ADDR_HI = 0x010;
    SEM_ADDR_LO = 0x014;
    SEM_PAYLOAD = 0x018;
    SEM_EXECUTE = 0x01c;
    COPY_SRC_HI = 0x100;
    COPY_SRC_LO = 0x104;
    COPY_DST_HI = 0x108;
    COPY_DST_LO = 0x10c;
    COPY_LEN = 0x110;
    COPY_LAUNCH = 0x114;
    CODE_HI = 0x200;
    CODE_LO = 0x204;
    CODE_LEN = 0x208;
    ENTRY_HI = 0x20c;
    ENTRY_LO = 0x210;
    ENTRY_LEN = 0x214;
    GRID_X = 0x218;
    GRID_Y = 0x21c;
    GRID_Z = 0x220;
    BLOCK_X = 0x224;
    BLOCK_Y = 0x228;
    BLOCK_Z = 0x22c;
    SHARED_BYTES = 0x230;
    PARAM_HI = 0x234;
    PARAM_LO = 0x238;
    PARAM_LEN = 0x23c;
    LAUNCH = 0x240;
}

/// `SEM_EXECUTE` operations (bits 1:0) and flags.
pub const SEM_OP_ACQUIRE: u32 = 1;
pub const SEM_OP_RELEASE: u32 = 2;
pub const SEM_FLAG_INTERRUPT: u32 = 1 << 4;
pub const SEM_FLAG_TIMESTAMP: u32 = 1 << 5;

/// Pushbuffer header opcodes (bits 31:29).
pub const OP_INCR: u32 = 1;
pub const OP_NONINCR: u32 = 3;
pub const OP_IMMD: u32 = 4;
/// Largest count (bits 28:16) of a header, and the largest IMMD value.
pub const MAX_COUNT: u32 = 0x1fff;

/// A header word: `op`, `count` (data words, or the IMMD value), `method` (byte address).
pub const fn header(op: u32, count: u32, method: u32) -> u32 {
    ((op & 7) << 29) | ((count & MAX_COUNT) << 16) | ((method >> 2) & 0x1fff)
}

/// Fields of a header word: (opcode, count, subchannel, method byte address).
pub const fn decode_header(word: u32) -> (u32, u32, u32, u32) {
    (
        word >> 29,
        (word >> 16) & MAX_COUNT,
        (word >> 13) & 0x7,
        (word & 0x1fff) << 2,
    )
}

/// GPFIFO entry: bits 47:0 segment GPU VA, bits 63:48 length in words.
pub const fn gpfifo_entry(va: u64, words: u32) -> u64 {
    (va & 0xffff_ffff_ffff) | ((words as u64) << 48)
}
