//! The VRAM section: the partition's pages that are not all zero, as runs of whole 4 KiB pages
//! (`page u64, count u32, count × 4096 bytes`).
//!
//! One pass over the data each way, through the engine's bulk VRAM calls (`pgpu::Engine`,
//! "Bulk VRAM access"): saving asks the engine which pages are non-zero (a bitmap; on cuda a
//! GPU kernel, only the bitmap crosses PCIe), then reads only those runs, once, streaming them
//! into the writer while the engine fetches the next piece. Restoring zeroes the partition
//! (`vram_zero`: the device memset on cuda; on sim only pages not zero already are written) and
//! streams the runs into it as they are read.
//!
//! The bytes are checksummed in lanes on several threads (the section's one CRC-32 combined
//! from theirs, `snapfmt::Crc`), and to or from a file written and read at offsets by those
//! lanes (`lanes`): the layout is the same whichever way a section was written.

use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;

use pgpu::EngineSnapshot;
use pgpu::engine::bulk::{VRAM_PAGE as PAGE, for_each_run};
use snapfmt::Crc;

use super::SnapshotError;
use super::format::{SnapReader, SnapWriter, VRAM};
use super::lanes::{self, Io};

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
    engine: &dyn EngineSnapshot,
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
    engine: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    io: Io<'_>,
) -> Result<u64, SnapshotError> {
    whole_pages(size)?;
    let runs = nonzero_runs(engine, base, size)?;
    save_runs(w, engine, base, &runs, io)
}

