//! The engine-independent conformance checks (`pgpu::conformance`) on the sim engine, with both
//! page-size configurations (sim: 4 KiB + 2 MiB; cuda-like: 2 MiB only) and several workers.

use pgpu::PageSize;
use pgpu::conformance::{Setup, check_engine};
use pgpu::sim::{SimConfig, SimEngine};

#[test]
fn sim_engine_conforms() {
    for (pages, workers) in [
        (vec![PageSize::Size4K, PageSize::Size2M], 1),
        (vec![PageSize::Size2M], 2),
    ] {
        let cfg = SimConfig {
            vram_size: 16 << 20,
            workers,
            page_sizes: pages,
            ..Default::default()
        };
        let e = SimEngine::new(cfg).unwrap();
        assert_eq!(check_engine(&e, Setup::default()), Ok(7));
    }
}

/// The checkpoint preemption method keeps the contract (kernels preempted by the flag, resumed
/// by relaunch, contexts in bytes).
#[test]
fn sim_engine_conforms_with_checkpoints() {
    for workers in [1, 2] {
        let cfg = SimConfig {
            vram_size: 16 << 20,
            workers,
            preempt: pgpu::PreemptMethod::Checkpoint,
            ..Default::default()
        };
        let e = SimEngine::new(cfg).unwrap();
        assert_eq!(check_engine(&e, Setup::default()), Ok(7));
        let st = e.ckpt_stats();
        assert!(st.modules_transformed > 0 && st.launches > 0, "{st:?}");
    }
}

#[test]
fn checks_catch_a_broken_setup() {
    // Too little VRAM for the checks: reported, not a panic.
    let cfg = SimConfig {
        vram_size: 2 << 20,
        workers: 1,
        ..Default::default()
    };
    let e = SimEngine::new(cfg).unwrap();
    assert!(check_engine(&e, Setup::default()).is_err());
}
