//! A whole container in memory: [`Writer`] builds one (a section can be written in place, so
//! that a nested container such as an interpreter context is never copied), [`read`] splits
//! hostile bytes into checked sections.

use crate::{
    END, Format, FrameError, HEADER, Id, SECTION_OVERHEAD, check_header, check_version,
    header_bytes, id_name, section_crc, split_head,
};

/// One section as read (its CRC-32 already checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section<'a> {
    pub id: Id,
    pub version: u32,
    pub payload: &'a [u8],
}

impl<'a> Section<'a> {
    /// The payload, if the section has version `want` (else the version error).
    pub fn payload_v(&self, want: u32) -> Result<&'a [u8], FrameError> {
        check_version(self.id, self.version, want)?;
        Ok(self.payload)
    }

    /// The id as text.
    pub fn name(&self) -> String {
        id_name(self.id)
    }
}

/// Builds a container in memory.
#[derive(Debug)]
pub struct Writer {
    buf: Vec<u8>,
}

/// Where a section begun with [`Writer::begin`] starts.
#[derive(Debug)]
#[must_use = "a begun section must be ended"]
pub struct Open {
    at: usize,
}

impl Writer {
    /// A container of `format` (header written).
    pub fn new(format: &Format) -> Self {
        Self::with_capacity(format, 0)
    }

    /// The same, with room for `n` bytes of sections.
    pub fn with_capacity(format: &Format, n: usize) -> Self {
        let mut buf = Vec::with_capacity(HEADER + n + 2 * SECTION_OVERHEAD as usize);
        buf.extend_from_slice(&header_bytes(format));
        Writer { buf }
    }

    /// Appends a whole section.
    pub fn section(&mut self, id: Id, version: u32, payload: &[u8]) {
        let s = self.begin(id, version);
        self.buf.extend_from_slice(payload);
        self.end(s);
    }

    /// A container appended to `buf` (its header written there): a container nested in another
    /// one's section is written in place, without a copy.
    pub fn append_to(mut buf: Vec<u8>, format: &Format) -> Self {
        buf.extend_from_slice(&header_bytes(format));
        Writer { buf }
    }

    /// Starts a section whose payload the caller appends to [`Writer::buf`]; [`Writer::end`]
    /// fills in its length and CRC-32.
    pub fn begin(&mut self, id: Id, version: u32) -> Open {
        let at = self.buf.len();
        self.buf.extend_from_slice(&id);
        self.buf.extend_from_slice(&version.to_le_bytes());
        self.buf.extend_from_slice(&0u64.to_le_bytes());
        Open { at }
    }

    /// The bytes written so far (append a begun section's payload here).
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Ends the section begun at `open`.
    pub fn end(&mut self, open: Open) {
        let start = open.at + 16;
        let len = (self.buf.len() - start) as u64;
        self.buf[open.at + 8..start].copy_from_slice(&len.to_le_bytes());
        let mut id = [0u8; 4];
        id.copy_from_slice(&self.buf[open.at..open.at + 4]);
        let version = u32::from_le_bytes([
            self.buf[open.at + 4],
            self.buf[open.at + 5],
            self.buf[open.at + 6],
            self.buf[open.at + 7],
        ]);
        let mut h = section_crc(id, version, len);
        h.update(&self.buf[start..]);
        let crc = h.finalize();
        self.buf.extend_from_slice(&crc.to_le_bytes());
    }

    /// Appends the end section and returns the bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.section(END, 0, &[]);
        self.buf
    }
}

