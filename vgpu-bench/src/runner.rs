//! Runs `suite` workload instances on the sim engine: buffers placed in a fresh address space
//! (4 KiB pages backed by VRAM, an unmapped guard page after each), PTX loaded, launches run.

use pgpu::sim::SimEngine;
use pgpu::{
    Engine, Job, LaunchJob, MapTarget, Mapping, ModuleId, Outcome, PageSize, Perm, PreemptHandle,
    SpaceId, VaWindow,
};

use crate::error::BenchError;

/// Base of the address space the runner creates.
pub const BASE: u64 = 0x4_0000_0000;

/// An instance placed in an address space.
pub struct Placed {
    pub space: SpaceId,
    pub module: ModuleId,
    pub addrs: Vec<u64>,
}

/// Finds a workload by name.
pub fn workload(name: &str) -> Result<&'static suite::Workload, BenchError> {
    suite::find(name).ok_or_else(|| BenchError::UnknownWorkload(name.to_string()))
}

/// Creates a space, maps and fills every buffer, loads the module.
pub fn place(e: &SimEngine, inst: &suite::Instance) -> Result<Placed, BenchError> {
    let total: u64 = inst
        .buffers
        .iter()
        .map(|b| (b.init.len().max(1) as u64).next_multiple_of(4096) + 4096)
        .sum();
    let window = total.next_multiple_of(2 << 20).max(2 << 20);
    let space = e.create_space(VaWindow {
        base: BASE,
        size: window,
    })?;
    let (mut va, mut pa) = (BASE, 0u64);
    let mut addrs = Vec::new();
    for b in &inst.buffers {
        let len = (b.init.len().max(1) as u64).next_multiple_of(4096);
        let m = Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size4K,
        };
        e.map(space, &m)?;
        e.copy_to_space(space, va, &b.init)?;
        addrs.push(va);
        va += len + 4096;
        pa += len;
    }
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)?;
    Ok(Placed {
        space,
        module,
        addrs,
    })
}

/// The engine job of launch `i`.
pub fn job(p: &Placed, inst: &suite::Instance, i: usize) -> Result<Job, BenchError> {
    let l = inst
        .launches
        .get(i)
        .ok_or_else(|| BenchError::Invalid(format!("no launch {i}")))?;
    let params = suite::layout_params(&l.params, &p.addrs)
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
    Ok(Job::Launch(LaunchJob {
        space: p.space,
        module: p.module,
        entry: l.entry.to_string(),
        grid: l.grid,
        block: l.block,
        dynamic_shared: l.shared_bytes,
        params,
    }))
}

/// Runs every launch to completion (no preemption).
pub fn run_all(e: &SimEngine, p: &Placed, inst: &suite::Instance) -> Result<(), BenchError> {
    let h = PreemptHandle::new();
    for i in 0..inst.launches.len() {
        match e.execute(&job(p, inst, i)?, &h)? {
            Outcome::Completed { .. } => {}
            Outcome::Faulted { fault, .. } => {
                return Err(BenchError::Fault {
                    workload: inst.workload.to_string(),
                    fault,
                });
            }
            Outcome::Preempted { .. } => {
                return Err(BenchError::Invalid("unexpected preemption".into()));
            }
        }
    }
    Ok(())
}

/// Reads every buffer back and runs the instance's check.
pub fn check(e: &dyn Engine, p: &Placed, inst: &suite::Instance) -> Result<(), BenchError> {
    let mut outs = Vec::new();
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        let mut buf = vec![0u8; b.init.len()];
        e.copy_from_space(p.space, va, &mut buf)?;
        outs.push(buf);
    }
    let slices: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&slices)
        .map(|_| ())
        .map_err(|m| BenchError::Check {
            workload: inst.workload.to_string(),
            msg: m.to_string(),
        })
}

/// Restores every buffer's initial contents (before re-running a non-idempotent instance).
pub fn reset(e: &SimEngine, p: &Placed, inst: &suite::Instance) -> Result<(), BenchError> {
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        e.copy_to_space(p.space, va, &b.init)?;
    }
    Ok(())
}
