//! `preempt=auto`'s `wait` (issue 23, `pgpu::ckwait`) on the sim engine: a request for a launch
//! whose kernel's earlier runs say it ends within the wait budget is not acted on (the job
//! completes, counted in `CkptStats::waited_preemptions`, its bytes those of an unrequested
//! run); a launch expected to run longer is stopped as before; a waited launch that outlasts
//! its estimate is stopped once the budget has passed, by its own method (here: restart), and
//! resumes to the same bytes (`wait_overruns`); a launch that has already run well past its
//! estimate when the request comes is stopped at once, whatever the budget, one just past it
//! is still waited; budget 0 never waits.

mod common;

use std::time::{Duration, Instant};

use common::runner::{self, Placed};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

const SEED: u32 = 0x1234_5678;
/// 2 CTAs of 64 threads on one worker: under `auto`, few CTAs of an idempotent entry: restart.
const CTAS: u32 = 2;
const THREADS: u32 = 64;

fn engine(budget: Duration) -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers: 1,
        preempt: PreemptMethod::Auto,
        preempt_wait: budget,
        ..SimConfig::default()
    })
    .unwrap()
}

/// The `lcg_spin` launch of `iters` steps per thread (same grid whatever `iters`: the same
/// kernel and shape to the engine's estimate) and its expected output.
fn job(p: &Placed, iters: u32) -> (Job, Vec<u8>) {
    let mut params = p.addrs[0].to_le_bytes().to_vec();
    params.extend_from_slice(&iters.to_le_bytes());
    params.extend_from_slice(&SEED.to_le_bytes());
    let jump = suite::lcg::Jump::new(iters);
    let want = (0..CTAS * THREADS)
        .flat_map(|g| jump.value(g, SEED).to_le_bytes())
        .collect();
    let job = Job::Launch(LaunchJob {
        space: p.space,
        module: p.module,
        entry: suite::lcg::ENTRY.into(),
        grid: [CTAS, 1, 1],
        block: [THREADS, 1, 1],
        dynamic_shared: 0,
        params,
    });
    (job, want)
}

fn place(e: &SimEngine) -> Placed {
    runner::place(e, &suite::lcg::instance(1, CTAS, THREADS, SEED), 0)
}

fn read_out(e: &SimEngine, p: &Placed) -> Vec<u8> {
    let mut out = vec![0u8; (CTAS * THREADS * 4) as usize];
    e.copy_from_space(p.space, p.addrs[0], &mut out).unwrap();
    out
}

fn clear_out(e: &SimEngine, p: &Placed) {
    e.copy_to_space(
        p.space,
        p.addrs[0],
        &vec![0u8; (CTAS * THREADS * 4) as usize],
    )
    .unwrap();
}

/// Steps per thread for which one run takes at least `at_least` on this host (measured on an
/// engine of its own, so the engines under test know nothing of these runs).
fn calibrate(at_least: Duration) -> u32 {
    let e = engine(Duration::ZERO);
    let p = place(&e);
    let mut iters = 500u32;
    loop {
        let (j, _) = job(&p, iters);
        let t = Instant::now();
        let out = e.execute(&j, &PreemptHandle::new()).unwrap();
        assert!(matches!(out, Outcome::Completed { .. }));
        if t.elapsed() >= at_least || iters >= 1 << 28 {
            return iters;
        }
        iters *= 2;
    }
}

/// Unrequested runs that make the engine's estimate of the kernel.
fn warm_up(e: &SimEngine, p: &Placed, iters: u32, runs: usize) {
    let (j, want) = job(p, iters);
    for _ in 0..runs {
        clear_out(e, p);
        let out = e.execute(&j, &PreemptHandle::new()).unwrap();
        assert!(matches!(out, Outcome::Completed { .. }));
        assert_eq!(read_out(e, p), want);
    }
}

/// Executes `j` with a request from another thread as soon as the launch runs (the handle's
/// `running_since`; the kernels run 100 ms or more, so the request comes while they run even
/// on a loaded host); returns the outcome, the request's instant and the return's.
fn execute_requested(e: &SimEngine, j: &Job) -> (Outcome, Instant, Instant) {
    execute_requested_at(e, j, Duration::ZERO)
}

/// Resumes until the job completes.
fn finish(e: &SimEngine, mut out: Outcome) {
    while let Outcome::Preempted { context, .. } = out {
        let context = SavedContext::from_bytes(context.into_bytes());
        out = e.resume(context, &PreemptHandle::new()).unwrap();
    }
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
}

