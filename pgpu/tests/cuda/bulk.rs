//! The bulk VRAM calls on the GPU (`pgpu::bulk_check`): the non-zero page bitmap of the
//! kernel equal to a byte-by-byte scan, runs read back through the pinned slots (more pages
//! than one slot, runs crossing slots), pages written in a scattered order, zeroing by the
//! device memset; then the speed of each on 256 MiB of random pages (`MEASURE` lines).

use std::ops::ControlFlow;
use std::time::Instant;

use pgpu::bulk_check::check_bulk;
use pgpu::cuda::CudaConfig;
use pgpu::*;

use crate::support::*;

const PG: u64 = 4096;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_bulk_vram_calls_match_byte_scans() {
    let vram = 512 * MIB;
    let e = cuda(CudaConfig {
        vram_size: vram,
        ..CudaConfig::default()
    });
    // One page and the last pages first (the slots are made at the first call, sized to it:
    // the smallest ones, then grown by the writes' whole slots), then three slots' worth of
    // pages (a slot is at most 64 MiB) starting off any boundary; the whole VRAM.
    for (pa, pages, seed) in [
        (5 * MIB, 1, 4),
        (vram - 70 * PG, 70, 3),
        (3 * PG, 3 * 16384 + 77, 1),
        (0, vram / PG, 2),
    ] {
        let r = check_bulk(&e, pa, pages, seed)
            .unwrap_or_else(|m| panic!("at {pa:#x}+{pages} pages: {m}"));
        println!("MEASURE bulk check {pa:#x}+{pages} pages: {r:?}");
        assert!(r.nonzero > 0);
    }
    // Speed on 256 MiB with every other 4-page group non-zero (random bytes).
    let (pa, len) = (64 * MIB, 256 * MIB);
    e.vram_zero(0, vram).unwrap();
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut data = vec![0u8; len as usize];
    for (i, page) in data.chunks_mut(PG as usize).enumerate() {
        if (i / 4) % 2 == 0 {
            for w in page.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
    e.vram_write(pa, &data).unwrap();
    let pages = len / PG;
    let mut bm = vec![0u64; pages.div_ceil(64) as usize];
    let t = Instant::now();
    e.vram_nonzero_pages(pa, pages, &mut bm).unwrap();
    let scan = t.elapsed();
    let set: u64 = bm.iter().map(|w| u64::from(w.count_ones())).sum();
    assert_eq!(set, pages / 2);
    let runs: Vec<(u64, u64)> = (0..pages / 8).map(|g| (pa + g * 8 * PG, 4 * PG)).collect();
    let mut out = vec![0u8; (len / 2) as usize];
    out.fill(1);
    let t = Instant::now();
    let mut at = 0usize;
    let flow = e
        .vram_read_runs(&runs, &mut |p| {
            out[at..at + p.len()].copy_from_slice(p);
            at += p.len();
            ControlFlow::Continue(())
        })
        .unwrap();
    let read = t.elapsed();
    assert!(flow.is_continue() && at == out.len());
    e.vram_zero(pa, len).unwrap();
    let t = Instant::now();
    let mut next = 0usize;
    let flow = e
        .vram_write_pages(&mut |buf, pas| {
            let n = (buf.len() / PG as usize).min(runs.len() * 4 - next);
            let b = next * PG as usize;
            buf[..n * PG as usize].copy_from_slice(&out[b..b + n * PG as usize]);
            for k in next..next + n {
                pas.push(pa + (k as u64 / 4) * 8 * PG + (k as u64 % 4) * PG);
            }
            next += n;
            ControlFlow::Continue(())
        })
        .unwrap();
    let write = t.elapsed();
    assert!(flow.is_continue());
    let mut back = vec![0u8; len as usize];
    e.vram_read(pa, &mut back).unwrap();
    assert!(back == data, "written pages differ");
    let t = Instant::now();
    e.vram_zero(0, vram).unwrap();
    let zero = t.elapsed();
    let gbs = |b: u64, d: std::time::Duration| b as f64 / d.as_secs_f64() / 1e9;
    println!(
        "MEASURE bulk 256 MiB, half the pages in 16 KiB runs: bitmap {:.2} ms ({:.0} GB/s scanned), \
         read {:.1} GB/s, write {:.1} GB/s (of bytes moved, host copies included), zero {} MiB {:.2} ms",
        scan.as_secs_f64() * 1e3,
        gbs(len, scan),
        gbs(len / 2, read),
        gbs(len / 2, write),
        vram >> 20,
        zero.as_secs_f64() * 1e3
    );
}

/// `CudaConfig::bulk_slot_bytes`: the slots are made with the engine and kept at their size
/// (here the smallest, 1 MiB: every call below goes through many slots), never regrown by a
/// larger call, and every bulk call is still exact.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_bulk_calls_through_fixed_slots() {
    let vram = 256 * MIB;
    let e = cuda(CudaConfig {
        vram_size: vram,
        bulk_slot_bytes: 700 << 10,
        ..CudaConfig::default()
    });
    assert_eq!(e.bulk_slot_bytes(), MIB, "made with the engine, rounded up");
    for (pa, pages, seed) in [
        (5 * MIB, 1, 4),
        (3 * PG, 3 * 256 + 77, 1),
        (0, vram / PG, 2),
    ] {
        let r = check_bulk(&e, pa, pages, seed)
            .unwrap_or_else(|m| panic!("at {pa:#x}+{pages} pages: {m}"));
        assert!(r.nonzero > 0);
        assert_eq!(e.bulk_slot_bytes(), MIB, "kept after {pa:#x}+{pages} pages");
    }
    e.vram_reserve_writes(64 * MIB).unwrap();
    assert_eq!(
        e.bulk_slot_bytes(),
        MIB,
        "kept after a reservation of writes"
    );
    // Without the option: none until the first call, then sized to it.
    let plain = cuda(CudaConfig {
        vram_size: vram,
        ..CudaConfig::default()
    });
    assert_eq!(plain.bulk_slot_bytes(), 0);
    check_bulk(&plain, 0, vram / PG, 5).unwrap();
    assert_eq!(plain.bulk_slot_bytes(), 64 * MIB);
}
