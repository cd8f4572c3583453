//! CUDA fat binaries as nvcc 13 emits them: the `.nvFatBinSegment` wrapper, the fat binary's
//! entries (PTX or SASS), PTX decompression (LZ4, ZSTD), and the choice of the PTX a backend
//! can run. Every input is hostile: parsing is bounded and never panics.
//!
//! The layout (checked against nvcc 13.0's output in `tests/`):
//!
//! - the wrapper (`__fatBinC_Wrapper_t`, `include/fatbinary_section.h`), 24 bytes in
//!   `.nvFatBinSegment`: magic `0x466243B1`, version (1, or 2 for a prelinked one), a pointer to
//!   the fat binary (in `.nv_fatbin`), a pointer to a file name or prelinked fat binaries;
//! - the fat binary: a 16-byte header (magic `0xBA55ED50`, version u16, header size u16, size of
//!   the entries u64), then the entries, each a header (its own size in it: 64 bytes for SASS,
//!   80 for PTX in CUDA 13) and a payload;
//! - a PTX payload is raw text, an LZ4 block (flag `0x2000`) or a ZSTD frame (flag `0x8000`),
//!   decompressing to the text plus a NUL. nvcc strips comments and indentation from the PTX it
//!   puts there.
//!
//! A program hands the library a raw pointer; [`sniff`] and [`fatbin_len`] tell from the first
//! bytes how many to read, capped at [`MAX_FATBIN_SIZE`].

mod choose;
mod decompress;
mod entry;
mod error;
mod header;
mod image;
mod wrapper;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

pub use choose::{ChooseError, ChosenPtx, Found, Limits, choose_ptx, choose_ptx_in};
pub use decompress::{MAX_PTX_SIZE, ptx_text};
pub use entry::{Compression, Entry, EntryKind, Fatbin, PtxIsa, parse_fatbin};
pub use error::FatbinError;
pub use header::{FATBIN_MAGIC, FatbinHeader, HEADER_PEEK, MAX_FATBIN_SIZE, fatbin_len};
pub use image::{Image, MAX_PTX_TEXT, Sniff, parse_image, sniff};
pub use wrapper::{WRAPPER_MAGIC, WRAPPER_SIZE, Wrapper};
