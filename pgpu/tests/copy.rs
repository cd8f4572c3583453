//! Copy-engine jobs: VA → VA copies through the MMU, faults that stay in their address space,
//! and preemption / resume through context bytes.

mod common;

use common::*;
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

fn map_vram(e: &SimEngine, s: SpaceId, va: u64, len: u64, pa: u64, perm: Perm) {
    let m = Mapping {
        va,
        len,
        target: MapTarget::Vram { pa },
        perm,
        page_size: PageSize::Size4K,
    };
    e.map(s, &m).unwrap();
}

fn copy(s: SpaceId, src: u64, dst: u64, len: u64) -> Job {
    Job::Copy(CopyJob {
        space: s,
        src,
        dst,
        len,
    })
}

#[test]
fn copy_job_crosses_pages_of_scattered_memory() {
    let e = engine();
    let s = space(&e);
    // Source pages map to PAs in reverse order, destination to a 2M page.
    for i in 0..16u64 {
        map_vram(
            &e,
            s,
            BASE + i * 4096,
            4096,
            (15 - i) * 4096,
            Perm::ReadOnly,
        );
    }
    let m = Mapping {
        va: BASE + 2 * MIB,
        len: 2 * MIB,
        target: MapTarget::Vram { pa: 4 * MIB },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size2M,
    };
    e.map(s, &m).unwrap();
    let data = Rng(7).bytes(16 * 4096 - 100);
    for (i, page) in data.chunks(4096).enumerate() {
        e.vram_write((15 - i as u64) * 4096, page).unwrap();
    }
    let out = e.execute(
        &copy(s, BASE, BASE + 2 * MIB + 3, data.len() as u64),
        &PreemptHandle::new(),
    );
    assert!(matches!(out, Ok(Outcome::Completed { .. })), "{out:?}");
    let mut got = vec![0u8; data.len()];
    e.vram_read(4 * MIB + 3, &mut got).unwrap();
    assert_eq!(got, data);
}

