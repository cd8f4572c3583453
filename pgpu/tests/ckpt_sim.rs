//! The checkpoint preemption method on the sim engine (`SimConfig::preempt = Checkpoint`):
//! every suite workload, run through the `Engine` trait, preempted many times at random moments
//! (a `PreemptHandle::request` from another thread after a seeded delay, and the engine's step
//! knob at seeded instructions), resumed from the in-memory context and from its bytes, gives
//! bytes identical to an unpreempted run; kernels the transformation refuses and launches whose
//! save area is over the limit fall back to the interpreter's own preemption and are counted;
//! hostile context bytes are refused.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Rng, runner};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

fn ck_engine(workers: usize, max_save_area_bytes: u64, poll: u32) -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers,
        preempt: PreemptMethod::Checkpoint,
        max_save_area_bytes,
        ckpt_poll_interval: poll,
        ..SimConfig::default()
    })
    .unwrap()
}

fn plain_engine() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers: 1,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Requests preemption of `h` after `delay_us` from another thread (unless `stop` is set first).
fn request_later(
    h: &PreemptHandle,
    delay_us: u64,
    stop: &Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let (h, stop) = (h.clone(), stop.clone());
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_micros(delay_us));
        if !stop.load(Ordering::SeqCst) {
            h.request();
        }
    })
}

/// Runs every launch of `inst` on `e`, preempting each run with a request from another thread
/// after a random delay (or by the step knob at a random instruction), at most `max_preempts`
/// times per launch; resumes alternate between the in-memory context and its bytes.
fn run_preempted(
    e: &SimEngine,
    p: &runner::Placed,
    inst: &suite::Instance,
    rng: &mut Rng,
    max_preempts: u32,
) -> (Vec<Vec<u8>>, u32) {
    let h = PreemptHandle::new();
    let mut preemptions = 0;
    let steps = (inst.approx_thread_instrs / 32).max(4);
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
        let mut n = 0u32;
        let mut first = true;
        let mut ctx: Option<SavedContext> = None;
        loop {
            h.clear();
            let stop = Arc::new(AtomicBool::new(false));
            let mut waiter = None;
            e.set_step_limit(None);
            if first {
                // Every launch is preempted at least once whatever the host's speed: the step
                // knob at an instruction inside the first half of the kernel (a request from
                // another thread can come after a fast host finished the kernel).
                e.set_step_limit(Some(1 + rng.below((steps / 2).max(1))));
            } else if n < max_preempts {
                match rng.below(4) {
                    0 => e.set_step_limit(Some(1 + rng.below(steps))),
                    1 if rng.below(4) == 0 => {
                        h.request();
                    }
                    _ => waiter = Some(request_later(&h, rng.below(2000), &stop)),
                }
            }
            let out = if first {
                first = false;
                e.execute(&job, &h).unwrap()
            } else {
                e.resume(ctx.take().unwrap(), &h).unwrap()
            };
            stop.store(true, Ordering::SeqCst);
            if let Some(w) = waiter {
                w.join().unwrap();
            }
            match out {
                Outcome::Completed { .. } => break,
                Outcome::Preempted { context, .. } => {
                    n += 1;
                    preemptions += 1;
                    ctx = Some(if preemptions % 2 == 0 {
                        SavedContext::from_bytes(context.into_bytes())
                    } else {
                        context
                    });
                }
                Outcome::Faulted { fault, .. } => panic!("{}: {fault}", inst.workload),
            }
        }
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
    (outs, preemptions)
}

