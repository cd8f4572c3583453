//! The snapshot state file's container: a header (magic, format version, section count) and
//! length-prefixed sections, each with a CRC-32 over its tag, length and payload; plus the
//! bounds-checked byte reader the section decoders use. Nothing here trusts the file: every
//! length is checked against what is left and against fixed limits before anything is
//! allocated.

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// The file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"VGVMSNAP";
/// The format version this build writes and reads (also in the manifest).
/// 2: live snapshots (`gpu_live`, `vram.bin`) and the migration stream's VRAM frames.
pub const VERSION: u32 = 2;
/// Largest state file accepted (the GPU's state goes to a file of its own).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
/// Most sections accepted in one file.
pub const MAX_SECTIONS: u32 = 1024;

/// Bytes of the header: magic, version, section count.
const HEADER: usize = 8 + 4 + 4;

/// Section tags.
pub mod tag {
    /// VM-wide KVM state: PIC master and slave, IOAPIC, PIT, KVM clock.
    pub const VM: u32 = 1;
    /// One vCPU (one section each).
    pub const VCPU: u32 = 2;
    /// The 8250 UART.
    pub const SERIAL: u32 = 3;
    /// The CMOS index register (Linux boots only).
    pub const CMOS: u32 = 4;
    /// The PCI root complex and every function's configuration space.
    pub const PCI: u32 = 5;
    /// The PCI test device's registers (with `--testdev`).
    pub const TESTDEV: u32 = 6;
    /// One virtio-blk disk's device state (one section each, in the manifest's order;
    /// `crate::disk::state`).
    pub const DISK: u32 = 7;
}

/// Why a state file does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not a vgpu-vmm snapshot state file (bad magic)")]
    Magic,
    #[error("state file format version {found}, this build reads version {VERSION}")]
    Version { found: u32 },
    #[error("state file truncated: {what} needs {need} bytes at offset {at}, {left} left")]
    Truncated {
        what: &'static str,
        at: usize,
        need: u64,
        left: usize,
    },
    #[error("state file is {0} bytes, more than the {MAX_STATE_BYTES} accepted")]
    TooLarge(u64),
    #[error("state file has {0} sections, more than the {MAX_SECTIONS} accepted")]
    TooManySections(u32),
    #[error(
        "section {index} (tag {tag}) is corrupted: CRC-32 {found:#010x}, expected {want:#010x}"
    )]
    Checksum {
        index: u32,
        tag: u32,
        found: u32,
        want: u32,
    },
    #[error("{0} trailing bytes after the last section")]
    Trailing(usize),
    #[error("unknown section tag {0}")]
    UnknownTag(u32),
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

/// One section as read from the file (checksum already verified).
#[derive(Debug, Clone, Copy)]
pub struct Section<'a> {
    pub tag: u32,
    pub payload: &'a [u8],
}

fn crc(tag: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&tag.to_le_bytes());
    h.update(&(payload.len() as u64).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Builds a state file in memory.
#[derive(Debug, Default)]
pub struct FileWriter {
    sections: Vec<(u32, Vec<u8>)>,
}

impl FileWriter {
    /// Appends a section.
    pub fn section(&mut self, tag: u32, payload: Vec<u8>) {
        self.sections.push((tag, payload));
    }

    /// The file's bytes.
    pub fn finish(self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.sections.len() as u32).to_le_bytes());
        for (tag, payload) in &self.sections {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            out.extend_from_slice(payload);
            out.extend_from_slice(&crc(*tag, payload).to_le_bytes());
        }
        out
    }
}

