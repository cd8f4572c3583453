//! The errors of fat-binary parsing and PTX decompression (hostile input gives one of these,
//! never a panic).

use thiserror::Error;

/// Why bytes were refused as a fat binary, a wrapper, an entry or PTX.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FatbinError {
    #[error("{what}: {len} bytes, at least {need} needed")]
    Truncated {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("{what}: magic {found:#010x}, expected {expected:#010x}")]
    BadMagic {
        what: &'static str,
        found: u32,
        expected: u32,
    },
    #[error("fat binary wrapper version {0} (1 or 2 expected)")]
    WrapperVersion(u32),
    #[error("fat binary header size {0} (at least 16)")]
    HeaderSize(u16),
    #[error("fat binary of {0} bytes exceeds the limit of {limit} bytes", limit = crate::MAX_FATBIN_SIZE)]
    TooLarge(u64),
    #[error(
        "fat binary entry at offset {offset}: header size {size} (at least 64, within the fat binary)"
    )]
    EntryHeaderSize { offset: usize, size: u32 },
    #[error(
        "fat binary entry at offset {offset}: payload of {size} bytes runs past the end ({left} left)"
    )]
    EntryPayload {
        offset: usize,
        size: u64,
        left: usize,
    },
    #[error("fat binary has more than {0} entries")]
    TooManyEntries(usize),
    #[error("entry for arch {arch} is not PTX")]
    NotPtx { arch: u32 },
    #[error("PTX for arch {arch}: both LZ4 and ZSTD flags set (flags {flags:#x})")]
    AmbiguousCompression { arch: u32, flags: u64 },
    #[error(
        "PTX for arch {arch}: compressed size {compressed} does not fit the payload of {payload} bytes"
    )]
    CompressedSize {
        arch: u32,
        compressed: u32,
        payload: usize,
    },
    #[error("PTX for arch {arch}: declared size {size} exceeds the limit of {limit} bytes", limit = crate::MAX_PTX_SIZE)]
    PtxTooLarge { arch: u32, size: u64 },
    #[error("PTX for arch {arch}: {codec} decompression failed: {reason}")]
    Decompress {
        arch: u32,
        codec: &'static str,
        reason: String,
    },
    #[error("PTX for arch {arch}: decompressed to {got} bytes, the entry declares {declared}")]
    SizeMismatch { arch: u32, got: u64, declared: u64 },
    #[error("PTX text is not ASCII/UTF-8 (byte offset {0})")]
    NotText(usize),
    #[error("PTX text has no terminating NUL within {0} bytes")]
    Unterminated(usize),
}