fn every_workload(workers: usize, seed: u64, trials: u32, poll: u32) {
    let e = ck_engine(workers, 64 << 20, poll);
    let plain = plain_engine();
    let mut rng = Rng(seed);
    let mut total = 0;
    for w in suite::all() {
        let inst = if w.name == "spin" {
            suite::hand::spin::instance_with(20_000, 2, 64, suite::Size::Small)
        } else {
            w.instance(suite::Size::Small)
        };
        let pr = runner::place(&plain, &inst, 0);
        let (want, _) = runner::run(&plain, &pr, &inst, || None).unwrap();
        for t in 0..trials {
            let p = runner::place(&e, &inst, 0);
            let (got, n) = run_preempted(&e, &p, &inst, &mut rng, 12);
            total += n;
            runner::check(&inst, &got).unwrap_or_else(|m| panic!("{} trial {t}: {m}", w.name));
            if w.name != "spin" {
                // spin writes the time it spun: only its check applies.
                assert!(got == want, "{} trial {t}: bytes differ", w.name);
            }
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
        plain.unload_module(pr.module).unwrap();
        plain.destroy_space(pr.space).unwrap();
    }
    let s = e.ckpt_stats();
    assert_eq!((&e as &dyn Engine).checkpoint_stats(), Some(s.clone()));
    assert_eq!((&plain as &dyn Engine).checkpoint_stats(), None);
    assert_eq!(s.fallback_modules, 0, "{:?}", s.fallback_reasons);
    assert_eq!(s.fallback_launches, 0);
    assert!(total > 20, "only {total} preemptions");
    assert_eq!(s.preemptions, u64::from(total));
    assert!(s.saved_incremental_bytes <= s.saved_full_bytes, "{s:?}");
    if poll == 1 {
        assert!(
            s.saved_threads > 0,
            "no thread ever saved at a point: {s:?}"
        );
        assert!(s.saved_full_bytes > 0);
    }
}

#[test]
fn every_suite_workload_preempted_and_resumed_one_worker() {
    every_workload(1, 0xc0ff_ee01, 3, 1);
}

#[test]
fn every_suite_workload_preempted_and_resumed_two_workers() {
    every_workload(2, 0xc0ff_ee02, 3, 1);
}

/// The transformation's default poll interval (64): threads read the flag rarely, so small
/// kernels are mostly stopped at CTA entry; still identical bytes.
#[test]
fn every_suite_workload_preempted_and_resumed_default_poll_interval() {
    every_workload(2, 0xc0ff_ee03, 2, pgpu::ckpt::default_poll_interval());
}

/// A kernel using the transformation's reserved prefix: refused, counted with its reason, and
/// it still runs and preempts (the interpreter's own method).
const RESERVED: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry k(.param .u64 out, .param .u32 n)
{
    .reg .u32 %__ck_x;
    .reg .u32 %r<4>;
    .reg .u64 %rd<4>;
    .reg .pred %p;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x;
    mov.u32 %__ck_x, 0;
L:
    add.u32 %__ck_x, %__ck_x, %r2;
    add.u32 %r1, %r1, -1;
    setp.ne.u32 %p, %r1, 0;
    @%p bra L;
    mul.wide.u32 %rd2, %r2, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %__ck_x;
    ret;
}
"#;

#[test]
fn refused_kernels_and_oversized_save_areas_fall_back_and_are_counted() {
    for limit in [64 << 20, 1u64] {
        let e = ck_engine(2, limit, 1);
        let s = common::space(&e);
        e.map(
            s,
            &Mapping {
                va: common::BASE,
                len: 4096,
                target: MapTarget::Vram { pa: 0 },
                perm: Perm::ReadWrite,
                page_size: PageSize::Size4K,
            },
        )
        .unwrap();
        let m = e.load_module(RESERVED, &LoadLimits::default()).unwrap().id;
        let mut params = common::BASE.to_le_bytes().to_vec();
        params.extend_from_slice(&1000u32.to_le_bytes());
        let job = Job::Launch(LaunchJob {
            space: s,
            module: m,
            entry: "k".into(),
            grid: [1, 1, 1],
            block: [64, 1, 1],
            dynamic_shared: 0,
            params,
        });
        let h = PreemptHandle::new();
        e.set_step_limit(Some(50));
        let mut out = e.execute(&job, &h).unwrap();
        let mut n = 0;
        while let Outcome::Preempted { context, .. } = out {
            n += 1;
            out = e.resume(context, &h).unwrap();
        }
        assert!(n > 0 && matches!(out, Outcome::Completed { .. }));
        let mut buf = vec![0u8; 256];
        e.copy_from_space(s, common::BASE, &mut buf).unwrap();
        for t in 0..64u32 {
            let v = u32::from_le_bytes(buf[4 * t as usize..][..4].try_into().unwrap());
            assert_eq!(v, t * 1000);
        }
        let st = e.ckpt_stats();
        assert_eq!(st.fallback_modules, 1);
        assert!(st.fallback_reasons[0].contains("__ck"), "{st:?}");
        assert_eq!(st.preemptions, 0, "no checkpointed run");
        // A transformable module with a save area over the limit falls back per launch.
        let v = suite::find("vecadd").unwrap().instance(suite::Size::Small);
        let p = runner::place(&e, &v, 1 << 20);
        let mut calls = 0;
        let (got, pre) = runner::run(&e, &p, &v, || {
            calls += 1;
            (calls <= 5).then_some(20)
        })
        .unwrap();
        runner::check(&v, &got).unwrap();
        assert!(pre > 0);
        let st = e.ckpt_stats();
        if limit == 1 {
            assert_eq!(st.fallback_launches, v.launches.len() as u64, "{st:?}");
            assert_eq!(st.preemptions, 0);
        } else {
            assert_eq!(st.fallback_launches, 0);
            assert!(st.preemptions > 0);
        }
    }
}

#[test]
fn hostile_checkpoint_context_bytes_are_refused() {
    let e = ck_engine(1, 64 << 20, 1);
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Small);
    let p = runner::place(&e, &inst, 0);
    let l = &inst.launches[0];
    let job = p.job(l);
    let h = PreemptHandle::new();
    e.set_step_limit(Some(40));
    let Outcome::Preempted { context, .. } = e.execute(&job, &h).unwrap() else {
        panic!("not preempted")
    };
    e.set_step_limit(None);
    let bytes = context.into_bytes();
    let mut rng = Rng(7);
    // Every truncation, and random corruptions of the header, are errors or runs, never panics;
    // truncations are always refused.
    for cut in (0..bytes.len()).step_by((bytes.len() / 97).max(1)) {
        let r = e.resume(SavedContext::from_bytes(bytes[..cut].to_vec()), &h);
        assert!(
            matches!(r, Err(EngineError::BadContext(_))),
            "cut {cut}: {r:?}"
        );
    }
    let mut long = bytes.clone();
    long.insert(0, 0);
    assert!(e.resume(SavedContext::from_bytes(long), &h).is_err());
    for _ in 0..50 {
        let mut b = bytes.clone();
        let i = rng.below(64.min(b.len() as u64)) as usize;
        b[i] ^= 1 << rng.below(8);
        let _ = e.resume(SavedContext::from_bytes(b), &h);
    }
    // The intact bytes still resume to the right result.
    let mut out = e.resume(SavedContext::from_bytes(bytes), &h).unwrap();
    while let Outcome::Preempted { context, .. } = out {
        out = e.resume(context, &h).unwrap();
    }
    assert!(matches!(out, Outcome::Completed { .. }));
}

