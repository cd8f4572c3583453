//! The cuda engine.
//!
//! Without a GPU (CI, dev machines): construction fails with a clear error instead of panicking,
//! and the PTX rewrite for sliced launches is checked on the sim engine (every suite workload run
//! as 1-D sub-launches of 3 blocks gives the same bytes as the plain run).
//!
//! With one, `cargo test -p pgpu --release --test cuda -- --ignored --test-threads=1`: the
//! conformance checks, every suite workload against sim (identical bytes), preemption from
//! another thread with identical bytes, a kernel fault that loses the context (in a child
//! process), host regions, and measurements printed as `MEASURE` lines.
//!
//! Files: this one (construction, the rewrite on sim, conformance, every workload against sim,
//! preemption, kernel faults), `cuda/support.rs` (helpers), `cuda/measure.rs` (the `MEASURE`
//! figures), `cuda/ckpt.rs` (the checkpoint preemption method), `cuda/ckpath.rs` (its request
//! path: flag writes, end waits, status reads, breakdowns), `cuda/ckearly.rs` (requests before
//! and at a checkpointed launch's start), `cuda/memory.rs` (host regions, spaces sharing a window, hostile context bytes), `cuda/bulk.rs`
//! (the bulk VRAM calls of snapshots: bitmap kernel, pinned slots, memset), `cuda/starve.rs`
//! (restarting launches longer than a time slice still finish), `cuda/legacy.rs` (escalated
//! resumes see their status area while the legacy stream is busy), `cuda/prepare.rs` (a
//! prepared first run makes nothing and stops at its slice end), `cuda/ckcost.rs` (the driver
//! calls and host time of a checkpointed launch no request reaches), `cuda/ckwait.rs` (`auto`'s
//! wait), `cuda/ckadapt.rs` (each run's request path chosen by its kernel's estimate), `cuda/contend.rs`
//! (a guest kernel's GPU time beside the bulk VRAM calls of a live copy), `cuda/contend_copy.rs`
//! (a guest's small copy jobs beside them, by the copy engine and by a kernel).

#[path = "cuda/bulk.rs"]
mod bulk;
#[path = "cuda/ckadapt.rs"]
mod ckadapt;
#[path = "cuda/ckcost.rs"]
mod ckcost;
#[path = "cuda/ckearly.rs"]
mod ckearly;
#[path = "cuda/ckpath.rs"]
mod ckpath;
#[path = "cuda/ckpt.rs"]
mod ckpt;
#[path = "cuda/ckwait.rs"]
mod ckwait;
#[path = "cuda/contend.rs"]
mod contend;
#[path = "cuda/contend_copy.rs"]
mod contend_copy;
#[path = "cuda/legacy.rs"]
mod legacy;
#[path = "cuda/measure.rs"]
mod measure;
#[path = "cuda/memory.rs"]
mod memory;
#[path = "cuda/prepare.rs"]
mod prepare;
#[path = "cuda/starve.rs"]
mod starve;
#[path = "cuda/support.rs"]
mod support;

use std::time::Duration;

use pgpu::conformance::{check_engine, check_fatal_kernel_fault};
use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::*;
use support::*;

#[test]
fn construction_without_a_driver_is_a_clear_error() {
    match CudaEngine::new(CudaConfig::default()) {
        Ok(e) => assert_eq!(e.info().page_sizes, vec![PageSize::Size2M]),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("CUDA"), "{text}");
        }
    }
    let bad = CudaEngine::new(CudaConfig {
        vram_size: 3 * MIB,
        ..CudaConfig::default()
    });
    assert!(bad.is_err());
}

#[test]
fn rewritten_ptx_run_as_sub_launches_on_sim_gives_identical_bytes() {
    let e = sim();
    let mut failures = Vec::new();
    let (mut subs, mut runs) = (0, 0);
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        let rw = pgpu::cuda::rewrite::rewrite(inst.ptx);
        if !rw.sliced {
            failures.push(format!("{}: not sliced: {}", w.name, rw.reason));
            continue;
        }
        let plain = place(&e, &inst, window());
        let (want, _) = run(&e, &plain, &inst, None).unwrap();
        e.destroy_space(plain.space).unwrap();
        let p = place(&e, &inst, window());
        let module = e
            .load_module(&rw.text, &pgpu::LoadLimits::default())
            .map(|m| m.id)
            .unwrap();
        let h = PreemptHandle::new();
        for l in &inst.launches {
            let mut params = suite::layout_params(&l.params, &p.addrs).unwrap();
            params.resize(params.len().next_multiple_of(4), 0);
            let total: u32 = l.grid.iter().product();
            let mut next = 0;
            while next < total {
                let n = 3.min(total - next);
                let mut pp = params.clone();
                for v in [next, l.grid[0], l.grid[1], l.grid[2]] {
                    pp.extend_from_slice(&v.to_le_bytes());
                }
                let job = Job::Launch(LaunchJob {
                    space: p.space,
                    module,
                    entry: l.entry.to_string(),
                    grid: [n, 1, 1],
                    block: l.block,
                    dynamic_shared: l.shared_bytes,
                    params: pp,
                });
                let out = e.execute(&job, &h).unwrap();
                assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
                next += n;
                subs += 1;
            }
        }
        let mut outs = Vec::new();
        for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            outs.push(buf);
        }
        if let Err(m) = check(&inst, &outs) {
            failures.push(format!("{}: {m}", w.name));
        } else if w.name != "spin" && outs != want {
            failures.push(format!("{}: sliced bytes differ", w.name));
        } else {
            runs += 1;
        }
        e.destroy_space(p.space).unwrap();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(runs, suite::all().count());
    println!("{runs} workloads, {subs} sub-launches");
    assert!(subs > 2 * runs);
}

