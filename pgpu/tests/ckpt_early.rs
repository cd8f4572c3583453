//! Early preemption requests on the sim engine's transformed launches (`checkpoint`, `restart`,
//! `auto`): the engine-independent half of the cuda engine's early-request path (the same
//! transformed PTX and protocol: the flag read in the prologue, the status words, the resume
//! launch; `tests/cuda/ckearly.rs` is the GPU half). A request pending before `execute` stops
//! the job before any thread did work (preempted, no thread saved at a point); one made the
//! moment the engine marks the job running races the start; one pending before a resume stops
//! that run too. Every job then resumes, unrequested, to the bytes of an unpreempted run (the
//! spin, whose values are timer readings, to its check).

mod common;

use std::time::{Duration, Instant};

use common::{Rng, runner};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

const METHODS: [PreemptMethod; 3] = [
    PreemptMethod::Checkpoint,
    PreemptMethod::Restart,
    PreemptMethod::Auto,
];

fn engine(method: PreemptMethod) -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers: 2,
        preempt: method,
        ..SimConfig::default()
    })
    .unwrap()
}

fn plain() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers: 1,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Every suite workload at size small (a short spin) and every long one at `long`.
fn instances(long: suite::Size) -> Vec<suite::Instance> {
    suite::all()
        .map(|w| {
            if w.name == "spin" {
                suite::hand::spin::instance_with(20_000, 2, 64, suite::Size::Small)
            } else {
                w.instance(suite::Size::Small)
            }
        })
        .chain(suite::long::all().iter().map(|w| w.instance(long)))
        .collect()
}

/// Resumes `out` with no request until it completes (at most 1000 resumes).
fn finish(e: &SimEngine, mut out: Outcome, what: &str) {
    let mut n = 0;
    while let Outcome::Preempted { context, .. } = out {
        n += 1;
        assert!(
            n <= 1000,
            "{what}: still preempted after 1000 unrequested resumes"
        );
        // Every other resume through bytes, as a stored context would.
        let context = if n % 2 == 0 {
            SavedContext::from_bytes(context.into_bytes())
        } else {
            context
        };
        out = e.resume(context, &PreemptHandle::new()).unwrap();
    }
    assert!(matches!(out, Outcome::Completed { .. }), "{what}: {out:?}");
}

/// Runs `inst` on `e`, each launch through `first` (the `execute` call and what comes with it)
/// then `finish`, and checks the buffers against an unpreempted run on `plain` (spin: its check).
fn run_checked(
    e: &SimEngine,
    plain: &SimEngine,
    inst: &suite::Instance,
    what: &str,
    mut first: impl FnMut(&SimEngine, &Job) -> Outcome,
) {
    let pr = runner::place(plain, inst, 0);
    let (want, _) = runner::run(plain, &pr, inst, || None).unwrap();
    plain.unload_module(pr.module).unwrap();
    plain.destroy_space(pr.space).unwrap();
    let p = runner::place(e, inst, 0);
    for l in &inst.launches {
        let out = first(e, &p.job(l));
        finish(e, out, what);
    }
    let got: Vec<Vec<u8>> = inst
        .buffers
        .iter()
        .zip(&p.addrs)
        .map(|(b, &va)| {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            buf
        })
        .collect();
    runner::check(inst, &got).unwrap_or_else(|m| panic!("{what}: {m}"));
    if inst.workload != "spin" {
        assert!(got == want, "{what}: bytes differ from the unpreempted run");
    }
    e.unload_module(p.module).unwrap();
    e.destroy_space(p.space).unwrap();
}

