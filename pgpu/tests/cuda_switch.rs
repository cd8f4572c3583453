//! Moving a cuda engine's state to another device of the host (`pgpu::switch`, issue 25): a job
//! preempted on device 0 finishes on device 1 with the same bytes, guest RAM (engine-owned host
//! memory) handed over, not copied.
//!
//! Without a GPU: the engine construction fails clearly and the test checks that. With two,
//! `cargo test -p pgpu --release --test cuda_switch -- --ignored --nocapture`; with fewer it
//! says so and passes (nothing to move between). Prints `MEASURE` lines (stage, commit).

use std::sync::Arc;
use std::time::Instant;

use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::switch::SwitchEngine;
use pgpu::*;

const MIB: u64 = 1 << 20;
const VRAM: u64 = 64 * MIB;
const BASE: u64 = 0x10_0000_0000;

fn engine(device: i32) -> Result<Arc<CudaEngine>, EngineError> {
    CudaEngine::new(CudaConfig {
        device,
        vram_size: VRAM,
        initial_blocks: 1,
        ..CudaConfig::default()
    })
    .map(Arc::new)
}

#[test]
fn a_second_device_without_a_gpu_is_a_clear_error() {
    match engine(1) {
        Ok(_) => {}
        Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
    }
    match pgpu::cuda::devices(64) {
        Ok(d) => assert!(!d.is_empty()),
        Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
    }
}

#[test]
#[ignore = "needs two CUDA devices"]
fn a_job_preempted_on_device_0_finishes_on_device_1() {
    let n = pgpu::cuda::devices(64).map_or(0, |d| d.len());
    if n < 2 {
        eprintln!("SKIP: {n} CUDA device(s); moving needs two");
        return;
    }
    let first = engine(0).unwrap();
    let sw = SwitchEngine::new(first.clone());
    // Guest RAM: engine-owned host memory, mapped at a guest VA.
    let (ram, ptr) = sw.alloc_host_region(2 * MIB).unwrap();
    let space = sw
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    let maps = [
        Mapping {
            va: BASE,
            len: 8 * MIB,
            target: MapTarget::Vram { pa: 2 * MIB },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
        Mapping {
            va: BASE + 16 * MIB,
            len: 2 * MIB,
            target: MapTarget::Host {
                region: ram,
                offset: 0,
            },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    ];
    sw.map_batch(space, &maps).unwrap();
    let count: u32 = 1 << 20;
    let (a, b, c) = (BASE, BASE + 4 * MIB, BASE + 16 * MIB);
    let ones: Vec<u8> = (0..count).flat_map(|_| 1f32.to_le_bytes()).collect();
    let idx: Vec<u8> = (0..count).flat_map(|i| (i as f32).to_le_bytes()).collect();
    sw.copy_to_space(space, a, &ones).unwrap();
    // b's second half lies past a's 4 MiB: a and b are 4 MiB each.
    sw.copy_to_space(space, b, &idx).unwrap();
    let module = sw
        .load_module(
            suite::find("vecadd").unwrap().ptx,
            &LoadLimits {
                max_host_bytes: 64 * MIB,
                ..LoadLimits::default()
            },
        )
        .unwrap()
        .id;
    // c: half a million floats in guest RAM (2 MiB).
    let m = count / 2;
    let mut params = Vec::new();
    for p in [a, b, c] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&m.to_le_bytes());
    let job = Job::Launch(LaunchJob {
        space,
        module,
        entry: "vecadd".into(),
        grid: [m.div_ceil(256), 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        params,
    });
    let h = PreemptHandle::new();
    h.request();
    let out = sw.execute(&job, &h).unwrap();
    h.clear();
    let Outcome::Preempted { context, .. } = out else {
        panic!("expected a preemption, got {out:?}")
    };

    let t = Instant::now();
    let second = engine(1).unwrap();
    let (from, to) = (first.clone(), second.clone());
    let mut handover = move |id: HostRegionId| -> Result<HostRegionId, EngineError> {
        to.share_host_region(&from, id)
    };
    let staged = sw
        .stage(second.clone(), Some(&mut handover), &LoadLimits::default())
        .unwrap();
    let stage_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let mut buf = vec![0u8; 4 * MIB as usize];
    for at in (0..VRAM).step_by(buf.len()) {
        first.vram_read(at, &mut buf).unwrap();
        staged.engine().vram_write(at, &buf).unwrap();
    }
    let copy_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let old = sw.commit(staged).unwrap();
    let commit_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(old);
    drop(first);
    println!(
        "MEASURE switch device 0 -> 1: stage {stage_ms:.1} ms (context, VRAM, module load), \
         VRAM copy {copy_ms:.1} ms ({} MiB through the host), commit {commit_ms:.2} ms",
        VRAM >> 20
    );
    let out = sw.resume(context, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    // The results are in guest RAM, read through its CPU pointer (the same memory).
    // SAFETY: the region is 2 MiB, alive while `sw` holds it.
    let got = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), 4 * m as usize) };
    for (i, w) in got.chunks(4).enumerate() {
        let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        assert_eq!(v, 1.0 + i as f32, "c[{i}]");
    }
    // And a new launch on device 1 works too.
    let out = sw.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    assert_eq!(sw.switches(), 1);
}
