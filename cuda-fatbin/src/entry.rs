//! The fat binary's entries: each a header (kind, sizes, PTX ISA version, arch, flags, the
//! decompressed size) and a payload. Headers differ in size (64 bytes for SASS, 80 for PTX in
//! CUDA 13), so every entry is skipped by its own header-size field.

use std::fmt;

use crate::FatbinError;
use crate::header::{FatbinHeader, u16_at, u32_at, u64_at};

/// The fields every entry header has (the bytes up to the decompressed size).
const ENTRY_MIN_HEADER: usize = 64;
/// The most entries accepted in one fat binary (a real one has a handful per arch).
const MAX_ENTRIES: usize = 4096;

/// Flag of an LZ4-compressed payload (`--compress-mode=speed`).
const FLAG_LZ4: u64 = 0x2000;
/// Flag of a ZSTD-compressed payload (CUDA 13's default).
const FLAG_ZSTD: u64 = 0x8000;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// PTX text for a virtual arch (`compute_XX`).
    Ptx,
    /// A cubin (ELF with SASS) for a real arch (`sm_XX`).
    Elf,
    /// Anything else (e.g. LTO IR), kept with its raw kind number.
    Other(u16),
}

/// How a payload is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd,
}

/// A PTX ISA version (`.version MAJOR.MINOR`); ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxIsa {
    pub major: u16,
    pub minor: u16,
}

impl PtxIsa {
    pub const fn new(major: u16, minor: u16) -> Self {
        PtxIsa { major, minor }
    }
}

impl fmt::Display for PtxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One entry, borrowing its payload from the fat binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Offset of the entry's header from the start of the fat binary.
    pub offset: usize,
    pub kind: EntryKind,
    pub header_size: u32,
    /// The PTX ISA version (for PTX; an ELF entry has other numbers here).
    pub isa: PtxIsa,
    /// The arch number: 80 is `compute_80` for PTX, `sm_80` for ELF.
    pub arch: u32,
    pub flags: u64,
    /// Bytes of compressed data at the start of the payload (0 when uncompressed).
    pub compressed_size: u32,
    /// Bytes the payload decompresses to (0 when uncompressed).
    pub uncompressed_size: u64,
    /// The whole payload (the compressed bytes, or the text, with padding).
    pub payload: &'a [u8],
}

impl Entry<'_> {
    /// The payload's compression, from the flags.
    pub fn compression(&self) -> Result<Compression, FatbinError> {
        match (self.flags & FLAG_LZ4 != 0, self.flags & FLAG_ZSTD != 0) {
            (false, false) => Ok(Compression::None),
            (true, false) => Ok(Compression::Lz4),
            (false, true) => Ok(Compression::Zstd),
            (true, true) => Err(FatbinError::AmbiguousCompression {
                arch: self.arch,
                flags: self.flags,
            }),
        }
    }
}

/// A parsed fat binary: its header and entries in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatbin<'a> {
    pub header: FatbinHeader,
    pub entries: Vec<Entry<'a>>,
    /// Bytes the fat binary occupies (header and entries); bytes after it are not read.
    pub len: usize,
}

/// Parses a fat binary (magic `0xBA55ED50`) from `bytes`, which must hold at least the length
/// its header declares; bytes beyond are ignored.
pub fn parse_fatbin(bytes: &[u8]) -> Result<Fatbin<'_>, FatbinError> {
    let header = FatbinHeader::parse(bytes)?;
    let len = header.total_len();
    if bytes.len() < len {
        return Err(FatbinError::Truncated {
            what: "fat binary",
            len: bytes.len(),
            need: len,
        });
    }
    let body = &bytes[..len];
    let mut offset = usize::from(header.header_size);
    let mut entries = Vec::new();
    while offset < len {
        if entries.len() == MAX_ENTRIES {
            return Err(FatbinError::TooManyEntries(MAX_ENTRIES));
        }
        let entry = parse_entry(body, offset)?;
        offset += entry.header_size as usize + entry.payload.len();
        entries.push(entry);
    }
    Ok(Fatbin {
        header,
        entries,
        len,
    })
}

fn parse_entry(body: &[u8], offset: usize) -> Result<Entry<'_>, FatbinError> {
    let left = body.len() - offset;
    if left < ENTRY_MIN_HEADER {
        return Err(FatbinError::Truncated {
            what: "fat binary entry header",
            len: left,
            need: ENTRY_MIN_HEADER,
        });
    }
    let h = &body[offset..];
    let header_size = u32_at(h, 4);
    let hs = header_size as usize;
    if hs < ENTRY_MIN_HEADER || hs > left {
        return Err(FatbinError::EntryHeaderSize {
            offset,
            size: header_size,
        });
    }
    let size = u64_at(h, 8);
    let room = left - hs;
    let payload_len = match usize::try_from(size) {
        Ok(n) if n <= room => n,
        _ => {
            return Err(FatbinError::EntryPayload {
                offset,
                size,
                left: room,
            });
        }
    };
    let kind = match u16_at(h, 0) {
        1 => EntryKind::Ptx,
        2 => EntryKind::Elf,
        k => EntryKind::Other(k),
    };
    Ok(Entry {
        offset,
        kind,
        header_size,
        compressed_size: u32_at(h, 16),
        isa: PtxIsa::new(u16_at(h, 26), u16_at(h, 24)),
        arch: u32_at(h, 28),
        flags: u64_at(h, 40),
        uncompressed_size: u64_at(h, 56),
        payload: &h[hs..hs + payload_len],
    })
}
