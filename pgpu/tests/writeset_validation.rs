//! Validated write sets on the sim engine (issue 24): every suite launch runs its
//! bounds-checked twin (`ptx::ckpt::bounds`) with the extents of its real buffers (the
//! allocations a guest declares), preempted at random points and resumed (also from bytes) and
//! with the checkpoint preemption method transforming the twin again; the flag word
//! (`EngineSnapshot::alloc_flag`) stays clear, the results are the reference's, and every page
//! the engine's exact dirty log saw the launch write lies inside the extents: the validated
//! write set is a superset of the exact log. A planted kernel storing below its buffer raises
//! the flag, and the log shows the page its write set missed.

mod common;

use common::runner::{check, place};
use common::*;
use pgpu::ckpt::PreemptMethod;
use pgpu::dirty::{self, PAGE};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;
use ptx::ckpt::bounds::transform;

const VRAM: u64 = 64 * MIB;

fn harvest(e: &SimEngine) -> Vec<u64> {
    let mut b = vec![0u64; dirty::words(VRAM)];
    e.dirty_log_harvest(MapTarget::Vram { pa: 0 }, VRAM, &mut b)
        .unwrap();
    b
}

/// Sets the VRAM pages behind `[lo, hi)` of `space` in `out`.
fn pages_of(e: &SimEngine, space: SpaceId, lo: u64, hi: u64, out: &mut [u64]) {
    let mut va = lo & !(PAGE - 1);
    while va < hi {
        if let Ok(Some(Translation {
            target: MapTarget::Vram { pa },
            ..
        })) = e.lookup(space, va)
        {
            let p = pa / PAGE;
            out[(p / 64) as usize] |= 1 << (p % 64);
        }
        va += PAGE;
    }
}

fn suite_checked(preempt: PreemptMethod, seed: u64) {
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    let mut launches = 0;
    let mut preemptions = 0;
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        let e = SimEngine::new(SimConfig {
            vram_size: VRAM,
            workers: 2,
            preempt,
            ..SimConfig::default()
        })
        .unwrap();
        let p = place(&e, &inst, 0);
        let t = transform(inst.ptx, &ptx::LoadOptions::default())
            .unwrap_or_else(|err| panic!("{}: {err}", w.name));
        let twin = e.load_module(&t.ptx, &LoadLimits::default()).unwrap().id;
        let flag = e.alloc_flag(p.space).unwrap().expect("a flag word");
        e.dirty_log_start().unwrap();
        let h = PreemptHandle::new();
        for l in &inst.launches {
            launches += 1;
            let ce = t
                .entry(l.entry)
                .unwrap_or_else(|| panic!("{} {}: not checked", w.name, l.entry));
            let own = suite::layout_params(&l.params, &p.addrs).unwrap();
            let offs = suite::param_offsets(&l.params);
            let mut allowed = vec![0u64; dirty::words(VRAM)];
            let ranges: Vec<(u64, u64)> = ce
                .params
                .iter()
                .map(|o| {
                    let i = offs.iter().position(|x| x == o).unwrap();
                    let suite::Param::Buffer(b) = l.params[i] else {
                        panic!("{}: stores through a scalar", w.name)
                    };
                    let (lo, hi) = (p.addrs[b], p.addrs[b] + inst.buffers[b].init.len() as u64);
                    pages_of(&e, p.space, lo, hi, &mut allowed);
                    (lo, hi)
                })
                .collect();
            let job = Job::Launch(LaunchJob {
                space: p.space,
                module: twin,
                entry: l.entry.to_string(),
                grid: l.grid,
                block: l.block,
                dynamic_shared: l.shared_bytes,
                params: ce.buffer(&own, flag, &ranges),
            });
            let approx = (inst.approx_thread_instrs / 32).max(16);
            let mut written = vec![0u64; dirty::words(VRAM)];
            e.set_step_limit(Some(1 + rng.below(approx)));
            let mut out = e.execute(&job, &h).unwrap();
            let mut n = 0;
            while let Outcome::Preempted { context, .. } = out {
                n += 1;
                for (a, b) in written.iter_mut().zip(harvest(&e)) {
                    *a |= b;
                }
                let context = if n % 2 == 0 {
                    SavedContext::from_bytes(context.into_bytes())
                } else {
                    context
                };
                e.set_step_limit(if n > 8 {
                    None
                } else {
                    Some(1 + rng.below(approx))
                });
                out = e.resume(context, &h).unwrap();
            }
            e.set_step_limit(None);
            preemptions += n;
            assert!(
                matches!(out, Outcome::Completed { .. }),
                "{}: {out:?}",
                w.name
            );
            for (a, b) in written.iter_mut().zip(harvest(&e)) {
                *a |= b;
            }
            if e.take_flag(flag).unwrap() {
                failures.push(format!("{} {}: flag raised", w.name, l.entry));
            }
            if let Some(pg) = (0..VRAM / PAGE)
                .find(|&q| dirty::is_set(&written, q) && !dirty::is_set(&allowed, q))
            {
                failures.push(format!(
                    "{} {}: page {pg:#x} written outside the validated write set",
                    w.name, l.entry
                ));
            }
        }
        e.dirty_log_stop();
        let mut outs = Vec::new();
        for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            outs.push(buf);
        }
        if let Err(err) = check(&inst, &outs) {
            failures.push(format!("{}: {err}", w.name));
        }
        e.free_flag(flag);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(launches >= 25, "{launches} launches");
    assert!(preemptions > 10, "{preemptions} preemptions");
}