/// Writes the VRAM section holding `runs` (`(first page, pages)`, ascending, not overlapping,
/// inside the partition at `base`); returns the bytes of VRAM saved.
///
/// The engine hands a transfer's worth of pieces at a time (`vram_read_runs_batched`: a
/// pinned 64 MiB slot on cuda, filled while this one is consumed); their CRC-32 is computed in
/// lanes on several threads and, to a file, each lane writes its bytes at their offset itself;
/// to a stream the bytes are copied on this thread once hashed.
pub fn save_runs(
    w: &mut SnapWriter<'_>,
    engine: &dyn EngineSnapshot,
    base: u64,
    runs: &[(u64, u64)],
    io: Io<'_>,
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
    let mut sink = |pieces: &[&[u8]]| -> ControlFlow<()> {
        let r = (|| {
            let mut heads: Vec<[u8; RUN_HEADER as usize]> = Vec::new();
            let mut starts = Vec::with_capacity(pieces.len());
            for piece in pieces {
                let starts_run = left == 0;
                if starts_run {
                    let &(first, count) = runs.get(next).ok_or_else(|| {
                        SnapshotError::Vram("the engine returned more bytes than asked".into())
                    })?;
                    let mut h = [0u8; RUN_HEADER as usize];
                    h[..8].copy_from_slice(&first.to_le_bytes());
                    h[8..].copy_from_slice(&(count as u32).to_le_bytes());
                    heads.push(h);
                    left = count * PAGE;
                    next += 1;
                }
                if piece.len() as u64 > left {
                    return Err(SnapshotError::Vram(
                        "the engine returned a piece spanning two runs".into(),
                    ));
                }
                left -= piece.len() as u64;
                starts.push(starts_run);
            }
            let mut heads = heads.iter();
            let mut extents: Vec<&[u8]> = Vec::with_capacity(2 * pieces.len());
            for (piece, starts_run) in pieces.iter().zip(starts) {
                if starts_run && let Some(h) = heads.next() {
                    extents.push(h);
                }
                extents.push(piece);
            }
            put(w, &extents, io)
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
        .vram_read_runs_batched(&ranges, &mut sink)
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

/// Appends `extents` to the open section: hashed in lanes, then copied to the stream, or
/// hashed and written at their offsets by the lanes.
fn put(w: &mut SnapWriter<'_>, extents: &[&[u8]], io: Io<'_>) -> Result<(), SnapshotError> {
    match io {
        Io::Stream => {
            let crcs = snapfmt::crc::pieces(extents);
            for (e, c) in extents.iter().zip(crcs) {
                w.raw_hashed(e, c)?;
            }
        }
        Io::File { file, at } => {
            let crcs = lanes::write_at(file, at.get(), extents)?;
            let c = crcs.into_iter().fold(Crc::EMPTY, Crc::then);
            at.set(at.get() + c.len);
            w.skip_hashed(c)?;
        }
    }
    Ok(())
}

/// The most bytes a VRAM section of a `size`-byte partition can have.
pub fn limit(size: u64) -> u64 {
    size + RUN_HEADER * size.div_ceil(PAGE)
}

/// Reads the VRAM section into the partition (every page: saved bytes or zero). On error the
/// partition may hold part of the image: the caller scrubs it (`scrub`). Each of the engine's
/// transfer buffers is filled (from a file: by lanes reading at offsets, several threads) and
/// hashed in lanes before it is handed back; the section's CRC-32 is checked with its last
/// byte, after the last pages went up (a corrupted image leaves the partition to `scrub`).
pub fn restore(
    r: &mut SnapReader<'_>,
    engine: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    io: Io<'_>,
) -> Result<u64, SnapshotError> {
    whole_pages(size)?;
    let left = r.header(VRAM, limit(size))?;
    engine.vram_zero(base, size).map_err(engine_err)?;
    let mut runs = RunReader {
        r,
        io,
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
struct RunReader<'r, 'a, 'f> {
    r: &'r mut SnapReader<'a>,
    io: Io<'f>,
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

/// A piece of the section as `RunReader::fill` plans it: a run header (read at once, its
/// bytes kept for the hash) or data bytes for the buffer at `at`.
enum Part {
    Head([u8; RUN_HEADER as usize]),
    /// Offset in the buffer, bytes, offset in the file (positional reads).
    Data(usize, usize, u64),
}

impl RunReader<'_, '_, '_> {
    fn bad(what: String) -> SnapshotError {
        SnapshotError::Invalid {
            section: "VRAM",
            what,
        }
    }

    /// Reads `n` section bytes whose CRC comes later: into `buf` from the stream, or (from a
    /// file) only counted, returning their file offset for the lanes.
    fn defer(&mut self, buf: &mut [u8]) -> Result<u64, SnapshotError> {
        match self.io {
            Io::Stream => {
                self.r.exact_deferred(buf, "VRAM")?;
                Ok(0)
            }
            Io::File { at, .. } => {
                let off = at.get();
                self.r.skip_deferred(buf.len() as u64, "VRAM")?;
                at.set(off + buf.len() as u64);
                Ok(off)
            }
        }
    }

    /// The next run's header, checked.
    fn header(&mut self) -> Result<[u8; RUN_HEADER as usize], SnapshotError> {
        if self.left < RUN_HEADER {
            return Err(Self::bad(format!("{} bytes left, not a run", self.left)));
        }
        let mut h = [0u8; RUN_HEADER as usize];
        let off = self.defer(&mut h)?;
        if let Io::File { file, .. } = self.io {
            file.read_exact_at(&mut h, off).map_err(eof)?;
        }
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
        Ok(h)
    }

    /// Fills `buf` with whole pages of runs, listing their addresses in `pas`; nothing listed
    /// at the end of the section.
    fn fill(&mut self, buf: &mut [u8], pas: &mut Vec<u64>, base: u64) -> Result<(), SnapshotError> {
        let room = buf.len() as u64 / PAGE;
        let mut filled = 0u64;
        let mut parts = Vec::new();
        while filled < room {
            if self.run.1 == 0 {
                if self.left == 0 {
                    break;
                }
                parts.push(Part::Head(self.header()?));
            }
            let (page, count) = self.run;
            let n = count.min(room - filled);
            let (at, len) = ((filled * PAGE) as usize, (n * PAGE) as usize);
            let off = self.defer(&mut buf[at..at + len])?;
            parts.push(Part::Data(at, len, off));
            pas.extend((page..page + n).map(|p| base + p * PAGE));
            self.run = (page + n, count - n);
            self.left -= n * PAGE;
            self.data += n * PAGE;
            filled += n;
        }
        // The data's CRCs (from a file: read by the lanes first), then every part's in order.
        let data: Vec<Crc> = match self.io {
            Io::Stream => {
                let pieces: Vec<&[u8]> = parts
                    .iter()
                    .filter_map(|p| match *p {
                        Part::Data(at, len, _) => Some(&buf[at..at + len]),
                        Part::Head(_) => None,
                    })
                    .collect();
                snapfmt::crc::pieces(&pieces)
            }
            Io::File { file, .. } => {
                let mut rest = &mut buf[..];
                let mut taken = 0usize;
                let mut reads = Vec::new();
                for p in &parts {
                    if let Part::Data(at, len, off) = *p {
                        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - taken);
                        let (mine, tail) = tail.split_at_mut(len);
                        reads.push((off, mine));
                        rest = tail;
                        taken = at + len;
                    }
                }
                lanes::read_at(file, reads).map_err(eof)?
            }
        };
        let mut data = data.into_iter();
        for p in &parts {
            let c = match p {
                Part::Head(h) => Crc::of(h),
                Part::Data(..) => data.next().unwrap_or(Crc::EMPTY),
            };
            self.r.hashed(c)?;
        }
        Ok(())
    }
}

/// A file read past its end is a truncated image.
fn eof(e: std::io::Error) -> SnapshotError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        SnapshotError::Truncated("VRAM")
    } else {
        SnapshotError::Io(e)
    }
}

/// Zeroes the partition after a failed restore (on sim, pages already zero are left untouched).
pub fn scrub(engine: &dyn EngineSnapshot, base: u64, size: u64) -> Result<(), SnapshotError> {
    engine.vram_zero(base, size).map_err(engine_err)
}

#[cfg(test)]
mod tests {
    use pgpu::Engine;
    use pgpu::sim::{SimConfig, SimEngine};

    use super::super::format::{self, split_sections};
    use super::*;

    const MIB: u64 = 1 << 20;

    fn engine() -> SimEngine {
        SimEngine::new(SimConfig {
            vram_size: 16 * MIB,
            ..SimConfig::default()
        })
        .unwrap()
    }

    /// The runs `(first page, pages)` of a VRAM section's payload.
    fn section_runs(snap: &[u8]) -> Vec<(u64, u64)> {
        let secs = split_sections(snap).unwrap();
        let (_, p) = secs.iter().find(|(t, _)| *t == VRAM).unwrap();
        let mut at = 0;
        let mut runs = Vec::new();
        while at < p.len() {
            let first = u64::from_le_bytes(p[at..at + 8].try_into().unwrap());
            let n = u64::from(u32::from_le_bytes(p[at + 8..at + 12].try_into().unwrap()));
            runs.push((first, n));
            at += 12 + (n * PAGE) as usize;
        }
        assert_eq!(at, p.len());
        runs
    }

    fn save_to_vec(e: &SimEngine, base: u64, size: u64) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut w = SnapWriter::new(&mut out).unwrap();
        let data = save(&mut w, e, base, size, Io::Stream).unwrap();
        w.finish().unwrap();
        (out, data)
    }

    fn restore_from(
        snap: &[u8],
        e: &SimEngine,
        base: u64,
        size: u64,
    ) -> Result<u64, SnapshotError> {
        let mut input = snap;
        let mut r = SnapReader::new(&mut input)?;
        let data = restore(&mut r, e, base, size, Io::Stream)?;
        r.finish()?;
        Ok(data)
    }

    /// A new file in a directory of this test's own (removed when dropped).
    struct TempFile(std::path::PathBuf, std::fs::File);

    impl TempFile {
        fn new(name: &str) -> TempFile {
            let dir = std::env::temp_dir().join(format!(
                "vgpu-vram-{}-{name}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("snap");
            let f = std::fs::File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .unwrap();
            TempFile(dir, f)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Saves through the file path (lanes writing at offsets); returns the file's bytes.
    fn save_to_file(e: &SimEngine, base: u64, size: u64) -> (Vec<u8>, u64) {
        let t = TempFile::new("save");
        let at = std::cell::Cell::new(0);
        let mut out = lanes::FileAt {
            file: &t.1,
            at: &at,
        };
        let mut w = SnapWriter::new(&mut out).unwrap();
        let io = Io::File {
            file: &t.1,
            at: &at,
        };
        let data = save(&mut w, e, base, size, io).unwrap();
        let n = w.finish().unwrap();
        assert_eq!(n, at.get());
        (std::fs::read(t.0.join("snap")).unwrap(), data)
    }

    /// Restores through the file path (lanes reading at offsets).
    fn restore_from_file(
        snap: &[u8],
        e: &SimEngine,
        base: u64,
        size: u64,
    ) -> Result<u64, SnapshotError> {
        let t = TempFile::new("restore");
        std::fs::write(t.0.join("snap"), snap).unwrap();
        let at = std::cell::Cell::new(0);
        let mut input = lanes::FileAt {
            file: &t.1,
            at: &at,
        };
        let mut r = SnapReader::new(&mut input)?;
        let io = Io::File {
            file: &t.1,
            at: &at,
        };
        let data = restore(&mut r, e, base, size, io)?;
        r.finish()?;
        Ok(data)
    }

    fn bytes(e: &SimEngine, pa: u64, len: u64) -> Vec<u8> {
        let mut b = vec![0u8; len as usize];
        e.vram_read(pa, &mut b).unwrap();
        b
    }

    #[test]
    fn sections_of_patterns_round_trip() {
        // A partition at 2 MiB of 10 MiB + 12 KiB (not a multiple of the engines' 4 MiB
        // chunks). Cases: all zero; all non-zero; runs crossing 4 MiB boundaries, one ending
        // at the partition's last page, single pages with one byte set at either end.
        let (base, size) = (2 * MIB, 10 * MIB + 12 * 1024);
        let pages = size / PAGE;
        let cases: Vec<(&str, Vec<(u64, u64)>)> = vec![
            ("all zero", vec![]),
            ("all non-zero", vec![(0, pages)]),
            (
                "runs",
                vec![
                    (0, 1),
                    (2, 1),
                    (1020, 10),
                    (2040, 20),
                    (2047, 0),
                    (2300, 5),
                    (pages - 3, 3),
                ],
            ),
        ];
        for (name, mut runs) in cases {
            runs.retain(|r| r.1 > 0);
            let src = engine();
            // Bytes outside the partition must not be saved.
            src.vram_fill(0, base, 0x77).unwrap();
            src.vram_fill(base + size, 16 * MIB - base - size, 0x77)
                .unwrap();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for &(first, n) in &runs {
                let mut b = vec![0u8; (n * PAGE) as usize];
                for w in b.chunks_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    w.copy_from_slice(&(x | 1).to_le_bytes());
                }
                src.vram_write(base + first * PAGE, &b).unwrap();
            }
            // Single bytes at a page's first and last byte are pages of their own.
            let mut want = runs.clone();
            if name == "runs" {
                src.vram_write(base + 100 * PAGE, &[1]).unwrap();
                src.vram_write(base + 102 * PAGE - 1, &[1]).unwrap();
                want.insert(2, (100, 2));
            }
            let (snap, data) = save_to_vec(&src, base, size);
            let merged = {
                let mut m: Vec<(u64, u64)> = Vec::new();
                for &(f, n) in &want {
                    match m.last_mut() {
                        Some((mf, mn)) if *mf + *mn == f => *mn += n,
                        _ => m.push((f, n)),
                    }
                }
                m
            };
            assert_eq!(section_runs(&snap), merged, "{name}");
            assert_eq!(
                data,
                merged.iter().map(|r| r.1 * PAGE).sum::<u64>(),
                "{name}"
            );
            // Into a partition full of other bytes: saved pages come back, the rest is zero,
            // nothing outside the partition changes.
            let dst = engine();
            dst.vram_fill(0, 16 * MIB, 0x33).unwrap();
            assert_eq!(
                restore_from(&snap, &dst, base, size).unwrap(),
                data,
                "{name}"
            );
            assert!(bytes(&src, base, size) == bytes(&dst, base, size), "{name}");
            assert!(bytes(&dst, 0, base).iter().all(|&b| b == 0x33), "{name}");
            let after = base + size;
            assert!(
                bytes(&dst, after, 16 * MIB - after)
                    .iter()
                    .all(|&b| b == 0x33),
                "{name}"
            );
            // Saving the restored partition gives the same bytes; so does the file path, and
            // restoring from a file gives the same partition.
            assert!(save_to_vec(&dst, base, size).0 == snap, "{name}");
            assert!(
                save_to_file(&dst, base, size) == (snap.clone(), data),
                "{name}"
            );
            let again = engine();
            again.vram_fill(0, 16 * MIB, 0x44).unwrap();
            assert_eq!(
                restore_from_file(&snap, &again, base, size).unwrap(),
                data,
                "{name}"
            );
            assert!(
                bytes(&src, base, size) == bytes(&again, base, size),
                "{name}"
            );
            assert!(bytes(&again, 0, base).iter().all(|&b| b == 0x44), "{name}");
        }
    }

    #[test]
    fn hostile_runs_are_refused() {
        let (base, size) = (0, 4 * MIB);
        let src = engine();
        src.vram_fill(PAGE, 3 * PAGE, 9).unwrap();
        let (snap, _) = save_to_vec(&src, base, size);
        let mut secs = split_sections(&snap).unwrap();
        let vram_at = secs.iter().position(|(t, _)| *t == VRAM).unwrap();
        let good = secs[vram_at].1.clone();
        let mut forge = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut p = good.clone();
            edit(&mut p);
            secs[vram_at].1 = p;
            let f = format::assemble(format::VERSION, &secs);
            let dst = engine();
            let from_stream = restore_from(&f, &dst, base, size);
            // The file path refuses what the stream path refuses, the same way.
            let from_file = restore_from_file(&f, &engine(), base, size);
            assert_eq!(
                format!("{from_stream:?}"),
                format!("{from_file:?}"),
                "stream and file paths disagree"
            );
            from_stream
        };
        // Past the partition, empty, overlapping the previous run, shorter than announced.
        let e = forge(&|p| p[..8].copy_from_slice(&(size / PAGE - 1).to_le_bytes()));
        assert!(matches!(e, Err(SnapshotError::Invalid { .. })), "{e:?}");
        let e = forge(&|p| p[8..12].copy_from_slice(&0u32.to_le_bytes()));
        assert!(matches!(e, Err(SnapshotError::Invalid { .. })), "{e:?}");
        let e = forge(&|p| {
            let mut two = p.clone();
            two[..8].copy_from_slice(&0u64.to_le_bytes());
            p.extend_from_slice(&two);
        });
        assert!(matches!(e, Err(SnapshotError::Invalid { .. })), "{e:?}");
        let e = forge(&|p| p[8..12].copy_from_slice(&4u32.to_le_bytes()));
        assert!(matches!(e, Err(SnapshotError::Invalid { .. })), "{e:?}");
        let e = forge(&|p| p.extend_from_slice(&[0; 5]));
        assert!(matches!(e, Err(SnapshotError::Invalid { .. })), "{e:?}");
        assert!(forge(&|_| {}).is_ok());
        // Truncated files and flipped bits (the CRC made by `assemble` no longer matches the
        // bytes edited after it): refused by both paths, never a panic.
        secs[vram_at].1 = good.clone();
        let f = format::assemble(format::VERSION, &secs);
        let at = f.len() - good.len() - 24;
        for cut in [at + 3, at + 16 + 12, at + 16 + 12 + 4096, f.len() - 1] {
            let e = restore_from_file(&f[..cut], &engine(), base, size).unwrap_err();
            assert!(
                matches!(e, SnapshotError::Truncated(_)),
                "cut at {cut}: {e:?}"
            );
            assert!(restore_from(&f[..cut], &engine(), base, size).is_err());
        }
        for byte in [at + 16, at + 16 + 12 + 5, f.len() - 30] {
            let mut g = f.clone();
            g[byte] ^= 0x10;
            let s = restore_from(&g, &engine(), base, size).unwrap_err();
            let e = restore_from_file(&g, &engine(), base, size).unwrap_err();
            assert_eq!(format!("{s:?}"), format!("{e:?}"), "byte {byte}");
        }
    }
}