/// A kernel whose runs all end within the budget is not stopped: the request is waited on,
/// the job completes with the unrequested bytes, and the counters say so.
#[test]
fn a_short_kernel_is_waited_and_completes() {
    let iters = calibrate(Duration::from_millis(100));
    let e = engine(Duration::from_secs(20));
    let p = place(&e);
    warm_up(&e, &p, iters, 3);
    let (j, want) = job(&p, iters);
    clear_out(&e, &p);
    let before = e.ckpt_stats();
    let (out, requested, returned) = execute_requested(&e, &j);
    let after = e.ckpt_stats();
    assert!(
        matches!(out, Outcome::Completed { .. }),
        "a waited launch completes: {out:?}"
    );
    assert!(requested < returned, "the request came while it ran");
    assert_eq!(after.waited_preemptions, before.waited_preemptions + 1);
    assert_eq!(after.wait_overruns, before.wait_overruns);
    assert_eq!(after.preemptions, before.preemptions);
    assert!(after.wait_last_expected_ns > 0 && after.wait_budget_ns == 20_000_000_000);
    assert_eq!(read_out(&e, &p), want);
}

/// A kernel expected to run longer than the budget is stopped as before (restart), and
/// resumes to the same bytes.
#[test]
fn a_long_kernel_is_not_waited() {
    let iters = calibrate(Duration::from_millis(100));
    let e = engine(Duration::from_millis(1));
    let p = place(&e);
    warm_up(&e, &p, iters, 3);
    let (j, want) = job(&p, iters);
    clear_out(&e, &p);
    let before = e.ckpt_stats();
    let (out, _, _) = execute_requested(&e, &j);
    let after = e.ckpt_stats();
    assert!(matches!(out, Outcome::Preempted { .. }), "{out:?}");
    assert_eq!(after.waited_preemptions, before.waited_preemptions);
    assert!(after.preemptions > before.preemptions);
    finish(&e, out);
    assert_eq!(read_out(&e, &p), want);
}

/// Budget 0: never waited, even for a kernel that would end within any budget.
#[test]
fn budget_zero_disables_waiting() {
    let iters = calibrate(Duration::from_millis(100));
    let e = engine(Duration::ZERO);
    let p = place(&e);
    warm_up(&e, &p, iters, 3);
    let (j, want) = job(&p, iters);
    clear_out(&e, &p);
    let (out, _, _) = execute_requested(&e, &j);
    let s = e.ckpt_stats();
    assert!(matches!(out, Outcome::Preempted { .. }), "{out:?}");
    assert_eq!((s.waited_preemptions, s.wait_overruns), (0, 0));
    finish(&e, out);
    assert_eq!(read_out(&e, &p), want);
}

/// A request pending when the launch starts is not waited on (the job stops at its first
/// point, as `PreemptHandle` documents), even with an estimate within the budget.
#[test]
fn a_request_pending_at_the_start_is_not_waited() {
    let iters = calibrate(Duration::from_millis(100));
    let e = engine(Duration::from_secs(20));
    let p = place(&e);
    warm_up(&e, &p, iters, 3);
    let (j, want) = job(&p, iters);
    clear_out(&e, &p);
    let h = PreemptHandle::new();
    h.request();
    let out = e.execute(&j, &h).unwrap();
    assert!(matches!(out, Outcome::Preempted { .. }), "{out:?}");
    assert_eq!(e.ckpt_stats().waited_preemptions, 0);
    finish(&e, out);
    assert_eq!(read_out(&e, &p), want);
}

/// The estimate is wrong (earlier runs were short, this one is long): the waited launch is
/// stopped once the budget has passed, by its own method, within budget + that method's stop;
/// it resumes to the bytes of an unrequested run.
#[test]
fn a_waited_launch_that_overruns_is_stopped_after_the_budget() {
    let short = calibrate(Duration::from_millis(5));
    let budget = Duration::from_millis(100);
    let e = engine(budget);
    let p = place(&e);
    warm_up(&e, &p, short, 3);
    // 100 times the short kernel's length: far beyond the budget on any host.
    let (j, want) = job(&p, short.saturating_mul(100));
    clear_out(&e, &p);
    let before = e.ckpt_stats();
    let t = Instant::now();
    let (out, requested, returned) = execute_requested(&e, &j);
    let ran = t.elapsed();
    let after = e.ckpt_stats();
    assert!(
        matches!(out, Outcome::Preempted { .. }),
        "stopped, not run to its end ({ran:?}): {out:?}"
    );
    assert_eq!(after.waited_preemptions, before.waited_preemptions + 1);
    assert_eq!(after.wait_overruns, before.wait_overruns + 1);
    let latency = returned - requested;
    assert!(latency >= budget, "the request was waited on: {latency:?}");
    // Budget + the restart method's stop (a point within 64 loop iterations here) with room
    // for a loaded host; the kernel itself runs seconds.
    assert!(
        latency < budget + Duration::from_secs(1),
        "stopped within budget + its method's stop: {latency:?}"
    );
    finish(&e, out);
    assert_eq!(read_out(&e, &p), want);
}