#[test]
fn copy_fault_reports_va_and_access_and_spares_other_spaces() {
    let e = engine();
    let a = space(&e);
    let b = space(&e);
    map_vram(&e, a, BASE, 0x3000, 0, Perm::ReadWrite);
    map_vram(&e, a, BASE + 0x10000, 0x1000, 0x10000, Perm::ReadWrite);
    map_vram(&e, b, BASE, 0x2000, 0x20000, Perm::ReadWrite);
    e.copy_to_space(b, BASE, b"space b").unwrap();
    // Destination runs past its single mapped page.
    let out = e
        .execute(
            &copy(a, BASE, BASE + 0x10000, 0x2000),
            &PreemptHandle::new(),
        )
        .unwrap();
    let Outcome::Faulted { fault, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(fault.kind, FaultKind::Unmapped);
    assert_eq!(fault.va, BASE + 0x11000);
    assert_eq!(fault.access, Some(AccessKind::Write));
    // Unmapped source.
    let out = e
        .execute(&copy(a, BASE + 0x3000, BASE, 16), &PreemptHandle::new())
        .unwrap();
    let Outcome::Faulted { fault, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        (fault.va, fault.access),
        (BASE + 0x3000, Some(AccessKind::Read))
    );
    // The engine and the other space carry on.
    let out = e
        .execute(&copy(b, BASE, BASE + 0x1000, 7), &PreemptHandle::new())
        .unwrap();
    assert!(matches!(out, Outcome::Completed { .. }));
    let mut got = [0u8; 7];
    e.copy_from_space(b, BASE + 0x1000, &mut got).unwrap();
    assert_eq!(&got, b"space b");
    // And the faulting space can run again once fixed.
    map_vram(&e, a, BASE + 0x11000, 0x1000, 0x11000, Perm::ReadWrite);
    let out = e
        .execute(
            &copy(a, BASE, BASE + 0x10000, 0x2000),
            &PreemptHandle::new(),
        )
        .unwrap();
    assert!(matches!(out, Outcome::Completed { .. }));
}

#[test]
fn read_only_destination_faults() {
    let e = engine();
    let s = space(&e);
    map_vram(&e, s, BASE, 0x2000, 0, Perm::ReadOnly);
    let out = e
        .execute(&copy(s, BASE, BASE + 0x1000, 8), &PreemptHandle::new())
        .unwrap();
    let Outcome::Faulted { fault, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!((fault.kind, fault.va), (FaultKind::ReadOnly, BASE + 0x1000));
}

#[test]
fn preempted_copy_resumes_from_bytes_with_identical_result() {
    let cfg = SimConfig {
        vram_size: 16 * MIB,
        workers: 1,
        copy_chunk: 4096,
        ..SimConfig::default()
    };
    let e = SimEngine::new(cfg).unwrap();
    let s = space(&e);
    map_vram(&e, s, BASE, 4 * MIB, 0, Perm::ReadWrite);
    let data = Rng(3).bytes(MIB as usize + 5);
    e.copy_to_space(s, BASE + 1, &data).unwrap();
    let mut rng = Rng(11);
    let h = PreemptHandle::new();
    e.set_step_limit(Some(1 + rng.below(40)));
    let mut out = e
        .execute(
            &copy(s, BASE + 1, BASE + 2 * MIB + 9, data.len() as u64),
            &h,
        )
        .unwrap();
    let mut preemptions = 0;
    while let Outcome::Preempted { context, .. } = out {
        preemptions += 1;
        // Through plain bytes, as a scheduler would store them.
        let bytes = context.into_bytes();
        e.set_step_limit(Some(1 + rng.below(40)));
        out = e.resume(SavedContext::from_bytes(bytes), &h).unwrap();
    }
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    assert!(preemptions > 5, "{preemptions}");
    let mut got = vec![0u8; data.len()];
    e.copy_from_space(s, BASE + 2 * MIB + 9, &mut got).unwrap();
    assert_eq!(got, data);
}

#[test]
fn preempt_request_before_start_and_from_another_thread() {
    let e = engine();
    let s = space(&e);
    map_vram(&e, s, BASE, 32 * MIB, 0, Perm::ReadWrite);
    let data = Rng(5).bytes(16 * MIB as usize);
    e.copy_to_space(s, BASE, &data).unwrap();
    let h = PreemptHandle::new();
    h.request();
    let out = e
        .execute(&copy(s, BASE, BASE + 16 * MIB, 16 * MIB), &h)
        .unwrap();
    let Outcome::Preempted { context, .. } = out else {
        panic!("{out:?}")
    };
    assert!(!context.is_bytes(), "in-memory context");
    h.clear();
    // Resume (in-memory contexts) and preempt from another thread until done.
    let mut ctx = context;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let out = std::thread::scope(|sc| {
            let h2 = h.clone();
            sc.spawn(move || {
                std::thread::sleep(std::time::Duration::from_micros(200));
                h2.request();
            });
            e.resume(ctx, &h).unwrap()
        });
        h.clear();
        match out {
            Outcome::Preempted { context, .. } => ctx = context,
            Outcome::Completed { .. } => break,
            other => panic!("{other:?}"),
        }
        assert!(rounds < 10_000);
    }
    assert!(h.running_since().is_some());
    let mut got = vec![0u8; data.len()];
    e.copy_from_space(s, BASE + 16 * MIB, &mut got).unwrap();
    assert!(got == data, "copied bytes differ");
}

#[test]
fn hostile_contexts_are_refused() {
    let e = engine();
    let s = space(&e);
    let h = PreemptHandle::new();
    for bytes in [vec![], b"PGPUCTX2".to_vec(), vec![0xff; 64]] {
        let r = e.resume(SavedContext::from_bytes(bytes), &h);
        assert!(matches!(r, Err(EngineError::BadContext(_))), "{r:?}");
    }
    map_vram(&e, s, BASE, 0x2000, 0, Perm::ReadWrite);
    h.request();
    let Outcome::Preempted { context, .. } =
        e.execute(&copy(s, BASE, BASE + 0x1000, 64), &h).unwrap()
    else {
        panic!()
    };
    let mut bad = context.to_bytes();
    bad.truncate(bad.len() - 1);
    assert!(matches!(
        e.resume(SavedContext::from_bytes(bad), &h),
        Err(EngineError::BadContext(_))
    ));
    // An in-memory context resumes only on the engine that made it.
    let other = engine();
    let r = other.resume(context.clone(), &h);
    assert!(
        matches!(r, Err(EngineError::UnknownSpace(_))),
        "bytes path: {r:?}"
    );
    let Outcome::Preempted { context: live, .. } =
        e.execute(&copy(s, BASE, BASE + 0x1000, 64), &h).unwrap()
    else {
        panic!()
    };
    let r = other.resume(live, &h);
    assert!(matches!(r, Err(EngineError::BadContext(_))), "{r:?}");
    e.destroy_space(s).unwrap();
    assert_eq!(e.resume(context, &h), Err(EngineError::UnknownSpace(s)));
}
