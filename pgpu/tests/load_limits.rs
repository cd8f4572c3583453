//! `load_module` under `LoadLimits`: a cancelled or late load is refused and leaves nothing
//! loaded; module variables and the kept text are counted in `host_bytes` and bounded by
//! `max_host_bytes`; unloading gives the bytes back.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{Engine, EngineError, LoadLimits};

/// A module with a `.global` counter and `pad` bytes of further variables.
fn counter_ptx(pad: u64) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .global .align 4 .u32 counter;\n.global .align 8 .b8 pad[{pad}];\n\
         .visible .entry bump(.param .u64 out)\n{{\n\
         \t.reg .b32 %r<3>;\n\t.reg .b64 %rd<3>;\n\
         \tld.param.u64 %rd1, [out];\n\tmov.u64 %rd2, counter;\n\
         \tatom.global.add.u32 %r1, [%rd2], 1;\n\tst.global.u32 [%rd1], %r1;\n\tret;\n}}\n"
    )
}

fn engine() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 4 << 20,
        workers: 1,
        ..SimConfig::default()
    })
    .unwrap()
}

#[test]
fn a_cancelled_load_is_refused_and_leaves_nothing() {
    let e = engine();
    let cancel = Arc::new(AtomicBool::new(true));
    let limits = LoadLimits {
        cancel: Some(cancel.clone()),
        ..LoadLimits::default()
    };
    assert_eq!(
        e.load_module(&counter_ptx(64), &limits),
        Err(EngineError::LoadCancelled)
    );
    assert_eq!(e.module_usage(), (0, 0));
    cancel.store(false, std::sync::atomic::Ordering::SeqCst);
    let m = e.load_module(&counter_ptx(64), &limits).unwrap();
    assert_eq!(e.module_usage(), (1, m.host_bytes));
}

#[test]
fn a_load_past_its_deadline_is_refused() {
    let e = engine();
    let limits = LoadLimits {
        deadline: Some(Instant::now() - Duration::from_millis(1)),
        ..LoadLimits::default()
    };
    assert_eq!(
        e.load_module(&counter_ptx(64), &limits),
        Err(EngineError::LoadDeadline)
    );
    assert_eq!(e.module_usage(), (0, 0));
}

#[test]
fn module_variables_are_charged_and_bounded() {
    let e = engine();
    let text = counter_ptx(32 << 20);
    let small = LoadLimits {
        max_host_bytes: 16 << 20,
        ..LoadLimits::default()
    };
    match e.load_module(&text, &small) {
        Err(EngineError::HostBudget { used, limit, .. }) => {
            assert!(used > limit, "{used} > {limit}");
            assert_eq!(limit, (16 << 20) - text.len() as u64);
        }
        other => panic!("expected a host budget refusal, got {other:?}"),
    }
    assert_eq!(e.module_usage(), (0, 0), "nothing kept of a refused module");

    let big = LoadLimits {
        max_host_bytes: 256 << 20,
        ..LoadLimits::default()
    };
    let m = e.load_module(&text, &big).unwrap();
    assert!(m.host_bytes >= (32 << 20) + text.len() as u64, "{m:?}");
    assert_eq!(e.module_usage(), (1, m.host_bytes));
    // The same text again: the same module, counted once in host memory.
    assert_eq!(e.load_module(&text, &big), Ok(m));
    assert_eq!(e.module_usage(), (1, m.host_bytes));
    e.unload_module(m.id).unwrap();
    assert_eq!(e.module_usage(), (1, m.host_bytes), "one load left");
    e.unload_module(m.id).unwrap();
    assert_eq!(e.module_usage(), (0, 0));
}

#[test]
fn the_kept_text_counts_too() {
    let e = engine();
    let text = counter_ptx(64);
    let limits = LoadLimits {
        max_host_bytes: text.len() as u64 - 1,
        ..LoadLimits::default()
    };
    assert!(matches!(
        e.load_module(&text, &limits),
        Err(EngineError::HostBudget {
            what: "PTX text",
            ..
        })
    ));
}
