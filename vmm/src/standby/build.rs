//! Putting a snapshot into a standby ([`build_on_standby`]): the snapshot's RAM into the
//! registered RAM, then the same device, GPU and state phases as a cold restore
//! ([`crate::builder::assemble`]); a template's modules the snapshot does not use are released
//! before, the rest after, once the restore's own loads hold them
//! ([`super::template::Template`]). A migration received into the standby
//! ([`super::incoming`]) is built the same way, on the engine its rounds were written into.

use std::time::Instant;

use super::Standby;
use crate::builder::{Made, PausedVm, RestoreError, assemble, note_incoming};
use crate::snapshot::load::Loaded;
use crate::snapshot::restore_report::{RestoreReport, ms_since};
use crate::vm::VmConfig;

/// Builds the VM of snapshot `r` on `standby` (which [`Standby::fit`] found it fits; `cfg`
/// from the manifest, its GPU from the fit): the snapshot's RAM put into the registered RAM,
/// the devices made, the GPU's device built on the prepared engine, the state put back. A
/// migration received into the standby (`r` from its stream) brings the standby's engine back
/// from its rounds, with the pre-copied VRAM in it and, on cuda, guest RAM filled
/// ([`crate::snapshot::incoming::Prepared`]); its figures go into `r.incoming`. Once this
/// starts the standby is used up, whatever the outcome.
pub fn build_on_standby(
    cfg: &VmConfig,
    r: &mut Loaded,
    standby: Standby,
    check_ms: f64,
) -> Result<PausedVm, RestoreError> {
    let mut report = RestoreReport {
        standby: true,
        check_ms,
        prepared_ms: Some(standby.prepared_ms),
        template_modules: standby.template.as_ref().map(|t| t.modules),
        template_ms: standby.template.as_ref().map(|t| t.ms),
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
        mut template,
        prepared_ms,
        ..
    } = standby;
    // The engine the rounds were written into, or the one prepared.
    let (engine, applied, filled) = match r.gpu.as_mut().and_then(|g| g.prepared.take()) {
        Some(p) => (Some(p.engine), p.vram_applied, !p.ram.is_empty()),
        None if engine.is_none() && cfg.gpu.is_some() => return Err(RestoreError::EngineLost),
        None => (engine, false, false),
    };
    if let (Some(tp), Some(e)) = (template.as_mut(), &engine) {
        // Reading the snapshot's module texts, part of checking it.
        let t = Instant::now();
        tp.fit_image(r, cfg.gpu.as_ref(), e.engine());
        report.check_ms += ms_since(t);
    }
    let t = Instant::now();
    let (mem, backing, ram_owner, ram_ids) = ram.restore(&r.ram, r.manifest.ram_bytes, filled)?;
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
        applied,
        ram_owner,
        msrs: Some(msrs),
        slots: None,
    };
    let (mut vm, delta) = assemble(cfg, r, made, report)?;
    if let (Some(tp), Some(report)) = (template.as_mut(), vm.restore.as_mut()) {
        tp.settle(report);
    }
    note_incoming(r, &vm, delta);
    if let Some((rep, _)) = &mut r.incoming {
        rep.dest_standby_prepared_ms = Some(prepared_ms);
    }
    Ok(vm)
}