/// Three unrequested runs of `warm` (the engine's estimate of its kernel): the longest's wall
/// time, which bounds their GPU time and so the estimate (their maximum).
fn longest_of_three(e: &SimEngine, warm: &Job) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let out = e.execute(warm, &PreemptHandle::new()).unwrap();
            assert!(matches!(out, Outcome::Completed { .. }));
            t.elapsed()
        })
        .max()
        .unwrap()
}

/// Executes `j` with a request once it has run `at` (the handle's `running_since`); the
/// outcome, the request's instant and the return's.
fn execute_requested_at(e: &SimEngine, j: &Job, at: Duration) -> (Outcome, Instant, Instant) {
    let h = PreemptHandle::new();
    std::thread::scope(|s| {
        let h2 = h.clone();
        let req = s.spawn(move || {
            while h2.running_since().is_none_or(|t| t.elapsed() < at) {
                std::thread::yield_now();
            }
            h2.request()
        });
        let out = e.execute(j, &h).unwrap();
        let returned = Instant::now();
        (out, req.join().unwrap(), returned)
    })
}

/// The request comes once the launch has already run past its kernel's estimate (earlier runs
/// were short, this one is long): it is not waited (nothing could make it end within the
/// budget), but stopped at once by its own method, long before the (huge) budget passes; it
/// resumes to the bytes of an unrequested run.
#[test]
fn a_launch_already_past_its_estimate_is_not_waited() {
    let short = calibrate(Duration::from_millis(5));
    let budget = Duration::from_secs(20);
    let e = engine(budget);
    let p = place(&e);
    let longest = longest_of_three(&e, &job(&p, short).0);
    // 100 times the short kernel's length: still running when the request comes.
    let (j, want) = job(&p, short.saturating_mul(100));
    clear_out(&e, &p);
    let before = e.ckpt_stats();
    // Three times the longest warm-up run after the kernel started: past its estimate and
    // the allowance (the estimate again, `ckwait::past_tolerance`).
    let (out, requested, returned) = execute_requested_at(&e, &j, longest * 3);
    let after = e.ckpt_stats();
    assert!(matches!(out, Outcome::Preempted { .. }), "{out:?}");
    assert_eq!(after.waited_preemptions, before.waited_preemptions);
    assert_eq!(after.wait_overruns, before.wait_overruns);
    let latency = returned - requested;
    assert!(
        latency < Duration::from_secs(5),
        "stopped at once, not after the 20 s budget: {latency:?}"
    );
    finish(&e, out);
    assert_eq!(read_out(&e, &p), want);
}

/// A request that comes once the launch has run a little past its kernel's estimate (less
/// than the estimate again: the allowance for a real GPU's start after the engine's mark) is
/// still waited on, and the launch completes with the bytes of an unrequested run. On a loaded
/// host the run can end before the request lands (its length varies with the load): such a try
/// shows nothing and is made again, up to 10 times; a request that landed well before the end
/// and was not waited fails.
#[test]
fn a_launch_just_past_its_estimate_is_still_waited() {
    let short = calibrate(Duration::from_millis(100));
    let e = engine(Duration::from_secs(20));
    let p = place(&e);
    // Twice the warm-up runs' length; the request at 1.3 times the longest of them: past the
    // estimate, within twice it, and ~0.7 estimates before this run ends.
    let (j, want) = job(&p, short.saturating_mul(2));
    for _ in 0..10 {
        let longest = longest_of_three(&e, &job(&p, short).0);
        clear_out(&e, &p);
        let before = e.ckpt_stats();
        let (out, requested, returned) = execute_requested_at(&e, &j, longest.mul_f64(1.3));
        let after = e.ckpt_stats();
        assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
        assert_eq!(read_out(&e, &p), want);
        assert_eq!(after.wait_overruns, before.wait_overruns);
        if after.waited_preemptions == before.waited_preemptions + 1 {
            return;
        }
        assert_eq!(after.waited_preemptions, before.waited_preemptions);
        let ahead = returned.saturating_duration_since(requested);
        assert!(
            ahead < longest / 4,
            "a request {ahead:?} before the end (runs of {longest:?}) was not waited"
        );
    }
    panic!("in 10 tries no request landed while the launch ran");
}
