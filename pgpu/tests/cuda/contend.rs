//! What the bulk VRAM calls of a live copy cost a guest's kernels on the same engine (issue
//! 24: during a 1 GiB live migration the guest's `lcg_spin` launches took ~15% more GPU time):
//! the migration guest's kernel (`lcg_spin`, 20 000 steps, 8 CTAs of 64 threads: compute-bound,
//! ~90 µs on an H100) launched back to back, alone and while another thread loops one bulk
//! call over 1 GiB — batched reads of contiguous runs (round 0), of scattered pages (later
//! rounds, through the gather kernel), page writes (a destination on the same GPU) and the
//! non-zero bitmap — each with its host copy of the bytes, as a snapshot's sink makes — and,
//! without GPU work, one thread per CPU copying host memory (the live copy's lanes). Prints a
//! `MEASURE` line per phase: the launch's GPU time (the engine's, from an event recorded before
//! the launch call) and its wall time, median and p90, the mean host time of the launch's
//! driver calls (a wait behind the bulk thread's calls shows there), and the bulk call's GB/s. The
//! kernel's output is checked after every phase.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpu::cuda::CudaConfig;
use pgpu::*;

use crate::support::*;

const PG: u64 = 4096;
pub(crate) const GIB: u64 = 1 << 30;

/// What the second thread does during a phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Bulk {
    Alone,
    ReadContiguous,
    ReadScattered,
    WritePages,
    Nonzero,
    /// No GPU work: one thread per CPU copying host memory, as a live copy's CRC and copy
    /// lanes keep the host's cores busy (does the launch's host path lose its core?).
    CpuLoad,
}

