//! A switch between two sim engines mid-job: the same code path a move between two devices
//! takes (stage, VRAM pre-copy, commit), checked byte for byte.

use std::sync::Arc;

use super::*;
use crate::engine::{
    Engine, Job, LaunchJob, MapTarget, Mapping, Outcome, PageSize, Perm, PreemptHandle, VaWindow,
};
use crate::sim::{SimConfig, SimEngine};

const VRAM: u64 = 8 << 20;
const BASE: u64 = 0x4_0000_0000;

fn sim(vram: u64) -> Arc<dyn EngineSnapshot> {
    Arc::new(
        SimEngine::new(SimConfig {
            vram_size: vram,
            workers: 1,
            ..SimConfig::default()
        })
        .unwrap(),
    )
}

fn limits() -> LoadLimits {
    LoadLimits {
        max_host_bytes: 64 << 20,
        ..LoadLimits::default()
    }
}

/// Copies all of the old engine's VRAM to the staged one (what a move's pre-copy rounds and
/// last round add up to when nothing runs).
fn precopy(from: &dyn EngineSnapshot, to: &dyn EngineSnapshot) {
    let mut buf = vec![0u8; 1 << 20];
    for at in (0..VRAM).step_by(buf.len()) {
        from.vram_read(at, &mut buf).unwrap();
        to.vram_write(at, &buf).unwrap();
    }
}

