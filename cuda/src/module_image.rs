//! The bytes a program hands to `cuModuleLoadData` (or a file for `cuModuleLoad`) → the PTX
//! text to load.
//!
//! Accepted: PTX text (NUL-terminated, as the driver API asks), and a fat binary (magic
//! `0xBA55ED50`, or the `0x466243B1` wrapper nvcc emits around one), parsed by `cuda-fatbin`:
//! the highest PTX entry the device accepts ([`PtxLimits`]), decompressed. ELF (a SASS-only
//! cubin) is refused: no PTX to run.

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
    #[error("fat binary: {0}")]
    Fatbin(String),
    /// A well-formed fat binary with no PTX the device runs (SASS only, or PTX too new).
    #[error("{0}")]
    NoUsablePtx(String),
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
            return from_fatbin_bytes(bytes, limits);
        }
    }
    let text = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
    let text = std::str::from_utf8(text).map_err(|_| ImageError::Unknown)?;
    if !text.contains(".version") && !text.contains(".entry") && !text.contains(".target") {
        return Err(ImageError::Unknown);
    }
    Ok(text.to_string())
}

/// The choice of PTX in a parsed fat binary, for `limits`.
fn choose(fb: &cuda_fatbin::Fatbin<'_>, limits: PtxLimits) -> Result<String, ImageError> {
    let isa = u16::try_from(limits.max_isa).unwrap_or(u16::MAX);
    let l = cuda_fatbin::Limits {
        max_arch: limits.max_arch,
        max_isa: cuda_fatbin::PtxIsa::new(isa / 10, isa % 10),
    };
    cuda_fatbin::choose_ptx(fb, l)
        .map(|c| c.text)
        .map_err(|e| match e {
            cuda_fatbin::ChooseError::NoUsablePtx { .. } => ImageError::NoUsablePtx(e.to_string()),
            cuda_fatbin::ChooseError::Entry(_) => ImageError::Fatbin(e.to_string()),
        })
}

fn fatbin_err(e: cuda_fatbin::FatbinError) -> ImageError {
    ImageError::Fatbin(e.to_string())
}

/// A fat binary (or a wrapper) in a buffer the library owns (a file's bytes): parsed inside
/// the buffer only; a wrapper's pointer into a program is meaningless in a file and refused.
fn from_fatbin_bytes(bytes: &[u8], limits: PtxLimits) -> Result<String, ImageError> {
    if cuda_fatbin::sniff(bytes) == cuda_fatbin::Sniff::Wrapper {
        return Err(ImageError::Fatbin(
            "a fat binary wrapper (it points into a program) is not a module file".into(),
        ));
    }
    let fb = cuda_fatbin::parse_fatbin(bytes).map_err(fatbin_err)?;
    choose(&fb, limits)
}

/// A fat binary, or the wrapper nvcc emits around one, at a program's pointer: the wrapper is
/// followed, the header read, then exactly the length it declares (capped by
/// `cuda_fatbin::MAX_FATBIN_SIZE`), parsed and the highest PTX the device runs decompressed.
fn from_fatbin(p: *const u8, limits: PtxLimits) -> Result<String, ImageError> {
    let mut p = p;
    // SAFETY: the caller read 4 bytes at `p` already (the magic).
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    if cuda_fatbin::sniff(head) == cuda_fatbin::Sniff::Wrapper {
        // SAFETY: a wrapper is WRAPPER_SIZE bytes (nvcc's `__fatBinC_Wrapper_t`, the program's
        // promise when it hands one over).
        let w = unsafe { std::slice::from_raw_parts(p, cuda_fatbin::WRAPPER_SIZE) };
        let w = cuda_fatbin::Wrapper::parse(w).map_err(fatbin_err)?;
        if w.data == 0 {
            return Err(ImageError::Null);
        }
        p = w.data as *const u8;
    }
    // SAFETY: a fat binary starts with its HEADER_PEEK-byte header.
    let peek = unsafe { std::slice::from_raw_parts(p, cuda_fatbin::HEADER_PEEK) };
    let len = cuda_fatbin::fatbin_len(peek).map_err(fatbin_err)?;
    // SAFETY: the header declares `len` bytes (bounded by fatbin_len); the program's fat binary
    // is that long.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    let fb = cuda_fatbin::parse_fatbin(bytes).map_err(fatbin_err)?;
    choose(&fb, limits)
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

    #[test]
    fn fat_binaries_give_their_best_ptx() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../cuda-fatbin/tests/fixtures/"
        );
        for f in ["zstd.fatbin", "lz4.fatbin", "raw.fatbin"] {
            let bytes = std::fs::read(format!("{dir}{f}")).unwrap();
            let ptx = ptx_from_bytes(&bytes, L).unwrap();
            assert!(
                ptx.contains(".entry") && ptx.contains(".version"),
                "{f}: {ptx}"
            );
            // The same bytes at a program's pointer.
            // SAFETY: a whole fat binary.
            assert_eq!(unsafe { ptx_from_ptr(bytes.as_ptr(), L) }.unwrap(), ptx);
            // A device that runs no PTX of these gets an error naming what was found.
            let none = PtxLimits {
                max_arch: 50,
                max_isa: 90,
            };
            let e = ptx_from_bytes(&bytes, none).unwrap_err();
            assert!(matches!(e, ImageError::NoUsablePtx(_)), "{f}: {e}");
            assert!(e.to_string().contains("compute_"), "{f}: {e}");
        }
    }
}
