//! A check of an engine's bulk VRAM calls (`EngineSnapshot::vram_nonzero_pages`, `vram_read_runs`,
//! `vram_write_pages`, `vram_zero`) against its plain `vram_read`/`vram_write` and a host copy
//! of the bytes: the bitmap equal to a byte-by-byte scan (pages with one non-zero byte at
//! their first, last or a random offset included), the runs read back in order with no piece
//! spanning two runs (and `vram_read_runs_batched` the same bytes, in pieces of its own cut by the same rules), pages written in a scattered order landing where listed, and zeroing
//! touching nothing outside its range. Written against the trait only: `tests/bulk.rs` runs it
//! on the sim engine and on the trait's default implementations, `tests/cuda.rs` on the cuda
//! engine. Returns a message naming what broke instead of panicking.

use std::ops::ControlFlow;

use crate::engine::bulk::{VRAM_PAGE as PAGE, for_each_run};
use crate::engine::{EngineError, EngineSnapshot};

/// What the check saw (for the test's output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkReport {
    /// Non-zero pages in the range.
    pub nonzero: u64,
    /// Runs of them.
    pub runs: u64,
    /// Pieces the engine handed to the reader.
    pub pieces: u64,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn e2s(what: &str) -> impl Fn(EngineError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The bitmap of `bytes` (one bit per page), byte by byte.
fn scan(bytes: &[u8]) -> Vec<u64> {
    let pages = bytes.len() / PAGE as usize;
    let mut bm = vec![0u64; pages.div_ceil(64)];
    for (p, page) in bytes.chunks(PAGE as usize).enumerate() {
        if page.iter().any(|&b| b != 0) {
            bm[p / 64] |= 1 << (p % 64);
        }
    }
    bm
}

/// Checks the bulk calls on `pages` pages at `pa` (4 KiB aligned; the engine's VRAM there is
/// overwritten), with pseudo-random contents from `seed`. The page just before and just after
/// the range (when inside VRAM) must keep their bytes.
pub fn check_bulk(
    e: &dyn EngineSnapshot,
    pa: u64,
    pages: u64,
    seed: u64,
) -> Result<BulkReport, String> {
    let len = pages * PAGE;
    let vram = e.info().vram_size;
    let mut rng = Rng(seed | 1);
    // Guard pages around the range hold a pattern that must survive.
    let guards: Vec<u64> = [
        pa.checked_sub(PAGE),
        Some(pa + len).filter(|&g| g + PAGE <= vram),
    ]
    .into_iter()
    .flatten()
    .collect();
    for &g in &guards {
        e.vram_write(g, &[0xa5; PAGE as usize])
            .map_err(e2s("guard write"))?;
    }
    e.vram_zero(pa, len).map_err(e2s("vram_zero"))?;
    let mut host = vec![0u8; len as usize];
    e.vram_read(pa, &mut host).map_err(e2s("vram_read"))?;
    if host.iter().any(|&b| b != 0) {
        return Err("vram_zero left non-zero bytes".into());
    }
    // Runs of random pages, pages with a single non-zero byte, gaps.
    let mut p = 0;
    while p < pages {
        let gap = match rng.below(4) {
            0 => 0,
            1 => 1,
            _ => rng.below(96),
        }
        .min(pages / 8);
        p += gap;
        let run = match rng.below(5) {
            0 => 1,
            1 => 64 + rng.below(200),
            _ => 1 + rng.below(20),
        }
        .min(pages.saturating_sub(p));
        for q in p..p + run {
            let page = &mut host[(q * PAGE) as usize..((q + 1) * PAGE) as usize];
            match rng.below(4) {
                0 => {
                    let at = match rng.below(3) {
                        0 => 0,
                        1 => PAGE as usize - 1,
                        _ => rng.below(PAGE) as usize,
                    };
                    page[at] = 1 + rng.below(255) as u8;
                }
                _ => {
                    for w in page.chunks_mut(8) {
                        w.copy_from_slice(&rng.next().to_le_bytes());
                    }
                }
            }
        }
        p += run;
    }
    e.vram_write(pa, &host).map_err(e2s("vram_write"))?;
    let want = scan(&host);
    let mut bm = vec![u64::MAX; want.len() + 1];
    e.vram_nonzero_pages(pa, pages, &mut bm)
        .map_err(e2s("vram_nonzero_pages"))?;
    if bm[..want.len()] != want[..] || bm[want.len()] != 0 {
        let first = (0..pages)
            .find(|&q| (bm[(q / 64) as usize] ^ want[(q / 64) as usize]) >> (q % 64) & 1 == 1);
        return Err(format!(
            "bitmap differs from the byte scan (first at page {first:?}, or bits past the range set)"
        ));
    }
    let mut runs = Vec::new();
    for_each_run(&want, pages, |s, n| {
        runs.push((pa + s * PAGE, n * PAGE));
        Ok::<(), ()>(())
    })
    .ok();
    let nonzero: u64 = runs.iter().map(|r| r.1 / PAGE).sum();

    // Read the runs back: bytes in order, pieces of whole pages inside one run.
    let (mut got, mut pieces, mut err) = (Vec::new(), 0u64, None::<String>);
    let (mut run, mut left) = (0usize, runs.first().map_or(0, |r| r.1));
    let flow = e
        .vram_read_runs(&runs, &mut |piece: &[u8]| {
            pieces += 1;
            if piece.is_empty()
                || !(piece.len() as u64).is_multiple_of(PAGE)
                || piece.len() as u64 > left
            {
                err = Some(format!("piece of {} bytes in run {run}", piece.len()));
                return ControlFlow::Break(());
            }
            got.extend_from_slice(piece);
            left -= piece.len() as u64;
            if left == 0 {
                run += 1;
                left = runs.get(run).map_or(0, |r| r.1);
            }
            ControlFlow::Continue(())
        })
        .map_err(e2s("vram_read_runs"))?;
    if let Some(m) = err {
        return Err(m);
    }
    let expect: Vec<u8> = runs
        .iter()
        .flat_map(|&(a, n)| {
            host[(a - pa) as usize..(a - pa + n) as usize]
                .iter()
                .copied()
        })
        .collect();
    if flow.is_break() || got != expect {
        return Err(format!(
            "vram_read_runs returned {} bytes, {} expected, or other bytes",
            got.len(),
            expect.len()
        ));
    }
    // The batched read: the same bytes, in order, in batches of pieces that are whole pages and
    // never span two runs (how an engine cuts a run into pieces is its own: the sim engine cuts
    // by its copy threads' batches, `read_runs` by `CHUNK`).
    let (mut batched, mut bpieces) = (Vec::new(), 0u64);
    let (mut run, mut left, mut bad) = (0usize, runs.first().map_or(0, |r| r.1), None);
    let flow = e
        .vram_read_runs_batched(&runs, &mut |batch: &[&[u8]]| {
            for p in batch {
                bpieces += 1;
                let n = p.len() as u64;
                if n == 0 || !n.is_multiple_of(PAGE) || n > left {
                    bad = Some(format!("batched piece of {n} bytes in run {run}"));
                    return ControlFlow::Break(());
                }
                batched.extend_from_slice(p);
                left -= n;
                if left == 0 {
                    run += 1;
                    left = runs.get(run).map_or(0, |r| r.1);
                }
            }
            ControlFlow::Continue(())
        })
        .map_err(e2s("vram_read_runs_batched"))?;
    if let Some(m) = bad {
        return Err(m);
    }
    if flow.is_break() || batched != expect {
        return Err(format!(
            "vram_read_runs_batched returned {} bytes in {bpieces} pieces, {} expected ({pieces} \
             pieces from vram_read_runs), or other bytes",
            batched.len(),
            expect.len()
        ));
    }
    // A sink that stops: no more pieces after it.
    if !runs.is_empty() {
        let mut calls = 0;
        let flow = e
            .vram_read_runs(&runs, &mut |_| {
                calls += 1;
                ControlFlow::Break(())
            })
            .map_err(e2s("vram_read_runs"))?;
        if !flow.is_break() || calls != 1 {
            return Err(format!("a stopping sink was called {calls} times"));
        }
    }

    // Write pages in a scattered order (last page first, then the rest in random order), in
    // calls of varying fill, into a zeroed range.
    e.vram_zero(pa, len).map_err(e2s("vram_zero"))?;
    let mut order: Vec<u64> = (0..pages).filter(|_| rng.below(3) != 0).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut want2 = vec![0u8; len as usize];
    for &q in &order {
        let r = (q * PAGE) as usize..((q + 1) * PAGE) as usize;
        want2[r.clone()].copy_from_slice(&host[r]);
    }
    let mut next = 0usize;
    let flow = e
        .vram_write_pages(&mut |buf: &mut [u8], pas: &mut Vec<u64>| {
            let room = buf.len() / PAGE as usize;
            let n = (1 + rng.below(room as u64) as usize).min(order.len() - next);
            for (i, &q) in order[next..next + n].iter().enumerate() {
                let r = (q * PAGE) as usize..((q + 1) * PAGE) as usize;
                buf[i * PAGE as usize..(i + 1) * PAGE as usize].copy_from_slice(&host[r]);
                pas.push(pa + q * PAGE);
            }
            next += n;
            ControlFlow::Continue(())
        })
        .map_err(e2s("vram_write_pages"))?;
    let mut back = vec![0u8; len as usize];
    e.vram_read(pa, &mut back).map_err(e2s("vram_read"))?;
    if flow.is_break() || back != want2 {
        let first = back.iter().zip(&want2).position(|(a, b)| a != b);
        return Err(format!(
            "vram_write_pages: bytes differ (first at {first:?})"
        ));
    }
    // A page outside VRAM is refused.
    let r = e.vram_write_pages(&mut |_, pas: &mut Vec<u64>| {
        if pas.is_empty() {
            pas.push(vram);
        }
        ControlFlow::Continue(())
    });
    if r.is_ok() {
        return Err("vram_write_pages accepted a page outside VRAM".into());
    }

    // Zero a middle part: only it changes.
    let (a, b) = (pages / 3, pages - pages / 4);
    e.vram_zero(pa + a * PAGE, (b - a) * PAGE)
        .map_err(e2s("vram_zero"))?;
    want2[(a * PAGE) as usize..(b * PAGE) as usize].fill(0);
    e.vram_read(pa, &mut back).map_err(e2s("vram_read"))?;
    if back != want2 {
        return Err("vram_zero of a sub-range: bytes differ".into());
    }
    for &g in &guards {
        let mut gb = vec![0u8; PAGE as usize];
        e.vram_read(g, &mut gb).map_err(e2s("guard read"))?;
        if gb.iter().any(|&x| x != 0xa5) {
            return Err(format!("the guard page at {g:#x} changed"));
        }
    }
    // Out of range or misaligned: refused.
    if e.vram_nonzero_pages(vram - PAGE, 2, &mut [0; 1]).is_ok()
        || e.vram_zero(pa + 1, PAGE).is_ok()
        || e.vram_read_runs(&[(vram, PAGE)], &mut |_| ControlFlow::Continue(()))
            .is_ok()
    {
        return Err("a range outside VRAM or misaligned was accepted".into());
    }
    Ok(BulkReport {
        nonzero,
        runs: runs.len() as u64,
        pieces,
    })
}
