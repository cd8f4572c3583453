//! The engine-level part of `vgpu-bench snapshot`: a partition filled with random non-zero
//! pages, then per repetition the bulk VRAM calls timed as a snapshot uses them (docs/snapshot.md,
//! "VRAM"): save = non-zero page bitmap + the non-zero runs read once into host memory or a
//! file; restore = zero the partition + write the pages back from memory or the file. The
//! partition's contents are checked after every restore of the first repetition (plain
//! `vram_read`, not the calls under test). Host memory copies run on up to 8 threads
//! (`par_copy`); file reads and writes on one.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant};

use pgpu::EngineSnapshot;
use pgpu::engine::bulk::{VRAM_PAGE as PAGE, for_each_run};

use crate::error::BenchError;

/// What was put in the partition: its runs (partition offsets, bytes) and their digest.
pub struct Filled {
    pub runs: Vec<(u64, u64)>,
    pub bytes: u64,
    pub digest: u64,
}

/// A pseudo-random generator (xorshift64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Digest of bytes, page after page (verification only, not timed).
pub fn digest(mut h: u64, bytes: &[u8]) -> u64 {
    for w in bytes.chunks_exact(8) {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Copies `src` to `dst` (same length), on several threads for large pieces: the host side of
/// "save to memory" and "restore from memory" (one core's memcpy, about 10 GB/s, would
/// otherwise be what is measured, not the engine).
pub fn par_copy(dst: &mut [u8], src: &[u8]) {
    const MIN: usize = 8 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(8)
        .min(src.len() / MIN)
        .max(1);
    if threads == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let part = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(part).zip(src.chunks(part)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

fn eng(e: pgpu::EngineError) -> BenchError {
    BenchError::Engine(e)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Fills `fill` of the partition's pages (runs of `run_pages` pages at random places) with
/// random bytes through `vram_write`; zeroes the rest.
pub fn fill(
    e: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    fill: f64,
    run_pages: u64,
    seed: u64,
) -> Result<Filled, BenchError> {
    e.vram_zero(base, size).map_err(eng)?;
    let slots = (size / PAGE).div_ceil(run_pages);
    let want = ((size / PAGE) as f64 * fill).round() as u64;
    let mut rng = Rng(seed | 1);
    let mut order: Vec<u64> = (0..slots).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut chosen: Vec<u64> = Vec::new();
    let mut pages = 0;
    for s in order {
        if pages >= want {
            break;
        }
        let n = run_pages.min(size / PAGE - s * run_pages);
        chosen.push(s);
        pages += n;
    }
    chosen.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for s in chosen {
        let (off, len) = (
            s * run_pages * PAGE,
            (run_pages * PAGE).min(size - s * run_pages * PAGE),
        );
        match runs.last_mut() {
            Some((o, l)) if *o + *l == off => *l += len,
            _ => runs.push((off, len)),
        }
    }
    let mut buf = vec![0u8; 4 << 20];
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &(off, len) in &runs {
        let mut at = 0;
        while at < len {
            let n = (len - at).min(buf.len() as u64) as usize;
            for w in buf[..n].chunks_exact_mut(8) {
                w.copy_from_slice(&(rng.next() | 1).to_le_bytes());
            }
            h = digest(h, &buf[..n]);
            e.vram_write(base + off + at, &buf[..n]).map_err(eng)?;
            at += n as u64;
        }
    }
    Ok(Filled {
        bytes: runs.iter().map(|r| r.1).sum(),
        runs,
        digest: h,
    })
}

/// Checks the partition with plain reads: the non-zero pages are exactly those of `f`, with
/// its digest.
pub fn verify(
    e: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    f: &Filled,
    what: &str,
) -> Result<(), BenchError> {
    let mut buf = vec![0u8; 4 << 20];
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        e.vram_read(base + off, &mut buf[..n]).map_err(eng)?;
        for (i, page) in buf[..n].chunks(PAGE as usize).enumerate() {
            if page.iter().any(|&b| b != 0) {
                h = digest(h, page);
                let p = off + i as u64 * PAGE;
                match runs.last_mut() {
                    Some((o, l)) if *o + *l == p => *l += PAGE,
                    _ => runs.push((p, PAGE)),
                }
            }
        }
        off += n as u64;
    }
    if runs != f.runs || h != f.digest {
        return Err(BenchError::Check {
            workload: "snapshot".into(),
            msg: format!("{what}: the partition differs from what was written"),
        });
    }
    Ok(())
}

/// The partition's non-zero runs (absolute addresses, bytes) from the engine's bitmap.
fn runs_of(e: &dyn EngineSnapshot, base: u64, size: u64) -> Result<Vec<(u64, u64)>, BenchError> {
    let pages = size / PAGE;
    let mut bm = vec![0u64; pages.div_ceil(64) as usize];
    e.vram_nonzero_pages(base, pages, &mut bm).map_err(eng)?;
    let mut runs = Vec::new();
    for_each_run(&bm, pages, |s, n| {
        runs.push((base + s * PAGE, n * PAGE));
        Ok::<(), ()>(())
    })
    .ok();
    Ok(runs)
}

/// The timings of one repetition.
#[derive(Debug, Clone, Default)]
pub struct Times {
    pub bitmap: Duration,
    pub save_mem: Duration,
    pub save_file: Duration,
    pub save_file_fsync: Duration,
    pub restore_mem: Duration,
    pub restore_file: Duration,
    pub restore_file_cold: Duration,
}

/// Saves: bitmap, then the runs into `sink`; checks the byte count.
fn save(
    e: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    f: &Filled,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), BenchError>,
) -> Result<(), BenchError> {
    let runs = runs_of(e, base, size)?;
    let (mut got, mut failed) = (0u64, None);
    // A stopped sink leaves its error in `failed`.
    let _ = e
        .vram_read_runs(&runs, &mut |p| match sink(p) {
            Ok(()) => {
                got += p.len() as u64;
                ControlFlow::Continue(())
            }
            Err(err) => {
                failed = Some(err);
                ControlFlow::Break(())
            }
        })
        .map_err(eng)?;
    if let Some(err) = failed {
        return Err(err);
    }
    if got != f.bytes {
        return Err(BenchError::Check {
            workload: "snapshot".into(),
            msg: format!("saved {got} bytes, {} expected", f.bytes),
        });
    }
    Ok(())
}

/// Saves into `mem` (packed in order) through the batched read: each transfer's pieces are
/// copied out on up to 8 threads (`par_copy_pieces`); checks the byte count.
fn save_to_memory(
    e: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    f: &Filled,
    mem: &mut [u8],
) -> Result<(), BenchError> {
    let runs = runs_of(e, base, size)?;
    let (mut at, mut short) = (0usize, false);
    // A stop (`Break`) is reported through `short`.
    let _ = e
        .vram_read_runs_batched(&runs, &mut |pieces| {
            let n: usize = pieces.iter().map(|p| p.len()).sum();
            match mem.get_mut(at..at + n) {
                Some(dst) => {
                    par_copy_pieces(dst, pieces);
                    at += n;
                    ControlFlow::Continue(())
                }
                None => {
                    short = true;
                    ControlFlow::Break(())
                }
            }
        })
        .map_err(eng)?;
    if short || at as u64 != f.bytes {
        return Err(BenchError::Check {
            workload: "snapshot".into(),
            msg: format!("saved {at} bytes or more, {} expected", f.bytes),
        });
    }
    Ok(())
}

/// Copies `pieces` one after another into `dst` (their total length), on up to 8 threads, each
/// taking consecutive pieces of about the same number of bytes; one piece alone goes through
/// [`par_copy`].
pub fn par_copy_pieces(dst: &mut [u8], pieces: &[&[u8]]) {
    if let [one] = pieces {
        par_copy(dst, one);
        return;
    }
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(8)
        .min(total / (8 << 20))
        .max(1);
    let share = total.div_ceil(threads);
    std::thread::scope(|s| {
        let mut rest = dst;
        let (mut group, mut bytes) = (Vec::new(), 0usize);
        for (i, p) in pieces.iter().enumerate() {
            group.push(*p);
            bytes += p.len();
            if bytes >= share || i + 1 == pieces.len() {
                let (d, r) = std::mem::take(&mut rest).split_at_mut(bytes);
                rest = r;
                let g = std::mem::take(&mut group);
                s.spawn(move || {
                    let mut at = 0;
                    for p in g {
                        d[at..at + p.len()].copy_from_slice(p);
                        at += p.len();
                    }
                });
                bytes = 0;
            }
        }
    });
}

/// Restores: zero the partition, then write the runs' pages from `fill_from(buf)` (which
/// fills all of `buf` with the next bytes).
fn restore(
    e: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    f: &Filled,
    fill_from: &mut dyn FnMut(&mut [u8]) -> Result<(), BenchError>,
) -> Result<(), BenchError> {
    e.vram_zero(base, size).map_err(eng)?;
    let (mut run, mut at, mut failed) = (0usize, 0u64, None);
    // A stopped source leaves its error in `failed`.
    let _ = e
        .vram_write_pages(&mut |buf, pas| {
            let room = buf.len() as u64 / PAGE;
            while (pas.len() as u64) < room && run < f.runs.len() {
                let (off, len) = f.runs[run];
                let n = ((len - at) / PAGE).min(room - pas.len() as u64);
                pas.extend((0..n).map(|k| base + off + at + k * PAGE));
                at += n * PAGE;
                if at == len {
                    (run, at) = (run + 1, 0);
                }
            }
            match fill_from(&mut buf[..pas.len() * PAGE as usize]) {
                Ok(()) => ControlFlow::Continue(()),
                Err(err) => {
                    failed = Some(err);
                    ControlFlow::Break(())
                }
            }
        })
        .map_err(eng)?;
    failed.map_or(Ok(()), Err)
}

/// One repetition; `mem` is a host buffer of `f.bytes` (touched before), `file` a path in the
/// out directory that this run created.
pub fn repetition(
    e: &dyn EngineSnapshot,
    base: u64,
    size: u64,
    f: &Filled,
    mem: &mut [u8],
    file: &Path,
    check: bool,
) -> Result<Times, BenchError> {
    let mut t = Times::default();
    let pages = size / PAGE;
    let mut bm = vec![0u64; pages.div_ceil(64) as usize];
    let s = Instant::now();
    e.vram_nonzero_pages(base, pages, &mut bm).map_err(eng)?;
    t.bitmap = s.elapsed();

    let s = Instant::now();
    save_to_memory(e, base, size, f, mem)?;
    t.save_mem = s.elapsed();
    if check && digest(0xcbf2_9ce4_8422_2325, mem) != f.digest {
        return Err(BenchError::Check {
            workload: "snapshot".into(),
            msg: "the bytes saved to memory differ from those written".into(),
        });
    }

    for fsync in [false, true] {
        let s = Instant::now();
        let out = File::options()
            .write(true)
            .truncate(true)
            .open(file)
            .map_err(io(file))?;
        let mut w = BufWriter::with_capacity(8 << 20, out);
        save(e, base, size, f, &mut |p| w.write_all(p).map_err(io(file)))?;
        let out = w.into_inner().map_err(|e| io(file)(e.into_error()))?;
        if fsync {
            out.sync_all().map_err(io(file))?;
            t.save_file_fsync = s.elapsed();
        } else {
            t.save_file = s.elapsed();
        }
    }

    let s = Instant::now();
    let mut at = 0usize;
    restore(e, base, size, f, &mut |buf| {
        par_copy(buf, &mem[at..at + buf.len()]);
        at += buf.len();
        Ok(())
    })?;
    t.restore_mem = s.elapsed();
    if check {
        verify(e, base, size, f, "restore from memory")?;
    }

    for cold in [false, true] {
        let mut input = File::open(file).map_err(io(file))?;
        if cold {
            // Drop the file's pages from the page cache (written and fsynced above).
            // SAFETY: a plain syscall on a descriptor we own.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&input),
                    0,
                    0,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
        let s = Instant::now();
        restore(e, base, size, f, &mut |buf| {
            input.read_exact(buf).map_err(io(file))
        })?;
        let d = s.elapsed();
        if cold {
            t.restore_file_cold = d;
        } else {
            t.restore_file = d;
        }
        if check {
            verify(
                e,
                base,
                size,
                f,
                if cold {
                    "restore from a cold file"
                } else {
                    "restore from a file"
                },
            )?;
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn pieces_land_in_order_whatever_the_grouping() {
        let a: Vec<u8> = (0..(5u32 << 20)).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..(9u32 << 20)).map(|i| (i * 7) as u8).collect();
        let c = vec![3u8; 4096];
        let d: Vec<u8> = (0..(17u32 << 20)).map(|i| (i >> 3) as u8).collect();
        for pieces in [
            vec![&a[..]],
            vec![&c[..], &c[..]],
            vec![&a[..], &b[..], &c[..], &d[..]],
        ] {
            let total: usize = pieces.iter().map(|p| p.len()).sum();
            let mut dst = vec![0u8; total];
            super::par_copy_pieces(&mut dst, &pieces);
            assert_eq!(dst, pieces.concat());
        }
    }
}
