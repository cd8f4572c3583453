//! BAR0 register offsets and bit fields of the virtual GPU (docs/hardware.md, "Registers").

/// `ID` register and the value it must read.
pub const ID: u32 = 0x0000;
pub const ID_VALUE: u32 = 0x5647_5055;
/// `VERSION`: major in bits 31:16.
pub const VERSION: u32 = 0x0004;
pub const VERSION_MAJOR: u32 = 1;
pub const VRAM_SIZE_LO: u32 = 0x0008;
pub const VRAM_SIZE_HI: u32 = 0x000c;
pub const CHANNELS: u32 = 0x0010;
pub const PAGE_SIZES: u32 = 0x0014;
pub const VA_BASE_LO: u32 = 0x0018;
pub const VA_BASE_HI: u32 = 0x001c;
pub const VA_SIZE_LO: u32 = 0x0020;
pub const VA_SIZE_HI: u32 = 0x0024;
pub const CAPS: u32 = 0x0028;
pub const MAX_PUSH_WORDS: u32 = 0x002c;
pub const TIMER_LO: u32 = 0x0030;
pub const TIMER_HI: u32 = 0x0034;
pub const INTR_STATUS: u32 = 0x0100;
pub const INTR_ENABLE: u32 = 0x0104;
pub const INTR_CHANNELS: u32 = 0x0108;
pub const PRAMIN_BASE: u32 = 0x0200;
pub const TLB_FLUSH: u32 = 0x0204;
pub const RUNLIST_BASE: u32 = 0x0600;
pub const RUNLIST_SUBMIT: u32 = 0x0604;
pub const FAULT_STATUS: u32 = 0x0800;
pub const FAULT_CHANNEL: u32 = 0x0804;
pub const FAULT_ADDR_LO: u32 = 0x0808;
pub const FAULT_ADDR_HI: u32 = 0x080c;
pub const FAULT_INFO: u32 = 0x0810;
pub const FAULT_CLEAR: u32 = 0x0814;
/// Offset of the PRAMIN window in BAR0, and its size (64 KiB units of `PRAMIN_BASE`).
pub const PRAMIN_WINDOW: u32 = 0x1_0000;
pub const PRAMIN_SIZE: u64 = 0x1_0000;

/// Most channels the register file has room for.
pub const MAX_CHANNELS: u32 = 32;

/// `CHAN_INST[n]`.
pub const fn chan_inst(n: u32) -> u32 {
    0x0400 + 8 * n
}
/// `CHAN_STATUS[n]`.
pub const fn chan_status(n: u32) -> u32 {
    0x0404 + 8 * n
}
/// `GP_PUT[n]` (the doorbell).
pub const fn gp_put(n: u32) -> u32 {
    0x1000 + 8 * n
}
/// `GP_GET[n]`.
pub const fn gp_get(n: u32) -> u32 {
    0x1004 + 8 * n
}

/// `CHAN_INST.VALID`.
pub const CHAN_INST_VALID: u32 = 1 << 31;
/// `CHAN_INST` address field mask (address >> 12).
pub const CHAN_INST_ADDR_MASK: u32 = 0x0fff_ffff;

/// `CHAN_STATUS` states (bits 3:0).
pub const CHAN_UNBOUND: u32 = 0;
pub const CHAN_IDLE: u32 = 1;
pub const CHAN_PENDING: u32 = 2;
pub const CHAN_RUNNING: u32 = 3;
pub const CHAN_FAULTED: u32 = 4;

/// `INTR_STATUS` / `INTR_ENABLE` bits.
pub const INTR_SEMAPHORE: u32 = 1 << 0;
pub const INTR_FAULT: u32 = 1 << 1;

/// `CAPS` bits.
pub const CAP_COPY: u32 = 1 << 0;
pub const CAP_COMPUTE: u32 = 1 << 1;
pub const CAP_SYSMEM: u32 = 1 << 2;
pub const CAP_MSI: u32 = 1 << 3;
pub const CAP_PV_BAR: u32 = 1 << 4;

/// `PAGE_SIZES` bits.
pub const PAGE_4K: u32 = 1 << 0;
pub const PAGE_2M: u32 = 1 << 1;

/// `FAULT_STATUS.VALID`.
pub const FAULT_VALID: u32 = 1 << 31;
/// `FAULT_CHANNEL` value of a device-level fault.
pub const FAULT_CHANNEL_DEVICE: u32 = 0xffff;

/// Instance block layout (4 KiB, in guest VRAM).
pub mod inst {
    pub const SIZE: u64 = 4096;
    pub const PDB: u64 = 0x00;
    pub const GPFIFO_BASE: u64 = 0x08;
    /// GPFIFO_ENTRIES (u32) and the reserved u32 after it, written as one u64.
    pub const GPFIFO_ENTRIES: u64 = 0x10;
    pub const ENGINE_CTX: u64 = 0x18;
}