/// A CTA-class kernel (shared memory and a barrier) that loops forever without a barrier: its
/// threads never reach a point, so after a request the job faults once the drain limit passes
/// instead of holding the engine forever.
const NEVER_DRAINS: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry k(.param .u64 out)
{
    .shared .align 4 .b8 sh[256];
    .reg .u32 %r<4>;
    .reg .u64 %rd<4>;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd1, %r1, 4;
    mov.u64 %rd2, sh;
    add.u64 %rd3, %rd2, %rd1;
    st.shared.u32 [%rd3], %r1;
    bar.sync 0;
    mov.u32 %r2, 0;
L:
    add.u32 %r2, %r2, 1;
    bra L;
}
"#;

#[test]
fn a_kernel_that_never_reaches_a_point_faults_after_the_drain_limit() {
    let e = SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers: 1,
        preempt: PreemptMethod::Checkpoint,
        max_checkpoint_drain: Duration::from_millis(50),
        ..SimConfig::default()
    })
    .unwrap();
    let s = common::space(&e);
    let m = e
        .load_module(NEVER_DRAINS, &LoadLimits::default())
        .unwrap()
        .id;
    assert_eq!(
        e.ckpt_stats().modules_transformed,
        1,
        "{:?}",
        e.ckpt_stats()
    );
    let job = Job::Launch(LaunchJob {
        space: s,
        module: m,
        entry: "k".into(),
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared: 0,
        params: common::BASE.to_le_bytes().to_vec(),
    });
    let h = PreemptHandle::new();
    let stop = Arc::new(AtomicBool::new(false));
    let w = request_later(&h, 5_000, &stop);
    let out = e.execute(&job, &h).unwrap();
    w.join().unwrap();
    match out {
        Outcome::Faulted { fault, .. } => {
            assert!(format!("{fault}").contains("preemption point"), "{fault}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_checkpoint_context_retargeted_at_another_engine_resumes_identically() {
    // What a VM snapshot restore does with a checkpointed kernel: the buffers move to a new
    // engine whose space and module have other ids; the context (with its save area) is
    // re-targeted at them and resumes to the unpreempted result.
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Small);
    let l = &inst.launches[0];
    let job_in = |p: &runner::Placed| p.job(l);
    let a = ck_engine(1, 64 << 20, 1);
    let p = runner::place(&a, &inst, 0);
    let h = PreemptHandle::new();
    let mut out = a.execute(&job_in(&p), &h).unwrap();
    while let Outcome::Preempted { context, .. } = out {
        out = a.resume(context, &h).unwrap();
    }
    let out_idx = inst.buffers.len() - 1;
    let mut want = vec![0u8; inst.buffers[out_idx].init.len()];
    a.copy_from_space(p.space, p.addrs[out_idx], &mut want)
        .unwrap();
    let p2 = runner::place(&a, &inst, 16 << 20);
    a.set_step_limit(Some(40));
    let Outcome::Preempted { context, .. } = a.execute(&job_in(&p2), &h).unwrap() else {
        panic!("not preempted")
    };
    a.set_step_limit(None);
    let bytes = context.into_bytes();
    let mut bufs = Vec::new();
    for (i, b) in inst.buffers.iter().enumerate() {
        let mut v = vec![0u8; b.init.len()];
        a.copy_from_space(p2.space, p2.addrs[i], &mut v).unwrap();
        bufs.push(v);
    }
    let b = ck_engine(1, 64 << 20, 1);
    // Another space and module first, so that the ids differ.
    let other = suite::find("vecadd").unwrap().instance(suite::Size::Small);
    runner::place(&b, &other, 0);
    common::space(&b);
    let q = runner::place(&b, &inst, 16 << 20);
    assert!(q.space != p2.space && q.module != p2.module);
    for (i, v) in bufs.iter().enumerate() {
        b.copy_to_space(q.space, q.addrs[i], v).unwrap();
    }
    let ctx = b
        .retarget_context(
            SavedContext::from_bytes(bytes),
            q.space,
            Some(q.module),
            None,
        )
        .unwrap();
    let mut out = b.resume(ctx, &h).unwrap();
    while let Outcome::Preempted { context, .. } = out {
        out = b.resume(context, &h).unwrap();
    }
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let mut got = vec![0u8; want.len()];
    b.copy_from_space(q.space, q.addrs[out_idx], &mut got)
        .unwrap();
    assert!(got == want, "the re-targeted checkpointed matmul differs");
}

fn method_engine(method: PreemptMethod, workers: usize) -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers,
        preempt: method,
        ckpt_poll_interval: 1,
        ..SimConfig::default()
    })
    .unwrap()
}

