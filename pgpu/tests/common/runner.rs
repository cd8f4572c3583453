//! Runs `suite` workload instances on an engine: places buffers in a fresh address space (4 KiB
//! pages, an unmapped guard page after each buffer), loads the PTX, runs the launches (optionally
//! preempting at chosen points and resuming from context bytes) and reads the buffers back.

use pgpu::sim::SimEngine;
use pgpu::*;

use super::BASE;

pub use super::placed::Placed;

/// Creates a space at `BASE`, maps and fills every buffer (VRAM from PA `pa_base` on).
pub fn place(e: &SimEngine, inst: &suite::Instance, pa_base: u64) -> Placed {
    let space = e
        .create_space(VaWindow {
            base: BASE,
            size: 1 << 30,
        })
        .unwrap();
    let (mut va, mut pa) = (BASE, pa_base);
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
        e.map(space, &m).unwrap();
        e.copy_to_space(space, va, &b.init).unwrap();
        addrs.push(va);
        va += len + 4096;
        pa += len;
    }
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
    Placed {
        space,
        module,
        addrs,
    }
}

/// Runs every launch. Before each `execute`/`resume` call, `step` picks the engine's step limit
/// (None: run to the end); preempted runs resume alternately from the in-memory context and from
/// its bytes. Returns the buffers' contents and the preemption count, or the fault as text.
pub fn run(
    e: &SimEngine,
    p: &Placed,
    inst: &suite::Instance,
    mut step: impl FnMut() -> Option<u64>,
) -> Result<(Vec<Vec<u8>>, u32), String> {
    let h = PreemptHandle::new();
    let mut preemptions = 0;
    for l in &inst.launches {
        let params = suite::layout_params(&l.params, &p.addrs).map_err(|e| e.to_string())?;
        let job = Job::Launch(LaunchJob {
            space: p.space,
            module: p.module,
            entry: l.entry.to_string(),
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params,
        });
        e.set_step_limit(step());
        let mut out = e.execute(&job, &h).map_err(|e| e.to_string())?;
        while let Outcome::Preempted { context, .. } = out {
            preemptions += 1;
            // Every other resume goes through plain bytes, as a stored context would.
            let context = if preemptions % 2 == 0 {
                SavedContext::from_bytes(context.into_bytes())
            } else {
                context
            };
            e.set_step_limit(step());
            out = e.resume(context, &h).map_err(|e| e.to_string())?;
        }
        if let Outcome::Faulted { fault, .. } = out {
            return Err(format!("{}: {fault}", l.entry));
        }
    }
    e.set_step_limit(None);
    let mut outs = Vec::new();
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        let mut buf = vec![0u8; b.init.len()];
        e.copy_from_space(p.space, va, &mut buf)
            .map_err(|e| e.to_string())?;
        outs.push(buf);
    }
    Ok((outs, preemptions))
}

/// Checks outputs against the instance's CPU reference.
pub fn check(inst: &suite::Instance, outs: &[Vec<u8>]) -> Result<suite::Summary, String> {
    let slices: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&slices).map_err(|m| m.to_string())
}