/// vecadd of `n` floats: a = 1.0, b = i, c = a + b at VA BASE + 2 MiB.
fn vecadd(sw: &SwitchEngine, n: u32) -> (SpaceId, Job) {
    let space = sw
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    sw.map(
        space,
        &Mapping {
            va: BASE,
            len: 4 << 20,
            target: MapTarget::Vram { pa: 2 << 20 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let (a, b, c) = (BASE, BASE + (1 << 20), BASE + (2 << 20));
    let ones: Vec<u8> = (0..n).flat_map(|_| 1f32.to_le_bytes()).collect();
    let idx: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    sw.copy_to_space(space, a, &ones).unwrap();
    sw.copy_to_space(space, b, &idx).unwrap();
    let module = sw
        .load_module(suite::find("vecadd").unwrap().ptx, &limits())
        .unwrap()
        .id;
    let mut params = Vec::new();
    for p in [a, b, c] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&n.to_le_bytes());
    let job = Job::Launch(LaunchJob {
        space,
        module,
        entry: "vecadd".into(),
        grid: [n.div_ceil(64), 1, 1],
        block: [64, 1, 1],
        dynamic_shared: 0,
        params,
    });
    (space, job)
}

fn check_c(sw: &SwitchEngine, space: SpaceId, n: u32) {
    let mut out = vec![0u8; 4 * n as usize];
    sw.copy_from_space(space, BASE + (2 << 20), &mut out)
        .unwrap();
    for (i, w) in out.chunks(4).enumerate() {
        let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        assert_eq!(v, 1.0 + i as f32, "c[{i}]");
    }
}

#[test]
fn a_job_preempted_on_one_engine_finishes_on_the_other_with_the_same_results() {
    let first = sim(VRAM);
    let sw = SwitchEngine::new(first.clone());
    let n = 4096;
    let (space, job) = vecadd(&sw, n);
    // Host memory the guest's GPU maps (registered again on the new engine).
    let layout = std::alloc::Layout::from_size_align(2 << 20, 2 << 20).unwrap();
    // SAFETY: a non-zero size; freed at the end, after the region is unregistered.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!ptr.is_null());
    // SAFETY: `ptr` is 2 MiB of memory that outlives the registration (unregistered below).
    let region = unsafe { sw.register_host_region(ptr, layout.size()) }.unwrap();
    sw.map(
        space,
        &Mapping {
            va: BASE + (8 << 20),
            len: 2 << 20,
            target: MapTarget::Host { region, offset: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let handle = PreemptHandle::new();
    handle.request();
    let Outcome::Preempted { context, .. } = sw.execute(&job, &handle).unwrap() else {
        panic!("expected a preemption")
    };
    handle.clear();

    let staged = sw.stage(sim(VRAM), None, &limits()).unwrap();
    precopy(&*first, &**staged.engine());
    let old = sw.commit(staged).unwrap();
    assert!(Arc::ptr_eq(&old, &first));
    assert_eq!(sw.switches(), 1);
    assert!(!Arc::ptr_eq(&sw.current(), &first));
    // The old engine's space is gone; the caller's ids still work on the new one.
    let t = sw.lookup(space, BASE + (8 << 20)).unwrap().unwrap();
    assert_eq!(t.target, MapTarget::Host { region, offset: 0 });

    // The preempted job's context holds the old engine until it resumes on the new one.
    let held = Arc::strong_count(&first);
    let out = sw.resume(context, &handle).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    assert_eq!(Arc::strong_count(&first), held - 1);
    check_c(&sw, space, n);
    // The old engine's VRAM was not written after the switch (its c[] half done at most).
    let mut c_old = vec![0u8; 4 * n as usize];
    first.vram_read(4 << 20, &mut c_old).unwrap();
    let mut c_new = vec![0u8; 4 * n as usize];
    sw.vram_read(4 << 20, &mut c_new).unwrap();
    assert_ne!(c_old, c_new);

    // The host region reached through the new engine is the same memory.
    sw.copy_to_space(space, BASE + (8 << 20) + 16, b"moved")
        .unwrap();
    // SAFETY: 2 MiB at `ptr`, allocated above.
    let host = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
    assert_eq!(&host[16..21], b"moved");
    sw.unmap(space, BASE + (8 << 20), 2 << 20).unwrap();
    sw.unregister_host_region(region).unwrap();
    // Modules: one caller load, unloaded from the engine in use.
    let Job::Launch(l) = &job else { unreachable!() };
    sw.unload_module(l.module).unwrap();
    assert!(sw.unload_module(l.module).is_err());
    drop(sw);
    drop(first);
    // SAFETY: allocated above with `layout`; no engine holds it any more.
    unsafe { std::alloc::dealloc(ptr, layout) };
}

#[test]
fn switching_twice_and_back_keeps_state_and_mappings_split_by_unmaps() {
    let sw = SwitchEngine::new(sim(VRAM));
    let n = 1024;
    let (space, job) = vecadd(&sw, n);
    // A second load of the same text: the same module, charged the same (text included).
    let Job::Launch(l) = &job else { unreachable!() };
    let ptx = suite::find("vecadd").unwrap().ptx;
    let again = sw.load_module(ptx, &limits()).unwrap();
    assert_eq!(again.id, l.module);
    assert!(again.host_bytes >= ptx.len() as u64);
    // Unmap the middle 2 MiB page of the 4 MiB mapping... of another, 3-page mapping.
    sw.map(
        space,
        &Mapping {
            va: BASE + (16 << 20),
            len: 6 << 20,
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadOnly,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    sw.unmap(space, BASE + (18 << 20), 2 << 20).unwrap();
    for _ in 0..2 {
        let old = sw.current();
        let staged = sw.stage(sim(VRAM), None, &limits()).unwrap();
        precopy(&*old, &**staged.engine());
        sw.commit(staged).unwrap();
    }
    assert_eq!(sw.switches(), 2);
    assert!(sw.lookup(space, BASE + (18 << 20)).unwrap().is_none());
    let t = sw.lookup(space, BASE + (20 << 20)).unwrap().unwrap();
    assert_eq!(t.target, MapTarget::Vram { pa: 4 << 20 });
    assert_eq!(t.perm, Perm::ReadOnly);
    // One of the two loads given back: the module stays for the other.
    sw.unload_module(again.id).unwrap();
    let out = sw.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    check_c(&sw, space, n);
}

#[test]
fn what_cannot_move_is_refused_and_the_old_engine_stays() {
    let sw = SwitchEngine::new(sim(VRAM));
    // Another VRAM size.
    let e = sw.stage(sim(VRAM * 2), None, &limits()).err().unwrap();
    assert!(e.to_string().contains("does not match"), "{e}");
    // Engine-owned host memory without a handover.
    let (r, _) = sw.alloc_host_region(2 << 20).unwrap();
    let e = sw.stage(sim(VRAM), None, &limits()).err().unwrap();
    assert!(e.to_string().contains("handover"), "{e}");
    // A handover that fails is the stage's error.
    let mut refuse = |_: HostRegionId| -> Result<HostRegionId, EngineError> {
        Err(EngineError::Backend("no adoption here".into()))
    };
    let e = sw
        .stage(sim(VRAM), Some(&mut refuse as Handover<'_>), &limits())
        .err()
        .unwrap();
    assert!(e.to_string().contains("no adoption"), "{e}");
    sw.unregister_host_region(r).unwrap();
    // Flag words outstanding: the commit is refused, the old engine stays.
    let (space, _) = vecadd(&sw, 64);
    let before = sw.current();
    let flag = sw.alloc_flag(space).unwrap();
    let staged = sw.stage(sim(VRAM), None, &limits()).unwrap();
    if let Some(va) = flag {
        let e = sw.commit(staged).err().unwrap();
        assert!(e.to_string().contains("flag"), "{e}");
        assert!(Arc::ptr_eq(&before, &sw.current()));
        sw.free_flag(va);
    } else {
        sw.commit(staged).unwrap();
    }
}

#[test]
fn a_commit_the_new_engine_refuses_leaves_the_old_engine_running_its_spaces() {
    let first = sim(VRAM);
    let sw = SwitchEngine::new(first.clone());
    let n = 512;
    let (space, job) = vecadd(&sw, n);
    // A new engine that cannot hold the VM's space: the rebuild there fails.
    let cramped: Arc<dyn EngineSnapshot> = Arc::new(
        SimEngine::new(SimConfig {
            vram_size: VRAM,
            workers: 1,
            limits: crate::engine::EngineLimits {
                max_spaces: 0,
                ..Default::default()
            },
            ..SimConfig::default()
        })
        .unwrap(),
    );
    let staged = sw.stage(cramped, None, &limits()).unwrap();
    precopy(&*first, &**staged.engine());
    let e = sw.commit(staged).err().unwrap();
    assert!(e.to_string().contains("spaces"), "{e}");
    assert!(Arc::ptr_eq(&sw.current(), &first));
    assert_eq!(sw.switches(), 0);
    // The old engine has the space again, with its mapping, and runs the job.
    let t = sw.lookup(space, BASE).unwrap().unwrap();
    assert_eq!(t.target, MapTarget::Vram { pa: 2 << 20 });
    let out = sw.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    check_c(&sw, space, n);
}
