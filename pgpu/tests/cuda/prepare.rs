//! `Engine::prepare` on a real GPU (issue 25), ignored (needs an NVIDIA GPU): a fresh engine's
//! first run of a checkpointed launch made its streams and save area (and, with CUDA's lazy
//! loading, loaded its kernel) inside the run — under a vgpud grant, with the slice's clock
//! running. Prepared first (as the VM's worker now does before it asks for the GPU), the run
//! makes no stream and no save area, stops at its 2 ms slice end, and the launch finishes with
//! the CPU reference's bytes. Prints `MEASURE prepare` lines: when the run started and how late
//! it stopped, unprepared and prepared (the stop latency itself is `vgpu-bench fairness`'s).

use std::time::{Duration, Instant};

use pgpu::cuda::CudaConfig;
use pgpu::*;

use super::support::*;

const SLICE: Duration = Duration::from_millis(2);

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_prepared_first_run_makes_nothing_and_stops_at_its_slice() {
    for prepared in [false, true] {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: PreemptMethod::Checkpoint,
            ..CudaConfig::default()
        });
        let inst = suite::long::find("long_tight")
            .unwrap()
            .instance(suite::Size::Xl);
        let p = place(&e, &inst, window());
        let l = &inst.launches[0];
        let job = Job::Launch(LaunchJob {
            space: p.space,
            module: p.module,
            entry: l.entry.to_string(),
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params: suite::layout_params(&l.params, &p.addrs).unwrap(),
        });
        assert!(!e.prepared(&job), "a fresh engine has made nothing for it");
        if prepared {
            e.prepare(&job).unwrap();
            assert!(e.prepared(&job), "prepared: the run finds everything");
        }
        let before = e.made_counts();
        let h = PreemptHandle::new();
        let t0 = Instant::now();
        h.set_deadline(Some(t0 + SLICE));
        let out = e.execute(&job, &h).unwrap();
        let ran = t0.elapsed();
        let started = h.running_since().map(|t| t.saturating_duration_since(t0));
        let after = e.made_counts();
        let made = (after.0 - before.0, after.1 - before.1);
        println!(
            "MEASURE prepare prepared={prepared}: run started {:.0} us after the call, ended {:.0} us after the {SLICE:?} slice end; made {} streams, {} save areas in the run",
            started.unwrap_or_default().as_secs_f64() * 1e6,
            ran.saturating_sub(SLICE).as_secs_f64() * 1e6,
            made.0,
            made.1
        );
        let mut ctx = match out {
            Outcome::Preempted { context, .. } => Some(context),
            other => panic!("a kernel of tens of ms in a {SLICE:?} slice: {other:?}"),
        };
        if prepared {
            assert_eq!(
                made,
                (0, 0),
                "a prepared run makes no stream and no save area"
            );
        }
        h.clear();
        h.set_deadline(None);
        while let Some(c) = ctx.take() {
            match e.resume(c, &h).unwrap() {
                Outcome::Completed { .. } => {}
                Outcome::Preempted { context, .. } => ctx = Some(context),
                Outcome::Faulted { fault, .. } => panic!("{fault}"),
            }
        }
        let mut outs = Vec::new();
        for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            outs.push(buf);
        }
        check(&inst, &outs).unwrap_or_else(|m| panic!("prepared={prepared}: {m}"));
    }
}
