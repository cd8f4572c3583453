//! Guest-visible faults (the spec's fault kinds, with the rule that was broken) and the host-side
//! errors of the shadow layer.

use pgpu::EngineError;
use thiserror::Error;

/// Fault kinds of `docs/hardware.md` ("Fault kinds"), defined once in `vgpu-hw`.
pub use vgpu_hw::FaultKind;

/// The validation rule a guest value broke (for host logs and tests; the guest sees the kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum Rule {
    // Instance block (kind 6 unless noted).
    #[error("instance block address is not 4 KiB aligned")]
    InstanceMisaligned,
    #[error("instance block is not inside guest VRAM")]
    InstanceOutsideVram,
    #[error("PDB target is neither VRAM (1) nor system memory (2)")]
    PdbTarget,
    #[error("PDB bits 11:2 are reserved and must be 0")]
    PdbReserved,
    #[error("page directory does not fit in guest VRAM")]
    PdOutsideVram,
    #[error("page directory is not inside one guest RAM region")]
    PdOutsideRam,
    #[error("reserved instance field at 0x14 is not 0")]
    InstanceReserved,
    #[error("ENGINE_CTX area is not inside the VA window")]
    EngineCtxOutsideWindow,
    /// Kind 7.
    #[error("GPFIFO_BASE is not 8-byte aligned")]
    GpfifoMisaligned,
    /// Kind 7.
    #[error("GPFIFO_ENTRIES is not a power of two in 2..=65536")]
    GpfifoEntries,
    /// Kind 7.
    #[error("GPFIFO ring is not inside the VA window")]
    GpfifoOutsideWindow,
    // PDE/PTE (kind 5 unless noted).
    #[error("entry target 3 is reserved")]
    ReservedTarget,
    #[error("entry has reserved bits set")]
    EntryReserved,
    #[error("READ_ONLY set on a PDE without BIG")]
    ReadOnlyWithoutBig,
    #[error("big page address is not 2 MiB aligned")]
    BigPageMisaligned,
    #[error("page size not offered by this GPU (PAGE_SIZES)")]
    PageSizeUnsupported,
    #[error("system-memory target not offered by this GPU (CAPS bit 2)")]
    SysmemUnsupported,
    /// Kind 3.
    #[error("VRAM address outside guest VRAM")]
    VramRange,
    /// Kind 4.
    #[error("system-memory address outside guest RAM (or straddling two RAM regions)")]
    SysmemRange,
    /// Kind 3 or 4 (per the table's aperture), or 6 for the page directory.
    #[error("guest memory holding a table could not be read")]
    TableUnreadable,
    /// Kind 3: the guest VRAM address has no place in the VM's partition (host configuration).
    #[error("VRAM address outside the VM's partition")]
    PartitionRange,
    /// Kind 4: the guest RAM has no host region behind it (host configuration).
    #[error("guest RAM not backed by a registered host region")]
    SysmemUnbacked,
    /// Kind 13.
    #[error("channel id is not below CHANNELS")]
    ChannelRange,
}

/// A fault to report to the guest: FAULT_STATUS.KIND = `kind.code()`, FAULT_ADDR = `addr`,
/// FAULT_INFO = `info`.
///
/// `addr` is, per kind: 3/4/5 the GPU VA the entry would have mapped (`info` = the entry's index
/// in its PD or PT); 6/7 the instance block's guest VRAM address (`info` = the field's byte
/// offset); 13 zero (`info` = the channel id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[error("fault kind {} ({rule}) at {addr:#x}, info {info}", kind.code())]
pub struct GuestFault {
    /// The spec's fault kind.
    pub kind: FaultKind,
    /// The rule that was broken.
    pub rule: Rule,
    /// The address involved.
    pub addr: u64,
    /// Kind-specific information.
    pub info: u32,
}

impl GuestFault {
    /// A fault of `kind` for breaking `rule`.
    pub const fn new(kind: FaultKind, rule: Rule, addr: u64, info: u32) -> Self {
        Self {
            kind,
            rule,
            addr,
            info,
        }
    }
}

/// Host-side errors: bad host configuration, engine refusals, misuse of the API.
#[derive(Debug, Error)]
pub enum ShadowError {
    #[error("bad configuration: {0}")]
    Config(&'static str),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("mappings overlap at VA {0:#x}")]
    Overlap(u64),
    #[error("bad mapping at VA {va:#x}: {why}")]
    BadMapping { va: u64, why: &'static str },
    #[error("the shadow space was destroyed")]
    Destroyed,
}

impl ShadowError {
    /// Whether the engine refused only because a job runs in the space (`SpaceBusy`): not the
    /// guest's fault; retry once the job has stopped (a failed `sync` rebuilds fully next time).
    pub fn is_busy(&self) -> bool {
        matches!(self, ShadowError::Engine(EngineError::SpaceBusy(_)))
    }
}