#[test]
fn every_suite_launch_checked_is_a_superset_of_the_exact_log() {
    suite_checked(PreemptMethod::Slice, 0x5a5a_0001);
}

#[test]
fn checked_twins_under_the_checkpoint_method_too() {
    suite_checked(PreemptMethod::Checkpoint, 0x5a5a_0002);
}

const PLANTED: &str = r#".version 7.0
.target sm_70
.address_size 64
.visible .entry k(.param .u64 dst, .param .u32 below)
{
    .reg .b64 %rd<8>;
    .reg .b32 %r<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [dst];
    ld.param.u32 %r1, [below];
    mov.u32 %r2, %tid.x;
    mul.wide.u32 %rd2, %r2, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 st.global.u32 [%rd1+-4096], 77;
    ret;
}
"#;

/// A sim engine with one space of two adjacent one-page buffers at `BASE`: a (PA 0) then dst
/// (PA 4096).
fn two_pages() -> (SimEngine, SpaceId) {
    let e = SimEngine::new(SimConfig {
        vram_size: VRAM,
        ..SimConfig::default()
    })
    .unwrap();
    let space = e
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    e.map(
        space,
        &Mapping {
            va: BASE,
            len: 2 * PAGE,
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size4K,
        },
    )
    .unwrap();
    (e, space)
}

#[test]
fn a_planted_store_outside_its_buffer_raises_the_flag_and_the_log_shows_the_missed_page() {
    let (e, space) = two_pages();
    let dst = BASE + PAGE;
    let t = transform(PLANTED, &ptx::LoadOptions::default()).unwrap();
    let twin = e.load_module(&t.ptx, &LoadLimits::default()).unwrap().id;
    let ce = t.entry("k").unwrap();
    let flag = e.alloc_flag(space).unwrap().unwrap();
    e.dirty_log_start().unwrap();
    for below in [0u32, 1] {
        let mut own = dst.to_le_bytes().to_vec();
        own.extend_from_slice(&below.to_le_bytes());
        let job = Job::Launch(LaunchJob {
            space,
            module: twin,
            entry: "k".into(),
            grid: [1, 1, 1],
            block: [64, 1, 1],
            dynamic_shared: 0,
            params: ce.buffer(&own, flag, &[(dst, dst + PAGE)]),
        });
        let out = e.execute(&job, &PreemptHandle::new()).unwrap();
        assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
        let written = harvest(&e);
        assert_eq!(e.take_flag(flag).unwrap(), below == 1, "below {below}");
        // The write set (dst's page, PA page 1) misses page 0 exactly when the flag is up.
        assert!(dirty::is_set(&written, 1));
        assert_eq!(dirty::is_set(&written, 0), below == 1);
    }
    // The store still happened.
    let mut w = [0u8; 4];
    e.vram_read(0, &mut w).unwrap();
    assert_eq!(u32::from_le_bytes(w), 77);
    assert!(!e.take_flag(flag).unwrap(), "a take clears it");
    // Another space's kernels cannot reach the word: the planted store there faults out of
    // the window instead of raising (or clearing) this space's flag.
    let other = e
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    e.map(
        other,
        &Mapping {
            va: BASE,
            len: 2 * PAGE,
            target: MapTarget::Vram { pa: 8 * PAGE },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size4K,
        },
    )
    .unwrap();
    let mut own = dst.to_le_bytes().to_vec();
    own.extend_from_slice(&1u32.to_le_bytes());
    let job = Job::Launch(LaunchJob {
        space: other,
        module: twin,
        entry: "k".into(),
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared: 0,
        params: ce.buffer(&own, flag, &[(dst, dst + PAGE)]),
    });
    let out = e.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Faulted { .. }), "{out:?}");
    assert!(!e.take_flag(flag).unwrap());
    e.free_flag(flag);
    assert!(e.take_flag(flag).is_err(), "freed");
}

