//! The VRAM section: the partition's pages that are not all zero, as runs of whole 4 KiB pages
//! (`page u64, count u32, count × 4096 bytes`).
//!
//! One pass over the data each way, through the engine's bulk VRAM calls (`pgpu::Engine`,
//! "Bulk VRAM access"): saving asks the engine which pages are non-zero (a bitmap; on cuda a
//! GPU kernel, only the bitmap crosses PCIe), then reads only those runs, once, streaming them
//! into the writer while the engine fetches the next piece. Restoring zeroes the partition
//! (`vram_zero`: the device memset on cuda; on sim only pages not zero already are written) and
//! streams the runs into it as they are read.

use std::ops::ControlFlow;

use pgpu::Engine;
use pgpu::engine::bulk::{VRAM_PAGE as PAGE, for_each_run};

use super::SnapshotError;
use super::format::{SnapReader, SnapWriter, VRAM};

/// Bytes of a run header.
const RUN_HEADER: u64 = 12;
/// Pages of a run at most (its count is a u32).
const MAX_RUN: u64 = u32::MAX as u64;

fn engine_err(e: pgpu::EngineError) -> SnapshotError {
    SnapshotError::Vram(e.to_string())
}

fn whole_pages(size: u64) -> Result<(), SnapshotError> {
    if size.is_multiple_of(PAGE) {
        Ok(())
    } else {
        Err(SnapshotError::Vram(format!(
            "partition of {size:#x} bytes is not whole pages"
        )))
    }
}

/// Runs `(first page, pages)` of the non-zero pages of the partition `[base, base + size)`,
/// each at most `MAX_RUN` pages.
pub(crate) fn nonzero_runs(
    engine: &dyn Engine,
    base: u64,
    size: u64,
) -> Result<Vec<(u64, u64)>, SnapshotError> {
    let pages = size / PAGE;
    let mut bitmap = vec![0u64; pages.div_ceil(64) as usize];
    engine
        .vram_nonzero_pages(base, pages, &mut bitmap)
        .map_err(engine_err)?;
    let mut runs = Vec::new();
    for_each_run(&bitmap, pages, |first, count| {
        let mut at = 0;
        while at < count {
            let n = (count - at).min(MAX_RUN);
            runs.push((first + at, n));
            at += n;
        }
        Ok::<(), ()>(())
    })
    .ok();
    Ok(runs)
}

/// Writes the VRAM section; returns the bytes of VRAM saved.
pub fn save(
    w: &mut SnapWriter<'_>,
    engine: &dyn Engine,
    base: u64,
    size: u64,
) -> Result<u64, SnapshotError> {
    whole_pages(size)?;
    let runs = nonzero_runs(engine, base, size)?;
    save_runs(w, engine, base, &runs)
}