/// Splits hostile bytes into sections: header checked, every section's length against what is
/// left, its CRC-32, at most `max_sections` of them, the end section last and nothing after
/// it. Section versions are the caller's to check ([`Section::payload_v`]).
pub fn read<'a>(
    format: &Format,
    bytes: &'a [u8],
    max_sections: usize,
) -> Result<Vec<Section<'a>>, FrameError> {
    let n = bytes.len().min(8);
    if bytes[..n] != format.magic[..n] {
        return Err(FrameError::Magic {
            format: format.name,
        });
    }
    let head: &[u8; HEADER] = bytes
        .get(..HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or(FrameError::Truncated { what: "header" })?;
    check_header(format, head)?;
    let mut rest = &bytes[HEADER..];
    let mut out = Vec::new();
    loop {
        let h: &[u8; 16] =
            rest.get(..16)
                .and_then(|h| h.try_into().ok())
                .ok_or(FrameError::Truncated {
                    what: "a section header",
                })?;
        let (id, version, len) = split_head(h);
        rest = &rest[16..];
        if rest.len() < 4 || len > (rest.len() - 4) as u64 {
            return Err(FrameError::Truncated { what: "a section" });
        }
        let (payload, tail) = rest.split_at(len as usize);
        let want = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        rest = &tail[4..];
        let mut c = section_crc(id, version, len);
        c.update(payload);
        let found = c.finalize();
        if found != want {
            return Err(FrameError::Checksum {
                id: id_name(id),
                found,
                want,
            });
        }
        if id == END {
            check_version(id, version, 0)?;
            if len != 0 {
                return Err(FrameError::Invalid {
                    what: "the end section",
                    detail: format!("{len} payload bytes"),
                });
            }
            if !rest.is_empty() {
                return Err(FrameError::Trailing);
            }
            return Ok(out);
        }
        if out.len() == max_sections {
            return Err(FrameError::TooManySections(max_sections));
        }
        out.push(Section {
            id,
            version,
            payload,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Format = Format {
        magic: *b"TESTFMT\0",
        version: 3,
        name: "test file",
    };

    fn sample() -> Vec<u8> {
        let mut w = Writer::new(&F);
        w.section(*b"ONE\0", 1, &[1, 2, 3]);
        let s = w.begin(*b"TWO\0", 7);
        w.buf().extend_from_slice(b"in place");
        w.end(s);
        w.section(*b"NONE", 1, &[]);
        w.finish()
    }

    #[test]
    fn round_trip() {
        let b = sample();
        // Nested in place: the inner container is the outer section's payload.
        let mut outer = Writer::new(&F);
        let s = outer.begin(*b"NEST", 1);
        let buf = std::mem::take(outer.buf());
        let mut inner = Writer::append_to(buf, &F);
        inner.section(*b"ONE\0", 1, &[1, 2, 3]);
        *outer.buf() = inner.finish();
        outer.end(s);
        let o = outer.finish();
        let nest = read(&F, &o, 1).unwrap()[0].payload;
        assert_eq!(read(&F, nest, 1).unwrap()[0].payload, &[1, 2, 3]);
        let s = read(&F, &b, 8).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(
            (s[0].id, s[0].version, s[0].payload),
            (*b"ONE\0", 1, &[1u8, 2, 3][..])
        );
        assert_eq!(s[1].payload_v(7).unwrap(), b"in place");
        assert_eq!(
            s[1].payload_v(6).unwrap_err().to_string(),
            "section TWO\\x00 version 7; this build reads version 6"
        );
        assert_eq!(s[2].payload.len(), 0);
    }

    #[test]
    fn every_truncation_and_every_flipped_bit_is_refused() {
        let b = sample();
        for n in 0..b.len() {
            assert!(read(&F, &b[..n], 8).is_err(), "truncated to {n}");
        }
        for bit in 0..b.len() * 8 {
            let mut g = b.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            assert!(read(&F, &g, 8).is_err(), "bit {bit} flipped");
        }
        let mut g = b.clone();
        g.push(0);
        assert_eq!(read(&F, &g, 8).unwrap_err(), FrameError::Trailing);
    }

    #[test]
    fn magic_versions_lengths_and_counts() {
        let b = sample();
        let mut g = b.clone();
        g[0] = b'X';
        assert_eq!(
            read(&F, &g, 8).unwrap_err(),
            FrameError::Magic {
                format: "test file"
            }
        );
        let mut g = b.clone();
        g[8] = 2;
        assert_eq!(
            read(&F, &g, 8).unwrap_err().to_string(),
            "test file format version 2; this build reads version 3"
        );
        // An absurd length (CRC made to match) is refused before anything is allocated.
        let mut g = b[..HEADER].to_vec();
        g.extend_from_slice(b"HUGE");
        g.extend_from_slice(&1u32.to_le_bytes());
        g.extend_from_slice(&u64::MAX.to_le_bytes());
        g.extend_from_slice(&[0; 8]);
        assert_eq!(
            read(&F, &g, 8).unwrap_err(),
            FrameError::Truncated { what: "a section" }
        );
        assert_eq!(read(&F, &b, 2).unwrap_err(), FrameError::TooManySections(2));
        // A checksum error names the section.
        let mut g = b.clone();
        g[HEADER + 16] ^= 1;
        let e = read(&F, &g, 8).unwrap_err().to_string();
        assert!(
            e.starts_with("section ONE\\x00 is corrupted: CRC-32"),
            "{e}"
        );
    }
}