/// `restart` and `auto`: every suite and long workload, preempted at random moments and
/// resumed, gives the unpreempted bytes; idempotent kernels restarted (no thread saved).
#[test]
fn restart_and_auto_preempt_every_workload_identically() {
    let plain = plain_engine();
    for (method, seed) in [
        (PreemptMethod::Restart, 0x7e57_0001),
        (PreemptMethod::Auto, 0x7e57_0002),
    ] {
        let e = method_engine(method, 2);
        let mut rng = Rng(seed);
        let mut total = 0;
        for w in suite::all()
            .filter(|w| w.name != "spin")
            .chain(suite::long::all())
        {
            let inst = w.instance(suite::Size::Small);
            let pr = runner::place(&plain, &inst, 0);
            let (want, _) = runner::run(&plain, &pr, &inst, || None).unwrap();
            let p = runner::place(&e, &inst, 0);
            let (got, n) = run_preempted(&e, &p, &inst, &mut rng, 6);
            total += n;
            assert!(got == want, "{method}: {}: bytes differ", w.name);
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
            plain.unload_module(pr.module).unwrap();
            plain.destroy_space(pr.space).unwrap();
        }
        let s = e.ckpt_stats();
        // Random preemption points: how many land before a small instance ends depends on the
        // host's load (auto slices the many-CTA kernels, whose slices may all end first).
        assert!(total > 10, "{method}: only {total} preemptions");
        assert!(s.restart_launches > 0, "{method}: {s:?}");
        assert_eq!(s.fallback_modules, 0, "{method}: {:?}", s.fallback_reasons);
        if method == PreemptMethod::Auto {
            assert!(s.sliced_launches > 0, "auto never sliced: {s:?}");
        }
    }
}

