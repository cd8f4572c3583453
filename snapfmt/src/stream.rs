//! The container through `std::io`, for images too large to hold (the GPU's, with its VRAM): a
//! section's length is announced first and its payload written or read in pieces; the CRC-32
//! follows its last byte, written or checked as that byte passes, so a caller that writes or
//! reads exactly the announced bytes never handles it.
//!
//! Large payloads need not be hashed here, on one core: [`StreamWriter::raw_hashed`] takes
//! bytes with their CRC computed by the caller (in lanes on several threads, [`crate::crc`]),
//! [`StreamWriter::skip_hashed`] counts bytes the caller wrote itself at the stream's current
//! offset (positional writes on several threads), and [`StreamReader::exact_deferred`] /
//! [`StreamReader::skip_deferred`] read or skip bytes whose CRC the caller hands back later
//! with [`StreamReader::hashed`], before the section's end is checked. Both ends also keep the
//! CRC-32 of every byte of the stream (`total`), combined from the sections' own, for callers
//! that checksum the whole file.

use std::io::{Read, Write};

use crate::crc::Crc;
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
    /// Bytes read whose CRC the caller has not handed back yet (reader).
    pending: u64,
}

impl Open {
    fn new(id: Id, version: u32, len: u64) -> Open {
        Open {
            id,
            left: len,
            crc: section_crc(id, version, len),
            pending: 0,
        }
    }
}

/// The stream's CRC after a section: its header and payload (the section's own CRC state) and
/// its 4 CRC bytes.
fn fold_section(total: Crc, section: &crc32fast::Hasher, crc_bytes: &[u8; 4]) -> Crc {
    let s = Crc {
        value: section.clone().finalize(),
        len: section.total_len(),
    };
    total.then(s).then(Crc::of(crc_bytes))
}

/// Writes a container to a stream.
pub struct StreamWriter<'a> {
    out: &'a mut dyn Write,
    open: Option<Open>,
    /// Bytes written, framing included.
    pub written: u64,
    /// CRC-32 of the bytes of finished sections (and the header).
    total: Crc,
}

impl<'a> StreamWriter<'a> {
    /// Writes the header of `format`.
    pub fn new(out: &'a mut dyn Write, format: &Format) -> Result<Self, StreamError> {
        let header = header_bytes(format);
        let mut w = StreamWriter {
            out,
            open: None,
            written: 0,
            total: Crc::of(&header),
        };
        w.put(&header)?;
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
        self.open = Some(Open::new(id, version, len));
        self.close_if_done()
    }

    /// The open section, if `n` more payload bytes fit in it.
    fn room(&mut self, n: u64) -> Result<&mut Open, StreamError> {
        let o = self.open.as_mut().ok_or(FrameError::Invalid {
            what: "a section",
            detail: "payload written outside a section".into(),
        })?;
        if n > o.left {
            return Err(FrameError::Invalid {
                what: "a section",
                detail: format!(
                    "{n} payload bytes where section {} has {} left",
                    id_name(o.id),
                    o.left
                ),
            }
            .into());
        }
        Ok(o)
    }

    /// Payload bytes of the open section (at most what it has left).
    pub fn raw(&mut self, b: &[u8]) -> Result<(), StreamError> {
        if b.is_empty() {
            return Ok(());
        }
        let o = self.room(b.len() as u64)?;
        o.crc.update(b);
        o.left -= b.len() as u64;
        self.put(b)?;
        self.close_if_done()
    }

    /// As [`Self::raw`], with `crc` the caller's CRC of `b` (computed in lanes): `b` is not
    /// hashed here. A wrong `crc` makes a file that readers refuse.
    pub fn raw_hashed(&mut self, b: &[u8], crc: Crc) -> Result<(), StreamError> {
        self.check_len(b.len() as u64, crc)?;
        if b.is_empty() {
            return Ok(());
        }
        let o = self.room(crc.len)?;
        o.crc.combine(&crc.hasher());
        o.left -= crc.len;
        self.put(b)?;
        self.close_if_done()
    }

    /// Counts `crc.len` payload bytes of the open section that the caller wrote itself, at
    /// the stream's current offset (`written`), with CRC `crc`; the caller keeps the output's
    /// position in step (the next bytes of this writer go after them).
    pub fn skip_hashed(&mut self, crc: Crc) -> Result<(), StreamError> {
        if crc.len == 0 {
            return Ok(());
        }
        let o = self.room(crc.len)?;
        o.crc.combine(&crc.hasher());
        o.left -= crc.len;
        self.written += crc.len;
        self.close_if_done()
    }

