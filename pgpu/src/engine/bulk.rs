//! Default implementations of the engine's bulk VRAM calls (`EngineSnapshot::vram_nonzero_pages`,
//! `vram_read_runs`, `vram_write_pages`, `vram_zero`) on top of `vram_read`, `vram_write` and
//! `vram_fill`, through a host buffer of [`CHUNK`] bytes. Engines with a faster path override
//! them (the cuda engine: GPU kernels and pinned, double-buffered copies; the sim engine: a scan
//! of its memory in place). Also the checks every implementation makes of its arguments.

use std::ops::ControlFlow;

use super::{Engine, EngineError, EngineSnapshot};

/// Where `Engine::vram_read_runs` hands the bytes it read.
pub type PageSink<'a> = dyn FnMut(&[u8]) -> ControlFlow<()> + 'a;
/// Where `Engine::vram_read_runs_batched` hands the bytes it read: several pieces at once (a
/// transfer's worth), so that the consumer can copy them out on several threads.
pub type BatchSink<'a> = dyn FnMut(&[&[u8]]) -> ControlFlow<()> + 'a;
/// What `Engine::vram_write_pages` asks for pages: fill the buffer's first pages, list each
/// one's destination.
pub type PageSource<'a> = dyn FnMut(&mut [u8], &mut Vec<u64>) -> ControlFlow<()> + 'a;

/// Bytes of a VRAM page as the bulk calls count them.
pub const VRAM_PAGE: u64 = 4096;
/// Bytes per `vram_read`/`vram_write` of the default implementations.
pub const CHUNK: u64 = 4 << 20;

/// Checks that `pa..pa + len` is whole pages inside `vram` bytes of VRAM.
pub fn check_pages(pa: u64, len: u64, vram: u64) -> Result<(), EngineError> {
    if !pa.is_multiple_of(VRAM_PAGE) || !len.is_multiple_of(VRAM_PAGE) {
        return Err(EngineError::BadCopy("VRAM range not whole 4 KiB pages"));
    }
    match pa.checked_add(len) {
        Some(end) if end <= vram => Ok(()),
        _ => Err(EngineError::VramRange { pa, len }),
    }
}

/// Checks a bitmap call's arguments: the range (`pages` pages at `pa`) and the bitmap's length.
pub fn check_bitmap(pa: u64, pages: u64, words: usize, vram: u64) -> Result<(), EngineError> {
    let len = pages
        .checked_mul(VRAM_PAGE)
        .ok_or(EngineError::VramRange { pa, len: u64::MAX })?;
    check_pages(pa, len, vram)?;
    if (words as u64) < pages.div_ceil(64) {
        return Err(EngineError::BadCopy("bitmap shorter than one bit per page"));
    }
    Ok(())
}

/// Whether `b` is all zero (an OR over the whole slice vectorizes; no early exit needed).
pub fn is_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |a, x| a | x) == 0
}

/// Marks in `bitmap` (bit `first + i`) the pages of `bytes` that are not all zero.
pub fn mark_nonzero(bytes: &[u8], first: u64, bitmap: &mut [u64]) {
    for (i, page) in bytes.chunks(VRAM_PAGE as usize).enumerate() {
        if !is_zero(page) {
            let p = first + i as u64;
            bitmap[(p / 64) as usize] |= 1 << (p % 64);
        }
    }
}

pub(crate) fn nonzero_pages<E: Engine + ?Sized>(
    e: &E,
    pa: u64,
    pages: u64,
    bitmap: &mut [u64],
) -> Result<(), EngineError> {
    check_bitmap(pa, pages, bitmap.len(), e.info().vram_size)?;
    bitmap.fill(0);
    let size = pages * VRAM_PAGE;
    let mut buf = vec![0u8; CHUNK.min(size) as usize];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(CHUNK);
        let b = &mut buf[..n as usize];
        e.vram_read(pa + off, b)?;
        mark_nonzero(b, off / VRAM_PAGE, bitmap);
        off += n;
    }
    Ok(())
}

