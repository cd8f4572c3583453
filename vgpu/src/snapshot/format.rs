//! The snapshot byte format's framing (docs/snapshot.md, "Virtual GPU"): the project's one
//! container ([`snapfmt`], magic `VGPUSNAP`) streamed, its sections in their fixed order, each
//! with its CRC-32 checked as its last byte is read; and a cursor that decodes a section's
//! payload as hostile bytes ([`snapfmt::Dec`] with this module's errors).

use std::io::{Read, Write};

use snapfmt::{FrameError, StreamError};

use super::SnapshotError;

/// The first bytes of a virtual GPU snapshot.
pub const MAGIC: &[u8; 8] = b"VGPUSNAP";
/// The format version this build writes and reads (2: the `PARA` section of para-virtual GPUs
/// and the `VDLT` section of live snapshots; 3: the common container, `snapfmt`: section
/// versions, a CRC-32 per section instead of one checksum over the file).
pub const VERSION: u32 = 3;
/// The container.
pub const FORMAT: snapfmt::Format = snapfmt::Format {
    magic: *MAGIC,
    version: VERSION,
    name: "virtual GPU snapshot",
};
/// The version of every section (their layouts are those of format version 2).
pub const SECTION_VERSION: u32 = 1;

/// Section tags, in the order they appear.
pub const CONF: [u8; 4] = *b"CONF";
pub const REGS: [u8; 4] = *b"REGS";
pub const CHAN: [u8; 4] = *b"CHAN";
pub const MODS: [u8; 4] = *b"MODS";
pub const CTXT: [u8; 4] = *b"CTXT";
pub const PARA: [u8; 4] = *b"PARA";
pub const VRAM: [u8; 4] = *b"VRAM";
/// In place of `VRAM` in the image of a live snapshot: the pages written since the last
/// pre-copy round, over the pre-copied VRAM (`snapshot::live`).
pub const VDLT: [u8; 4] = *b"VDLT";
pub const END: [u8; 4] = snapfmt::END;

/// A section tag as text (for errors).
pub fn tag_name(tag: [u8; 4]) -> String {
    snapfmt::id_name(tag)
}

impl From<StreamError> for SnapshotError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::Io(e) => SnapshotError::Io(e),
            StreamError::Frame(f) => f.into(),
        }
    }
}

impl From<FrameError> for SnapshotError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Magic { .. } => SnapshotError::BadMagic,
            FrameError::Version { found, .. } => SnapshotError::Version(found),
            FrameError::Truncated { what } => SnapshotError::Truncated(what),
            FrameError::Checksum { .. } => SnapshotError::Checksum,
            FrameError::Section { expected, found } => SnapshotError::Section { expected, found },
            FrameError::SectionVersion { id, found, want } => SnapshotError::SectionVersion {
                tag: id,
                found,
                want,
            },
            FrameError::TooLarge { id, len, limit } => SnapshotError::SectionTooLarge {
                tag: id,
                len,
                limit,
            },
            FrameError::Trailing => SnapshotError::Trailing,
            FrameError::TooManySections(n) => SnapshotError::Invalid {
                section: "the image",
                what: format!("more than {n} sections"),
            },
            FrameError::Invalid { what, detail } => SnapshotError::Invalid {
                section: what,
                what: detail,
            },
        }
    }
}

/// Writes the snapshot: each section's CRC-32 follows its last byte.
pub struct SnapWriter<'a>(snapfmt::StreamWriter<'a>);

impl<'a> SnapWriter<'a> {
    pub fn new(out: &'a mut dyn Write) -> Result<Self, SnapshotError> {
        Ok(SnapWriter(snapfmt::StreamWriter::new(out, &FORMAT)?))
    }

    /// Payload bytes of the section begun with [`SnapWriter::header`].
    pub fn raw(&mut self, b: &[u8]) -> Result<(), SnapshotError> {
        Ok(self.0.raw(b)?)
    }

    /// A section header: tag and payload length (then exactly that many bytes of `raw`).
    pub fn header(&mut self, tag: [u8; 4], len: u64) -> Result<(), SnapshotError> {
        Ok(self.0.header(tag, SECTION_VERSION, len)?)
    }

    /// A whole section.
    pub fn section(&mut self, tag: [u8; 4], payload: &[u8]) -> Result<(), SnapshotError> {
        Ok(self.0.section(tag, SECTION_VERSION, payload)?)
    }

