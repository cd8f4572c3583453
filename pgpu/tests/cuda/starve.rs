//! Progress of restarting launches on a real GPU (issue 23's known hazard), ignored (needs an
//! NVIDIA GPU): `long_tight` at size xl (2 CTAs whose threads all run the whole kernel, tens of
//! ms) under `restart` and `auto`, every run given a 500 µs time slice (`set_deadline`, as
//! vgpud's grants do), finishes with the CPU reference's bytes within a bounded number of runs
//! — without escalation every run restarted the threads from scratch and it never finished —
//! and the engine counts the escalation. Prints `MEASURE starve` lines (runs, GPU time).

use std::time::{Duration, Instant};

use pgpu::cuda::CudaConfig;
use pgpu::*;

use super::support::*;

/// Runs of one launch before calling it starved (500 µs each: ~1 s of slices).
const MAX_RUNS: u32 = 2000;
const SLICE: Duration = Duration::from_micros(500);

/// Runs every launch of `inst` (placed at `p`) in slices of `SLICE` until it completes;
/// returns the runs and the GPU time, or panics on a fault or after `MAX_RUNS` slices.
fn run_in_slices(
    e: &dyn Engine,
    p: &Placed,
    inst: &suite::Instance,
    what: &str,
) -> (u32, Duration) {
    let h = PreemptHandle::new();
    let (mut runs, mut gpu) = (0u32, Duration::ZERO);
    for l in &inst.launches {
        let job = launch_job(p, l).unwrap();
        let mut ctx: Option<SavedContext> = None;
        loop {
            assert!(
                runs < MAX_RUNS,
                "{what}: not finished after {runs} slices of {SLICE:?}"
            );
            runs += 1;
            h.clear();
            h.set_deadline(Some(Instant::now() + SLICE));
            let out = match ctx.take() {
                None => e.execute(&job, &h).unwrap(),
                Some(c) => e.resume(c, &h).unwrap(),
            };
            gpu += out.gpu_time();
            match out {
                Outcome::Completed { .. } => break,
                Outcome::Preempted { context, .. } => ctx = Some(context),
                Outcome::Faulted { fault, .. } => panic!("{what}: {fault}"),
            }
        }
    }
    h.set_deadline(None);
    (runs, gpu)
}

/// The output buffers of `inst` placed at `p`.
fn outputs(e: &dyn Engine, p: &Placed, inst: &suite::Instance) -> Vec<Vec<u8>> {
    let mut outs = Vec::new();
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        let mut buf = vec![0u8; b.init.len()];
        e.copy_from_space(p.space, va, &mut buf).unwrap();
        outs.push(buf);
    }
    outs
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_restarting_kernel_longer_than_the_slice_finishes() {
    for method in [PreemptMethod::Restart, PreemptMethod::Auto] {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: method,
            ..CudaConfig::default()
        });
        let w = suite::long::find("long_tight").unwrap();
        let inst = w.instance(suite::Size::Xl);
        let p = place(&e, &inst, window());
        let (runs, gpu) = run_in_slices(&e, &p, &inst, &method.to_string());
        check(&inst, &outputs(&e, &p, &inst)).unwrap_or_else(|m| panic!("{method}: {m}"));
        let st = e.ckpt_stats();
        println!(
            "MEASURE starve {method} long_tight xl: {runs} runs of {SLICE:?}, GPU {:.1} ms, {} escalated, {} threads saved",
            gpu.as_secs_f64() * 1e3,
            st.escalated_launches,
            st.saved_threads
        );
        assert!(
            runs > 2,
            "{method}: a kernel of tens of ms took {runs} slices"
        );
        assert!(st.escalated_launches >= 1, "{method}: {st:?}");
    }
}

/// The save-area pool after escalated jobs (the lead's H100 fairness run with one-CTA kernels
/// under vgpud, `preempt=auto`: evictions, `CUDA_ERROR_LAUNCH_FAILED`): an escalated launch
/// runs in the checkpoint form, whose threads save registers; once it completed, its buffer
/// went back to the pool with those registers in it, and the next restarting launch (records
/// of another stride) read them as status words — threads that finished without writing
/// theirs stayed "pending", and resume launches trapped or restored garbage. Now every buffer
/// in the pool is all zero, and jobs of several entries and forms sharing the pool, all in
/// 500 µs slices, finish with the CPU's bytes, under `restart`, `auto` and `checkpoint`.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_pooled_save_areas_come_back_zero_after_escalation() {
    for method in [
        PreemptMethod::Restart,
        PreemptMethod::Auto,
        PreemptMethod::Checkpoint,
    ] {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: method,
            ..CudaConfig::default()
        });
        for round in 0..3 {
            for name in ["long_tight", "long_loose", "long_many", "long_tight"] {
                let what = format!("{method} round {round} {name}");
                let inst = suite::long::find(name).unwrap().instance(suite::Size::Xl);
                let p = place(&e, &inst, window());
                run_in_slices(&e, &p, &inst, &what);
                check(&inst, &outputs(&e, &p, &inst)).unwrap_or_else(|m| panic!("{what}: {m}"));
                let dirty = e.ck_pool_nonzero_bytes().unwrap();
                assert_eq!(dirty, 0, "{what}: non-zero bytes in the idle save areas");
                e.destroy_space(p.space).unwrap();
                e.unload_module(p.module).unwrap();
            }
        }
        let st = e.ckpt_stats();
        println!(
            "MEASURE pool {method}: {} preemptions, {} escalated, {} threads saved",
            st.preemptions, st.escalated_launches, st.saved_threads
        );
        assert!(
            st.saved_threads > 0,
            "{method}: no thread ever saved registers: {st:?}"
        );
    }
}