pub(crate) fn read_runs<E: Engine + ?Sized>(
    e: &E,
    runs: &[(u64, u64)],
    sink: &mut PageSink<'_>,
) -> Result<ControlFlow<()>, EngineError> {
    let vram = e.info().vram_size;
    for &(pa, len) in runs {
        check_pages(pa, len, vram)?;
    }
    let most = runs.iter().map(|r| r.1).max().unwrap_or(0);
    let mut buf = vec![0u8; CHUNK.min(most) as usize];
    for &(pa, len) in runs {
        let mut at = 0;
        while at < len {
            let n = (len - at).min(CHUNK) as usize;
            e.vram_read(pa + at, &mut buf[..n])?;
            if sink(&buf[..n]).is_break() {
                return Ok(ControlFlow::Break(()));
            }
            at += n as u64;
        }
    }
    Ok(ControlFlow::Continue(()))
}

pub(crate) fn read_runs_batched<E: EngineSnapshot + ?Sized>(
    e: &E,
    runs: &[(u64, u64)],
    sink: &mut BatchSink<'_>,
) -> Result<ControlFlow<()>, EngineError> {
    e.vram_read_runs(runs, &mut |piece: &[u8]| sink(&[piece]))
}

/// Checks the page addresses a write source produced (`filled` pages of the buffer).
pub fn check_sourced(pas: &[u64], buf_pages: usize, vram: u64) -> Result<(), EngineError> {
    if pas.len() > buf_pages {
        return Err(EngineError::BadCopy(
            "the source listed more pages than its buffer holds",
        ));
    }
    for &pa in pas {
        check_pages(pa, VRAM_PAGE, vram)?;
    }
    Ok(())
}

pub(crate) fn write_pages<E: Engine + ?Sized>(
    e: &E,
    source: &mut PageSource<'_>,
) -> Result<ControlFlow<()>, EngineError> {
    let vram = e.info().vram_size;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut pas = Vec::new();
    loop {
        pas.clear();
        if source(&mut buf, &mut pas).is_break() {
            return Ok(ControlFlow::Break(()));
        }
        if pas.is_empty() {
            return Ok(ControlFlow::Continue(()));
        }
        check_sourced(&pas, buf.len() / VRAM_PAGE as usize, vram)?;
        // Consecutive pages in one write.
        let mut i = 0;
        while i < pas.len() {
            let mut j = i + 1;
            while j < pas.len() && pas[j] == pas[j - 1] + VRAM_PAGE {
                j += 1;
            }
            let (a, b) = (i * VRAM_PAGE as usize, j * VRAM_PAGE as usize);
            e.vram_write(pas[i], &buf[a..b])?;
            i = j;
        }
    }
}

pub(crate) fn zero<E: EngineSnapshot + ?Sized>(
    e: &E,
    pa: u64,
    len: u64,
) -> Result<(), EngineError> {
    check_pages(pa, len, e.info().vram_size)?;
    // A bitmap of one chunk at a time (bounded host memory for any partition size).
    let span = CHUNK * 64;
    let mut bitmap = vec![0u64; (span / VRAM_PAGE).div_ceil(64) as usize];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(span);
        let pages = n / VRAM_PAGE;
        e.vram_nonzero_pages(pa + off, pages, &mut bitmap)?;
        for_each_run(&bitmap, pages, |first, count| {
            e.vram_fill(pa + off + first * VRAM_PAGE, count * VRAM_PAGE, 0)
        })?;
        off += n;
    }
    Ok(())
}