    /// Payload bytes with their CRC computed by the caller (in lanes).
    pub fn raw_hashed(&mut self, b: &[u8], crc: snapfmt::Crc) -> Result<(), SnapshotError> {
        Ok(self.0.raw_hashed(b, crc)?)
    }

    /// Payload bytes the caller wrote itself at the current offset, with their CRC.
    pub fn skip_hashed(&mut self, crc: snapfmt::Crc) -> Result<(), SnapshotError> {
        Ok(self.0.skip_hashed(crc)?)
    }

    /// The end section, then flush; returns the bytes written.
    pub fn finish(self) -> Result<u64, SnapshotError> {
        Ok(self.0.finish()?)
    }

    /// As [`SnapWriter::finish`], returning the CRC-32 of the whole snapshot and its length.
    pub fn finish_total(self) -> Result<snapfmt::Crc, SnapshotError> {
        Ok(self.0.finish_total()?)
    }
}

/// Reads a snapshot; never reads more than a section announces.
pub struct SnapReader<'a>(snapfmt::StreamReader<'a>);

impl<'a> SnapReader<'a> {
    /// Reads and checks the header.
    pub fn new(input: &'a mut dyn Read) -> Result<Self, SnapshotError> {
        Ok(SnapReader(snapfmt::StreamReader::new(input, &FORMAT)?))
    }

    /// Fills `buf` from the current section (end of input: `Truncated(what)`).
    pub fn exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), SnapshotError> {
        Ok(self.0.exact(buf, what)?)
    }

    /// The next section's header, which must be `tag`, and its length (at most `limit`).
    pub fn header(&mut self, tag: [u8; 4], limit: u64) -> Result<u64, SnapshotError> {
        Ok(self.0.header(tag, SECTION_VERSION, limit)?)
    }

    /// A whole section of at most `limit` bytes.
    pub fn section(&mut self, tag: [u8; 4], limit: u64) -> Result<Vec<u8>, SnapshotError> {
        Ok(self.0.section(tag, SECTION_VERSION, limit)?)
    }

    /// Fills `buf` from the current section; its CRC comes later ([`SnapReader::hashed`]).
    pub fn exact_deferred(
        &mut self,
        buf: &mut [u8],
        what: &'static str,
    ) -> Result<(), SnapshotError> {
        Ok(self.0.exact_deferred(buf, what)?)
    }

    /// Counts `n` bytes of the current section the caller read itself; CRC later.
    pub fn skip_deferred(&mut self, n: u64, what: &'static str) -> Result<(), SnapshotError> {
        Ok(self.0.skip_deferred(n, what)?)
    }

    /// The CRC of the next deferred bytes.
    pub fn hashed(&mut self, crc: snapfmt::Crc) -> Result<(), SnapshotError> {
        Ok(self.0.hashed(crc)?)
    }

    /// The end section, and nothing after it.
    pub fn finish(self) -> Result<(), SnapshotError> {
        Ok(self.0.finish()?)
    }

    /// As [`SnapReader::finish`], returning the CRC-32 of the whole snapshot and its length.
    pub fn finish_total(self) -> Result<snapfmt::Crc, SnapshotError> {
        Ok(self.0.finish_total()?)
    }
}

/// Little-endian encoder of a section's payload.
pub use snapfmt::Enc;

