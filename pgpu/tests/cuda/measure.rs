//! GPU measurements printed as `MEASURE` lines: map/unmap cost per 2 MiB page, sub-launch
//! overhead on a long kernel, preemption and resume latency.

use std::time::{Duration, Instant};

use pgpu::cuda::CudaConfig;
use pgpu::*;

use crate::support::*;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_measurements() {
    let e = cuda(CudaConfig {
        vram_size: 1024 * MIB,
        ..CudaConfig::default()
    });
    // Map / unmap cost per 2 MiB page.
    let s = e.create_space(window()).unwrap();
    let pages = 256u64;
    let maps: Vec<Mapping> = (0..pages)
        .map(|i| Mapping {
            va: VGPU_BASE + i * PAGE,
            len: PAGE,
            target: MapTarget::Vram { pa: i * PAGE },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        })
        .collect();
    let t = Instant::now();
    e.map_batch(s, &maps).unwrap();
    let map_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    let t = Instant::now();
    e.unmap(s, VGPU_BASE, pages * PAGE).unwrap();
    let unmap_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    println!(
        "MEASURE map+access {map_us:.1} us / 2 MiB, unmap {unmap_us:.1} us / 2 MiB ({pages} pages)"
    );
    e.destroy_space(s).unwrap();

    drop(e);
    // A long kernel: spin, 100 us per thread, 400k CTAs of 32 threads (~95 waves on an H200).
    let inst = suite::hand::spin::instance_with(100_000, 400_000, 32, suite::Size::Large);
    let l = &inst.launches[0];
    let mut whole = Duration::ZERO;
    for (target, depth) in [
        (Duration::from_secs(10), 1),
        (Duration::from_micros(200), 1),
        (Duration::from_micros(200), 2),
        (Duration::from_micros(50), 2),
    ] {
        let e = cuda(CudaConfig {
            vram_size: 1024 * MIB,
            sub_launch_target: target,
            pipeline_depth: depth,
            ..CudaConfig::default()
        });
        let p = place(&e, &inst, window());
        let job = p.job(l);
        let h = PreemptHandle::new();
        e.execute(&job, &h).unwrap(); // warm-up: JIT, throughput measured
        let reps = 3;
        let n0 = e.sub_launches();
        let (mut wall, mut gpu) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..reps {
            let t = Instant::now();
            let out = e.execute(&job, &h).unwrap();
            wall += t.elapsed();
            gpu += out.gpu_time();
        }
        let subs = (e.sub_launches() - n0) / reps;
        let wall = wall / reps as u32;
        if whole.is_zero() {
            whole = wall;
        }
        println!(
            "MEASURE spin 400k CTAs, sub-launch target {target:?}, depth {depth}: {subs} sub-launches, wall {:.2} ms, gpu_time {:.2} ms, {:+.1}% vs whole",
            wall.as_secs_f64() * 1e3,
            gpu.as_secs_f64() * 1e3 / reps as f64,
            (wall.as_secs_f64() / whole.as_secs_f64() - 1.0) * 100.0
        );
        if target != Duration::from_micros(200) || depth != 2 {
            e.destroy_space(p.space).unwrap();
            continue;
        }
        // Preemption latency at 200 us: request at a random point, measured until execute
        // returns; and resume latency (resume called -> first sub-launch about to be issued).
        let (mut stop_lat, mut resume_lat) = (Vec::new(), Vec::new());
        let mut seed = 0x1234_5678_u64;
        h.clear();
        let mut out = e.execute(&job, &h).unwrap();
        let mut rounds = 0;
        while rounds < 200 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let delay = Duration::from_micros(50 + (seed >> 33) % 1000);
            let hh = h.clone();
            match out {
                Outcome::Completed { .. } => {
                    h.clear();
                    let th = std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        hh.request();
                    });
                    out = e.execute(&job, &h).unwrap();
                    th.join().unwrap();
                }
                Outcome::Preempted { context, .. } => {
                    let at = h.requested_at().unwrap();
                    stop_lat.push(at.elapsed().as_secs_f64() * 1e6);
                    rounds += 1;
                    h.clear();
                    let th = std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        hh.request();
                    });
                    let t = Instant::now();
                    out = e.resume(context, &h).unwrap();
                    if let Some(r) = h.running_since() {
                        resume_lat.push(r.saturating_duration_since(t).as_secs_f64() * 1e6);
                    }
                    th.join().unwrap();
                }
                Outcome::Faulted { fault, .. } => panic!("{fault}"),
            }
        }
        let n = stop_lat.len();
        println!(
            "MEASURE preemption latency at 200us sub-launches, depth 2 (request -> execute returns) n={n}: p50 {:.0} us, p99 {:.0} us, max {:.0} us",
            percentile(&mut stop_lat, 0.5),
            percentile(&mut stop_lat, 0.99),
            percentile(&mut stop_lat, 1.0)
        );
        println!(
            "MEASURE resume latency (resume called -> running) p50 {:.1} us, p99 {:.1} us",
            percentile(&mut resume_lat, 0.5),
            percentile(&mut resume_lat, 0.99)
        );
        e.destroy_space(p.space).unwrap();
    }
}
