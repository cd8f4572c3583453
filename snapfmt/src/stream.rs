//! The container through `std::io`, for images too large to hold (the GPU's, with its VRAM): a
//! section's length is announced first and its payload written or read in pieces; the CRC-32
//! follows its last byte, written or checked as that byte passes, so a caller that writes or
//! reads exactly the announced bytes never handles it.

use std::io::{Read, Write};

use crate::{
    END, Format, FrameError, HEADER, Id, check_header, check_version, header_bytes, id_name,
    section_crc, split_head,
};

/// A framing error or the I/O error under it.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// The section being written or read.
struct Open {
    id: Id,
    left: u64,
    crc: crc32fast::Hasher,
}

/// Writes a container to a stream.
pub struct StreamWriter<'a> {
    out: &'a mut dyn Write,
    open: Option<Open>,
    /// Bytes written, framing included.
    pub written: u64,
}

impl<'a> StreamWriter<'a> {
    /// Writes the header of `format`.
    pub fn new(out: &'a mut dyn Write, format: &Format) -> Result<Self, StreamError> {
        let mut w = StreamWriter {
            out,
            open: None,
            written: 0,
        };
        w.put(&header_bytes(format))?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> Result<(), StreamError> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    /// Starts a section of `len` payload bytes (then exactly `len` bytes of [`Self::raw`]).
    pub fn header(&mut self, id: Id, version: u32, len: u64) -> Result<(), StreamError> {
        if let Some(o) = &self.open {
            return Err(unfinished(o.id));
        }
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&id);
        h[4..8].copy_from_slice(&version.to_le_bytes());
        h[8..].copy_from_slice(&len.to_le_bytes());
        self.put(&h)?;
        self.open = Some(Open {
            id,
            left: len,
            crc: section_crc(id, version, len),
        });
        self.close_if_done()
    }

    /// Payload bytes of the open section (at most what it has left).
    pub fn raw(&mut self, b: &[u8]) -> Result<(), StreamError> {
        if b.is_empty() {
            return Ok(());
        }
        let o = self.open.as_mut().ok_or(FrameError::Invalid {
            what: "a section",
            detail: "payload written outside a section".into(),
        })?;
        if b.len() as u64 > o.left {
            return Err(FrameError::Invalid {
                what: "a section",
                detail: format!(
                    "{} payload bytes where section {} has {} left",
                    b.len(),
                    id_name(o.id),
                    o.left
                ),
            }
            .into());
        }
        o.crc.update(b);
        o.left -= b.len() as u64;
        self.put(b)?;
        self.close_if_done()
    }

    fn close_if_done(&mut self) -> Result<(), StreamError> {
        if self.open.as_ref().is_some_and(|o| o.left == 0)
            && let Some(o) = self.open.take()
        {
            self.put(&o.crc.finalize().to_le_bytes())?;
        }
        Ok(())
    }

    /// A whole section.
    pub fn section(&mut self, id: Id, version: u32, payload: &[u8]) -> Result<(), StreamError> {
        self.header(id, version, payload.len() as u64)?;
        self.raw(payload)
    }

    /// The end section, then flush; returns the bytes written.
    pub fn finish(mut self) -> Result<u64, StreamError> {
        self.section(END, 0, &[])?;
        self.out.flush()?;
        Ok(self.written)
    }
}

fn unfinished(id: Id) -> StreamError {
    FrameError::Invalid {
        what: "a section",
        detail: format!("section {} not finished", id_name(id)),
    }
    .into()
}

/// Reads a container from a hostile stream; never reads past what a section announced.
pub struct StreamReader<'a> {
    input: &'a mut dyn Read,
    open: Option<Open>,
}

impl<'a> StreamReader<'a> {
    /// Reads and checks the header of `format`.
    pub fn new(input: &'a mut dyn Read, format: &Format) -> Result<Self, StreamError> {
        let mut r = StreamReader { input, open: None };
        let mut h = [0u8; HEADER];
        r.fill(&mut h, "header")?;
        check_header(format, &h)?;
        Ok(r)
    }

