//! The bytes a program hands to `cuModuleLoadData` (or a file for `cuModuleLoad`) → the PTX
//! text to load.
//!
//! Accepted now: PTX text (NUL-terminated, as the driver API asks). A fat binary (magic
//! `0xBA55ED50`, or the `0x466243B1` wrapper) is recognised and refused with a clear error
//! until the `cuda-fatbin` crate is merged: then [`from_fatbin`] picks the highest PTX entry
//! the device accepts. ELF (SASS-only cubin) is refused: no PTX to run.

use thiserror::Error;

/// Largest PTX text read from a program's pointer.
pub const MAX_PTX: usize = 64 << 20;

/// Why an image gives no PTX.
#[derive(Debug, Error, PartialEq)]
pub enum ImageError {
    #[error("a null image")]
    Null,
    #[error(
        "the image is a CUDA ELF (SASS only): no PTX to run; build with -gencode arch=compute_80,code=compute_80"
    )]
    Elf,
    #[error("fat binaries are not readable by this build yet: {0}")]
    Fatbin(String),
    #[error("the PTX text is not terminated within {MAX_PTX} bytes")]
    TooLong,
    #[error("the image is neither PTX text nor a fat binary")]
    Unknown,
}

/// What the device runs, for the choice of PTX in a fat binary (from `DeviceInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxLimits {
    /// Highest `compute_XX` (80 for compute_80).
    pub max_arch: u32,
    /// Highest PTX ISA, major*10+minor (90 for 9.0).
    pub max_isa: u32,
}

const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const WRAPPER_MAGIC: u32 = 0x4662_43B1;

/// PTX text from a program's image pointer.
///
/// # Safety
/// `p`, if not null, points to the program's image: PTX text with a NUL within [`MAX_PTX`]
/// bytes, a fat binary, or an ELF file (at least 4 readable bytes).
pub unsafe fn ptx_from_ptr(p: *const u8, limits: PtxLimits) -> Result<String, ImageError> {
    if p.is_null() {
        return Err(ImageError::Null);
    }
    // SAFETY: an image has at least its 4 magic bytes.
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if head == b"\x7fELF" {
        return Err(ImageError::Elf);
    }
    if magic == FATBIN_MAGIC || magic == WRAPPER_MAGIC {
        return from_fatbin(p, limits);
    }
    let mut len = 0;
    // SAFETY: text up to its NUL (the program's promise), bounded.
    while len < MAX_PTX && unsafe { *p.add(len) } != 0 {
        len += 1;
    }
    if len == MAX_PTX {
        return Err(ImageError::TooLong);
    }
    // SAFETY: `len` bytes were just read.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    ptx_from_bytes(bytes, limits)
}

/// PTX text from a whole file's bytes (`cuModuleLoad`).
pub fn ptx_from_bytes(bytes: &[u8], limits: PtxLimits) -> Result<String, ImageError> {
    if bytes.starts_with(b"\x7fELF") {
        return Err(ImageError::Elf);
    }
    if bytes.len() >= 4 {
        let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic == FATBIN_MAGIC || magic == WRAPPER_MAGIC {
            return from_fatbin(bytes.as_ptr(), limits);
        }
    }
    let text = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
    let text = std::str::from_utf8(text).map_err(|_| ImageError::Unknown)?;
    if !text.contains(".version") && !text.contains(".entry") && !text.contains(".target") {
        return Err(ImageError::Unknown);
    }
    Ok(text.to_string())
}

/// The boundary to `cuda-fatbin` (`fatbin_len` on the first bytes, `parse_image`, then
/// `choose_ptx` with `limits`: the highest PTX the device runs, decompressed): not merged yet.
fn from_fatbin(_p: *const u8, _limits: PtxLimits) -> Result<String, ImageError> {
    Err(ImageError::Fatbin(
        "the cuda-fatbin crate is not merged into this library yet".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: PtxLimits = PtxLimits {
        max_arch: 90,
        max_isa: 90,
    };

    #[test]
    fn text_elf_and_fatbin_are_told_apart() {
        let t = b".version 8.0\n.target sm_80\n\0junk";
        // SAFETY: a NUL-terminated buffer.
        let text = unsafe { ptx_from_ptr(t.as_ptr(), L) }.unwrap();
        assert_eq!(text, ".version 8.0\n.target sm_80\n");
        assert_eq!(ptx_from_bytes(b"\x7fELF\x02\x01", L), Err(ImageError::Elf));
        let fb = 0xBA55_ED50u32.to_le_bytes();
        assert!(matches!(ptx_from_bytes(&fb, L), Err(ImageError::Fatbin(_))));
        assert_eq!(ptx_from_bytes(b"hello\0", L), Err(ImageError::Unknown));
        // SAFETY: null is checked.
        let null = unsafe { ptx_from_ptr(std::ptr::null(), L) };
        assert_eq!(null, Err(ImageError::Null));
    }
}
