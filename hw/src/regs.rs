//! BAR0: identity, register offsets (bytes from the start of BAR0) and their bit fields
//! (docs/hardware.md, "Registers (BAR0)").

/// PCI identity of the virtual GPU (class 03:02:00, 3D controller).
pub const VENDOR_ID: u16 = 0x1234;
pub const DEVICE_ID: u16 = 0x9a01;

/// BAR0 size: registers below `REGS_END`, then the PRAMIN window.
pub const BAR0_SIZE: u64 = 128 << 10;
/// End of the register file in BAR0; the PRAMIN window starts here.
pub const REGS_END: u32 = 0x1_0000;
/// Offset of the PRAMIN window in BAR0.
pub const PRAMIN_WINDOW: u32 = 0x1_0000;
/// Size of the PRAMIN window (and the unit of `PRAMIN_BASE`).
pub const PRAMIN_SIZE: u64 = 0x1_0000;

/// Value of `ID`.
pub const ID_VALUE: u32 = 0x5647_5055;
/// Value of `VERSION` (major in bits 31:16).
pub const VERSION_VALUE: u32 = 0x0001_0000;
/// `VERSION` major.
pub const VERSION_MAJOR: u32 = VERSION_VALUE >> 16;

crate::named_consts! { u32;
    ID = 0x0000;
    VERSION = 0x0004;
    VRAM_SIZE_LO = 0x0008;
    VRAM_SIZE_HI = 0x000c;
    CHANNELS = 0x0010;
    PAGE_SIZES = 0x0014;
    VA_BASE_LO = 0x0018;
    VA_BASE_HI = 0x001c;
    VA_SIZE_LO = 0x0020;
    VA_SIZE_HI = 0x0024;
    CAPS = 0x0028;
    MAX_PUSH_WORDS = 0x002c;
    TIMER_LO = 0x0030;
    TIMER_HI = 0x0034;
    BELL_PAGE_LO = 0x0040;
    BELL_PAGE_HI = 0x0044;
    INTR_STATUS = 0x0100;
    INTR_ENABLE = 0x0104;
    INTR_CHANNELS = 0x0108;
    PRAMIN_BASE = 0x0200;
    TLB_FLUSH = 0x0204;
    RUNLIST_BASE = 0x0600;
    RUNLIST_SUBMIT = 0x0604;
    FAULT_STATUS = 0x0800;
    FAULT_CHANNEL = 0x0804;
    FAULT_ADDR_LO = 0x0808;
    FAULT_ADDR_HI = 0x080c;
    FAULT_INFO = 0x0810;
    FAULT_CLEAR = 0x0814;
    ALLOC_VA_LO = 0x0900;
    ALLOC_VA_HI = 0x0904;
    ALLOC_LEN_LO = 0x0908;
    ALLOC_LEN_HI = 0x090c;
    ALLOC_DECLARE = 0x0910;
}

/// Per-channel registers: `CHAN_INST[n]` at `CHAN_BASE + 8n`, `CHAN_STATUS[n]` at +4.
pub const CHAN_BASE: u32 = 0x0400;
/// Doorbells: `GP_PUT[n]` at `DOORBELL_BASE + 8n`, `GP_GET[n]` at +4.
pub const DOORBELL_BASE: u32 = 0x1000;
/// Bytes between one channel's registers and the next one's.
pub const CHAN_STRIDE: u32 = 8;
/// Per-channel register arrays: (name, offset of element 0, stride).
pub const ARRAYS: &[(&str, u32, u32)] = &[
    ("CHAN_INST", CHAN_BASE, CHAN_STRIDE),
    ("CHAN_STATUS", CHAN_BASE + 4, CHAN_STRIDE),
    ("GP_PUT", DOORBELL_BASE, CHAN_STRIDE),
    ("GP_GET", DOORBELL_BASE + 4, CHAN_STRIDE),
];

/// Most channels the register file has room for.
pub const MAX_CHANNELS: u32 = 32;

/// `CHAN_INST[n]`.
pub const fn chan_inst(n: u32) -> u32 {
    CHAN_BASE + CHAN_STRIDE * n
}
/// `CHAN_STATUS[n]`.
pub const fn chan_status(n: u32) -> u32 {
    CHAN_BASE + CHAN_STRIDE * n + 4
}
/// `GP_PUT[n]` (the doorbell).
pub const fn gp_put(n: u32) -> u32 {
    DOORBELL_BASE + CHAN_STRIDE * n
}
/// `GP_GET[n]`.
pub const fn gp_get(n: u32) -> u32 {
    DOORBELL_BASE + CHAN_STRIDE * n + 4
}

/// A per-channel register (the arrays of [`ARRAYS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChanReg {
    /// `CHAN_INST[n]`.
    Inst,
    /// `CHAN_STATUS[n]`.
    Status,
    /// `GP_PUT[n]`, the doorbell.
    GpPut,
    /// `GP_GET[n]`.
    GpGet,
}

