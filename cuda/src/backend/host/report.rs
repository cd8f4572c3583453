//! The `"preempt"` part of the library's report (`VGPU_CUDA_STATS`) for the in-process
//! engines: the method (`VGPU_CUDA_PREEMPT`) and its poll interval (`VGPU_CUDA_CKPT_POLL`),
//! on cuda the request path choice (`VGPU_CUDA_CK_PATH`) and the launches that took each path,
//! the module loads prepared (`modules_prepared`, where loads prepare:
//! `VGPU_CUDA_PREPARE_MODULES`), what the engine did with it (modules transformed or refused,
//! launches run transformed, restarting, sliced, preemptions and the bytes they saved, the
//! runs no request reached and the driver calls they made: `pgpu::CkptStats`) and the forced preemptions of the test knob (`VGPU_CUDA_PREEMPT_TEST`).

use std::sync::atomic::Ordering;

/// The report, or `None` when no in-process engine was made (the guest backend, or a program
/// that never initialised).
pub fn preempt_report() -> Option<serde_json::Value> {
    let s = super::shared::current()?;
    let mut j = serde_json::json!({ "method": s.preempt.to_string() });
    if s.prepare_modules {
        j["modules_prepared"] = s.modules_prepared.load(Ordering::Relaxed).into();
    }
    if let Some(c) = s.engine.checkpoint_stats() {
        j["poll_interval"] = s.ckpt_poll.into();
        if s.kind == super::shared::EngineKind::Cuda {
            j["ck_path"] = s.ck_path.to_string().into();
        }
        j["engine"] = serde_json::json!({
            "modules_transformed": c.modules_transformed,
            "fallback_modules": c.fallback_modules,
            "fallback_launches": c.fallback_launches,
            "fallback_reasons": c.fallback_reasons,
            "launches_transformed": c.launches,
            "restart_launches": c.restart_launches,
            "checkpoint_launches": c.launches.saturating_sub(c.restart_launches),
            "sliced_launches": c.sliced_launches,
            "escalated_launches": c.escalated_launches,
            "waited_preemptions": c.waited_preemptions,
            "wait_overruns": c.wait_overruns,
            "preemptions": c.preemptions,
            "saved_threads": c.saved_threads,
            "saved_full_bytes": c.saved_full_bytes,
            "saved_incremental_bytes": c.saved_incremental_bytes,
            "unrequested_runs": c.unrequested_runs,
            "unrequested_driver_calls": c.unrequested_driver_calls,
            "fast_path_launches": c.fast_path_launches,
            "fixed_path_launches": c.fixed_path_launches,
        });
    }
    if let Some(f) = &s.forced {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        j["forced"] = serde_json::json!({
            "seed": f.seed(),
            "per_launch": f.per_launch(),
            "armed": g(&f.counters.armed),
            "preempted": g(&f.counters.preempted),
            "from_bytes": g(&f.counters.from_bytes),
        });
    }
    Some(j)
}
