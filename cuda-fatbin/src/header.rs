//! The fat binary's 16-byte header: magic, version, header size and the size of the entries
//! that follow. [`fatbin_len`] tells a library reading from a raw pointer how many bytes to read.

use crate::FatbinError;

/// Magic of a fat binary (`0xBA55ED50`, little-endian `50 ED 55 BA`).
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Bytes to read first from a pointer to a fat binary: enough for [`fatbin_len`].
pub const HEADER_PEEK: usize = 16;
/// The largest fat binary accepted (header and entries): 1 GiB.
pub const MAX_FATBIN_SIZE: u64 = 1 << 30;

/// The parsed 16-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatbinHeader {
    pub version: u16,
    /// Bytes from the start to the first entry (16 in every nvcc output seen).
    pub header_size: u16,
    /// Bytes of the entries after the header.
    pub entries_size: u64,
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

impl FatbinHeader {
    /// Parses the first [`HEADER_PEEK`] bytes (more may follow and are ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, FatbinError> {
        if bytes.len() < HEADER_PEEK {
            return Err(FatbinError::Truncated {
                what: "fat binary header",
                len: bytes.len(),
                need: HEADER_PEEK,
            });
        }
        let magic = u32_at(bytes, 0);
        if magic != FATBIN_MAGIC {
            return Err(FatbinError::BadMagic {
                what: "fat binary",
                found: magic,
                expected: FATBIN_MAGIC,
            });
        }
        let header = FatbinHeader {
            version: u16_at(bytes, 4),
            header_size: u16_at(bytes, 6),
            entries_size: u64_at(bytes, 8),
        };
        if usize::from(header.header_size) < HEADER_PEEK {
            return Err(FatbinError::HeaderSize(header.header_size));
        }
        let total = u64::from(header.header_size).saturating_add(header.entries_size);
        if total > MAX_FATBIN_SIZE {
            return Err(FatbinError::TooLarge(total));
        }
        Ok(header)
    }

    /// Header plus entries: the whole fat binary's length (at most [`MAX_FATBIN_SIZE`]).
    pub fn total_len(&self) -> usize {
        // Bounded by MAX_FATBIN_SIZE in `parse`, so it fits usize on 64-bit hosts.
        usize::try_from(u64::from(self.header_size) + self.entries_size).unwrap_or(usize::MAX)
    }
}

/// From the first [`HEADER_PEEK`] bytes of a fat binary, how many bytes the whole fat binary
/// has (refused beyond [`MAX_FATBIN_SIZE`]).
pub fn fatbin_len(first: &[u8]) -> Result<usize, FatbinError> {
    FatbinHeader::parse(first).map(|h| h.total_len())
}