/// Splits a state file into its sections, checking magic, version, lengths and checksums.
pub fn sections(file: &[u8]) -> Result<Vec<Section<'_>>, DecodeError> {
    if file.len() as u64 > MAX_STATE_BYTES {
        return Err(DecodeError::TooLarge(file.len() as u64));
    }
    let mut r = Reader::new(file);
    if r.bytes("magic", 8)? != MAGIC {
        return Err(DecodeError::Magic);
    }
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(DecodeError::Version { found: version });
    }
    let count = r.u32("section count")?;
    if count > MAX_SECTIONS {
        return Err(DecodeError::TooManySections(count));
    }
    debug_assert_eq!(r.pos, HEADER);
    let mut out = Vec::new();
    for index in 0..count {
        let tag = r.u32("section tag")?;
        let len = r.u64("section length")?;
        let payload = r.bytes_u64("section payload", len)?;
        let want = r.u32("section checksum")?;
        let found = crc(tag, payload);
        if found != want {
            return Err(DecodeError::Checksum {
                index,
                tag,
                found,
                want,
            });
        }
        out.push(Section { tag, payload });
    }
    if r.left() != 0 {
        return Err(DecodeError::Trailing(r.left()));
    }
    Ok(out)
}

/// A bounds-checked little-endian reader over a byte slice.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        self.bytes_u64(what, n as u64)
    }

    fn bytes_u64(&mut self, what: &'static str, n: u64) -> Result<&'a [u8], DecodeError> {
        if n > self.left() as u64 {
            return Err(DecodeError::Truncated {
                what,
                at: self.pos,
                need: n,
                left: self.left(),
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.bytes(what, 1)?[0])
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.bytes(what, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(what, 8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A plain-old-data KVM structure, byte for byte as KVM gave it.
    pub fn pod<T: FromBytes>(&mut self, what: &'static str) -> Result<T, DecodeError> {
        let b = self.bytes(what, std::mem::size_of::<T>())?;
        T::read_from_bytes(b).map_err(|_| DecodeError::Invalid {
            what,
            detail: "wrong size".into(),
        })
    }

    /// A count followed by that many items of `item_len` bytes, refused above `max`.
    pub fn count(
        &mut self,
        what: &'static str,
        item_len: usize,
        max: u32,
    ) -> Result<u32, DecodeError> {
        let n = self.u32(what)?;
        if n > max {
            return Err(DecodeError::Invalid {
                what,
                detail: format!("{n} entries, at most {max} accepted"),
            });
        }
        let need = u64::from(n) * item_len as u64;
        if need > self.left() as u64 {
            return Err(DecodeError::Truncated {
                what,
                at: self.pos,
                need,
                left: self.left(),
            });
        }
        Ok(n)
    }

    /// Fails unless everything was read.
    pub fn end(&self, what: &'static str) -> Result<(), DecodeError> {
        if self.left() == 0 {
            Ok(())
        } else {
            Err(DecodeError::Invalid {
                what,
                detail: format!("{} unexpected bytes at the end", self.left()),
            })
        }
    }
}

/// Appends `T`'s bytes.
pub fn put_pod<T: IntoBytes + Immutable>(out: &mut Vec<u8>, v: &T) {
    out.extend_from_slice(v.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Vec<u8> {
        let mut w = FileWriter::default();
        w.section(tag::VM, vec![1, 2, 3]);
        w.section(tag::SERIAL, vec![]);
        w.finish()
    }

    #[test]
    fn round_trip() {
        let f = file();
        let s = sections(&f).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].tag, s[0].payload), (tag::VM, &[1u8, 2, 3][..]));
        assert_eq!((s[1].tag, s[1].payload.len()), (tag::SERIAL, 0));
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let f = file();
        for n in 0..f.len() {
            assert!(sections(&f[..n]).is_err(), "truncated to {n}");
        }
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x40;
            assert!(sections(&g).is_err(), "byte {i} flipped");
        }
        let mut g = f.clone();
        g.push(0);
        assert_eq!(sections(&g).unwrap_err(), DecodeError::Trailing(1));
        let mut g = f.clone();
        g[8] = VERSION as u8 + 1;
        assert_eq!(
            sections(&g).unwrap_err(),
            DecodeError::Version { found: VERSION + 1 }
        );
        // An absurd length is refused before anything is allocated.
        let mut g = f[..HEADER + 4].to_vec();
        g.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            sections(&g).unwrap_err(),
            DecodeError::Truncated { .. }
        ));
    }
}
