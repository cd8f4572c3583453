//! PTX text out of an entry: raw, an LZ4 block or a ZSTD frame. Output is bounded by the
//! entry's declared size, itself capped at [`MAX_PTX_SIZE`].

use std::io::Read;

use crate::{Compression, Entry, EntryKind, FatbinError};

/// The largest PTX text accepted from one entry: 512 MiB.
pub const MAX_PTX_SIZE: u64 = 512 << 20;

/// The PTX text of a PTX entry, decompressed, up to its terminating NUL.
pub fn ptx_text(entry: &Entry<'_>) -> Result<String, FatbinError> {
    if entry.kind != EntryKind::Ptx {
        return Err(FatbinError::NotPtx { arch: entry.arch });
    }
    let arch = entry.arch;
    let bytes = match entry.compression()? {
        Compression::None => entry.payload.to_vec(),
        codec => {
            let declared = entry.uncompressed_size;
            if declared > MAX_PTX_SIZE {
                return Err(FatbinError::PtxTooLarge {
                    arch,
                    size: declared,
                });
            }
            let compressed = entry.compressed_size as usize;
            if compressed == 0 || compressed > entry.payload.len() {
                return Err(FatbinError::CompressedSize {
                    arch,
                    compressed: entry.compressed_size,
                    payload: entry.payload.len(),
                });
            }
            let input = &entry.payload[..compressed];
            // Bounded by MAX_PTX_SIZE above.
            let declared = declared as usize;
            let out = match codec {
                Compression::Lz4 => lz4(input, declared, arch)?,
                _ => zstd(input, declared, arch)?,
            };
            if out.len() != declared {
                return Err(FatbinError::SizeMismatch {
                    arch,
                    got: out.len() as u64,
                    declared: declared as u64,
                });
            }
            out
        }
    };
    into_text(bytes)
}

/// nvcc stores an LZ4 block (no frame): decompress into exactly the declared size.
fn lz4(input: &[u8], declared: usize, arch: u32) -> Result<Vec<u8>, FatbinError> {
    let mut out = vec![0u8; declared];
    let n =
        lz4_flex::block::decompress_into(input, &mut out).map_err(|e| FatbinError::Decompress {
            arch,
            codec: "LZ4",
            reason: e.to_string(),
        })?;
    out.truncate(n);
    Ok(out)
}

/// A ZSTD frame, read at most one byte past the declared size (so a longer output is caught
/// without decompressing all of it).
fn zstd(input: &[u8], declared: usize, arch: u32) -> Result<Vec<u8>, FatbinError> {
    let err = |reason: String| FatbinError::Decompress {
        arch,
        codec: "ZSTD",
        reason,
    };
    let decoder = ruzstd::decoding::StreamingDecoder::new(input).map_err(|e| err(e.to_string()))?;
    let mut out = Vec::new();
    decoder
        .take(declared as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| err(e.to_string()))?;
    Ok(out)
}

/// Cuts the text at its first NUL, as a C string (nvcc terminates the text with one, and the
/// payload's padding adds more), and checks the rest is UTF-8 (PTX is ASCII).
pub(crate) fn into_text(mut bytes: Vec<u8>) -> Result<String, FatbinError> {
    if let Some(nul) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(nul);
    }
    String::from_utf8(bytes).map_err(|e| FatbinError::NotText(e.utf8_error().valid_up_to()))
}
