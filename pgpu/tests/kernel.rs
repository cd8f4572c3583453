//! Kernel jobs on the sim engine: typed faults that end only their own job and space, mappings
//! frozen while a kernel runs, kernels on guest-RAM (host region) mappings, preemption from
//! another thread, the module cache and refused launches.

mod common;

use std::time::{Duration, Instant};

use common::runner::{check, place, run};
use common::*;
use pgpu::sim::SimEngine;
use pgpu::*;

fn vecadd() -> suite::Instance {
    suite::find("vecadd").unwrap().instance(suite::Size::Small)
}

fn launch_job(p: &runner::Placed, inst: &suite::Instance, addrs: &[u64]) -> Job {
    let l = &inst.launches[0];
    Job::Launch(LaunchJob {
        space: p.space,
        module: p.module,
        entry: l.entry.to_string(),
        grid: l.grid,
        block: l.block,
        dynamic_shared: l.shared_bytes,
        params: suite::layout_params(&l.params, addrs).unwrap(),
    })
}

fn fault_of(out: Outcome) -> JobFault {
    match out {
        Outcome::Faulted { fault, .. } => fault,
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn kernel_faults_are_typed_and_stay_in_their_space() {
    let e = engine();
    let inst = vecadd();
    let a = place(&e, &inst, 0);
    let h = PreemptHandle::new();
    // Output pointer into an unmapped part of the window.
    let hole = BASE + (512 << 20);
    let job = launch_job(&a, &inst, &[a.addrs[0], a.addrs[1], hole]);
    let f = fault_of(e.execute(&job, &h).unwrap());
    assert_eq!(f.kind, FaultKind::Unmapped);
    assert_eq!(f.access, Some(AccessKind::Write));
    assert!(f.va >= hole && f.va < hole + 4 * 4000, "{f}");
    assert!(
        f.site
            .as_ref()
            .is_some_and(|s| s.entry == "vecadd" && s.line > 0 && s.thread[0] < 256),
        "{f}"
    );
    // Input pointer outside the window.
    let job = launch_job(&a, &inst, &[0x10, a.addrs[1], a.addrs[2]]);
    let f = fault_of(e.execute(&job, &h).unwrap());
    assert_eq!(
        (f.kind, f.access),
        (FaultKind::OutOfWindow, Some(AccessKind::Read))
    );
    // Output into the read-only remap of an input buffer.
    let ro = BASE + (256 << 20);
    let m = Mapping {
        va: ro,
        len: 4 << 12,
        target: MapTarget::Vram { pa: 0 },
        perm: Perm::ReadOnly,
        page_size: PageSize::Size4K,
    };
    e.map(a.space, &m).unwrap();
    let job = launch_job(&a, &inst, &[a.addrs[0], a.addrs[1], ro]);
    let f = fault_of(e.execute(&job, &h).unwrap());
    assert_eq!(
        (f.kind, f.access),
        (FaultKind::ReadOnly, Some(AccessKind::Write))
    );

    // Another space runs while the first one faults, and afterwards; so does the first one.
    let b = place(&e, &inst, 32 * MIB);
    let bad = launch_job(&a, &inst, &[a.addrs[0], a.addrs[1], hole]);
    std::thread::scope(|s| {
        let t = s.spawn(|| run(&e, &b, &inst, || None));
        let f = fault_of(e.execute(&bad, &PreemptHandle::new()).unwrap());
        assert_eq!(f.kind, FaultKind::Unmapped);
        let (outs, _) = t.join().unwrap().unwrap();
        check(&inst, &outs).unwrap();
    });
    let (outs, _) = run(&e, &a, &inst, || None).unwrap();
    check(&inst, &outs).unwrap();
    let c = e.counters();
    assert_eq!(c.faults, 4);
    assert!(c.thread_instructions > 0);
}

#[test]
fn mappings_are_frozen_while_a_kernel_runs_and_preemption_ends_it() {
    let e = engine();
    // Long enough never to finish on its own within the test.
    let inst = suite::hand::spin::instance_with(60_000_000_000, 1, 32, suite::Size::Small);
    let p = place(&e, &inst, 0);
    let other = place(&e, &vecadd(), 32 * MIB);
    let job = launch_job(&p, &inst, &p.addrs);
    let h = PreemptHandle::new();
    let scratch = Mapping {
        va: BASE + (512 << 20),
        len: 4096,
        target: MapTarget::Vram { pa: 48 * MIB },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    let out = std::thread::scope(|s| {
        let t = s.spawn(|| e.execute(&job, &h));
        let start = Instant::now();
        loop {
            match e.map(p.space, &scratch) {
                Err(EngineError::SpaceBusy(_)) => break,
                Ok(()) => {
                    e.unmap(p.space, scratch.va, scratch.len).unwrap();
                }
                Err(err) => panic!("{err}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "kernel never seen running"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            e.unmap(p.space, BASE, 4096),
            Err(EngineError::SpaceBusy(p.space))
        );
        assert_eq!(
            e.destroy_space(p.space),
            Err(EngineError::SpaceBusy(p.space))
        );
        // Other spaces are not frozen.
        e.map(other.space, &scratch).unwrap();
        h.request();
        t.join().unwrap().unwrap()
    });
    let Outcome::Preempted { context, gpu_time } = out else {
        panic!("{out:?}")
    };
    assert!(gpu_time > Duration::ZERO);
    // Preempted and not running: the space can change again (and the job is dropped).
    e.map(p.space, &scratch).unwrap();
    drop(context);
    e.unmap(p.space, scratch.va, scratch.len).unwrap();
    e.destroy_space(p.space).unwrap();
}

#[test]
fn kernels_use_guest_ram_through_host_region_mappings() {
    let e = engine();
    let inst = vecadd();
    let ram = HostBuf::new(4 * MIB as usize);
    // SAFETY: `ram` outlives its registration (unregistered at the end of the test).
    let r = unsafe { e.register_host_region(ram.ptr(), ram.len()) }.unwrap();
    let s = e
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    let m = Mapping {
        va: BASE,
        len: 4 * MIB,
        target: MapTarget::Host {
            region: r,
            offset: 0,
        },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size2M,
    };
    e.map(s, &m).unwrap();
    let mut addrs = Vec::new();
    for (i, b) in inst.buffers.iter().enumerate() {
        let off = i * 64 * 1024;
        ram.write(off, &b.init);
        addrs.push(BASE + off as u64);
    }
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    let p = runner::Placed {
        space: s,
        module,
        addrs: addrs.clone(),
    };
    let out = e
        .execute(&launch_job(&p, &inst, &addrs), &PreemptHandle::new())
        .unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let outs: Vec<Vec<u8>> = inst
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| ram.read(i * 64 * 1024, b.init.len()))
        .collect();
    check(&inst, &outs).unwrap();
    e.unmap(s, BASE, 4 * MIB).unwrap();
    e.unregister_host_region(r).unwrap();
}

#[test]
fn matmul_preempted_from_another_thread_gives_identical_bytes() {
    let cfg = pgpu::sim::SimConfig {
        vram_size: 64 * MIB,
        workers: 2,
        ..Default::default()
    };
    let e = SimEngine::new(cfg).unwrap();
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Medium);
    let p = place(&e, &inst, 0);
    let (want, _) = run(&e, &p, &inst, || None).unwrap();
    check(&inst, &want).unwrap();
    let p2 = place(&e, &inst, 32 * MIB);
    let job = launch_job(&p2, &inst, &p2.addrs);
    let h = PreemptHandle::new();
    let mut rng = Rng(99);
    let mut preemptions = 0;
    let mut next: Option<SavedContext> = None;
    loop {
        h.clear();
        let delay = Duration::from_micros(50 + rng.below(400));
        // The first round is preempted by a request made before it starts (the engine honours
        // it at the first preemption point), so the test cannot pass without preempting even
        // when a loaded machine delays the preempting thread past the whole kernel; later
        // rounds are preempted from another thread at random times.
        if preemptions == 0 && next.is_none() {
            h.request();
        }
        let out = std::thread::scope(|s| {
            let h2 = h.clone();
            s.spawn(move || {
                std::thread::sleep(delay);
                h2.request();
            });
            match next.take() {
                None => e.execute(&job, &h),
                Some(c) => e.resume(c, &h),
            }
        })
        .unwrap();
        match out {
            Outcome::Completed { .. } => break,
            Outcome::Preempted { context, .. } => {
                preemptions += 1;
                next = Some(if preemptions % 2 == 0 {
                    SavedContext::from_bytes(context.into_bytes())
                } else {
                    context
                });
            }
            Outcome::Faulted { fault, .. } => panic!("{fault}"),
        }
        assert!(preemptions < 100_000);
    }
    assert!(preemptions > 0, "never preempted");
    let mut got = vec![0u8; want[2].len()];
    e.copy_from_space(p2.space, p2.addrs[2], &mut got).unwrap();
    assert!(got == want[2], "preempted matmul differs");
}

#[test]
fn module_cache_and_load_errors() {
    let e = engine();
    let text = suite::find("vecadd").unwrap().ptx;
    let a = e
        .load_module(text, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    let b = e
        .load_module(text, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    assert_eq!(a, b, "same text, same module");
    let other = e
        .load_module(
            suite::find("saxpy").unwrap().ptx,
            &pgpu::LoadLimits::default(),
        )
        .map(|m| m.id)
        .unwrap();
    assert_ne!(a, other);
    e.unload_module(a).unwrap();
    e.unload_module(a).unwrap();
    assert_eq!(e.unload_module(a), Err(EngineError::UnknownModule(a)));
    let c = e
        .load_module(text, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    assert_ne!(a, c, "ids are never reused");
    let Err(EngineError::ModuleLoad { log }) = e
        .load_module(
            ".version 7.0\n.target sm_80\nbogus;",
            &pgpu::LoadLimits::default(),
        )
        .map(|m| m.id)
    else {
        panic!("garbage loaded")
    };
    assert!(log.contains("3:"), "error text names the line: {log}");
    let big = " ".repeat(e.info().limits.max_ptx_bytes + 1);
    assert!(matches!(
        e.load_module(&big, &pgpu::LoadLimits::default())
            .map(|m| m.id),
        Err(EngineError::ModuleLoad { .. })
    ));
}

#[test]
fn refused_launches_run_nothing() {
    let e = engine();
    let inst = vecadd();
    let p = place(&e, &inst, 0);
    let Job::Launch(good) = launch_job(&p, &inst, &p.addrs) else {
        unreachable!()
    };
    let h = PreemptHandle::new();
    let bad = |f: &dyn Fn(&mut LaunchJob)| {
        let mut j = good.clone();
        f(&mut j);
        e.execute(&Job::Launch(j), &h)
    };
    let is_bad = |r: Result<Outcome, EngineError>| matches!(r, Err(EngineError::BadLaunch(_)));
    assert!(is_bad(bad(&|j| j.entry = "nope".into())));
    assert!(is_bad(bad(&|j| j.params.pop().map(|_| ()).unwrap_or(()))));
    assert!(is_bad(bad(&|j| j.params = vec![0; 5000])));
    assert!(is_bad(bad(&|j| j.grid = [0, 1, 1])));
    assert!(is_bad(bad(&|j| j.block = [2048, 1, 1])));
    assert!(is_bad(bad(&|j| j.grid = [u32::MAX, u32::MAX, u32::MAX])));
    assert!(is_bad(bad(&|j| j.dynamic_shared = u32::MAX)));
    assert!(is_bad(bad(&|j| j.entry = "x".repeat(5000))));
    assert_eq!(
        bad(&|j| j.module = ModuleId(999)),
        Err(EngineError::UnknownModule(ModuleId(999)))
    );
    assert_eq!(
        bad(&|j| j.space = SpaceId(999)),
        Err(EngineError::UnknownSpace(SpaceId(999)))
    );
    assert_eq!(e.counters().runs, 0);
    assert!(matches!(
        e.execute(&Job::Launch(good), &h),
        Ok(Outcome::Completed { .. })
    ));
}

#[test]
fn contexts_of_unloaded_modules_do_not_resume() {
    let e = engine();
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Small);
    let p = place(&e, &inst, 0);
    let job = launch_job(&p, &inst, &p.addrs);
    let h = PreemptHandle::new();
    e.set_step_limit(Some(3));
    let Outcome::Preempted { context, .. } = e.execute(&job, &h).unwrap() else {
        panic!()
    };
    let bytes = context.to_bytes();
    e.unload_module(p.module).unwrap();
    assert_eq!(
        e.resume(context, &h),
        Err(EngineError::UnknownModule(p.module))
    );
    assert_eq!(
        e.resume(SavedContext::from_bytes(bytes), &h),
        Err(EngineError::UnknownModule(p.module))
    );
}

#[test]
fn concurrent_jobs_in_many_spaces_with_map_churn() {
    let e = engine();
    let inst = vecadd();
    let placed: Vec<runner::Placed> = (0..3).map(|i| place(&e, &inst, i * 8 * MIB)).collect();
    let churn = e
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    std::thread::scope(|s| {
        let workers: Vec<_> = placed
            .iter()
            .map(|p| {
                s.spawn(|| {
                    for _ in 0..5 {
                        let (outs, _) = run(&e, p, &inst, || None).unwrap();
                        check(&inst, &outs).unwrap();
                    }
                })
            })
            .collect();
        let mut rng = Rng(1);
        for _ in 0..2000 {
            let va = BASE + rng.below(256) * 4096;
            let m = Mapping {
                va,
                len: 4096,
                target: MapTarget::Vram {
                    pa: 40 * MIB + rng.below(256) * 4096,
                },
                perm: Perm::ReadWrite,
                page_size: PageSize::Size4K,
            };
            match e.map(churn, &m) {
                Ok(()) | Err(EngineError::BadMapping(MapError::Overlap(_))) => {}
                Err(err) => panic!("{err}"),
            }
            if rng.below(2) == 0 {
                e.unmap(churn, va, 4096).unwrap();
            }
        }
        for w in workers {
            w.join().unwrap();
        }
    });
    assert_eq!(e.counters().faults, 0);
}

#[test]
fn module_limits_bound_what_a_guest_can_pin() {
    let vecadd = suite::find("vecadd").unwrap().ptx;
    let saxpy = suite::find("saxpy").unwrap().ptx;
    let limits = EngineLimits {
        max_modules: 1,
        max_ptx_bytes_total: vecadd.len() + saxpy.len() - 1,
        ..EngineLimits::default()
    };
    let cfg = pgpu::sim::SimConfig {
        vram_size: 2 * MIB,
        workers: 1,
        limits,
        ..Default::default()
    };
    let e = SimEngine::new(cfg).unwrap();
    let a = e
        .load_module(vecadd, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    assert_eq!(
        e.load_module(saxpy, &pgpu::LoadLimits::default())
            .map(|m| m.id),
        Err(EngineError::TooMany("modules"))
    );
    e.unload_module(a).unwrap();
    e.load_module(saxpy, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    let limits = EngineLimits {
        max_ptx_bytes_total: vecadd.len() + saxpy.len() - 1,
        ..EngineLimits::default()
    };
    let cfg = pgpu::sim::SimConfig {
        vram_size: 2 * MIB,
        workers: 1,
        limits,
        ..Default::default()
    };
    let e = SimEngine::new(cfg).unwrap();
    let a = e
        .load_module(vecadd, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    assert_eq!(
        e.load_module(saxpy, &pgpu::LoadLimits::default())
            .map(|m| m.id),
        Err(EngineError::TooMany("bytes of loaded PTX"))
    );
    e.unload_module(a).unwrap();
    e.load_module(saxpy, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
}

/// A kernel stops by itself at its handle's deadline (a time slice's end, no thread woken to
/// ask), within a polling quantum, and resumed slices give identical bytes.
#[test]
fn a_kernel_stops_at_its_deadline_and_resumes_identically() {
    let e = SimEngine::new(pgpu::sim::SimConfig {
        vram_size: 64 * MIB,
        workers: 1,
        ..Default::default()
    })
    .unwrap();
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Medium);
    let p = place(&e, &inst, 0);
    let (want, _) = run(&e, &p, &inst, || None).unwrap();
    let p2 = place(&e, &inst, 32 * MIB);
    let job = launch_job(&p2, &inst, &p2.addrs);
    let h = PreemptHandle::new();
    let (mut slices, mut late) = (0, Vec::new());
    let mut next: Option<SavedContext> = None;
    loop {
        let deadline = std::time::Instant::now() + Duration::from_micros(300);
        h.set_deadline(Some(deadline));
        let out = match next.take() {
            None => e.execute(&job, &h),
            Some(c) => e.resume(c, &h),
        }
        .unwrap();
        match out {
            Outcome::Completed { .. } => break,
            Outcome::Preempted { context, .. } => {
                assert!(h.is_requested(), "deadline passed");
                late.push(std::time::Instant::now().saturating_duration_since(deadline));
                slices += 1;
                next = Some(context);
            }
            Outcome::Faulted { fault, .. } => panic!("{fault}"),
        }
        assert!(slices < 100_000);
    }
    assert!(slices > 0, "the kernel outlived no deadline");
    late.sort();
    // Generous for a loaded CI machine: a quantum is a few µs of interpretation.
    assert!(
        late[late.len() / 2] < Duration::from_millis(5),
        "median overshoot {:?}",
        late[late.len() / 2]
    );
    let mut got = vec![0u8; want[2].len()];
    e.copy_from_space(p2.space, p2.addrs[2], &mut got).unwrap();
    assert!(got == want[2], "sliced matmul differs");
    h.set_deadline(None);
    assert!(!h.is_requested());
}

#[test]
fn a_context_retargeted_at_another_engine_s_space_and_module_resumes_identically() {
    // What a VM snapshot restore does: the job's buffers are copied to a new engine, whose
    // space and module for it have other ids; the saved context is re-targeted at them.
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Small);
    let a = engine();
    let p = place(&a, &inst, 0);
    let (want, _) = run(&a, &p, &inst, || None).unwrap();
    let p2 = place(&a, &inst, 16 * MIB);
    let job = launch_job(&p2, &inst, &p2.addrs);
    let h = PreemptHandle::new();
    // Preempted after a fixed number of interpreter steps (deterministic progress).
    a.set_step_limit(Some(20));
    let Outcome::Preempted { context, .. } = a.execute(&job, &h).unwrap() else {
        panic!("not preempted by the step limit")
    };
    a.set_step_limit(None);
    let bytes = context.into_bytes();
    let mut bufs = Vec::new();
    for (i, b) in inst.buffers.iter().enumerate() {
        let mut v = vec![0u8; b.init.len()];
        a.copy_from_space(p2.space, p2.addrs[i], &mut v).unwrap();
        bufs.push(v);
    }
    // The new engine: another space and module first, so that the ids differ.
    let b = engine();
    space(&b);
    space(&b);
    b.load_module(vecadd().ptx, &LoadLimits::default()).unwrap();
    let q = place(&b, &inst, 16 * MIB);
    assert!(q.space != p2.space && q.module != p2.module);
    for (i, v) in bufs.iter().enumerate() {
        b.copy_to_space(q.space, q.addrs[i], v).unwrap();
    }
    // As saved, the context names A's ids: on B they are another space and module.
    let stale = b.resume(SavedContext::from_bytes(bytes.clone()), &h);
    assert!(!matches!(stale, Ok(Outcome::Completed { .. })), "{stale:?}");
    let ctx = b
        .retarget_context(
            SavedContext::from_bytes(bytes),
            q.space,
            Some(q.module),
            None,
        )
        .unwrap();
    h.clear();
    let mut out = b.resume(ctx, &h).unwrap();
    while let Outcome::Preempted { context, .. } = out {
        out = b.resume(context, &h).unwrap();
    }
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let mut got = vec![0u8; want[2].len()];
    b.copy_from_space(q.space, q.addrs[2], &mut got).unwrap();
    assert!(got == want[2], "the re-targeted matmul differs");
    // Bytes that are not a context, and a context re-targeted at a module it does not fit.
    assert!(matches!(
        b.retarget_context(SavedContext::from_bytes(vec![1, 2, 3]), q.space, None, None),
        Err(EngineError::BadContext(_))
    ));
}
