//! Progress under `preempt=restart|auto` (issue 23's known hazard): a restarting launch whose
//! threads all run longer than the time between two preemptions — here every run is stopped by
//! the sim engine's step knob long before any thread could end, as a daemon's short time
//! slices would — must still finish, with the bytes of an unpreempted run. A restarted thread
//! keeps nothing, so without escalation such a launch is rerun from the start forever (the
//! bounded run loop below then fails instead of hanging); with it, the first run that finishes
//! no thread moves the launch to the entry's checkpoint form, which keeps progress.

mod common;

use common::runner;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

/// Runs (and resumes) one launch at most this many times before calling it starved.
const MAX_RUNS: u32 = 400;
/// Warp-instructions per worker that each run may execute before it is stopped (then its
/// threads run on to their next point): a small fraction of one thread's run in the few-CTA
/// long kernels (small: 2 CTAs of 2 warps, 400 iterations of a 4-instruction loop per thread
/// in `long_tight`), yet enough for a thread that starts afresh to reach its first point (one
/// that sees the flag before it stops again at once, with nothing done).
const STEPS_PER_RUN: u64 = 300;

fn engine(method: PreemptMethod, workers: usize) -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers,
        preempt: method,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Runs every launch of `inst`, each run stopped after `STEPS_PER_RUN`; contexts stay in
/// memory, or go through bytes at every preemption (`bytes`). Returns the output buffers and
/// the runs of the longest launch, or the launch that did not finish within `MAX_RUNS`.
fn run_starved(
    e: &SimEngine,
    p: &runner::Placed,
    inst: &suite::Instance,
    bytes: bool,
    steps: u64,
) -> Result<(Vec<Vec<u8>>, u32), String> {
    let h = PreemptHandle::new();
    let mut most = 0;
    for l in &inst.launches {
        let params = suite::layout_params(&l.params, &p.addrs).unwrap();
        let job = Job::Launch(LaunchJob {
            space: p.space,
            module: p.module,
            entry: l.entry.to_string(),
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params,
        });
        e.set_step_limit(Some(steps));
        let mut out = e.execute(&job, &h).unwrap();
        let mut runs = 1;
        while let Outcome::Preempted { context, .. } = out {
            if runs >= MAX_RUNS {
                e.set_step_limit(None);
                return Err(format!(
                    "{}: not finished after {runs} runs of {steps} steps",
                    l.entry
                ));
            }
            let context = if bytes {
                SavedContext::from_bytes(context.into_bytes())
            } else {
                context
            };
            out = e.resume(context, &h).unwrap();
            runs += 1;
        }
        if let Outcome::Faulted { fault, .. } = out {
            panic!("{}: {fault}", l.entry);
        }
        most = most.max(runs);
    }
    e.set_step_limit(None);
    let outs = inst
        .buffers
        .iter()
        .zip(&p.addrs)
        .map(|(b, &va)| {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            buf
        })
        .collect();
    Ok((outs, most))
}

/// `long_tight` (2 CTAs whose threads all run the whole kernel, idempotent: restarted under
/// `restart` and `auto`) stopped every 300 warp-instructions finishes, escalated, with the
/// right bytes; so do the other idempotent long kernels, with contexts in memory and in bytes.
#[test]
fn a_restarting_kernel_stopped_before_any_thread_ends_still_finishes() {
    for method in [PreemptMethod::Restart, PreemptMethod::Auto] {
        for name in ["long_tight", "long_loose", "long_smem"] {
            for bytes in [false, true] {
                let e = engine(method, 2);
                let w = suite::long::find(name).unwrap();
                let inst = w.instance(suite::Size::Small);
                let p = runner::place(&e, &inst, 0);
                let (got, runs) = run_starved(&e, &p, &inst, bytes, STEPS_PER_RUN)
                    .unwrap_or_else(|m| panic!("{method} {name} (bytes {bytes}): {m}"));
                runner::check(&inst, &got)
                    .unwrap_or_else(|m| panic!("{method} {name} (bytes {bytes}): {m}"));
                let s = e.ckpt_stats();
                let what = format!("{method} {name} (bytes {bytes}): {runs} runs, {s:?}");
                assert_eq!(s.restart_launches, 1, "{what}");
                assert!(runs > 2, "{what}: the knob must stop it several times");
                assert!(s.escalated_launches >= 1, "{what}");
                // Once escalated, threads save their state: the checkpoint form did the rest.
                assert!(s.saved_threads > 0, "{what}");
            }
        }
    }
}

/// A restarting launch whose runs do finish threads is not escalated: `long_many` under
/// `restart` (32 CTAs of 1 warp and 50 iterations; one worker, so that the steps are exact:
/// runs of 3000 steps pass the done CTAs' resume checks — every run relaunches the whole grid,
/// and with 1000 steps the done CTAs' checks alone used up a run — and end some more CTAs
/// every time).
#[test]
fn a_restarting_kernel_that_progresses_keeps_restarting() {
    let e = engine(PreemptMethod::Restart, 1);
    let w = suite::long::find("long_many").unwrap();
    let inst = w.instance(suite::Size::Small);
    let p = runner::place(&e, &inst, 0);
    let (got, runs) = run_starved(&e, &p, &inst, false, 3000).unwrap();
    runner::check(&inst, &got).unwrap();
    let s = e.ckpt_stats();
    assert!(runs > 2, "{runs} runs: {s:?}");
    assert_eq!(s.escalated_launches, 0, "{s:?}");
    assert_eq!(s.saved_threads, 0, "restarting threads save nothing: {s:?}");
}

/// `checkpoint`, `restart` and `auto` on one engine each: every long workload one after the
/// other (their jobs share the engine's modules, spaces and save areas), each run stopped
/// after a few hundred warp-instructions — many short slices, so restarting launches stall
/// and escalate, and checkpointed ones save and resume many times — with contexts alternately
/// in memory and through bytes, all give the CPU reference's bytes, so byte-identical results
/// whatever the method.
#[test]
fn every_method_gives_the_same_bytes_under_many_short_slices() {
    let mut results: Vec<(PreemptMethod, Vec<Vec<Vec<u8>>>)> = Vec::new();
    for method in [
        PreemptMethod::Checkpoint,
        PreemptMethod::Restart,
        PreemptMethod::Auto,
    ] {
        let e = engine(method, 2);
        let mut outs = Vec::new();
        for (i, w) in suite::long::all().iter().enumerate() {
            let inst = w.instance(suite::Size::Small);
            let p = runner::place(&e, &inst, 0);
            let what = format!("{method} {}", w.name);
            // `long_many` (32 one-warp CTAs): every run relaunches the grid, and the done
            // CTAs' checks and the fresh ones' way to their first point cost more than 600
            // steps (see above): it gets 3000, still several runs.
            let steps = if w.name == "long_many" {
                3000
            } else {
                2 * STEPS_PER_RUN
            };
            let (got, runs) = run_starved(&e, &p, &inst, i % 2 == 1, steps)
                .unwrap_or_else(|m| panic!("{what}: {m}"));
            runner::check(&inst, &got).unwrap_or_else(|m| panic!("{what}: {m}"));
            assert!(runs > 1, "{what}: never preempted");
            outs.push(got);
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
        let s = e.ckpt_stats();
        assert!(s.preemptions > 0, "{method}: {s:?}");
        if method != PreemptMethod::Checkpoint {
            assert!(s.escalated_launches > 0, "{method}: {s:?}");
        }
        results.push((method, outs));
    }
    let (m0, first) = &results[0];
    for (m, outs) in &results[1..] {
        assert!(outs == first, "{m} and {m0} give different bytes");
    }
}