    fn fill(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), StreamError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => FrameError::Truncated { what }.into(),
            _ => StreamError::Io(e),
        })
    }

    /// The next section's header, which must be `id` at `version`, and its payload length (at
    /// most `limit`).
    pub fn header(&mut self, id: Id, version: u32, limit: u64) -> Result<u64, StreamError> {
        if let Some(o) = &self.open {
            return Err(unfinished(o.id));
        }
        let mut h = [0u8; 16];
        self.fill(&mut h, "a section header")?;
        let (found, v, len) = split_head(&h);
        if found != id {
            return Err(FrameError::Section {
                expected: id_name(id),
                found: id_name(found),
            }
            .into());
        }
        check_version(id, v, version)?;
        if len > limit {
            return Err(FrameError::TooLarge {
                id: id_name(id),
                len,
                limit,
            }
            .into());
        }
        self.open = Some(Open {
            id,
            left: len,
            crc: section_crc(id, v, len),
        });
        self.check_if_done()?;
        Ok(len)
    }

    /// Fills `buf` from the open section (end of input: `Truncated(what)`); the section's
    /// CRC-32 is read and checked with its last byte.
    pub fn exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), StreamError> {
        if buf.is_empty() {
            return Ok(());
        }
        let left = self.open.as_ref().map_or(0, |o| o.left);
        if buf.len() as u64 > left {
            return Err(FrameError::Invalid {
                what,
                detail: format!("{} bytes wanted, {left} left in the section", buf.len()),
            }
            .into());
        }
        self.fill(buf, what)?;
        if let Some(o) = &mut self.open {
            o.crc.update(buf);
            o.left -= buf.len() as u64;
        }
        self.check_if_done()
    }

    fn check_if_done(&mut self) -> Result<(), StreamError> {
        if self.open.as_ref().is_some_and(|o| o.left == 0)
            && let Some(o) = self.open.take()
        {
            let mut c = [0u8; 4];
            self.fill(&mut c, "a section checksum")?;
            let want = u32::from_le_bytes(c);
            let found = o.crc.finalize();
            if found != want {
                return Err(FrameError::Checksum {
                    id: id_name(o.id),
                    found,
                    want,
                }
                .into());
            }
        }
        Ok(())
    }

    /// A whole section of at most `limit` bytes.
    pub fn section(&mut self, id: Id, version: u32, limit: u64) -> Result<Vec<u8>, StreamError> {
        let len = self.header(id, version, limit)?;
        let mut v = vec![0u8; len as usize];
        self.exact(&mut v, "a section")?;
        Ok(v)
    }

    /// The end section, and nothing after it.
    pub fn finish(mut self) -> Result<(), StreamError> {
        self.header(END, 0, 0)?;
        let mut extra = [0u8; 1];
        loop {
            return match self.input.read(&mut extra) {
                Ok(0) => Ok(()),
                Ok(_) => Err(FrameError::Trailing.into()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(StreamError::Io(e)),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Writer, read};

    const F: Format = Format {
        magic: *b"STREAMT\0",
        version: 1,
        name: "stream test",
    };

    fn streamed() -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = StreamWriter::new(&mut out, &F).unwrap();
        w.section(*b"AAAA", 1, b"abc").unwrap();
        w.header(*b"BIGS", 2, 10).unwrap();
        w.raw(b"0123").unwrap();
        assert!(w.header(*b"CCCC", 1, 0).is_err(), "a section is open");
        w.raw(b"456789").unwrap();
        assert!(w.raw(b"x").is_err(), "past the announced length");
        w.section(*b"NONE", 1, &[]).unwrap();
        let n = w.finish().unwrap();
        assert_eq!(n as usize, out.len());
        out
    }

    fn read_all(b: &[u8]) -> Result<Vec<u8>, StreamError> {
        let mut input = b;
        let mut r = StreamReader::new(&mut input, &F)?;
        let mut got = r.section(*b"AAAA", 1, 3)?;
        let n = r.header(*b"BIGS", 2, 10)?;
        let mut piece = [0u8; 5];
        for _ in 0..n / 5 {
            r.exact(&mut piece, "BIGS")?;
            got.extend_from_slice(&piece);
        }
        r.header(*b"NONE", 1, 0)?;
        r.finish()?;
        Ok(got)
    }

    #[test]
    fn streamed_equals_in_memory_and_reads_back() {
        let b = streamed();
        let mut w = Writer::new(&F);
        w.section(*b"AAAA", 1, b"abc");
        w.section(*b"BIGS", 2, b"0123456789");
        w.section(*b"NONE", 1, &[]);
        assert_eq!(w.finish(), b);
        assert_eq!(read(&F, &b, 8).unwrap().len(), 3);
        assert_eq!(read_all(&b).unwrap(), b"abc0123456789");
    }

    #[test]
    fn hostile_streams_are_refused() {
        let b = streamed();
        for n in 0..b.len() {
            assert!(read_all(&b[..n]).is_err(), "truncated to {n}");
        }
        for bit in 0..b.len() * 8 {
            let mut g = b.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            assert!(read_all(&g).is_err(), "bit {bit}");
        }
        let mut g = b.clone();
        g.push(0);
        assert!(matches!(
            read_all(&g),
            Err(StreamError::Frame(FrameError::Trailing))
        ));
        // Over the caller's limit: refused from the header alone.
        let mut input = &b[..];
        let mut r = StreamReader::new(&mut input, &F).unwrap();
        assert!(matches!(
            r.section(*b"AAAA", 1, 2),
            Err(StreamError::Frame(FrameError::TooLarge {
                len: 3,
                limit: 2,
                ..
            }))
        ));
        // Another section version.
        let mut input = &b[..];
        let mut r = StreamReader::new(&mut input, &F).unwrap();
        let e = r.section(*b"AAAA", 2, 3).unwrap_err().to_string();
        assert_eq!(e, "section AAAA version 1; this build reads version 2");
        // Reading past a section is refused, not served from the next one.
        let mut input = &b[..];
        let mut r = StreamReader::new(&mut input, &F).unwrap();
        r.header(*b"AAAA", 1, 3).unwrap();
        assert!(r.exact(&mut [0u8; 4], "AAAA").is_err());
    }
}