/// What `auto` chooses per kernel class (sim: 2 workers, so 8 CTAs or more are "many"):
/// many short CTAs slice, idempotent long kernels restart, the atomic one checkpoints, and so
/// does an in-place launch of an idempotent entry (its two pointers alias: not provably
/// idempotent, it runs in the entry's checkpoint form).
#[test]
fn auto_chooses_a_method_per_kernel_class() {
    let want = [
        ("long_tight", "restart"),
        ("long_many", "slice"),
        ("long_loose", "restart"),
        ("long_smem", "restart"),
        ("long_atomic", "checkpoint"),
        ("long_inplace", "checkpoint"),
    ];
    for (name, method) in want {
        let e = method_engine(PreemptMethod::Auto, 2);
        let w = suite::long::find(name).unwrap();
        let inst = w.instance(suite::Size::Small);
        let p = runner::place(&e, &inst, 0);
        let (got, _) = runner::run(&e, &p, &inst, || None).unwrap();
        runner::check(&inst, &got).unwrap_or_else(|m| panic!("{name}: {m}"));
        let s = e.ckpt_stats();
        let chose = if s.sliced_launches > 0 {
            "slice"
        } else if s.restart_launches > 0 {
            "restart"
        } else {
            "checkpoint"
        };
        assert_eq!(chose, method, "{name}: {s:?}");
        assert_eq!(
            s.sliced_launches + s.launches,
            1,
            "{name}: one launch: {s:?}"
        );
        assert_eq!(
            s.unproven_launches,
            u64::from(name == "long_inplace"),
            "{name}: {s:?}"
        );
    }
}

