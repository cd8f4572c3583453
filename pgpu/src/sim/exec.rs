//! Kernel execution of the sim engine: the MMU as the interpreter's `GlobalMemory`, one run of a
//! `ptx::Launch` under a preemption handle, and the mapping of interpreter faults to job faults.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ptx::{Access, FaultReason, GlobalMemory, HostSpan, KernelFault, MemFault};

use crate::engine::{AccessKind, FaultKind, JobFault, KernelSite, PreemptHandle};

use super::mmu::Mmu;

fn access_kind(a: Access) -> AccessKind {
    match a {
        Access::Read => AccessKind::Read,
        Access::Write => AccessKind::Write,
        Access::Atomic => AccessKind::Atomic,
    }
}

impl GlobalMemory for Mmu {
    #[inline]
    fn translate(&self, va: u64, access: Access) -> Result<HostSpan, MemFault> {
        match Mmu::translate(self, va, access_kind(access)) {
            // SAFETY: the MMU returns host ranges inside VRAM or a registered host region, which
            // stay valid for the whole run: the running job holds its space, so the tables are
            // frozen, VRAM lives as long as the engine, and a region cannot be unregistered while
            // mapped. Page frames are 4 KiB aligned, so `ptr` ≡ `va` (mod 8). Every other engine
            // access to this memory is atomic (`atomic_copy`).
            Ok((host, len)) => Ok(unsafe { HostSpan::new(host as *mut u8, len) }),
            Err(kind) => {
                let reason = match kind {
                    FaultKind::ReadOnly => FaultReason::ReadOnly,
                    _ => FaultReason::Unmapped,
                };
                Err(MemFault { va, access, reason })
            }
        }
    }
}

/// Runs `launch` against `mmu` until it completes, faults or is preempted through `preempt` (or
/// after `step_limit` warp-instructions per worker, for deterministic tests).
pub fn run(
    launch: &mut ptx::Launch,
    mmu: &Mmu,
    preempt: &PreemptHandle,
    threads: usize,
    step_limit: Option<u64>,
) -> ptx::RunOutcome {
    let mut ctl = ptx::RunControl::new(threads.max(1));
    ctl.step_limit = step_limit;
    ctl.deadline = preempt.deadline();
    let ctl = Arc::new(ctl);
    let hook_ctl = ctl.clone();
    let _hook = preempt.attach(Arc::new(move || {
        hook_ctl.preempt.store(true, Ordering::SeqCst)
    }));
    preempt.mark_running();
    launch.run(mmu, &ctl)
}

/// A job fault for an interpreter fault in `entry` of a space whose window is `window`.
pub fn job_fault(f: &KernelFault, entry: &str, mmu: &Mmu) -> JobFault {
    let window = mmu.window();
    let outside = f.va.wrapping_sub(window.base) >= window.size;
    let kind = match f.reason {
        FaultReason::Unmapped if outside => FaultKind::OutOfWindow,
        FaultReason::Unmapped => FaultKind::Unmapped,
        FaultReason::ReadOnly => FaultKind::ReadOnly,
        FaultReason::Misaligned => FaultKind::Misaligned,
        other => FaultKind::Kernel(format!("{other:?}")),
    };
    let memory = matches!(
        f.reason,
        FaultReason::Unmapped | FaultReason::ReadOnly | FaultReason::Misaligned
    );
    JobFault {
        kind,
        va: f.va,
        access: memory.then(|| access_kind(f.access)),
        site: Some(KernelSite {
            entry: entry.to_string(),
            pc: f.pc,
            line: f.pos.line,
            cta: f.cta,
            thread: f.thread,
        }),
    }
}