/// A preempted run of a checked twin resumed by another engine (a restored or migrated VM):
/// the flag word it was given is the first engine's and means nothing to the second (on cuda
/// another process's address: the store faulted the run). Re-targeted with its flag parameter
/// patched (`ParamPatch`, at `ptx::ckpt::bounds::flag_offset`) to 0, it completes and still
/// stores outside; resumed as it was, it faults.
#[test]
fn a_twin_resumed_by_another_engine_completes_with_its_flag_parameter_patched() {
    let t = transform(PLANTED, &ptx::LoadOptions::default()).unwrap();
    let ce = t.entry("k").unwrap();
    let offset = ptx::ckpt::bounds::flag_offset(&t.ptx, "k").expect("a flag parameter");
    assert_eq!(offset, ce.flag_off);
    let dst = BASE + PAGE;
    let (a, space) = two_pages();
    let twin = a.load_module(&t.ptx, &LoadLimits::default()).unwrap().id;
    let flag = a.alloc_flag(space).unwrap().unwrap();
    let mut own = dst.to_le_bytes().to_vec();
    own.extend_from_slice(&1u32.to_le_bytes());
    let job = Job::Launch(LaunchJob {
        space,
        module: twin,
        entry: "k".into(),
        grid: [64, 1, 1],
        block: [64, 1, 1],
        dynamic_shared: 0,
        params: ce.buffer(&own, flag, &[(dst, dst + PAGE)]),
    });
    let h = PreemptHandle::new();
    h.request();
    let bytes = match a.execute(&job, &h).unwrap() {
        Outcome::Preempted { context, .. } => context.into_bytes(),
        other => panic!("not preempted: {other:?}"),
    };
    for patched in [false, true] {
        let (b, space) = two_pages();
        let twin = b.load_module(&t.ptx, &LoadLimits::default()).unwrap().id;
        let patch = patched.then_some(ParamPatch { offset, value: 0 });
        let ctx = b
            .retarget_context(
                SavedContext::from_bytes(bytes.clone()),
                space,
                Some(twin),
                patch,
            )
            .unwrap();
        let out = b.resume(ctx, &PreemptHandle::new()).unwrap();
        if !patched {
            assert!(matches!(out, Outcome::Faulted { .. }), "{out:?}");
            continue;
        }
        assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
        let mut w = [0u8; 4];
        b.vram_read(0, &mut w).unwrap();
        assert_eq!(u32::from_le_bytes(w), 77, "the outside store happened");
        b.vram_read(PAGE + 4 * 63, &mut w).unwrap();
        assert_eq!(u32::from_le_bytes(w), 63);
    }
    // A patch outside the parameters is refused.
    let (b, space) = two_pages();
    let twin = b.load_module(&t.ptx, &LoadLimits::default()).unwrap().id;
    let far = ParamPatch {
        offset: ce.param_size,
        value: 0,
    };
    assert!(matches!(
        b.retarget_context(
            SavedContext::from_bytes(bytes),
            space,
            Some(twin),
            Some(far)
        ),
        Err(EngineError::BadContext(_))
    ));
}