/// Calls `f(first page, pages)` for each run of set bits among the first `pages` bits of
/// `bitmap`, ascending (a run ends at the end of the range).
pub fn for_each_run<F, T>(bitmap: &[u64], pages: u64, mut f: F) -> Result<(), T>
where
    F: FnMut(u64, u64) -> Result<(), T>,
{
    let mut run: Option<(u64, u64)> = None;
    let words = pages.div_ceil(64) as usize;
    for (w, &word) in bitmap.iter().take(words).enumerate() {
        let base = w as u64 * 64;
        // Bits past `pages` in the last word are ignored.
        let valid = if base + 64 > pages {
            (1u64 << (pages - base)) - 1
        } else {
            u64::MAX
        };
        let mut bits = word & valid;
        if bits == u64::MAX {
            run = match run {
                Some((s, n)) if s + n == base => Some((s, n + 64)),
                Some(r) => {
                    f(r.0, r.1)?;
                    Some((base, 64))
                }
                None => Some((base, 64)),
            };
            continue;
        }
        while bits != 0 {
            let lo = u64::from(bits.trailing_zeros());
            let ones = u64::from((bits >> lo).trailing_ones());
            let (s, n) = (base + lo, ones);
            run = match run {
                Some((rs, rn)) if rs + rn == s => Some((rs, rn + n)),
                Some(r) => {
                    f(r.0, r.1)?;
                    Some((s, n))
                }
                None => Some((s, n)),
            };
            bits = if lo + ones >= 64 {
                0
            } else {
                bits & !((1u64 << (lo + ones)) - 1)
            };
        }
    }
    if let Some((s, n)) = run {
        f(s, n)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(bitmap: &[u64], pages: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        for_each_run(bitmap, pages, |s, n| {
            v.push((s, n));
            Ok::<(), ()>(())
        })
        .unwrap();
        v
    }

    /// The runs of a bitmap, bit by bit.
    fn slow(bitmap: &[u64], pages: u64) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        for p in 0..pages {
            if bitmap[(p / 64) as usize] >> (p % 64) & 1 == 1 {
                match v.last_mut() {
                    Some((s, n)) if *s + *n == p => *n += 1,
                    _ => v.push((p, 1)),
                }
            }
        }
        v
    }

    #[test]
    fn runs_of_a_bitmap() {
        assert_eq!(runs(&[0, 0], 128), vec![]);
        assert_eq!(runs(&[u64::MAX, u64::MAX], 128), vec![(0, 128)]);
        // Bits past the range are ignored; a run ends at the end of the range.
        assert_eq!(runs(&[u64::MAX, u64::MAX], 100), vec![(0, 100)]);
        assert_eq!(runs(&[u64::MAX], 1), vec![(0, 1)]);
        // A run across a word boundary, and one ending on the last bit of a word.
        assert_eq!(
            runs(&[0b1 | (0b11 << 62), 0b111], 128),
            vec![(0, 1), (62, 5)]
        );
        assert_eq!(runs(&[1 << 63, 0, 1], 129), vec![(63, 1), (128, 1)]);
        // Pseudo-random bitmaps against the bit-by-bit answer.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let words = 1 + round % 7;
            let bm: Vec<u64> = (0..words)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Dense, sparse and all-ones words.
                    match x % 4 {
                        0 => x,
                        1 => x & (x >> 3) & (x >> 5),
                        2 => u64::MAX,
                        _ => 0,
                    }
                })
                .collect();
            let pages = words as u64 * 64 - (x % 64);
            assert_eq!(runs(&bm, pages), slow(&bm, pages), "{bm:x?} {pages}");
        }
    }

    #[test]
    fn checks_of_ranges() {
        assert!(check_pages(0, 8192, 8192).is_ok());
        assert!(check_pages(4096, 8192, 8192).is_err());
        assert!(check_pages(1, 4096, 8192).is_err());
        assert!(check_pages(0, 100, 8192).is_err());
        assert!(check_pages(u64::MAX - 4095, 4096, u64::MAX).is_err());
        assert!(check_bitmap(0, 65, 1, 1 << 30).is_err());
        assert!(check_bitmap(0, 65, 2, 1 << 30).is_ok());
        assert!(check_bitmap(0, u64::MAX, usize::MAX, u64::MAX).is_err());
        assert!(check_sourced(&[0, 4096], 1, 8192).is_err());
        assert!(check_sourced(&[8192], 1, 8192).is_err());
        assert!(check_sourced(&[4096], 1, 8192).is_ok());
    }
}
