//! What `cuModuleLoadData` and `__cudaRegisterFatBinary` may be handed: a fat binary, a
//! wrapper pointing to one, or PTX text (NUL-terminated). [`sniff`] tells which from the first
//! bytes, so a library reading from a raw pointer knows how much to read next.

use crate::{FATBIN_MAGIC, Fatbin, FatbinError, WRAPPER_MAGIC, Wrapper, parse_fatbin};

/// The longest PTX text accepted as an image (a library scanning a C string for its NUL stops
/// here): 512 MiB, as for PTX out of a fat binary.
pub const MAX_PTX_TEXT: usize = crate::MAX_PTX_SIZE as usize;

/// What an image's first four bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniff {
    /// A fat binary: read [`crate::HEADER_PEEK`] bytes, then [`crate::fatbin_len`] of them.
    Fatbin,
    /// A wrapper: read [`crate::WRAPPER_SIZE`] bytes and follow [`Wrapper::data`].
    Wrapper,
    /// Anything else is taken as PTX text, read up to its NUL (at most [`MAX_PTX_TEXT`]).
    Text,
}

/// Classifies an image by its first four bytes (fewer give [`Sniff::Text`]).
pub fn sniff(first: &[u8]) -> Sniff {
    match first
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    {
        Some(FATBIN_MAGIC) => Sniff::Fatbin,
        Some(WRAPPER_MAGIC) => Sniff::Wrapper,
        _ => Sniff::Text,
    }
}

/// A parsed image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image<'a> {
    Fatbin(Fatbin<'a>),
    /// The caller follows `data` (an address in the program) and parses what it points to.
    Wrapper(Wrapper),
    /// PTX text, cut at its NUL.
    Ptx(&'a str),
}

/// Parses an image: a fat binary, a wrapper, or PTX text (cut at the first NUL if any).
pub fn parse_image(bytes: &[u8]) -> Result<Image<'_>, FatbinError> {
    match sniff(bytes) {
        Sniff::Fatbin => parse_fatbin(bytes).map(Image::Fatbin),
        Sniff::Wrapper => Wrapper::parse(bytes).map(Image::Wrapper),
        Sniff::Text => {
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            if end > MAX_PTX_TEXT {
                return Err(FatbinError::Unterminated(MAX_PTX_TEXT));
            }
            std::str::from_utf8(&bytes[..end])
                .map(Image::Ptx)
                .map_err(|e| FatbinError::NotText(e.valid_up_to()))
        }
    }
}