pub(crate) fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// One pass of `what` over the GiB at `GIB` (reads, bitmap) or `2 * GIB` (writes); returns
/// the bytes moved.
pub(crate) fn bulk_pass(e: &pgpu::cuda::CudaEngine, what: Bulk, host: &mut [u8]) -> u64 {
    match what {
        Bulk::Alone => 0,
        Bulk::CpuLoad => {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let per = host.len() / threads;
            std::thread::scope(|s| {
                for chunk in host.chunks_mut(per.max(1)) {
                    s.spawn(move || {
                        let src = vec![7u8; chunk.len()];
                        for _ in 0..16 {
                            chunk.copy_from_slice(&src);
                            std::hint::black_box(&mut *chunk);
                        }
                    });
                }
            });
            16 * host.len() as u64
        }
        Bulk::ReadContiguous | Bulk::ReadScattered => {
            let runs: Vec<(u64, u64)> = if what == Bulk::ReadContiguous {
                vec![(GIB, GIB)]
            } else {
                // Every other page: the gather kernel packs them.
                (0..GIB / PG / 2).map(|i| (GIB + 2 * i * PG, PG)).collect()
            };
            let mut at = 0usize;
            let flow = e
                .vram_read_runs_batched(&runs, &mut |pieces: &[&[u8]]| {
                    for p in pieces {
                        let n = p.len().min(host.len() - at % host.len());
                        let o = at % host.len();
                        host[o..o + n].copy_from_slice(&p[..n]);
                        at += p.len();
                    }
                    ControlFlow::Continue(())
                })
                .unwrap();
            assert!(flow.is_continue());
            at as u64
        }
        Bulk::WritePages => {
            let pages = GIB / PG;
            let mut next = 0u64;
            let flow = e
                .vram_write_pages(&mut |buf: &mut [u8], pas: &mut Vec<u64>| {
                    let n = ((buf.len() as u64) / PG).min(pages - next);
                    let len = (n * PG) as usize;
                    let src = len.min(host.len());
                    buf[..src].copy_from_slice(&host[..src]);
                    for k in next..next + n {
                        pas.push(2 * GIB + k * PG);
                    }
                    next += n;
                    ControlFlow::Continue(())
                })
                .unwrap();
            assert!(flow.is_continue());
            GIB
        }
        Bulk::Nonzero => {
            let pages = GIB / PG;
            let mut bm = vec![0u64; pages.div_ceil(64) as usize];
            e.vram_nonzero_pages(GIB, pages, &mut bm).unwrap();
            GIB
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_kernels_beside_the_bulk_calls() {
    let e = cuda(CudaConfig {
        vram_size: 4 * GIB,
        ..CudaConfig::default()
    });
    let inst = suite::lcg::instance(20_000, 8, 64, 0x5eed_0024);
    let p = place(&e, &inst, window());
    // The GiB the reads and the bitmap go over: every page non-zero.
    let chunk: Vec<u8> = (0..64 * MIB).map(|i| (i % 251) as u8 | 1).collect();
    for off in (0..GIB).step_by(chunk.len()) {
        e.vram_write(GIB + off, &chunk).unwrap();
    }
    let job = launch_job(&p, &inst.launches[0]).unwrap();
    let h = PreemptHandle::new();
    let launch = || {
        let t = Instant::now();
        match e.execute(&job, &h).unwrap() {
            Outcome::Completed { gpu_time } => (gpu_time, t.elapsed()),
            other => panic!("lcg_spin: {other:?}"),
        }
    };
    // Warm: the module's JIT and the bulk slots.
    for _ in 0..50 {
        launch();
    }
    let mut host = vec![0u8; 64 * MIB as usize];
    for what in [
        Bulk::ReadContiguous,
        Bulk::ReadScattered,
        Bulk::WritePages,
        Bulk::Nonzero,
    ] {
        bulk_pass(&e, what, &mut host);
    }
    let phases = [
        Bulk::Alone,
        Bulk::ReadContiguous,
        Bulk::Alone,
        Bulk::ReadScattered,
        Bulk::WritePages,
        Bulk::Nonzero,
        Bulk::CpuLoad,
        Bulk::Alone,
    ];
    for what in phases {
        let stop = AtomicBool::new(false);
        let moved = AtomicU64::new(0);
        let (mut gpu, mut wall) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        let (calls0, call_ns0) = (e.sub_launches(), e.launch_call_ns());
        let mut bulk_time = Duration::ZERO;
        std::thread::scope(|s| {
            let bulk = s.spawn(|| {
                let mut host = vec![0u8; 64 * MIB as usize];
                let t = Instant::now();
                while what != Bulk::Alone && !stop.load(Ordering::Relaxed) {
                    moved.fetch_add(bulk_pass(&e, what, &mut host), Ordering::Relaxed);
                }
                t.elapsed()
            });
            // Let the bulk thread start its first call.
            std::thread::sleep(Duration::from_millis(5));
            while gpu.len() < 600 || (what != Bulk::Alone && moved.load(Ordering::Relaxed) == 0) {
                let (g, w) = launch();
                gpu.push(g.as_secs_f64() * 1e6);
                wall.push(w.as_secs_f64() * 1e6);
                if t0.elapsed() > Duration::from_secs(30) {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            bulk_time = bulk.join().unwrap();
        });
        let mut out = vec![0u8; inst.buffers[0].init.len()];
        e.copy_from_space(p.space, p.addrs[0], &mut out).unwrap();
        check(&inst, &[out]).unwrap();
        let gbs = moved.load(Ordering::Relaxed) as f64 / bulk_time.as_secs_f64().max(1e-9) / 1e9;
        let calls = (e.sub_launches() - calls0).max(1);
        let call_us = (e.launch_call_ns() - call_ns0) as f64 / calls as f64 / 1e3;
        println!(
            "MEASURE contend {what:?}: {} launches, gpu p50 {:.1} p90 {:.1} us, wall p50 {:.1} p90 {:.1} us, \
             launch calls {call_us:.1} us each, bulk {gbs:.2} GB/s",
            gpu.len(),
            pct(&mut gpu, 0.5),
            pct(&mut gpu, 0.9),
            pct(&mut wall, 0.5),
            pct(&mut wall, 0.9),
        );
    }
}
