//! The bounded little-endian payload codec every section decoder uses: [`Dec`] reads hostile
//! bytes (every read bounds-checked, every length checked against a limit and against what is
//! left before anything is allocated, the payload consumed exactly), [`Enc`] writes them.

use crate::FrameError;

/// Writes a payload.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
    /// Bytes as they are.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Length (u32) and bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.raw(b)
    }
}

/// Reads a hostile payload. Errors name what was being read: the label given to [`Dec::new`],
/// or the one set with [`Dec::at`].
#[derive(Debug, Clone)]
pub struct Dec<'a> {
    b: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Self {
        Dec { b, pos: 0, what }
    }

    /// Names what the next reads are (for their errors).
    pub fn at(&mut self, what: &'static str) -> &mut Self {
        self.what = what;
        self
    }

    /// An `Invalid` error naming the current label.
    pub fn bad(&self, detail: impl Into<String>) -> FrameError {
        FrameError::Invalid {
            what: self.what,
            detail: detail.into(),
        }
    }

    /// The current label.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.b.len() - self.pos
    }

    /// Bytes read so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if n > self.left() {
            return Err(FrameError::Truncated { what: self.what });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A flag byte: 0 or 1.
    pub fn bool(&mut self) -> Result<bool, FrameError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.bad(format!("flag byte {v}"))),
        }
    }

    /// Length (u32, at most `max`) and bytes.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], FrameError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.bad(format!("{n} bytes, at most {max} accepted")));
        }
        self.take(n)
    }

    /// Length (u64, at most `max`) and bytes.
    pub fn bytes_u64(&mut self, max: u64) -> Result<&'a [u8], FrameError> {
        let n = self.u64()?;
        if n > max {
            return Err(self.bad(format!("{n} bytes, at most {max} accepted")));
        }
        self.take(usize::try_from(n).map_err(|_| FrameError::Truncated { what: self.what })?)
    }

    /// Length (u32, at most `max`) and UTF-8 text.
    pub fn string(&mut self, max: usize) -> Result<&'a str, FrameError> {
        let b = self.bytes(max)?;
        std::str::from_utf8(b).map_err(|_| self.bad("not UTF-8"))
    }

    /// A count (u32) of items of at least `item` bytes each: at most `max`, and no more than
    /// what is left can hold (so that a vector of that many items is safe to allocate).
    pub fn count(&mut self, max: usize, item: usize) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.bad(format!("{n} entries, at most {max} accepted")));
        }
        if n.saturating_mul(item) > self.left() {
            return Err(FrameError::Truncated { what: self.what });
        }
        Ok(n)
    }

    /// Fails unless every byte was read.
    pub fn end(&self) -> Result<(), FrameError> {
        match self.left() {
            0 => Ok(()),
            n => Err(self.bad(format!("{n} unexpected bytes at the end"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn payload() -> Vec<u8> {
        let mut e = Enc::default();
        e.u8(1).u32(7).u64(9).bytes(b"text").u32(2).u64(1).u64(2);
        e.0
    }

    fn decode(b: &[u8]) -> Result<(bool, u32, u64, String, Vec<u64>), FrameError> {
        let mut d = Dec::new(b, "sample");
        let f = d.bool()?;
        let a = d.u32()?;
        let b = d.u64()?;
        let s = d.at("name").string(16)?.to_owned();
        let n = d.at("items").count(4, 8)?;
        let v = (0..n).map(|_| d.u64()).collect::<Result<_, _>>()?;
        d.end()?;
        Ok((f, a, b, s, v))
    }

    #[test]
    fn round_trip_and_limits() {
        let b = payload();
        assert_eq!(decode(&b).unwrap(), (true, 7, 9, "text".into(), vec![1, 2]));
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "cut at {n}");
        }
        let mut g = b.clone();
        g.push(0);
        assert_eq!(
            decode(&g).unwrap_err().to_string(),
            "items: 1 unexpected bytes at the end"
        );
        // A huge count fails on its limit, a plausible one on what is left: nothing allocated.
        let mut d = Dec::new(&[0xff, 0xff, 0xff, 0xff], "huge");
        assert!(d.count(usize::MAX, 8).is_err());
        let mut d = Dec::new(&[3, 0, 0, 0, 0], "short");
        assert_eq!(
            d.count(10, 1).unwrap_err(),
            FrameError::Truncated { what: "short" }
        );
        let mut d = Dec::new(&[2], "flag");
        assert_eq!(d.bool().unwrap_err().to_string(), "flag: flag byte 2");
        let huge = u64::MAX.to_le_bytes();
        let mut d = Dec::new(&huge, "blob");
        assert!(d.bytes_u64(u64::MAX).is_err());
    }

    proptest! {
        // Any bytes: an answer or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_fail(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&b);
        }

        // Any bytes after a good container header, and any edit of a good container: refused
        // or read, never a panic, and nothing is allocated beyond the input.
        #[test]
        fn any_container_bytes_read_or_fail(
            tail in proptest::collection::vec(any::<u8>(), 0..128),
            at in 0usize..64,
            x in any::<u8>(),
        ) {
            let f = crate::Format { magic: *b"PROPTEST", version: 1, name: "proptest" };
            let mut w = crate::Writer::new(&f);
            w.section(*b"ONE\0", 1, &payload());
            let good = w.finish();
            let mut b = good[..crate::HEADER].to_vec();
            b.extend_from_slice(&tail);
            let _ = crate::read(&f, &b, 4);
            let mut g = good.clone();
            let i = at % g.len();
            g[i] ^= x;
            let r = crate::read(&f, &g, 4);
            prop_assert!(x == 0 || r.is_err());
            let mut input = &g[..];
            if let Ok(mut s) = crate::StreamReader::new(&mut input, &f) {
                let _ = s.section(*b"ONE\0", 1, 1 << 20);
            }
        }
    }
}
