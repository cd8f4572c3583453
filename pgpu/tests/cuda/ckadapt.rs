//! The per-run choice of the request path on a real GPU (`CkPathChoice::Adaptive`, issue 23),
//! ignored: under `auto`, each long kernel class at size xl (1-100 ms) and a short `lcg_spin`
//! (calibrated to ~300 µs from `long_tight`'s measured time) runs unmeasured, then unpreempted
//! until its kernel has an estimate, then preempted by a warm requester and resumed. Every run's
//! bytes are the CPU's expected output and the unpreempted run's; the counters say that every
//! launch of an unmeasured or long kernel took the fast path (`armed` / `notice` / `mirror`)
//! and every launch of the measured short kernel the fixed one, and the breakdowns name the
//! same paths with no fallback; short and long launches interleaved on one engine's pooled
//! buffers (a stale mirror address must never reach a fixed-path kernel) keep the bytes right
//! and the pool zero. `MEASURE ckadapt` lines give request → `Preempted` p50/p99/max per kernel;
//! `MEASURE ckadapt cost` lines what each path costs a launch no request reaches.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pgpu::cuda::{CkPathChoice, CudaConfig, CudaEngine};
use pgpu::*;

use super::support::*;

const FAST: &str = "armed/notice/mirror";
const FIXED: &str = "write-value/sync/strided";

/// A long-lived requesting thread that spins to each request's moment (a sleep's slack is as
/// long as the short kernel's stop window).
struct Warm {
    tx: mpsc::Sender<(PreemptHandle, Instant)>,
    done: mpsc::Receiver<Instant>,
}

impl Warm {
    fn new() -> Warm {
        let (tx, rx) = mpsc::channel::<(PreemptHandle, Instant)>();
        let (dtx, done) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok((h, at)) = rx.recv() {
                while Instant::now() < at {
                    std::hint::spin_loop();
                }
                let _ = dtx.send(h.request());
            }
        });
        Warm { tx, done }
    }
}

/// The instance's buffers back to their initial bytes (`long_atomic` adds to its output).
fn reset(e: &CudaEngine, p: &Placed, inst: &suite::Instance) {
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        e.copy_to_space(p.space, va, &b.init).unwrap();
    }
}

fn read(e: &CudaEngine, p: &Placed, inst: &suite::Instance) -> Vec<Vec<u8>> {
    inst.buffers
        .iter()
        .zip(&p.addrs)
        .map(|(b, &va)| {
            let mut v = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut v).unwrap();
            v
        })
        .collect()
}

/// One unpreempted run of the instance's (single) launch: its GPU time and bytes.
fn unpreempted(e: &CudaEngine, p: &Placed, inst: &suite::Instance) -> (Duration, Vec<Vec<u8>>) {
    reset(e, p, inst);
    let out = e
        .execute(&p.job(&inst.launches[0]), &PreemptHandle::new())
        .unwrap();
    let Outcome::Completed { gpu_time } = out else {
        panic!("{}: not completed: {out:?}", inst.workload);
    };
    (gpu_time, read(e, p, inst))
}

