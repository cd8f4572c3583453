//! Register offsets, method addresses and fault kinds of the virtual GPU, exactly as
//! docs/hardware.md ("The virtual GPU") specifies them.

pub const VENDOR_ID: u16 = 0x1234;
pub const DEVICE_ID: u16 = 0x9a01;

/// BAR0 size and layout.
pub const BAR0_SIZE: u64 = 128 << 10;
pub const REGS_END: u64 = 0x1_0000;
pub const PRAMIN_WINDOW: u64 = 0x1_0000;

pub const ID: u64 = 0x0000;
pub const ID_VALUE: u32 = 0x5647_5055;
pub const VERSION: u64 = 0x0004;
pub const VERSION_VALUE: u32 = 0x0001_0000;
pub const VRAM_SIZE_LO: u64 = 0x0008;
pub const VRAM_SIZE_HI: u64 = 0x000c;
pub const CHANNELS: u64 = 0x0010;
pub const PAGE_SIZES: u64 = 0x0014;
pub const VA_BASE_LO: u64 = 0x0018;
pub const VA_BASE_HI: u64 = 0x001c;
pub const VA_SIZE_LO: u64 = 0x0020;
pub const VA_SIZE_HI: u64 = 0x0024;
pub const CAPS: u64 = 0x0028;
pub const MAX_PUSH_WORDS: u64 = 0x002c;
pub const TIMER_LO: u64 = 0x0030;
pub const TIMER_HI: u64 = 0x0034;
pub const INTR_STATUS: u64 = 0x0100;
pub const INTR_ENABLE: u64 = 0x0104;
pub const INTR_CHANNELS: u64 = 0x0108;
pub const PRAMIN_BASE: u64 = 0x0200;
pub const TLB_FLUSH: u64 = 0x0204;
pub const CHAN_BASE: u64 = 0x0400;
pub const RUNLIST_BASE: u64 = 0x0600;
pub const RUNLIST_SUBMIT: u64 = 0x0604;
pub const FAULT_STATUS: u64 = 0x0800;
pub const FAULT_CHANNEL: u64 = 0x0804;
pub const FAULT_ADDR_LO: u64 = 0x0808;
pub const FAULT_ADDR_HI: u64 = 0x080c;
pub const FAULT_INFO: u64 = 0x0810;
pub const FAULT_CLEAR: u64 = 0x0814;
pub const DOORBELL_BASE: u64 = 0x1000;

pub const CAP_COPY: u32 = 1 << 0;
pub const CAP_COMPUTE: u32 = 1 << 1;
pub const CAP_SYSMEM: u32 = 1 << 2;
pub const CAP_MSI: u32 = 1 << 3;
/// The para-virtual BAR (BAR3) is present (`mode=para`).
pub const CAP_PARA: u32 = 1 << 4;

pub const INTR_SEMAPHORE: u32 = 1 << 0;
pub const INTR_FAULT: u32 = 1 << 1;

pub const CHAN_INST_VALID: u32 = 1 << 31;

/// Channel states in CHAN_STATUS.
pub const STATE_UNBOUND: u32 = 0;
pub const STATE_IDLE: u32 = 1;
pub const STATE_PENDING: u32 = 2;
pub const STATE_RUNNING: u32 = 3;
pub const STATE_FAULTED: u32 = 4;

/// Longest pushbuffer segment the device accepts, in words.
pub const MAX_PUSH: u32 = 1 << 16;
/// Limits on method-provided sizes.
pub const MAX_CODE_LEN: u32 = 1 << 20;
pub const MAX_PARAM_LEN: u32 = 4096;
pub const MAX_ENTRY_LEN: u32 = 255;

/// Fault kinds (FAULT_STATUS bits 7:0): the spec's numbering, shared with `shadow`.
pub use shadow::FaultKind;

/// Access kinds (FAULT_STATUS bits 23:16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[repr(u8)]
pub enum Access {
    None = 0,
    Read = 1,
    Write = 2,
    Atomic = 3,
    Fetch = 4,
}

/// Method addresses (bytes).
pub mod method {
    pub const NOP: u32 = 0x000;
    pub const SEM_ADDR_HI: u32 = 0x010;
    pub const SEM_ADDR_LO: u32 = 0x014;
    pub const SEM_PAYLOAD: u32 = 0x018;
    pub const SEM_EXECUTE: u32 = 0x01c;
    pub const COPY_SRC_HI: u32 = 0x100;
    pub const COPY_SRC_LO: u32 = 0x104;
    pub const COPY_DST_HI: u32 = 0x108;
    pub const COPY_DST_LO: u32 = 0x10c;
    pub const COPY_LEN: u32 = 0x110;
    pub const COPY_LAUNCH: u32 = 0x114;
    pub const CODE_HI: u32 = 0x200;
    pub const CODE_LO: u32 = 0x204;
    pub const CODE_LEN: u32 = 0x208;
    pub const ENTRY_HI: u32 = 0x20c;
    pub const ENTRY_LO: u32 = 0x210;
    pub const ENTRY_LEN: u32 = 0x214;
    pub const GRID_X: u32 = 0x218;
    pub const BLOCK_X: u32 = 0x224;
    pub const SHARED_BYTES: u32 = 0x230;
    pub const PARAM_HI: u32 = 0x234;
    pub const PARAM_LO: u32 = 0x238;
    pub const PARAM_LEN: u32 = 0x23c;
    pub const LAUNCH: u32 = 0x240;

    pub const SEM_OP_ACQUIRE: u32 = 1;
    pub const SEM_OP_RELEASE: u32 = 2;
    pub const SEM_FLAG_INTERRUPT: u32 = 1 << 4;
    pub const SEM_FLAG_TIMESTAMP: u32 = 1 << 5;
}
