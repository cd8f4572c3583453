//! Putting a snapshot into a standby ([`build_on_standby`]): the snapshot's RAM into the
//! registered RAM, then the same device, GPU and state phases as a cold restore
//! ([`crate::builder::assemble`]).

use std::time::Instant;

use super::Standby;
use crate::builder::{Made, PausedVm, RestoreError, assemble};
use crate::snapshot::load::Loaded;
use crate::snapshot::restore_report::{RestoreReport, ms_since};
use crate::vm::VmConfig;

/// Builds the VM of snapshot `r` on `standby` (which [`Standby::fit`] found it fits; `cfg`
/// from the manifest, its GPU from the fit): the snapshot's RAM put into the registered RAM,
/// the devices made, the GPU's device built on the prepared engine, the state put back. Once
/// this starts the standby is used up, whatever the outcome.
pub fn build_on_standby(
    cfg: &VmConfig,
    r: &Loaded,
    standby: Standby,
    check_ms: f64,
) -> Result<PausedVm, RestoreError> {
    let mut report = RestoreReport {
        standby: true,
        check_ms,
        prepared_ms: Some(standby.prepared_ms),
        ..RestoreReport::default()
    };
    let Standby {
        kvm,
        vm,
        vcpus,
        tsc_khz,
        ram,
        engine,
        msrs,
        ..
    } = standby;
    let t = Instant::now();
    let (mem, backing, ram_owner, ram_ids) = ram.restore(&r.ram, r.manifest.ram_bytes)?;
    report.ram_ms = ms_since(t);
    let (engine, registered, sim) = match engine {
        Some(vgpu::PreparedEngine::Cuda(e, reg)) => (Some(e), reg.map(|r| *r), None),
        Some(vgpu::PreparedEngine::Sim(e)) => (None, None, Some(e)),
        None => (None, None, None),
    };
    let made = Made {
        kvm,
        vm,
        vcpus,
        tsc_khz,
        mem,
        backing,
        engine,
        registered,
        sim,
        ram_ids,
        applied: false,
        ram_owner,
        msrs: Some(msrs),
        slots: None,
    };
    Ok(assemble(cfg, r, made, report)?.0)
}