/// One run requested `after` its `execute` call by `w`, resumed to the end: request →
/// `Preempted` returned (µs), or `None` when the launch completed first (its request came too
/// late, or `auto` waited on it); and the final bytes.
fn preempted(
    e: &CudaEngine,
    p: &Placed,
    inst: &suite::Instance,
    after: Duration,
    w: &Warm,
) -> (Option<f64>, Vec<Vec<u8>>) {
    reset(e, p, inst);
    let h = PreemptHandle::new();
    w.tx.send((h.clone(), Instant::now() + after)).unwrap();
    let out = e.execute(&p.job(&inst.launches[0]), &h).unwrap();
    let returned = Instant::now();
    let asked = w.done.recv().unwrap();
    let lat = match out {
        Outcome::Preempted { context, .. } => {
            let out = e.resume(context, &PreemptHandle::new()).unwrap();
            assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
            Some(returned.saturating_duration_since(asked).as_secs_f64() * 1e6)
        }
        Outcome::Completed { .. } => None,
        o => panic!("{}: {o:?}", inst.workload),
    };
    (lat, read(e, p, inst))
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((p * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Launches on (fast, fixed) paths since `before`.
fn paths(e: &CudaEngine, before: &CkptStats) -> (u64, u64) {
    let s = e.ckpt_stats();
    (
        s.fast_path_launches - before.fast_path_launches,
        s.fixed_path_launches - before.fixed_path_launches,
    )
}

/// One kernel through the three phases; returns its estimate (the unpreempted runs' longest
/// GPU time). `short`: the estimate must be below the threshold (the calibrated kernel); the
/// others' paths follow the rule from their measured estimate (the long kernels' xl sizes are
/// meant to run 1-100 ms; one below the threshold on a faster GPU takes the fixed path, said
/// in its MEASURE line).
fn phases(
    e: &CudaEngine,
    name: &str,
    inst: &suite::Instance,
    short: bool,
    after: &dyn Fn(u64) -> Duration,
    w: &Warm,
) -> Duration {
    let p = place(e, inst, window());
    // Unmeasured: the fast path, whatever the kernel.
    let s0 = e.ckpt_stats();
    let _ = e.take_ck_breakdowns();
    let mut tries = 0;
    loop {
        let (lat, bytes) = preempted(e, &p, inst, after(tries), w);
        tries += 1;
        check(inst, &bytes).unwrap_or_else(|m| panic!("{name} unmeasured: {m}"));
        if lat.is_some() {
            break;
        }
        assert!(tries < 20, "{name}: never preempted in 20 tries");
    }
    let b = e.take_ck_breakdowns();
    assert_eq!(b.len(), 1, "{name}: one preemption");
    assert_eq!(b[0].path, FAST, "{name}: unmeasured → fast: {:?}", b[0]);
    // Two runs that completed before it would have made an estimate.
    let (fast, fixed) = paths(e, &s0);
    assert!(
        fast >= 1 && fast + fixed == tries,
        "{name}: {fast}/{fixed} of {tries}"
    );
    // Measured: two unpreempted runs (the estimate needs two).
    let (g1, want) = unpreempted(e, &p, inst);
    let (g2, again) = unpreempted(e, &p, inst);
    check(inst, &want).unwrap_or_else(|m| panic!("{name} unpreempted: {m}"));
    assert!(want == again, "{name}: two unpreempted runs differ");
    let estimate = g1.max(g2);
    let long = estimate >= pgpu::cuda::DEFAULT_FAST_FROM;
    assert!(
        !(short && long),
        "{name}: estimate {estimate:?}, not below the threshold {:?}",
        pgpu::cuda::DEFAULT_FAST_FROM
    );
    // Preempted with an estimate: fast for long kernels, fixed for the short one.
    let _ = e.take_ck_breakdowns();
    let s1 = e.ckpt_stats();
    let (mut lat, mut launches) = (Vec::new(), 0u64);
    while lat.len() < 11 && launches < 60 {
        let (l, bytes) = preempted(e, &p, inst, after(launches), w);
        launches += 1;
        assert!(
            bytes == want,
            "{name}: preempted bytes differ from unpreempted"
        );
        lat.extend(l);
    }
    assert_eq!(
        lat.len(),
        11,
        "{name}: 11 preemptions in {launches} launches"
    );
    let want_path = if long { (launches, 0) } else { (0, launches) };
    assert_eq!(paths(e, &s1), want_path, "{name}: (fast, fixed) launches");
    let b = e.take_ck_breakdowns();
    assert_eq!(b.len(), 11, "{name}: one breakdown per preemption");
    let path = if long { FAST } else { FIXED };
    for x in &b {
        assert_eq!(x.path, path, "{name}: {x:?}");
    }
    // The warm requester's first request warms it (not counted).
    lat.remove(0);
    println!(
        "MEASURE ckadapt {name} (auto, {path}, estimate {:.0} us): request→Preempted p50/p99/max {:.1}/{:.1}/{:.1} us over {} ({launches} launches)",
        estimate.as_secs_f64() * 1e6,
        pct(lat.clone(), 0.5),
        pct(lat.clone(), 0.99),
        pct(lat.clone(), 1.0),
        lat.len()
    );
    e.unload_module(p.module).unwrap();
    e.destroy_space(p.space).unwrap();
    estimate
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckadapt_long_kernels_take_the_fast_path_and_a_short_one_the_fixed_path() {
    let e = cuda(CudaConfig {
        vram_size: 512 * MIB,
        preempt: PreemptMethod::Auto,
        ck_path: CkPathChoice::adaptive(),
        ..CudaConfig::default()
    });
    let w = Warm::new();
    let long_after = |i: u64| Duration::from_micros(300 + 61 * (i % 11));
    let mut tight_us = 0.0;
    let mut long = Vec::new();
    for name in ["long_tight", "long_loose", "long_smem", "long_atomic"] {
        let inst = suite::long::find(name).unwrap().instance(suite::Size::Xl);
        let est = phases(&e, name, &inst, false, &long_after, &w);
        if name == "long_tight" {
            tight_us = est.as_secs_f64() * 1e6;
        }
        long.push(est >= pgpu::cuda::DEFAULT_FAST_FROM);
    }
    assert!(
        long.iter().any(|&l| l),
        "no long kernel ran at least the threshold: the fast path with an estimate untested"
    );
    // `long_tight` at xl is lcg_spin of 4 000 000 steps on 2 CTAs of 256 threads (each
    // thread's steps one dependent chain): steps for ~300 µs (at least 1 000), on 2 CTAs of
    // 128 threads — another shape, so another estimate: the module's text is the same, and
    // an engine loads one text once (one module id).
    let iters = ((4_000_000.0 * 300.0 / tight_us.max(1.0)) as u32).clamp(1_000, 4_000_000);
    let short = suite::lcg::instance(iters, 2, 128, 0x5eed_1234);
    let short_after = |i: u64| Duration::from_micros(20 + 9 * (i % 11));
    let est = phases(&e, "lcg_spin_short", &short, true, &short_after, &w);
    println!(
        "MEASURE ckadapt short kernel: {iters} steps, {:.0} us (long_tight {tight_us:.0} us)",
        est.as_secs_f64() * 1e6
    );
    // Interleaved on one engine: the short kernel's fixed-path launches reuse save-area
    // buffers (half the size: within the pool's reuse bound) that long_tight's fast-path ones
    // left a mirror address in. One space and one module (the same text): the short kernel's
    // smaller buffer at the start of long_tight's.
    let tight = suite::long::find("long_tight")
        .unwrap()
        .instance(suite::Size::Xl);
    let pl = place(&e, &tight, window());
    let ps = Placed {
        space: pl.space,
        module: e.load_module(short.ptx, &LoadLimits::default()).unwrap().id,
        addrs: pl.addrs.clone(),
    };
    for _ in 0..2 {
        unpreempted(&e, &pl, &tight);
        unpreempted(&e, &ps, &short);
    }
    let (_, want_long) = unpreempted(&e, &pl, &tight);
    let (_, want_short) = unpreempted(&e, &ps, &short);
    let s0 = e.ckpt_stats();
    let _ = e.take_ck_breakdowns();
    for i in 0..6u64 {
        let (_, b) = preempted(&e, &pl, &tight, long_after(i), &w);
        assert!(b == want_long, "interleaved long_tight {i}: bytes differ");
        let (_, b) = preempted(&e, &ps, &short, short_after(i), &w);
        assert!(b == want_short, "interleaved short {i}: bytes differ");
    }
    let want = if long[0] { (6, 6) } else { (0, 12) };
    assert_eq!(paths(&e, &s0), want, "interleaved: (fast, fixed) launches");
    for x in e.take_ck_breakdowns() {
        assert!(x.path == FAST || x.path == FIXED, "a fallback: {x:?}");
    }
    assert_eq!(
        e.ck_pool_nonzero_bytes().unwrap(),
        0,
        "pooled save areas stay zero"
    );
}

/// What the fast path costs a launch no request reaches, against the fixed one (the basis of
/// `DEFAULT_FAST_FROM`): one engine whose every run takes the fast path (`adaptive:0`) and
/// one on the fixed default, `lcg_spin` on 2 CTAs of 128 threads at three lengths, 40 warm
/// unpreempted launches each under `checkpoint`; bytes checked, every launch counted on its
/// path. `MEASURE ckadapt cost` lines: host wall and GPU time per launch (p50) on each path,
/// the wall time's difference, and the driver calls per launch.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckadapt_never_preempted_cost_of_each_path() {
    const RUNS: usize = 40;
    const ITERS: [u32; 3] = [20_000, 100_000, 400_000];
    // Wall time p50 per length, fast path then fixed (one engine at a time).
    let mut wall_p50 = [[0.0f64; 2]; ITERS.len()];
    let paths_of = [
        (
            "fast",
            CkPathChoice::Adaptive {
                fast_from: Duration::ZERO,
            },
        ),
        ("fixed", CkPathChoice::Fixed),
    ];
    for (k, (what, ck_path)) in paths_of.into_iter().enumerate() {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: PreemptMethod::Checkpoint,
            ck_path,
            ..CudaConfig::default()
        });
        for (j, iters) in ITERS.into_iter().enumerate() {
            let inst = suite::lcg::instance(iters, 2, 128, 0x5eed_1234);
            let p = place(&e, &inst, window());
            // Warm: the module's functions, streams, pages, a save area in the pool.
            for _ in 0..3 {
                unpreempted(&e, &p, &inst);
            }
            let s0 = e.ckpt_stats();
            let job = p.job(&inst.launches[0]);
            let (mut wall, mut gpu) = (Vec::new(), Vec::new());
            for _ in 0..RUNS {
                let t0 = Instant::now();
                let out = e.execute(&job, &PreemptHandle::new()).unwrap();
                wall.push(t0.elapsed().as_secs_f64() * 1e6);
                let Outcome::Completed { gpu_time } = out else {
                    panic!("{what} {iters}: {out:?}");
                };
                gpu.push(gpu_time.as_secs_f64() * 1e6);
            }
            check(&inst, &read(&e, &p, &inst)).unwrap_or_else(|m| panic!("{what} {iters}: {m}"));
            let s = e.ckpt_stats();
            let want = if k == 0 {
                (RUNS as u64, 0)
            } else {
                (0, RUNS as u64)
            };
            assert_eq!(
                paths(&e, &s0),
                want,
                "{what} {iters}: (fast, fixed) launches"
            );
            let runs = s.unrequested_runs - s0.unrequested_runs;
            assert_eq!(runs, RUNS as u64, "{what} {iters}: unrequested runs");
            let calls = (s.unrequested_driver_calls - s0.unrequested_driver_calls) as f64;
            let (w, g) = (pct(wall, 0.5), pct(gpu, 0.5));
            println!(
                "MEASURE ckadapt cost {what} lcg_spin {iters} steps: wall {w:.1} us, GPU {g:.1} us, host {:.1} us per launch (p50), {:.1} driver calls",
                w - g,
                calls / runs as f64
            );
            wall_p50[j][k] = w;
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
    }
    for (iters, [f, x]) in ITERS.into_iter().zip(wall_p50) {
        println!(
            "MEASURE ckadapt cost lcg_spin {iters} steps: fast path {:+.1} us per never-preempted launch ({:.3}x the fixed path's wall time)",
            f - x,
            f / x.max(1e-9)
        );
    }
}
