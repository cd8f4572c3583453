//! The one container every saved state of the project uses (docs/snapshot.md, "Formats"): the
//! VM snapshot's state file, the virtual GPU's image, the engines' saved contexts and the PTX
//! interpreter's. A leaf crate (no project dependency) so that `ptx`, `pgpu`, `vgpu` and `vmm`
//! all use it without a cycle.
//!
//! Layout, little endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | magic (names the format) |
//! | 4 | format version |
//! | per section: 4 | id (four bytes, e.g. `b"VRAM"`) |
//! | 4 | section version |
//! | 8 | payload length |
//! | n | payload |
//! | 4 | CRC-32 (IEEE) over id, version, length and payload |
//! | last: 20 | the end section: id `END\0`, version 0, length 0, its CRC-32 |
//!
//! Nothing may follow the end section. Readers treat every byte as hostile: a length is checked
//! against what is left and against the caller's limit before anything is allocated, a CRC is
//! checked before a payload is handed out (in memory) or as its last byte is read (streamed), and
//! a wrong magic, format version or section version is refused naming both versions.
//!
//! - [`container`]: a whole container in memory ([`Writer`], [`read`]);
//! - [`stream`]: the same bytes written and read through `std::io` without holding them
//!   ([`StreamWriter`], [`StreamReader`]), for images with their VRAM;
//! - [`dec`]: the bounded payload reader ([`Dec`]) and writer ([`Enc`]) the section codecs use;
//! - [`crc`]: CRC-32 values that combine ([`Crc`]), so that a large payload is checksummed in
//!   lanes on several threads and still carries the one CRC-32 of its section.

pub mod container;
pub mod crc;
pub mod dec;
pub mod stream;

pub use container::{Section, Writer, read};
pub use crc::Crc;
pub use dec::{Dec, Enc};
pub use stream::{StreamError, StreamReader, StreamWriter};

/// A section id: four bytes, printable by convention.
pub type Id = [u8; 4];

/// The end section's id.
pub const END: Id = *b"END\0";

/// Bytes of the container header (magic, version).
pub const HEADER: usize = 12;
/// Bytes around a section's payload (id, version, length before; CRC-32 after).
pub const SECTION_OVERHEAD: u64 = 4 + 4 + 8 + 4;

/// What a container is: its magic, the version this build writes and reads, and a name for
/// errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub magic: [u8; 8],
    pub version: u32,
    pub name: &'static str,
}

/// An id as text (for errors): printable bytes as they are, others escaped.
pub fn id_name(id: Id) -> String {
    id.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                char::from(b).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// Why bytes are not a valid container (or a payload not a valid section).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a {format} (bad magic)")]
    Magic { format: &'static str },
    #[error("{format} format version {found}; this build reads version {want}")]
    Version {
        format: &'static str,
        found: u32,
        want: u32,
    },
    #[error("truncated: {what}")]
    Truncated { what: &'static str },
    #[error("section {id} is corrupted: CRC-32 {found:#010x}, expected {want:#010x}")]
    Checksum { id: String, found: u32, want: u32 },
    #[error("section {found} where {expected} was due")]
    Section { expected: String, found: String },
    #[error("section {id} version {found}; this build reads version {want}")]
    SectionVersion { id: String, found: u32, want: u32 },
    #[error("section {id} of {len} bytes, more than the {limit} accepted")]
    TooLarge { id: String, len: u64, limit: u64 },
    #[error("more than {0} sections")]
    TooManySections(usize),
    #[error("bytes after the end section")]
    Trailing,
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

fn section_crc(id: Id, version: u32, len: u64) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new();
    h.update(&id);
    h.update(&version.to_le_bytes());
    h.update(&len.to_le_bytes());
    h
}

fn header_bytes(f: &Format) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&f.magic);
    h[8..].copy_from_slice(&f.version.to_le_bytes());
    h
}

/// Checks a container header.
fn check_header(f: &Format, h: &[u8; HEADER]) -> Result<(), FrameError> {
    if h[..8] != f.magic {
        return Err(FrameError::Magic { format: f.name });
    }
    let found = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if found != f.version {
        return Err(FrameError::Version {
            format: f.name,
            found,
            want: f.version,
        });
    }
    Ok(())
}

/// Splits a section header (id, version, length).
fn split_head(h: &[u8; 16]) -> (Id, u32, u64) {
    let id = [h[0], h[1], h[2], h[3]];
    let version = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&h[8..]);
    (id, version, u64::from_le_bytes(l))
}

/// Section version check shared by both readers.
fn check_version(id: Id, found: u32, want: u32) -> Result<(), FrameError> {
    if found != want {
        return Err(FrameError::SectionVersion {
            id: id_name(id),
            found,
            want,
        });
    }
    Ok(())
}