/// A request pending when `execute` is called: the job is preempted with no thread saved at a
/// point (every thread stopped at the entry point, or no slice ran), a restarting launch is not
/// taken as stalled (no escalation), and every job resumes identically.
#[test]
fn a_request_pending_before_execute_preempts_before_any_work_and_resumes_identically() {
    let plain = plain();
    for method in METHODS {
        let e = engine(method);
        for inst in instances(suite::Size::Small) {
            let what = format!("{method} {} (pending)", inst.workload);
            run_checked(&e, &plain, &inst, &what, |e, job| {
                let before = e.ckpt_stats();
                let h = PreemptHandle::new();
                h.request();
                let out = e.execute(job, &h).unwrap();
                assert!(
                    matches!(out, Outcome::Preempted { .. }),
                    "{what}: a pending request did not preempt: {out:?}"
                );
                let after = e.ckpt_stats();
                assert_eq!(
                    after.saved_threads, before.saved_threads,
                    "{what}: threads ran to a point and saved under a request made before the start"
                );
                out
            });
        }
        let s = e.ckpt_stats();
        assert!(s.preemptions > 0, "{method}: {s:?}");
        assert_eq!(s.fallback_modules, 0, "{method}: {:?}", s.fallback_reasons);
        // No thread ran, so no restarting launch showed the restart hazard (`ckpt::stalled`):
        // none continues in its checkpoint form.
        assert_eq!(s.escalated_launches, 0, "{method}: {s:?}");
    }
}

/// A request made the moment the engine marks the job running (from another thread spinning
/// on `running_since`), three times per workload and method (the long ones at size medium):
/// whatever the race gave, the job resumes identically.
#[test]
fn a_request_at_the_start_races_the_launch_and_resumes_identically() {
    let plain = plain();
    for method in METHODS {
        let e = engine(method);
        let (mut preempted, mut runs) = (0, 0);
        // Rounds until the race was won a few times: on a loaded host (the whole suite runs
        // in parallel) the requesting thread often comes after the short kernels ended.
        for round in 0..4 {
            if preempted >= 5 {
                break;
            }
            for inst in instances(suite::Size::Medium) {
                for rep in 0..3 {
                    let what = format!(
                        "{method} {} (at start, round {round} run {rep})",
                        inst.workload
                    );
                    run_checked(&e, &plain, &inst, &what, |e, job| {
                        let h = PreemptHandle::new();
                        let h2 = h.clone();
                        let t = std::thread::spawn(move || {
                            let t0 = Instant::now();
                            while h2.running_since().is_none()
                                && t0.elapsed() < Duration::from_secs(10)
                            {
                                std::hint::spin_loop();
                            }
                            h2.request();
                        });
                        let out = e.execute(job, &h).unwrap();
                        t.join().unwrap();
                        runs += 1;
                        if matches!(out, Outcome::Preempted { .. }) {
                            preempted += 1;
                        }
                        out
                    });
                }
            }
        }
        println!("{method}: {preempted} of {runs} runs preempted by a request at their start");
        // The short suite kernels may end before the requesting thread runs (a loaded host);
        // the long ones (milliseconds here) are stopped.
        assert!(
            preempted >= 5,
            "{method}: only {preempted} of {runs} runs preempted"
        );
    }
}

/// A job preempted by the step knob, then resumed with a request already pending (that run stops
/// again unless its threads end before their next flag load), then resumed unrequested: it
/// finishes identically.
#[test]
fn a_request_pending_before_a_resume_stops_it_and_the_next_resume_finishes() {
    let plain = plain();
    let mut rng = Rng(0xea21_7001);
    for method in METHODS {
        let e = engine(method);
        let mut stopped = 0;
        for inst in instances(suite::Size::Small) {
            let steps = (inst.approx_thread_instrs / 32).max(4);
            let what = format!("{method} {} (pending resume)", inst.workload);
            run_checked(&e, &plain, &inst, &what, |e, job| {
                e.set_step_limit(Some(1 + rng.below(steps / 2)));
                let out = e.execute(job, &PreemptHandle::new()).unwrap();
                e.set_step_limit(None);
                let Outcome::Preempted { context, .. } = out else {
                    return out;
                };
                let h = PreemptHandle::new();
                h.request();
                // Restored threads run to their next flag load first: a run near its end may
                // complete.
                let out = e.resume(context, &h).unwrap();
                if matches!(out, Outcome::Preempted { .. }) {
                    stopped += 1;
                }
                out
            });
        }
        assert!(
            stopped > 10,
            "{method}: only {stopped} resumes under a request"
        );
    }
}