/// Decoder of a hostile section payload: [`snapfmt::Dec`] with errors naming the section.
pub struct Dec<'a> {
    d: snapfmt::Dec<'a>,
    section: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(b: &'a [u8], section: &'static str) -> Self {
        Dec {
            d: snapfmt::Dec::new(b, section),
            section,
        }
    }

    /// An `Invalid` error of this section.
    pub fn bad(&self, what: impl Into<String>) -> SnapshotError {
        SnapshotError::Invalid {
            section: self.section,
            what: what.into(),
        }
    }

    fn map(&self, e: FrameError) -> SnapshotError {
        match e {
            FrameError::Invalid { detail, .. } => self.bad(detail),
            _ => SnapshotError::Truncated(self.section),
        }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        self.d.take(n).map_err(|e| self.map(e))
    }
    pub fn u8(&mut self) -> Result<u8, SnapshotError> {
        self.d.u8().map_err(|e| self.map(e))
    }
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.d.u32().map_err(|e| self.map(e))
    }
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.d.u64().map_err(|e| self.map(e))
    }
    pub fn bool(&mut self) -> Result<bool, SnapshotError> {
        self.d.bool().map_err(|e| self.map(e))
    }
    /// Length (u32, at most `max`) and bytes.
    pub fn bytes(&mut self, max: usize, what: &str) -> Result<&'a [u8], SnapshotError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.bad(format!("{what} of {n} bytes (at most {max})")));
        }
        self.take(n)
    }
    /// A count (u32) of items of at least `item` bytes each, at most `max`.
    pub fn count(&mut self, max: usize, item: usize, what: &str) -> Result<usize, SnapshotError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(item) > self.d.left() {
            return Err(self.bad(format!("{n} {what} (at most {max})")));
        }
        Ok(n)
    }
    /// Length (u32, at most `max`) and bytes, copied.
    pub fn clone_bytes(&mut self, max: usize, what: &str) -> Result<Vec<u8>, SnapshotError> {
        Ok(self.bytes(max, what)?.to_vec())
    }
    /// Length (u32, at most `max`) and UTF-8 text.
    pub fn string(&mut self, max: usize, what: &str) -> Result<String, SnapshotError> {
        let b = self.bytes(max, what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.bad(format!("{what} is not UTF-8"))),
        }
    }

    /// Requires the payload to be used up.
    pub fn end(&self) -> Result<(), SnapshotError> {
        match self.d.left() {
            0 => Ok(()),
            n => Err(self.bad(format!("{n} trailing bytes"))),
        }
    }
}

/// A snapshot's sections as `(tag, payload)`, without the end section, if the framing holds
/// (tooling: the tests and the fuzz harness edit sections and reassemble).
pub fn split_sections(snap: &[u8]) -> Option<Vec<([u8; 4], Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = snapfmt::HEADER;
    loop {
        let head = snap.get(at..at.checked_add(16)?)?;
        let tag: [u8; 4] = head[..4].try_into().ok()?;
        if tag == END {
            return Some(out);
        }
        let len = usize::try_from(u64::from_le_bytes(head[8..].try_into().ok()?)).ok()?;
        let body = snap.get(at + 16..(at + 16).checked_add(len)?)?;
        out.push((tag, body.to_vec()));
        at += 16 + len + 4;
    }
}

/// A snapshot of format `version` from sections, with valid checksums and end section.
pub fn assemble(version: u32, sections: &[([u8; 4], Vec<u8>)]) -> Vec<u8> {
    let f = snapfmt::Format { version, ..FORMAT };
    let mut w = snapfmt::Writer::new(&f);
    for (tag, p) in sections {
        w.section(*tag, SECTION_VERSION, p);
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_split_and_reassemble() {
        let secs = vec![(CONF, vec![1, 2, 3]), (REGS, Vec::new())];
        let snap = assemble(VERSION, &secs);
        assert_eq!(split_sections(&snap), Some(secs));
        assert_eq!(split_sections(&snap[..snap.len() - 21]), None);
        // What the streamed writer writes is what `assemble` builds.
        let mut out = Vec::new();
        let mut w = SnapWriter::new(&mut out).unwrap();
        w.section(CONF, &[1, 2, 3]).unwrap();
        w.header(REGS, 0).unwrap();
        let n = w.finish().unwrap();
        assert_eq!((out, n), (snap.clone(), snap.len() as u64));
    }

    /// A version-2 image (FNV checksum over the file, sections without versions) is refused
    /// by its number; a section of another version by its tag and number.
    #[test]
    fn old_images_and_other_section_versions_are_refused() {
        let mut old = MAGIC.to_vec();
        old.extend_from_slice(&2u32.to_le_bytes());
        old.extend_from_slice(&CONF);
        old.extend_from_slice(&0u64.to_le_bytes());
        let e = SnapReader::new(&mut &old[..]).err().unwrap();
        assert!(matches!(e, SnapshotError::Version(2)), "{e}");
        assert_eq!(
            e.to_string(),
            "snapshot format version 2; this build reads version 3"
        );
        let mut w = snapfmt::Writer::new(&FORMAT);
        w.section(CONF, SECTION_VERSION + 1, &[]);
        let b = w.finish();
        let mut input = &b[..];
        let mut r = SnapReader::new(&mut input).unwrap();
        let e = r.section(CONF, 16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "section CONF is version 2; this build reads version 1"
        );
    }
}
