//! The VRAM section: the partition's pages that are not all zero, as runs of whole 4 KiB pages
//! (`page u64, count u32, count × 4096 bytes`), read and written through the engine in chunks
//! of up to `CHUNK` bytes. Restoring streams the runs into the partition and zeroes the gaps.

use pgpu::Engine;

use super::SnapshotError;
use super::format::{SnapReader, SnapWriter, VRAM};

const PAGE: u64 = 4096;
/// Bytes per engine read or write.
const CHUNK: u64 = 4 << 20;
/// Bytes of a run header.
const RUN_HEADER: u64 = 12;

fn engine_err(e: pgpu::EngineError) -> SnapshotError {
    SnapshotError::Vram(e.to_string())
}

/// Whether `b` is all zero (an OR over the whole page vectorizes; no early exit needed).
fn is_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |a, x| a | x) == 0
}

/// Zeroes the pages of `[start, end)` (partition offsets) that are not zero already: reading
/// first spares a fresh engine's untouched memory (a sim engine's VRAM is an anonymous mapping
/// that zero-filling would make resident).
fn zero_range(
    engine: &dyn Engine,
    base: u64,
    start: u64,
    end: u64,
    buf: &mut [u8],
) -> Result<(), SnapshotError> {
    let mut at = start;
    while at < end {
        let n = (end - at).min(buf.len() as u64);
        let chunk = &mut buf[..n as usize];
        engine.vram_read(base + at, chunk).map_err(engine_err)?;
        for (i, page) in chunk.chunks(PAGE as usize).enumerate() {
            if !is_zero(page) {
                let pa = base + at + i as u64 * PAGE;
                engine
                    .vram_fill(pa, page.len() as u64, 0)
                    .map_err(engine_err)?;
            }
        }
        at += n;
    }
    Ok(())
}

/// Runs `(first page, pages)` of non-zero pages of the partition `[base, base + size)`.
pub(super) fn nonzero_runs(
    engine: &dyn Engine,
    base: u64,
    size: u64,
) -> Result<Vec<(u64, u64)>, SnapshotError> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut buf = vec![0u8; CHUNK.min(size) as usize];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(CHUNK);
        let buf = &mut buf[..n as usize];
        engine.vram_read(base + off, buf).map_err(engine_err)?;
        for (i, page) in buf.chunks(PAGE as usize).enumerate() {
            if is_zero(page) {
                continue;
            }
            let p = off / PAGE + i as u64;
            match runs.last_mut() {
                // Runs stay under 2^32 pages and a chunk each for the writer.
                Some((first, count)) if *first + *count == p && *count < u64::from(u32::MAX) => {
                    *count += 1
                }
                _ => runs.push((p, 1)),
            }
        }
        off += n;
    }
    Ok(runs)
}

/// Writes the VRAM section; returns the bytes of VRAM saved.
pub fn save(
    w: &mut SnapWriter<'_>,
    engine: &dyn Engine,
    base: u64,
    size: u64,
) -> Result<u64, SnapshotError> {
    if !size.is_multiple_of(PAGE) {
        return Err(SnapshotError::Vram(format!(
            "partition of {size:#x} bytes is not whole pages"
        )));
    }
    let runs = nonzero_runs(engine, base, size)?;
    let data: u64 = runs.iter().map(|(_, n)| n * PAGE).sum();
    w.header(VRAM, data + RUN_HEADER * runs.len() as u64)?;
    let mut buf = vec![0u8; CHUNK.min(data) as usize];
    for (first, count) in runs {
        w.raw(&first.to_le_bytes())?;
        w.raw(&(count as u32).to_le_bytes())?;
        let (mut at, end) = (first * PAGE, (first + count) * PAGE);
        while at < end {
            let n = (end - at).min(CHUNK) as usize;
            engine
                .vram_read(base + at, &mut buf[..n])
                .map_err(engine_err)?;
            w.raw(&buf[..n])?;
            at += n as u64;
        }
    }
    Ok(data)
}

/// The most bytes a VRAM section of a `size`-byte partition can have.
pub fn limit(size: u64) -> u64 {
    size + RUN_HEADER * size.div_ceil(PAGE)
}

/// Reads the VRAM section into the partition (every page: saved bytes or zero). On error the
/// partition may hold part of the image: the caller scrubs it (`scrub`).
pub fn restore(
    r: &mut SnapReader<'_>,
    engine: &dyn Engine,
    base: u64,
    size: u64,
) -> Result<u64, SnapshotError> {
    if !size.is_multiple_of(PAGE) {
        return Err(SnapshotError::Vram(format!(
            "partition of {size:#x} bytes is not whole pages"
        )));
    }
    let mut left = r.header(VRAM, limit(size))?;
    let pages = size / PAGE;
    let bad = |what: String| SnapshotError::Invalid {
        section: "VRAM",
        what,
    };
    let mut next = 0u64;
    let mut data = 0u64;
    let mut buf = vec![0u8; CHUNK.min(size) as usize];
    while left > 0 {
        if left < RUN_HEADER {
            return Err(bad(format!("{left} bytes left, not a run")));
        }
        let mut h = [0u8; RUN_HEADER as usize];
        r.exact(&mut h, "VRAM")?;
        let first = u64::from_le_bytes(h[..8].try_into().unwrap_or_default());
        let count = u64::from(u32::from_le_bytes(h[8..].try_into().unwrap_or_default()));
        left -= RUN_HEADER;
        let end = first.checked_add(count).filter(|&e| e <= pages);
        let Some(end) = end.filter(|_| count > 0 && first >= next) else {
            return Err(bad(format!(
                "run of {count} pages at page {first:#x} (overlapping, empty or outside the {pages} pages)"
            )));
        };
        if count * PAGE > left {
            return Err(bad(format!(
                "run at page {first:#x} longer than the section"
            )));
        }
        if first > next {
            zero_range(engine, base, next * PAGE, first * PAGE, &mut buf)?;
        }
        let mut at = first * PAGE;
        while at < end * PAGE {
            let n = (end * PAGE - at).min(CHUNK) as usize;
            r.exact(&mut buf[..n], "VRAM")?;
            engine
                .vram_write(base + at, &buf[..n])
                .map_err(engine_err)?;
            at += n as u64;
        }
        left -= count * PAGE;
        data += count * PAGE;
        next = end;
    }
    if next < pages {
        zero_range(engine, base, next * PAGE, pages * PAGE, &mut buf)?;
    }
    Ok(data)
}

/// Zeroes the partition after a failed restore (pages already zero are left untouched).
pub fn scrub(engine: &dyn Engine, base: u64, size: u64) -> Result<(), SnapshotError> {
    let mut buf = vec![0u8; CHUNK.min(size) as usize];
    zero_range(engine, base, 0, size, &mut buf)
}