    fn check_len(&self, n: u64, crc: Crc) -> Result<(), StreamError> {
        if n != crc.len {
            return Err(FrameError::Invalid {
                what: "a section",
                detail: format!("a CRC of {} bytes for {n} bytes", crc.len),
            }
            .into());
        }
        Ok(())
    }

    fn close_if_done(&mut self) -> Result<(), StreamError> {
        if self.open.as_ref().is_some_and(|o| o.left == 0)
            && let Some(o) = self.open.take()
        {
            let c = o.crc.clone().finalize().to_le_bytes();
            self.total = fold_section(self.total, &o.crc, &c);
            self.put(&c)?;
        }
        Ok(())
    }

    /// A whole section.
    pub fn section(&mut self, id: Id, version: u32, payload: &[u8]) -> Result<(), StreamError> {
        self.header(id, version, payload.len() as u64)?;
        self.raw(payload)
    }

    /// The end section, then flush; returns the bytes written.
    pub fn finish(self) -> Result<u64, StreamError> {
        Ok(self.finish_total()?.len)
    }

    /// As [`Self::finish`], returning the CRC-32 of every byte written (its `len` the bytes).
    pub fn finish_total(mut self) -> Result<Crc, StreamError> {
        self.section(END, 0, &[])?;
        self.out.flush()?;
        Ok(self.total)
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
    /// CRC-32 of the bytes of finished sections (and the header).
    total: Crc,
}

impl<'a> StreamReader<'a> {
    /// Reads and checks the header of `format`.
    pub fn new(input: &'a mut dyn Read, format: &Format) -> Result<Self, StreamError> {
        let mut r = StreamReader {
            input,
            open: None,
            total: Crc::EMPTY,
        };
        let mut h = [0u8; HEADER];
        r.fill(&mut h, "header")?;
        check_header(format, &h)?;
        r.total = Crc::of(&h);
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
        self.open = Some(Open::new(id, v, len));
        self.check_if_done()?;
        Ok(len)
    }

    /// Fills `buf` from the open section (end of input: `Truncated(what)`); the section's
    /// CRC-32 is read and checked with its last byte.
    pub fn exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), StreamError> {
        if buf.is_empty() {
            return Ok(());
        }
        self.take(buf.len() as u64, what, false)?;
        self.fill(buf, what)?;
        if let Some(o) = &mut self.open {
            o.crc.update(buf);
            o.left -= buf.len() as u64;
        }
        self.check_if_done()
    }

    /// Checks that `n` more bytes are in the open section (`deferring`: bytes whose CRC comes
    /// later may be pending; otherwise none may, the hash going in order).
    fn take(&mut self, n: u64, what: &'static str, deferring: bool) -> Result<(), StreamError> {
        let (left, pending) = self.open.as_ref().map_or((0, 0), |o| (o.left, o.pending));
        if n > left {
            return Err(FrameError::Invalid {
                what,
                detail: format!("{n} bytes wanted, {left} left in the section"),
            }
            .into());
        }
        if pending > 0 && !deferring {
            return Err(FrameError::Invalid {
                what,
                detail: format!("{pending} bytes read before are not hashed yet"),
            }
            .into());
        }
        Ok(())
    }

    /// Fills `buf` from the open section without hashing it: the caller hands its CRC back
    /// with [`Self::hashed`] (computed in lanes), in order with other deferred bytes, before
    /// anything else of the section is read; the section's CRC is checked once all its bytes
    /// are read and hashed.
    pub fn exact_deferred(
        &mut self,
        buf: &mut [u8],
        what: &'static str,
    ) -> Result<(), StreamError> {
        if buf.is_empty() {
            return Ok(());
        }
        self.take(buf.len() as u64, what, true)?;
        self.fill(buf, what)?;
        self.defer(buf.len() as u64);
        Ok(())
    }

    /// Counts `n` bytes of the open section that the caller read itself at this stream's
    /// current offset (positional reads); the caller moves the input past them and hands
    /// their CRC back with [`Self::hashed`], as for [`Self::exact_deferred`].
    pub fn skip_deferred(&mut self, n: u64, what: &'static str) -> Result<(), StreamError> {
        if n == 0 {
            return Ok(());
        }
        self.take(n, what, true)?;
        self.defer(n);
        Ok(())
    }

    fn defer(&mut self, n: u64) {
        if let Some(o) = &mut self.open {
            o.left -= n;
            o.pending += n;
        }
    }

