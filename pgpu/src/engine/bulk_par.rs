//! Bulk VRAM reads and writes in batches of [`BATCH`] bytes copied on several threads, for
//! engines whose `vram_read`/`vram_write` are host memory copies that may run concurrently (the
//! sim engine): the same contract as `EngineSnapshot::vram_read_runs_batched` and
//! `vram_write_pages`, with batches as large as the cuda engine's pinned slots, so that a
//! snapshot's consumer sees the same pieces in either engine and the copies are not one
//! core's memcpy.

use std::ops::ControlFlow;

use rayon::prelude::*;

use super::bulk::{BatchSink, CHUNK, PageSource, VRAM_PAGE, check_pages, check_sourced};
use super::{Engine, EngineError};

/// Bytes of a batch at most (the cuda engine's slot size).
pub const BATCH: u64 = 64 << 20;

/// Bytes of a batch here: a `CHUNK` per thread of the pool, at most [`BATCH`] (a batch that
/// stays in the caches while its consumer hashes and writes it, on a machine of few cores).
pub fn batch() -> u64 {
    (CHUNK * rayon::current_num_threads() as u64).clamp(CHUNK, BATCH)
}

/// Reads `(dst, pa)` pieces into their buffers, each in `CHUNK`-byte copies, on the rayon pool.
fn read_all<E: Engine + ?Sized>(e: &E, parts: Vec<(&mut [u8], u64)>) -> Result<(), EngineError> {
    let mut lanes = Vec::new();
    for (dst, pa) in parts {
        let mut at = pa;
        for l in dst.chunks_mut(CHUNK as usize) {
            let n = l.len() as u64;
            lanes.push((l, at));
            at += n;
        }
    }
    lanes
        .into_par_iter()
        .try_for_each(|(l, pa)| e.vram_read(pa, l))
}

pub(crate) fn read_runs_batched<E: Engine + ?Sized>(
    e: &E,
    runs: &[(u64, u64)],
    sink: &mut BatchSink<'_>,
) -> Result<ControlFlow<()>, EngineError> {
    let vram = e.info().vram_size;
    for &(pa, len) in runs {
        check_pages(pa, len, vram)?;
    }
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let mut buf = vec![0u8; batch().min(total) as usize];
    let (mut run, mut at) = (0usize, 0u64);
    while run < runs.len() {
        // The next batch: pieces of runs, in order, none spanning two runs.
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        let mut filled = 0u64;
        while filled < buf.len() as u64 && run < runs.len() {
            let (pa, len) = runs[run];
            let n = (len - at).min(buf.len() as u64 - filled);
            if n > 0 {
                pieces.push((pa + at, n));
                filled += n;
                at += n;
            }
            if at == len {
                (run, at) = (run + 1, 0);
            }
        }
        let mut rest = &mut buf[..filled as usize];
        let mut parts = Vec::with_capacity(pieces.len());
        for &(pa, n) in &pieces {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(n as usize);
            parts.push((mine, pa));
            rest = tail;
        }
        read_all(e, parts)?;
        let mut slices = Vec::with_capacity(pieces.len());
        let mut off = 0usize;
        for &(_, n) in &pieces {
            slices.push(&buf[off..off + n as usize]);
            off += n as usize;
        }
        if sink(&slices).is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}

pub(crate) fn write_pages<E: Engine + ?Sized>(
    e: &E,
    source: &mut PageSource<'_>,
) -> Result<ControlFlow<()>, EngineError> {
    let vram = e.info().vram_size;
    let mut buf = vec![0u8; batch() as usize];
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
        // Consecutive pages in one write, at most CHUNK bytes each; the writes in parallel
        // (a page listed twice in one call: undefined which bytes win, as documented).
        let page = VRAM_PAGE as usize;
        let mut writes: Vec<(u64, &[u8])> = Vec::new();
        let mut i = 0;
        while i < pas.len() {
            let mut j = i + 1;
            while j < pas.len()
                && pas[j] == pas[j - 1] + VRAM_PAGE
                && (j - i) * page < CHUNK as usize
            {
                j += 1;
            }
            writes.push((pas[i], &buf[i * page..j * page]));
            i = j;
        }
        writes
            .into_par_iter()
            .try_for_each(|(pa, b)| e.vram_write(pa, b))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineSnapshot;
    use crate::sim::{SimConfig, SimEngine};

    /// The parallel batches read and write exactly what the one-buffer defaults do.
    #[test]
    fn batches_match_the_serial_defaults() {
        let mib = 1u64 << 20;
        let e = SimEngine::new(SimConfig {
            vram_size: 160 * mib,
            ..SimConfig::default()
        })
        .unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut pattern = vec![0u8; (150 * mib) as usize];
        for w in pattern.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        e.vram_write(0, &pattern).unwrap();
        // Runs crossing batch boundaries, one longer than a batch, single pages.
        let runs = vec![
            (0, VRAM_PAGE),
            (2 * VRAM_PAGE, 3 * mib),
            (4 * mib, 70 * mib),
            (80 * mib, 60 * mib + 5 * VRAM_PAGE),
            (141 * mib, VRAM_PAGE),
        ];
        let want: Vec<u8> = runs
            .iter()
            .flat_map(|&(pa, len)| pattern[pa as usize..(pa + len) as usize].to_vec())
            .collect();
        let mut got = Vec::new();
        let mut batches = 0;
        let mut sink = |ps: &[&[u8]]| {
            batches += 1;
            assert!(ps.iter().map(|p| p.len() as u64).sum::<u64>() <= BATCH);
            for p in ps {
                got.extend_from_slice(p);
            }
            ControlFlow::Continue(())
        };
        assert!(
            e.vram_read_runs_batched(&runs, &mut sink)
                .unwrap()
                .is_continue()
        );
        assert_eq!(batches, want.len().div_ceil(batch() as usize));
        assert!(got == want);
        // Write them back elsewhere in reverse page order through the parallel writes.
        e.vram_zero(0, 160 * mib).unwrap();
        let pages: Vec<u64> = (0..want.len() as u64 / VRAM_PAGE).collect();
        let mut next = 0usize;
        let mut source = |b: &mut [u8], pas: &mut Vec<u64>| {
            let room = b.len() / VRAM_PAGE as usize;
            for (k, &p) in pages[next..].iter().take(room).enumerate() {
                let at = k * VRAM_PAGE as usize;
                let src = (p * VRAM_PAGE) as usize;
                b[at..at + VRAM_PAGE as usize]
                    .copy_from_slice(&want[src..src + VRAM_PAGE as usize]);
                pas.push((pages.len() as u64 - 1 - p) * VRAM_PAGE);
            }
            next += pas.len();
            ControlFlow::Continue(())
        };
        assert!(e.vram_write_pages(&mut source).unwrap().is_continue());
        let mut back = vec![0u8; want.len()];
        e.vram_read(0, &mut back).unwrap();
        for (i, page) in back.chunks(VRAM_PAGE as usize).enumerate() {
            let src = (pages.len() - 1 - i) * VRAM_PAGE as usize;
            assert!(page == &want[src..src + VRAM_PAGE as usize], "page {i}");
        }
        // Bad arguments are refused before anything is read.
        let e2 =
            e.vram_read_runs_batched(&[(159 * mib, 2 * mib)], &mut |_| ControlFlow::Continue(()));
        assert!(e2.is_err());
    }
}
