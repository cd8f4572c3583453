//! The snapshot byte format's framing (docs/snapshot.md, "Virtual GPU"): the header, the
//! length-prefixed sections in their fixed order, the checksum over everything before the
//! end section, and a cursor that decodes a section's payload as hostile bytes.

use std::io::{Read, Write};

use super::SnapshotError;

/// The first bytes of a virtual GPU snapshot.
pub const MAGIC: &[u8; 8] = b"VGPUSNAP";
/// The format version this build writes and reads (2: the `PARA` section of para-virtual GPUs
/// and the `VDLT` section of live snapshots).
pub const VERSION: u32 = 2;

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
pub const END: [u8; 4] = *b"END\0";

/// A section tag as text (for errors).
pub fn tag_name(tag: [u8; 4]) -> String {
    tag.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                char::from(b).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// The snapshot checksum: FNV-1a's prime over 64-bit little-endian words (the tail
/// zero-padded) with a xor-shift after each word, and the length folded in last. Catches
/// accidental corruption; a forged file is validated field by field anyway.
#[derive(Debug, Clone)]
pub struct Checksum {
    h: u64,
    pend: [u8; 8],
    n: usize,
    len: u64,
}

const PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for Checksum {
    fn default() -> Self {
        Checksum {
            h: 0xcbf2_9ce4_8422_2325,
            pend: [0; 8],
            n: 0,
            len: 0,
        }
    }
}

impl Checksum {
    fn word(&mut self, w: u64) {
        let h = (self.h ^ w).wrapping_mul(PRIME);
        self.h = h ^ (h >> 29);
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.n > 0 {
            let k = (8 - self.n).min(data.len());
            self.pend[self.n..self.n + k].copy_from_slice(&data[..k]);
            self.n += k;
            data = &data[k..];
            if self.n < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.pend));
            self.n = 0;
        }
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().unwrap_or_default()));
        }
        let rest = words.remainder();
        self.pend[..rest.len()].copy_from_slice(rest);
        self.n = rest.len();
    }

    pub fn finish(&self) -> u64 {
        let mut c = self.clone();
        if c.n > 0 {
            c.pend[c.n..].fill(0);
            c.word(u64::from_le_bytes(c.pend));
        }
        c.word(c.len);
        c.h
    }
}

/// Writes the snapshot, checksumming every byte.
pub struct SnapWriter<'a> {
    out: &'a mut dyn Write,
    sum: Checksum,
    /// Bytes written.
    pub written: u64,
}

impl<'a> SnapWriter<'a> {
    pub fn new(out: &'a mut dyn Write) -> Result<Self, SnapshotError> {
        let mut w = SnapWriter {
            out,
            sum: Checksum::default(),
            written: 0,
        };
        w.raw(MAGIC)?;
        w.raw(&VERSION.to_le_bytes())?;
        Ok(w)
    }

    pub fn raw(&mut self, b: &[u8]) -> Result<(), SnapshotError> {
        self.sum.update(b);
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    /// A section header: tag and payload length.
    pub fn header(&mut self, tag: [u8; 4], len: u64) -> Result<(), SnapshotError> {
        self.raw(&tag)?;
        self.raw(&len.to_le_bytes())
    }

    /// A whole section.
    pub fn section(&mut self, tag: [u8; 4], payload: &[u8]) -> Result<(), SnapshotError> {
        self.header(tag, payload.len() as u64)?;
        self.raw(payload)
    }

    /// The end section (the checksum of everything before it), then flush.
    pub fn finish(self) -> Result<u64, SnapshotError> {
        let sum = self.sum.finish();
        self.out.write_all(&END)?;
        self.out.write_all(&8u64.to_le_bytes())?;
        self.out.write_all(&sum.to_le_bytes())?;
        self.out.flush()?;
        Ok(self.written + 20)
    }
}

/// Reads a snapshot, checksumming every byte; never reads more than a section announces.
pub struct SnapReader<'a> {
    input: &'a mut dyn Read,
    sum: Checksum,
}

impl<'a> SnapReader<'a> {
    /// Reads and checks the header.
    pub fn new(input: &'a mut dyn Read) -> Result<Self, SnapshotError> {
        let mut r = SnapReader {
            input,
            sum: Checksum::default(),
        };
        let mut head = [0u8; 12];
        r.exact(&mut head, "header")?;
        if &head[..8] != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        Ok(r)
    }