    /// The CRC of the next deferred bytes (at most as many as are pending).
    pub fn hashed(&mut self, crc: Crc) -> Result<(), StreamError> {
        if crc.len == 0 {
            return Ok(());
        }
        let pending = self.open.as_ref().map_or(0, |o| o.pending);
        if crc.len > pending {
            return Err(FrameError::Invalid {
                what: "a section",
                detail: format!("a CRC of {} bytes where {pending} are pending", crc.len),
            }
            .into());
        }
        if let Some(o) = &mut self.open {
            o.crc.combine(&crc.hasher());
            o.pending -= crc.len;
        }
        self.check_if_done()
    }

    fn check_if_done(&mut self) -> Result<(), StreamError> {
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.left == 0 && o.pending == 0)
            && let Some(o) = self.open.take()
        {
            let mut c = [0u8; 4];
            self.fill(&mut c, "a section checksum")?;
            let want = u32::from_le_bytes(c);
            self.total = fold_section(self.total, &o.crc, &c);
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
    pub fn finish(self) -> Result<(), StreamError> {
        self.finish_total().map(|_| ())
    }

    /// As [`Self::finish`], returning the CRC-32 of every byte read (its `len` the bytes).
    pub fn finish_total(mut self) -> Result<Crc, StreamError> {
        self.header(END, 0, 0)?;
        let mut extra = [0u8; 1];
        loop {
            return match self.input.read(&mut extra) {
                Ok(0) => Ok(self.total),
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

    /// Bytes hashed by the caller (in lanes, written or read positionally by the caller) make
    /// the same stream, with the same CRCs, as bytes hashed here; out of order or unhashed
    /// deferred bytes are refused.
    #[test]
    fn caller_hashed_bytes_make_the_same_stream() {
        let b = streamed();
        let mut out = Vec::new();
        let mut w = StreamWriter::new(&mut out, &F).unwrap();
        w.section(*b"AAAA", 1, b"abc").unwrap();
        w.header(*b"BIGS", 2, 10).unwrap();
        w.raw_hashed(b"0123", Crc::of(b"0123")).unwrap();
        assert!(
            w.raw_hashed(b"45", Crc::of(b"456")).is_err(),
            "CRC of other bytes"
        );
        // Six bytes written "elsewhere": this writer only counts them.
        w.skip_hashed(Crc::of(b"456789")).unwrap();
        w.section(*b"NONE", 1, &[]).unwrap();
        let total = w.finish_total().unwrap();
        assert_eq!(total, Crc::of(&b));
        assert_eq!(out.len(), b.len() - 6);
        assert_eq!(&out[..b.len() - 6 - 20 - 24], &b[..b.len() - 6 - 20 - 24]);

        let read = |g: &[u8]| -> Result<(Vec<u8>, Crc), StreamError> {
            let mut input = g;
            let mut r = StreamReader::new(&mut input, &F)?;
            r.section(*b"AAAA", 1, 3)?;
            r.header(*b"BIGS", 2, 10)?;
            let mut x = [0u8; 4];
            let mut y = [0u8; 6];
            r.exact_deferred(&mut x, "BIGS")?;
            r.exact_deferred(&mut y, "BIGS")?;
            r.hashed(Crc::of(&x))?;
            r.hashed(Crc::of(&y))?;
            r.header(*b"NONE", 1, 0)?;
            let t = r.finish_total()?;
            Ok(([&x[..], &y[..]].concat(), t))
        };
        assert_eq!(read(&b).unwrap(), (b"0123456789".to_vec(), Crc::of(&b)));
        for bit in 0..b.len() * 8 {
            let mut g = b.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            assert!(read(&g).is_err(), "bit {bit}");
        }
        // Hashed bytes must come in order: nothing else of the section is read while some
        // are pending, and no CRC covers more than is pending.
        let mut input = &b[..];
        let mut r = StreamReader::new(&mut input, &F).unwrap();
        r.section(*b"AAAA", 1, 3).unwrap();
        r.header(*b"BIGS", 2, 10).unwrap();
        let mut x = [0u8; 4];
        r.exact_deferred(&mut x, "BIGS").unwrap();
        assert!(r.exact(&mut [0u8; 2], "BIGS").is_err());
        assert!(r.hashed(Crc::of(b"01234")).is_err());
        // A section whose deferred bytes are never hashed is never finished.
        r.skip_deferred(6, "BIGS").unwrap();
        r.hashed(Crc::of(&x)).unwrap();
        assert!(r.header(*b"NONE", 1, 0).is_err());
        assert!(r.skip_deferred(1, "BIGS").is_err(), "past the section");
    }
}