/// The per-channel register at BAR0 offset `off` and its channel `n` (< [`MAX_CHANNELS`];
/// the device checks `n` against its own channel count), or `None`: the inverse of
/// [`chan_inst`], [`chan_status`], [`gp_put`] and [`gp_get`].
pub const fn chan_reg(off: u32) -> Option<(ChanReg, u32)> {
    let (base, low, high) = if off >= CHAN_BASE && off < chan_inst(MAX_CHANNELS) {
        (CHAN_BASE, ChanReg::Inst, ChanReg::Status)
    } else if off >= DOORBELL_BASE && off < gp_put(MAX_CHANNELS) {
        (DOORBELL_BASE, ChanReg::GpPut, ChanReg::GpGet)
    } else {
        return None;
    };
    let n = (off - base) / CHAN_STRIDE;
    match (off - base) % CHAN_STRIDE {
        0 => Some((low, n)),
        4 => Some((high, n)),
        _ => None,
    }
}

/// `ALLOC_DECLARE` operations: declare `[ALLOC_VA, ALLOC_VA + ALLOC_LEN)` an allocation, forget
/// the one starting at `ALLOC_VA`, forget all.
pub const ALLOC_OP_DECLARE: u32 = 1;
pub const ALLOC_OP_FORGET: u32 = 2;
pub const ALLOC_OP_FORGET_ALL: u32 = 3;

/// `CAPS` bits.
pub const CAP_COPY: u32 = 1 << 0;
pub const CAP_COMPUTE: u32 = 1 << 1;
pub const CAP_SYSMEM: u32 = 1 << 2;
pub const CAP_MSI: u32 = 1 << 3;
/// The para-virtual BAR (BAR3) is present (`mode=para`).
pub const CAP_PARA: u32 = 1 << 4;
/// The doorbell page (exitless submission, `BELL_PAGE_LO/_HI`; see `bell`).
pub const CAP_BELL: u32 = 1 << 5;

/// `BELL_PAGE_LO` bit 0: the doorbell page is in use; bits 31:12 are the address's low bits.
pub const BELL_ENABLE: u32 = 1 << 0;

/// `PAGE_SIZES` bits.
pub const PAGE_4K: u32 = 1 << 0;
pub const PAGE_2M: u32 = 1 << 1;

/// `INTR_STATUS` / `INTR_ENABLE` bits.
pub const INTR_SEMAPHORE: u32 = 1 << 0;
pub const INTR_FAULT: u32 = 1 << 1;

/// `CHAN_INST.VALID`.
pub const CHAN_INST_VALID: u32 = 1 << 31;
/// `CHAN_INST` address field mask (instance block address >> 12).
pub const CHAN_INST_ADDR_MASK: u32 = 0x0fff_ffff;

/// `CHAN_STATUS` states (bits 3:0); the fault kind is in bits 15:8.
pub const CHAN_UNBOUND: u32 = 0;
pub const CHAN_IDLE: u32 = 1;
pub const CHAN_PENDING: u32 = 2;
pub const CHAN_RUNNING: u32 = 3;
pub const CHAN_FAULTED: u32 = 4;

/// `FAULT_STATUS.VALID`; KIND is bits 7:0, ACCESS bits 23:16.
pub const FAULT_VALID: u32 = 1 << 31;
/// `FAULT_CHANNEL` value of a device-level fault.
pub const FAULT_CHANNEL_DEVICE: u32 = 0xffff;

/// Longest pushbuffer segment the device accepts, in words (`MAX_PUSH_WORDS`).
pub const MAX_PUSH: u32 = 1 << 16;
/// Limits on method-provided sizes: PTX text, kernel parameters, entry name (bytes).
pub const MAX_CODE_LEN: u32 = 1 << 20;
pub const MAX_PARAM_LEN: u32 = 4096;
pub const MAX_ENTRY_LEN: u32 = 255;

#[cfg(test)]
mod chan_reg_tests {
    use super::*;

    #[test]
    fn chan_reg_inverts_the_array_offsets() {
        for n in 0..MAX_CHANNELS {
            assert_eq!(chan_reg(chan_inst(n)), Some((ChanReg::Inst, n)));
            assert_eq!(chan_reg(chan_status(n)), Some((ChanReg::Status, n)));
            assert_eq!(chan_reg(gp_put(n)), Some((ChanReg::GpPut, n)));
            assert_eq!(chan_reg(gp_get(n)), Some((ChanReg::GpGet, n)));
            assert_eq!(chan_reg(gp_put(n) + 2), None);
        }
        for off in [
            0,
            CHAN_BASE - 4,
            chan_inst(MAX_CHANNELS),
            gp_put(MAX_CHANNELS),
            u32::MAX,
        ] {
            assert_eq!(chan_reg(off), None, "{off:#x}");
        }
    }
}