    /// Fills `buf` (end of input: `Truncated(what)`).
    pub fn exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), SnapshotError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => SnapshotError::Truncated(what),
            _ => SnapshotError::Io(e),
        })?;
        self.sum.update(buf);
        Ok(())
    }

    /// The next section's header, which must be `tag`, and its length (at most `limit`).
    pub fn header(&mut self, tag: [u8; 4], limit: u64) -> Result<u64, SnapshotError> {
        let mut h = [0u8; 12];
        self.exact(&mut h, "a section header")?;
        let found: [u8; 4] = [h[0], h[1], h[2], h[3]];
        if found != tag {
            return Err(SnapshotError::Section {
                expected: tag_name(tag),
                found: tag_name(found),
            });
        }
        let len = u64::from_le_bytes(h[4..].try_into().unwrap_or_default());
        if len > limit {
            return Err(SnapshotError::SectionTooLarge {
                tag: tag_name(tag),
                len,
                limit,
            });
        }
        Ok(len)
    }

    /// A whole section of at most `limit` bytes.
    pub fn section(&mut self, tag: [u8; 4], limit: u64) -> Result<Vec<u8>, SnapshotError> {
        let len = self.header(tag, limit)?;
        let mut v = vec![0u8; len as usize];
        self.exact(&mut v, "a section")?;
        Ok(v)
    }

    /// The end section: checks the checksum and that nothing follows.
    pub fn finish(mut self) -> Result<(), SnapshotError> {
        let want = self.sum.finish();
        let len = self.header(END, 8)?;
        if len != 8 {
            return Err(SnapshotError::Truncated("the end section"));
        }
        let mut b = [0u8; 8];
        self.input.read_exact(&mut b).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => SnapshotError::Truncated("the checksum"),
            _ => SnapshotError::Io(e),
        })?;
        if u64::from_le_bytes(b) != want {
            return Err(SnapshotError::Checksum);
        }
        let mut extra = [0u8; 1];
        match self.input.read(&mut extra) {
            Ok(0) => Ok(()),
            Ok(_) => Err(SnapshotError::Trailing),
            Err(e) => Err(SnapshotError::Io(e)),
        }
    }
}

/// Little-endian encoder of a section's payload.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Length (u32) and bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
}

/// Decoder of a hostile section payload: every read is bounds-checked.
pub struct Dec<'a> {
    b: &'a [u8],
    section: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(b: &'a [u8], section: &'static str) -> Self {
        Dec { b, section }
    }

    /// An `Invalid` error of this section.
    pub fn bad(&self, what: impl Into<String>) -> SnapshotError {
        SnapshotError::Invalid {
            section: self.section,
            what: what.into(),
        }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if n > self.b.len() {
            return Err(SnapshotError::Truncated(self.section));
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn bool(&mut self) -> Result<bool, SnapshotError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.bad(format!("flag byte {v}"))),
        }
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
        if n > max || n.saturating_mul(item) > self.b.len() {
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
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.bad(format!("{} trailing bytes", self.b.len())))
        }
    }
}

/// A snapshot's sections as `(tag, payload)`, without the end section, if the framing holds
/// (tooling: the tests and the fuzz harness edit sections and reassemble).
pub fn split_sections(snap: &[u8]) -> Option<Vec<([u8; 4], Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = 12usize;
    loop {
        let head = snap.get(at..at.checked_add(12)?)?;
        let tag: [u8; 4] = head[..4].try_into().ok()?;
        if tag == END {
            return Some(out);
        }
        let len = usize::try_from(u64::from_le_bytes(head[4..].try_into().ok()?)).ok()?;
        let body = snap.get(at + 12..(at + 12).checked_add(len)?)?;
        out.push((tag, body.to_vec()));
        at += 12 + len;
    }
}

/// A snapshot of format `version` from sections, with a valid checksum and end section.
pub fn assemble(version: u32, sections: &[([u8; 4], Vec<u8>)]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    for (tag, p) in sections {
        b.extend_from_slice(tag);
        b.extend_from_slice(&(p.len() as u64).to_le_bytes());
        b.extend_from_slice(p);
    }
    let mut c = Checksum::default();
    c.update(&b);
    b.extend_from_slice(&END);
    b.extend_from_slice(&8u64.to_le_bytes());
    b.extend_from_slice(&c.finish().to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_independent_of_how_the_bytes_are_split() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let mut whole = Checksum::default();
        whole.update(&data);
        for split in [1, 3, 7, 8, 9, 500, 999] {
            let mut c = Checksum::default();
            for part in data.chunks(split) {
                c.update(part);
            }
            assert_eq!(c.finish(), whole.finish(), "split {split}");
        }
        // Any one flipped bit, and a zero appended, change it.
        for bit in [0, 9, 4000, 7999] {
            let mut d = data.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            let mut c = Checksum::default();
            c.update(&d);
            assert_ne!(c.finish(), whole.finish(), "bit {bit}");
        }
        let mut c = Checksum::default();
        c.update(&data);
        c.update(&[0]);
        assert_ne!(c.finish(), whole.finish());
    }

    #[test]
    fn sections_split_and_reassemble() {
        let secs = vec![(CONF, vec![1, 2, 3]), (REGS, Vec::new())];
        let snap = assemble(VERSION, &secs);
        assert_eq!(split_sections(&snap), Some(secs));
        assert_eq!(split_sections(&snap[..snap.len() - 21]), None);
    }
}
