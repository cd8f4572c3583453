//! The snapshot state file's container: the project's one container ([`snapfmt`]) with magic
//! `VGVMSNAP`, this build's format version, and one versioned, CRC-32-checked section per VM
//! part, vCPU and device; plus the bounds-checked reader the section decoders use (a thin
//! layer over [`snapfmt::Dec`] that also reads KVM structures). Nothing here trusts the file:
//! every length is checked against what is left and against fixed limits before anything is
//! allocated.

use snapfmt::{Dec, FrameError, Id};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// The state file's container.
pub const FORMAT: snapfmt::Format = snapfmt::Format {
    magic: *b"VGVMSNAP",
    version: VERSION,
    name: "vgpu-vmm snapshot state file",
};
/// The format version this build writes and reads (also in the manifest).
/// 2: live snapshots (`gpu_live`, `vram.bin`) and the migration stream's VRAM frames.
/// 3: the state file, `gpu.bin` and the saved contexts in the common container (`snapfmt`:
/// four-byte section ids, section versions, an end section).
pub const VERSION: u32 = 3;
/// Largest state file accepted (the GPU's state goes to a file of its own).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
/// Most sections accepted in one file.
pub const MAX_SECTIONS: usize = 1024;

/// Section ids, in the order they appear in the file.
pub mod tag {
    use snapfmt::Id;

    /// VM-wide KVM state: PIC master and slave, IOAPIC, PIT, KVM clock.
    pub const VM: Id = *b"VM\0\0";
    /// One vCPU (one section each).
    pub const VCPU: Id = *b"VCPU";
    /// The 8250 UART.
    pub const SERIAL: Id = *b"UART";
    /// The CMOS index register (Linux boots only).
    pub const CMOS: Id = *b"CMOS";
    /// The PCI root complex and every function's configuration space.
    pub const PCI: Id = *b"PCI\0";
    /// The PCI test device's registers (with `--testdev`).
    pub const TESTDEV: Id = *b"TDEV";
    /// One virtio-blk disk's device state (one section each, in the manifest's order;
    /// `crate::disk::state`).
    pub const DISK: Id = *b"DISK";
    /// Every id, in file order.
    pub const ORDER: [Id; 7] = [VM, VCPU, SERIAL, CMOS, PCI, TESTDEV, DISK];
}

/// Why a state file does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("state file is {0} bytes, more than the {MAX_STATE_BYTES} accepted")]
    TooLarge(u64),
    #[error("unknown section {0}")]
    UnknownTag(String),
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

/// One section as read from the file (checksum already verified).
pub type Section<'a> = snapfmt::Section<'a>;

/// Builds a state file in memory.
#[derive(Debug)]
pub struct FileWriter(snapfmt::Writer);

impl Default for FileWriter {
    fn default() -> Self {
        FileWriter(snapfmt::Writer::new(&FORMAT))
    }
}

impl FileWriter {
    /// Appends a section.
    pub fn section(&mut self, id: Id, version: u32, payload: &[u8]) {
        self.0.section(id, version, payload);
    }

    /// The file's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.0.finish()
    }
}

/// Splits a state file into its sections, checking magic, version, lengths and checksums.
pub fn sections(file: &[u8]) -> Result<Vec<Section<'_>>, DecodeError> {
    if file.len() as u64 > MAX_STATE_BYTES {
        return Err(DecodeError::TooLarge(file.len() as u64));
    }
    Ok(snapfmt::read(&FORMAT, file, MAX_SECTIONS)?)
}

/// A bounds-checked little-endian reader over a section's payload; each read names what it
/// reads (for its error).
#[derive(Debug)]
pub struct Reader<'a>(Dec<'a>);

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader(Dec::new(buf, "state"))
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        Ok(self.0.at(what).take(n)?)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.0.at(what).u8()?)
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(self.0.at(what).u32()?)
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
        Ok(self.0.at(what).count(max as usize, item_len)? as u32)
    }

    /// Fails unless everything was read.
    pub fn end(&mut self, what: &'static str) -> Result<(), DecodeError> {
        Ok(self.0.at(what).end()?)
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
        w.section(tag::VM, 1, &[1, 2, 3]);
        w.section(tag::SERIAL, 1, &[]);
        w.finish()
    }

    #[test]
    fn round_trip() {
        let f = file();
        let s = sections(&f).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].id, s[0].payload), (tag::VM, &[1u8, 2, 3][..]));
        assert_eq!((s[1].id, s[1].payload.len()), (tag::SERIAL, 0));
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
        assert_eq!(
            sections(&g).unwrap_err(),
            DecodeError::Frame(FrameError::Trailing)
        );
        let mut g = f.clone();
        g[8] = VERSION as u8 + 1;
        assert_eq!(
            sections(&g).unwrap_err().to_string(),
            format!(
                "vgpu-vmm snapshot state file format version {}; this build reads version \
                 {VERSION}",
                VERSION + 1
            )
        );
        // An absurd length is refused before anything is allocated.
        let mut g = f[..snapfmt::HEADER + 8].to_vec();
        g.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            sections(&g).unwrap_err(),
            DecodeError::Frame(FrameError::Truncated { .. })
        ));
    }

    /// A version-2 state file (the format before the common container: u32 tags, a section
    /// count, no end section) is refused naming its version.
    #[test]
    fn a_version_2_file_is_refused_naming_its_version() {
        let mut old = b"VGVMSNAP".to_vec();
        old.extend_from_slice(&2u32.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&0u64.to_le_bytes());
        old.extend_from_slice(&0u32.to_le_bytes());
        let e = sections(&old).unwrap_err().to_string();
        assert_eq!(
            e,
            "vgpu-vmm snapshot state file format version 2; this build reads version 3"
        );
    }
}
