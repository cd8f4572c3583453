//! CRC-32 values that combine: the CRC of `a || b` from the CRCs of `a` and `b` and the length
//! of `b` (zlib's `crc32_combine`, through `crc32fast::Hasher::combine`). A section of
//! gigabytes is then checksummed in lanes on several threads, its pieces' CRCs folded in order
//! on one: the bytes and the value written are those of one serial pass, so files of either
//! kind read alike (docs/snapshot.md, "Formats: one container").

use rayon::prelude::*;

/// Bytes per lane: large pieces are split into lanes of this many bytes at most, each
/// checksummed on its own thread.
pub const LANE: usize = 4 << 20;

/// The CRC-32 (IEEE) of some bytes, with their length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc {
    pub value: u32,
    pub len: u64,
}

impl Crc {
    /// The CRC of no bytes.
    pub const EMPTY: Crc = Crc { value: 0, len: 0 };

    /// The CRC of `b`, on this thread.
    pub fn of(b: &[u8]) -> Crc {
        Crc {
            value: crc32fast::hash(b),
            len: b.len() as u64,
        }
    }

    /// The CRC of this one's bytes followed by `next`'s.
    #[must_use]
    pub fn then(self, next: Crc) -> Crc {
        if next.len == 0 {
            return self;
        }
        let mut h = crc32fast::Hasher::new_with_initial_len(self.value, self.len);
        h.combine(&crc32fast::Hasher::new_with_initial_len(
            next.value, next.len,
        ));
        Crc {
            value: h.finalize(),
            len: self.len + next.len,
        }
    }

    /// The CRC of `b`, its lanes on several threads.
    pub fn par_of(b: &[u8]) -> Crc {
        pieces(&[b]).into_iter().fold(Crc::EMPTY, Crc::then)
    }

    /// A hasher that continues from this CRC (for bytes hashed serially after it).
    pub(crate) fn hasher(self) -> crc32fast::Hasher {
        crc32fast::Hasher::new_with_initial_len(self.value, self.len)
    }
}

/// The CRC of each of `pieces`, in order; pieces (and lanes of large ones) are checksummed on
/// the rayon pool's threads.
pub fn pieces(pieces: &[&[u8]]) -> Vec<Crc> {
    let lanes: Vec<(usize, &[u8])> = pieces
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            let mut v: Vec<(usize, &[u8])> = p.chunks(LANE).map(|l| (i, l)).collect();
            if p.is_empty() {
                v.push((i, &p[..]));
            }
            v
        })
        .collect();
    let crcs: Vec<(usize, Crc)> = if lanes.len() > 1 {
        lanes.par_iter().map(|&(i, l)| (i, Crc::of(l))).collect()
    } else {
        lanes.iter().map(|&(i, l)| (i, Crc::of(l))).collect()
    };
    let mut out = vec![Crc::EMPTY; pieces.len()];
    for (i, c) in crcs {
        out[i] = out[i].then(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_equals_serial() {
        let b: Vec<u8> = (0..(9u32 << 20) + 77)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let whole = Crc::of(&b);
        assert_eq!(whole.value, crc32fast::hash(&b));
        assert_eq!(Crc::par_of(&b), whole);
        for cut in [0, 1, 4095, 4 << 20, b.len() - 1, b.len()] {
            let (x, y) = b.split_at(cut);
            assert_eq!(Crc::of(x).then(Crc::of(y)), whole, "cut at {cut}");
        }
        let parts: Vec<&[u8]> = vec![&b[..10], &b[10..10], &b[10..(5 << 20)], &b[(5 << 20)..]];
        let crcs = pieces(&parts);
        assert_eq!(crcs.len(), 4);
        assert_eq!(crcs[1], Crc::EMPTY);
        assert_eq!(crcs[2], Crc::of(parts[2]));
        assert_eq!(crcs.into_iter().fold(Crc::EMPTY, Crc::then), whole);
        // One flipped bit changes the combined value.
        let mut g = b.clone();
        g[6 << 20] ^= 4;
        assert_ne!(Crc::par_of(&g), whole);
    }
}