/// `pgpu::ckpt::choose`, rule by rule, on `long_loose` (idempotent: `out` written, `table`
/// read) and `long_atomic` (not idempotent).
#[test]
fn choose_follows_its_rule() {
    use pgpu::ckpt::{Choice, choose};
    let t = ptx::ckpt::transform(
        suite::long::PTX,
        &ptx::ckpt::Options {
            restart: true,
            ..ptx::ckpt::Options::default()
        },
    )
    .unwrap();
    let plan = t.entry("long_loose").unwrap();
    assert!(plan.restart);
    // out and table at the same address: not provably idempotent, under both methods.
    let mut params = vec![0u8; 24];
    params[..8].copy_from_slice(&0x1000u64.to_le_bytes());
    params[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
    for m in [PreemptMethod::Restart, PreemptMethod::Auto] {
        match choose(m, plan, &params, 2, 2) {
            Choice::SaveForm(why) => assert!(why.contains("also read"), "{why}"),
            other => panic!("{m}: {other:?}"),
        }
        // A buffer too short to hold `table`: not provable either.
        assert!(matches!(
            choose(m, plan, &params[..12], 2, 2),
            Choice::SaveForm(_)
        ));
    }
    // Many short CTAs slice before anything else, aliased or not.
    assert!(matches!(
        choose(PreemptMethod::Auto, plan, &params, 8, 2),
        Choice::Slice(_)
    ));
    assert!(matches!(
        choose(PreemptMethod::Restart, plan, &params, 8, 2),
        Choice::SaveForm(_)
    ));
    params[8..16].copy_from_slice(&0x2000u64.to_le_bytes());
    assert_eq!(
        choose(PreemptMethod::Restart, plan, &params, 2, 2),
        Choice::Restart
    );
    assert!(matches!(
        choose(PreemptMethod::Auto, plan, &params, 8, 2),
        Choice::Slice(_)
    ));
    assert_eq!(
        choose(PreemptMethod::Auto, plan, &params, 7, 2),
        Choice::Restart
    );
    let atomic = t.entry("long_atomic").unwrap();
    assert!(!atomic.restart);
    assert_eq!(
        choose(PreemptMethod::Auto, atomic, &params, 2, 2),
        Choice::Checkpoint
    );
}

/// Issue 23: an in-place launch (`long_inplace`, its `dst` and `src` the same buffer) of an
/// idempotent entry, few CTAs, under `auto` and `restart`, runs in the entry's checkpoint form
/// (before, it ran sliced, which on cuda cannot stop a few-CTA kernel quickly; restarting it
/// would apply the update again from its own output). Preempted at random points and resumed
/// (from the live context and from its bytes, kind 4), it gives the unpreempted bytes; its
/// threads saved their registers at points (a restarting form saves none).
#[test]
fn an_aliased_in_place_launch_is_checkpointed_and_resumes_identically() {
    let plain = plain_engine();
    let inst = suite::long::find("long_inplace")
        .unwrap()
        .instance(suite::Size::Medium);
    let pr = runner::place(&plain, &inst, 0);
    let (want, _) = runner::run(&plain, &pr, &inst, || None).unwrap();
    runner::check(&inst, &want).unwrap();
    for (method, seed) in [
        (PreemptMethod::Auto, 0xa11a_5001),
        (PreemptMethod::Restart, 0xa11a_5002),
    ] {
        let e = method_engine(method, 2);
        let mut rng = Rng(seed);
        let mut total = 0;
        let trials = 4u64;
        let steps = (inst.approx_thread_instrs / 32).max(4);
        for t in 0..trials {
            // Requests from another thread at random moments (and the step knob) ...
            let p = runner::place(&e, &inst, 0);
            let (got, n) = run_preempted(&e, &p, &inst, &mut rng, 12);
            total += n;
            assert!(got == want, "{method} trial {t}: bytes differ");
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
            // ... and every run stopped at a random instruction, up to 20 times.
            let p = runner::place(&e, &inst, 0);
            let mut runs = 0;
            let (got, n) = runner::run(&e, &p, &inst, || {
                runs += 1;
                (runs <= 20).then(|| 1 + rng.below(steps / 16))
            })
            .unwrap();
            assert!(
                n >= 3,
                "{method} trial {t}: the step knob stopped it {n} times"
            );
            total += n;
            assert!(got == want, "{method} trial {t}, step knob: bytes differ");
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
        let s = e.ckpt_stats();
        assert_eq!(s.unproven_launches, 2 * trials, "{method}: {s:?}");
        assert_eq!(s.launches, 2 * trials, "{method}: {s:?}");
        assert_eq!(s.restart_launches, 0, "{method}: {s:?}");
        assert_eq!(s.sliced_launches, 0, "{method}: {s:?}");
        assert_eq!(s.escalated_launches, 0, "{method}: {s:?}");
        assert_eq!(s.preemptions, u64::from(total), "{method}: {s:?}");
        assert!(total >= 4 * trials as u32, "{method}: {total} preemptions");
        assert!(s.saved_threads > 0, "{method}: nothing saved: {s:?}");
    }
}

/// Where the entry's checkpoint form does not fit the save-area limit (its records hold
/// registers; the restarting form's only a status), the aliased launch runs sliced, counted
/// as both, and still computes the right bytes.
#[test]
fn an_aliased_launch_without_a_checkpoint_form_within_the_limit_runs_sliced() {
    let inst = suite::long::find("long_inplace")
        .unwrap()
        .instance(suite::Size::Small);
    let l = &inst.launches[0];
    let area = |restart| {
        let t = ptx::ckpt::transform(
            inst.ptx,
            &ptx::ckpt::Options {
                restart,
                ..ptx::ckpt::Options::default()
            },
        )
        .unwrap();
        let plan = t.entry(l.entry).unwrap();
        assert_eq!(plan.restart, restart);
        pgpu::ckpt::area_bytes(plan, l.grid, l.block, 0)
    };
    let (restarting, checkpoint) = (area(true), area(false));
    assert!(restarting < checkpoint, "{restarting} {checkpoint}");
    let e = SimEngine::new(SimConfig {
        vram_size: 64 << 20,
        workers: 2,
        preempt: PreemptMethod::Auto,
        max_save_area_bytes: restarting,
        ckpt_poll_interval: 1,
        ..SimConfig::default()
    })
    .unwrap();
    let p = runner::place(&e, &inst, 0);
    let mut calls = 0;
    let (got, pre) = runner::run(&e, &p, &inst, || {
        calls += 1;
        (calls <= 5).then_some(200)
    })
    .unwrap();
    runner::check(&inst, &got).unwrap();
    assert!(pre > 0);
    let s = e.ckpt_stats();
    assert_eq!(
        (s.unproven_launches, s.sliced_launches, s.launches),
        (1, 1, 0),
        "{s:?}"
    );
    assert_eq!(s.fallback_launches, 0, "{s:?}");
}
