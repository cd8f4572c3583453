//! The `__fatBinC_Wrapper_t` nvcc places in `.nvFatBinSegment` and passes to
//! `__cudaRegisterFatBinary`: magic, version, and two pointers (the fat binary, and a file
//! name or prelinked fat binaries). 64-bit layout only.

use crate::FatbinError;
use crate::header::{u32_at, u64_at};

/// `FATBINC_MAGIC` of `fatbinary_section.h`.
pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Bytes of the wrapper on a 64-bit host.
pub const WRAPPER_SIZE: usize = 24;

/// The parsed wrapper. Version 1 is a translation unit's own fat binary; version 2
/// (`FATBINC_LINK_VERSION`, which nvcc 13 programs also register: its fat binary is empty and
/// its second pointer names the prelinked fat binaries of relocatable device code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrapper {
    pub version: u32,
    /// Address of the fat binary (in the program's address space).
    pub data: u64,
    /// Address of the file name (version 1) or of the prelinked fat binaries (version 2).
    pub filename_or_fatbins: u64,
}

impl Wrapper {
    /// Parses the first [`WRAPPER_SIZE`] bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, FatbinError> {
        if bytes.len() < WRAPPER_SIZE {
            return Err(FatbinError::Truncated {
                what: "fat binary wrapper",
                len: bytes.len(),
                need: WRAPPER_SIZE,
            });
        }
        let magic = u32_at(bytes, 0);
        if magic != WRAPPER_MAGIC {
            return Err(FatbinError::BadMagic {
                what: "fat binary wrapper",
                found: magic,
                expected: WRAPPER_MAGIC,
            });
        }
        let version = u32_at(bytes, 4);
        if !(1..=2).contains(&version) {
            return Err(FatbinError::WrapperVersion(version));
        }
        Ok(Wrapper {
            version,
            data: u64_at(bytes, 8),
            filename_or_fatbins: u64_at(bytes, 16),
        })
    }
}