/// Writes the VRAM section holding `runs` (`(first page, pages)`, ascending, not overlapping,
/// inside the partition at `base`); returns the bytes of VRAM saved.
pub fn save_runs(
    w: &mut SnapWriter<'_>,
    engine: &dyn Engine,
    base: u64,
    runs: &[(u64, u64)],
) -> Result<u64, SnapshotError> {
    let data: u64 = runs.iter().map(|(_, n)| n * PAGE).sum();
    w.header(VRAM, data + RUN_HEADER * runs.len() as u64)?;
    let ranges: Vec<(u64, u64)> = runs
        .iter()
        .map(|&(first, n)| (base + first * PAGE, n * PAGE))
        .collect();
    // The engine hands pieces in order, none spanning two runs: a run's header goes before its
    // first piece.
    let (mut next, mut left, mut failed) = (0usize, 0u64, None);
    let mut sink = |piece: &[u8]| -> ControlFlow<()> {
        let r = (|| {
            if left == 0 {
                let &(first, count) = runs.get(next).ok_or_else(|| {
                    SnapshotError::Vram("the engine returned more bytes than asked".into())
                })?;
                w.raw(&first.to_le_bytes())?;
                w.raw(&(count as u32).to_le_bytes())?;
                left = count * PAGE;
                next += 1;
            }
            if piece.len() as u64 > left {
                return Err(SnapshotError::Vram(
                    "the engine returned a piece spanning two runs".into(),
                ));
            }
            w.raw(piece)?;
            left -= piece.len() as u64;
            Ok(())
        })();
        match r {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    };
    let flow = engine
        .vram_read_runs(&ranges, &mut sink)
        .map_err(engine_err)?;
    if let Some(e) = failed {
        return Err(e);
    }
    if flow.is_break() || left != 0 || next != runs.len() {
        return Err(SnapshotError::Vram(
            "the engine returned fewer bytes than asked".into(),
        ));
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
    whole_pages(size)?;
    let left = r.header(VRAM, limit(size))?;
    engine.vram_zero(base, size).map_err(engine_err)?;
    let mut runs = RunReader {
        r,
        left,
        pages: size / PAGE,
        next: 0,
        run: (0, 0),
        data: 0,
        failed: None,
    };
    let mut source = |buf: &mut [u8], pas: &mut Vec<u64>| match runs.fill(buf, pas, base) {
        Ok(()) => ControlFlow::Continue(()),
        Err(e) => {
            runs.failed = Some(e);
            ControlFlow::Break(())
        }
    };
    let flow = engine.vram_write_pages(&mut source).map_err(engine_err)?;
    if let Some(e) = runs.failed {
        return Err(e);
    }
    if flow.is_break() || runs.left != 0 || runs.run.1 != 0 {
        return Err(SnapshotError::Vram("the VRAM writes stopped early".into()));
    }
    Ok(runs.data)
}

/// The runs of a VRAM section as a page source for `vram_write_pages`, validated as read.
struct RunReader<'r, 'a> {
    r: &'r mut SnapReader<'a>,
    /// Section bytes not read yet.
    left: u64,
    /// Pages of the partition.
    pages: u64,
    /// The first page the next run may start at.
    next: u64,
    /// The current run: next page to read, pages of it left.
    run: (u64, u64),
    /// Bytes of VRAM read.
    data: u64,
    failed: Option<SnapshotError>,
}

impl RunReader<'_, '_> {
    fn bad(what: String) -> SnapshotError {
        SnapshotError::Invalid {
            section: "VRAM",
            what,
        }
    }

    /// The next run's header, checked.
    fn header(&mut self) -> Result<(), SnapshotError> {
        if self.left < RUN_HEADER {
            return Err(Self::bad(format!("{} bytes left, not a run", self.left)));
        }
        let mut h = [0u8; RUN_HEADER as usize];
        self.r.exact(&mut h, "VRAM")?;
        let first = u64::from_le_bytes(h[..8].try_into().unwrap_or_default());
        let count = u64::from(u32::from_le_bytes(h[8..].try_into().unwrap_or_default()));
        self.left -= RUN_HEADER;
        let end = first.checked_add(count).filter(|&e| e <= self.pages);
        let Some(end) = end.filter(|_| count > 0 && first >= self.next) else {
            return Err(Self::bad(format!(
                "run of {count} pages at page {first:#x} (overlapping, empty or outside the {} pages)",
                self.pages
            )));
        };
        if count * PAGE > self.left {
            return Err(Self::bad(format!(
                "run at page {first:#x} longer than the section"
            )));
        }
        self.run = (first, count);
        self.next = end;
        Ok(())
    }

    /// Fills `buf` with whole pages of runs, listing their addresses in `pas`; nothing listed
    /// at the end of the section.
    fn fill(&mut self, buf: &mut [u8], pas: &mut Vec<u64>, base: u64) -> Result<(), SnapshotError> {
        let room = buf.len() as u64 / PAGE;
        let mut filled = 0u64;
        while filled < room {
            if self.run.1 == 0 {
                if self.left == 0 {
                    break;
                }
                self.header()?;
            }
            let (page, count) = self.run;
            let n = count.min(room - filled);
            let at = (filled * PAGE) as usize;
            self.r
                .exact(&mut buf[at..at + (n * PAGE) as usize], "VRAM")?;
            pas.extend((page..page + n).map(|p| base + p * PAGE));
            self.run = (page + n, count - n);
            self.left -= n * PAGE;
            self.data += n * PAGE;
            filled += n;
        }
        Ok(())
    }
}

/// Zeroes the partition after a failed restore (on sim, pages already zero are left untouched).
pub fn scrub(engine: &dyn Engine, base: u64, size: u64) -> Result<(), SnapshotError> {
    engine.vram_zero(base, size).map_err(engine_err)
}