// ---- GPU ----

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_conformance() {
    let e = cuda(CudaConfig {
        vram_size: 64 * MIB,
        ..CudaConfig::default()
    });
    println!("device: {}", e.device_name());
    for distinct in [false, true] {
        assert_eq!(check_engine(&e, cuda_setup_with(distinct)), Ok(7));
        println!("MEASURE conformance (distinct windows: {distinct}): 7 of 7 checks passed");
    }
    // The vGPU's window comes back exact.
    let s = e.create_space(window()).unwrap();
    e.destroy_space(s).unwrap();
    println!("MEASURE window {VGPU_BASE:#x}+{VGPU_SIZE:#x}: reserved at its base");
    // 4 KiB mappings are refused.
    let s = e.create_space(window()).unwrap();
    let m = Mapping {
        va: VGPU_BASE,
        len: 4096,
        target: MapTarget::Vram { pa: 0 },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    assert!(matches!(
        e.map(s, &m),
        Err(EngineError::BadMapping(MapError::UnsupportedPageSize(
            PageSize::Size4K
        )))
    ));
    // A different window overlapping it is refused (one VA space per process); the same
    // window is shared (time-multiplexed, see gpu_shared_windows_and_concurrent_jobs).
    let other = VaWindow {
        base: VGPU_BASE + (1 << 30),
        size: 1 << 30,
    };
    assert!(matches!(
        e.create_space(other),
        Err(EngineError::BadWindow { .. })
    ));
    let same = e.create_space(window()).unwrap();
    e.destroy_space(same).unwrap();
    e.destroy_space(s).unwrap();
    // The JIT log reaches the caller.
    match e.load_module(".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n\tbogus.u32 %r1;\n}\n", &pgpu::LoadLimits::default()).map(|m| m.id) {
        Err(EngineError::ModuleLoad { log }) => println!("MEASURE JIT log: {log}"),
        other => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_kernel_fault_loses_the_context() {
    in_child("gpu_kernel_fault_child");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run by gpu_kernel_fault_loses_the_context"]
fn gpu_kernel_fault_child() {
    if !is_child("gpu_kernel_fault_child") {
        return;
    }
    let e = cuda(CudaConfig::default());
    let setup = cuda_setup();
    assert_eq!(check_fatal_kernel_fault(&e, setup), Ok(()));
    println!("MEASURE fault: {}", e.lost().unwrap());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_every_workload_matches_sim() {
    let c = cuda(CudaConfig {
        vram_size: 512 * MIB,
        ..CudaConfig::default()
    });
    let s = sim();
    let mut failures = Vec::new();
    let mut count = 0;
    for size in [suite::Size::Small, suite::Size::Medium] {
        for w in suite::all() {
            let inst = w.instance(size);
            let mut outs = Vec::new();
            for e in [&c as &dyn Engine, &s as &dyn Engine] {
                let p = place(e, &inst, window());
                outs.push(run(e, &p, &inst, None));
                e.destroy_space(p.space).unwrap();
                e.unload_module(p.module).unwrap();
            }
            let (sim_out, cuda_out) = (outs.pop().unwrap(), outs.pop().unwrap());
            match (cuda_out, sim_out) {
                (Ok((a, _)), Ok((b, _))) => {
                    if let Err(m) = check(&inst, &a) {
                        failures.push(format!("{} {size:?} cuda: {m}", w.name));
                    } else if w.name != "spin" && a != b {
                        failures.push(format!("{} {size:?}: cuda bytes differ from sim", w.name));
                    } else {
                        count += 1;
                        let sum: u64 = a.iter().flatten().map(|&b| u64::from(b)).sum();
                        println!(
                            "MEASURE suite {} {size:?}: equal to sim (byte sum {sum})",
                            w.name
                        );
                    }
                }
                (a, b) => failures.push(format!(
                    "{} {size:?}: cuda {:?} sim {:?}",
                    w.name,
                    a.err(),
                    b.err()
                )),
            }
        }
    }
    println!("MEASURE suite: {count} workload runs equal to sim");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_preempted_runs_give_identical_bytes() {
    // One block per sub-launch (the target is far below one block's time), preempted every
    // 100 us: every workload runs as many sub-launches and is preempted many times.
    let e = cuda(CudaConfig {
        vram_size: 1024 * MIB,
        sub_launch_target: Duration::from_nanos(1),
        initial_blocks: 1,
        ..CudaConfig::default()
    });
    let mut failures = Vec::new();
    for w in suite::all() {
        let inst = w.instance(suite::Size::Large);
        let p = place(&e, &inst, window());
        let plain = run(&e, &p, &inst, None);
        e.destroy_space(p.space).unwrap();
        let p = place(&e, &inst, window());
        let s0 = e.sub_launches();
        let pre = run(&e, &p, &inst, Some(Duration::from_micros(100)));
        let subs = e.sub_launches() - s0;
        e.destroy_space(p.space).unwrap();
        match (plain, pre) {
            (Ok((a, _)), Ok((b, n))) => {
                if let Err(m) = check(&inst, &b) {
                    failures.push(format!("{} preempted: {m}", w.name));
                } else if w.name != "spin" && a != b {
                    failures.push(format!("{}: preempted bytes differ", w.name));
                } else {
                    println!(
                        "MEASURE preempted {} Large: identical bytes, {subs} sub-launches, {n} preemptions",
                        w.name
                    );
                }
            }
            (a, b) => failures.push(format!("{}: {:?} {:?}", w.name, a.err(), b.err())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
