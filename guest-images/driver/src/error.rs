//! The driver's error type.

use crate::fault::Fault;
use core::fmt;

/// Why a driver operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// `ID` did not read the virtual GPU's value.
    BadId(u32),
    /// `VERSION` has a major version this driver does not speak.
    BadVersion(u32),
    /// An identity register holds a value the driver cannot use.
    BadInfo(&'static str),
    /// The device lacks a capability the operation needs.
    MissingCap(&'static str),
    /// Out of guest VRAM.
    NoVram(u64),
    /// Out of GPU virtual address space.
    NoVa(u64),
    /// Out of system memory for the GPU.
    NoSysmem(u64),
    /// An address or size that is not aligned as required.
    Unaligned(u64),
    /// An address range outside what it must lie in.
    OutOfRange(u64),
    /// A mapping request over a VA that is mapped differently already.
    Overlap(u64),
    /// A channel id beyond the device's channels, or one already in use.
    BadChannel(u32),
    /// A pushbuffer method longer than the device's longest segment.
    PushTooLong(usize),
    /// The GPU reported a fault.
    Fault(Fault),
    /// A channel stopped (CHAN_STATUS says faulted) but FAULT_STATUS held no fault for it.
    ChannelFaulted { channel: u32, kind: u8 },
    /// Waiting for the GPU took longer than the configured limit.
    Timeout { waited_ns: u64 },
    /// A para-virtual call was refused as a whole (its STATUS: 1 BAD_CALL, 3 LIMIT,
    /// 4 HOST_ERROR; or 2 ENTRY_FAULT without a fault record).
    ParaRefused { status: u32, index: u32 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadId(v) => write!(f, "not the virtual GPU: ID reads {v:#x}"),
            Error::BadVersion(v) => write!(f, "unsupported device version {v:#x}"),
            Error::BadInfo(what) => write!(f, "unusable device register: {what}"),
            Error::MissingCap(what) => write!(f, "the device lacks {what}"),
            Error::NoVram(n) => write!(f, "out of VRAM ({n} bytes asked)"),
            Error::NoVa(n) => write!(f, "out of GPU VA space ({n} bytes asked)"),
            Error::NoSysmem(n) => write!(f, "out of GPU-visible system memory ({n} bytes asked)"),
            Error::Unaligned(a) => write!(f, "misaligned address or size {a:#x}"),
            Error::OutOfRange(a) => write!(f, "address {a:#x} out of range"),
            Error::Overlap(va) => write!(f, "GPU VA {va:#x} is already mapped differently"),
            Error::BadChannel(n) => write!(f, "channel {n} unavailable"),
            Error::PushTooLong(n) => write!(f, "method of {n} words exceeds MAX_PUSH_WORDS"),
            Error::Fault(fault) => write!(f, "GPU fault: {fault}"),
            Error::ChannelFaulted { channel, kind } => {
                write!(
                    f,
                    "channel {channel} faulted (kind {kind}) without a fault record"
                )
            }
            Error::Timeout { waited_ns } => write!(f, "GPU did not finish in {waited_ns} ns"),
            Error::ParaRefused { status, index } => {
                write!(
                    f,
                    "para-virtual call refused (status {status}, entry {index})"
                )
            }
        }
    }
}

impl core::error::Error for Error {}

impl From<Fault> for Error {
    fn from(f: Fault) -> Self {
        Error::Fault(f)
    }
}
