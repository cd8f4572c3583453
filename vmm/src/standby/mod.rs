//! A VM prepared before its snapshot (`vgpu-vmm --standby`, issue 24 "restore to running"),
//! in the manner of a Firecracker process started ahead and handed a snapshot to load: the
//! KVM VM with its irqchip and PIT, its vCPUs (CPUID, LAPIC), guest RAM registered as memory
//! slots ([`ram`]), the GPU engine (the cuda context with its VRAM and own modules, or a sim
//! engine) and the list of MSRs snapshots save are made at start; the process then waits on
//! its API socket ([`serve`]) until `restore DIR` names a snapshot, checks that the snapshot
//! fits what was prepared ([`Standby::fit`]: memory size, vCPUs, the GPU's engine keys), puts
//! its state in ([`crate::standby::build::build_on_standby`]) and runs it like `--restore` would.
//! A snapshot that does not fit, or that the checks of `--restore` refuse, is refused with the
//! standby left as it was. With `--template DIR` ([`template`]) the standby also loads the GPU
//! modules of that snapshot into its engine before the request, and sizes the engine's VRAM
//! transfer slots to its image (without one, to the partition), so that restoring that image
//! runs no JIT and allocates nothing. `incoming URL` ([`incoming`]) has the standby take a
//! migration instead of a snapshot: the same fit checked on the stream's manifest, the
//! pre-copy rounds written into the prepared engine.

pub mod build;
pub mod incoming;
pub mod ram;
pub mod serve;
pub mod template;

use std::sync::Arc;
use std::time::Instant;

use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vgpu::GpuConfig;

use crate::builder::{self, BuildError};
use crate::snapshot::load::Loaded;
use crate::vm::VmConfig;

/// What a standby prepares for (`--memory`, `--cpus`, `--gpu`).
#[derive(Debug, Clone)]
pub struct StandbyConfig {
    pub memory_mib: u64,
    pub cpus: u8,
    /// The GPU's configuration as `--gpu` gives it: its engine is made from it; a snapshot's
    /// GPU must agree on the engine's keys (`vgpu::engine_misfit`).
    pub gpu: Option<GpuConfig>,
    /// `--template DIR`: the snapshot whose GPU modules are loaded before the request.
    pub template: Option<std::path::PathBuf>,
}

/// Why a standby cannot be prepared, or refuses a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("standby: guest RAM: {0}")]
    Memory(#[from] crate::memory::MemoryError),
    #[error("standby: the virtual GPU's engine: {0}")]
    Engine(#[from] vgpu::VgpuError),
    #[error(
        "standby: --gpu {0}: this GPU's engine cannot be made before its device (a sim GPU \
         shared through vgpud, or mode=pt); use --restore"
    )]
    NotPreparable(String),
    #[error("standby: the MSRs snapshots save: {0}")]
    Msrs(#[from] crate::snapshot::cpu::CpuStateError),
    #[error("the snapshot does not fit this standby: {0}")]
    Misfit(String),
    #[error("the snapshot's GPU: {0}")]
    GpuSpec(#[from] crate::snapshot::gpu::GpuSpecError),
    #[error("standby: --template {dir}: {why}")]
    Template { dir: String, why: String },
}

/// Everything made before the snapshot is known; no vCPU thread runs.
pub struct Standby {
    pub(crate) kvm: Kvm,
    pub(crate) vm: Arc<VmFd>,
    pub(crate) vcpus: Vec<VcpuFd>,
    pub(crate) tsc_khz: u64,
    pub(crate) ram: ram::StandbyRam,
    pub(crate) engine: Option<vgpu::PreparedEngine>,
    pub(crate) cfg: StandbyConfig,
    /// The MSRs snapshots of the restored VM save (its API's controller needs them).
    pub(crate) msrs: Vec<u32>,
    /// `--template`: its modules loaded into the engine.
    pub(crate) template: Option<template::Template>,
    /// How long preparing took, in ms.
    pub prepared_ms: f64,
}

impl std::fmt::Debug for Standby {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Standby")
            .field("cfg", &self.cfg)
            .field("engine", &self.engine)
            .field("template", &self.template)
            .field("prepared_ms", &self.prepared_ms)
            .finish_non_exhaustive()
    }
}

impl Standby {
    /// Makes the VM, its vCPUs, guest RAM and the GPU's engine for `cfg` (with its template's
    /// modules loaded).
    pub fn prepare(cfg: &StandbyConfig) -> Result<Standby, StandbyError> {
        let t = Instant::now();
        // The template first: one that is refused costs no VM, engine or RAM.
        let checked = cfg
            .template
            .as_deref()
            .map(|dir| template::check(dir, cfg))
            .transpose()?;
        let vm_cfg = VmConfig {
            image: crate::loader::Image::Bundled(String::new()),
            cmdline: String::new(),
            memory_mib: cfg.memory_mib,
            cpus: cfg.cpus,
            testdev: false,
            timeout: None,
            linux: false,
            initramfs: None,
            gpu: cfg.gpu.clone(),
            console_prefix: None,
            disks: Vec::new(),
            tls: None,
        };
        let (kvm, vm) = builder::create_vm(&vm_cfg, false)?;
        let engine = match &cfg.gpu {
            Some(g) => Some(
                vgpu::Vgpu::prepare_engine(g)?
                    .ok_or_else(|| StandbyError::NotPreparable(g.spec()))?,
            ),
            None => None,
        };
        let cuda = match &engine {
            Some(vgpu::PreparedEngine::Cuda(e, _)) => Some(&**e),
            _ => None,
        };
        let template = match checked {
            Some(c) => Some(c.prepare(engine.as_ref())?),
            None => {
                // The transfer slots of the largest image the partition holds.
                if let (Some(e), Some(g)) = (&engine, &cfg.gpu) {
                    e.engine()
                        .vram_reserve_writes(g.vram)
                        .map_err(|e| StandbyError::Engine(vgpu::VgpuError::Engine(e)))?;
                }
                None
            }
        };
        let ram = ram::StandbyRam::new(&vm, cfg.memory_mib, cuda)?;
        let (vcpus, tsc_khz) = builder::create_vcpus(&kvm, &vm, &vm_cfg)?;
        let (msrs, _) = crate::snapshot::cpu::saveable_msrs(&kvm, &vcpus[0])?;
        let prepared_ms = t.elapsed().as_secs_f64() * 1e3;
        log::info!(
            "standby: {} MiB of RAM, {} vCPUs{} prepared in {prepared_ms:.1} ms",
            cfg.memory_mib,
            cfg.cpus,
            engine
                .as_ref()
                .map_or(String::new(), |e| format!(", {e:?}"))
        );
        Ok(Standby {
            kvm,
            vm,
            vcpus,
            tsc_khz,
            ram,
            engine,
            cfg: cfg.clone(),
            msrs,
            template,
            prepared_ms,
        })
    }

    /// What was prepared.
    pub fn config(&self) -> &StandbyConfig {
        &self.cfg
    }

    /// Checks that snapshot `l` fits what was prepared: its RAM size, its vCPUs, and its GPU
    /// (present here exactly when there; the engine's keys equal). Returns the GPU's
    /// configuration the VM is built with: the snapshot's, with the backend and vgpud of the
    /// standby's `--gpu` (as `--restore --gpu backend=...,host=...` would).
    pub fn fit(&self, l: &Loaded) -> Result<Option<GpuConfig>, StandbyError> {
        fit_config(&self.cfg, &l.manifest)
    }
}

/// [`Standby::fit`] of a standby prepared for `cfg`, from a snapshot's manifest (or a
/// migration stream's, before anything else of it is received).
pub(crate) fn fit_config(
    cfg: &StandbyConfig,
    m: &crate::snapshot::manifest::Manifest,
) -> Result<Option<GpuConfig>, StandbyError> {
    let want = cfg.memory_mib << 20;
    if m.memory_mib != cfg.memory_mib || m.ram_bytes != want {
        return Err(StandbyError::Misfit(format!(
            "its guest RAM is {} MiB ({} bytes), this standby prepared {} MiB (--memory)",
            m.memory_mib, m.ram_bytes, cfg.memory_mib
        )));
    }
    if m.cpus != cfg.cpus {
        return Err(StandbyError::Misfit(format!(
            "it has {} vCPUs, this standby prepared {} (--cpus)",
            m.cpus, cfg.cpus
        )));
    }
    match (&m.gpu, &cfg.gpu) {
        (None, None) => Ok(None),
        (Some(spec), None) => Err(StandbyError::Misfit(format!(
            "it has a virtual GPU ({spec}), this standby prepared none (--gpu)"
        ))),
        (None, Some(_)) => Err(StandbyError::Misfit(
            "it has no virtual GPU, this standby prepared one (--gpu)".into(),
        )),
        (Some(spec), Some(prepared)) => fit_gpu(spec, prepared).map(Some),
    }
}

/// The configuration a snapshot's GPU (`spec`, the manifest's) gets on an engine prepared for
/// `prepared`, or why it does not fit.
fn fit_gpu(spec: &str, prepared: &GpuConfig) -> Result<GpuConfig, StandbyError> {
    let given = GpuConfig {
        backend: prepared.backend,
        host: prepared.host.clone(),
        ..GpuConfig::default()
    };
    let mut cfg = crate::snapshot::gpu::restore_config(spec, Some(&given))?;
    if cfg.backend == vgpu::config::Backend::Cuda {
        // How a preemption request reaches a kernel is the host's choice, invisible to the
        // guest: the prepared engine's (a cuda snapshot of a build before `ck_path=adaptive`
        // became the default reads as `fixed`, and would otherwise never fit a standby started
        // with the default).
        cfg.ck_path = prepared.ck_path;
        // So are the copy slots (host memory and VRAM of this host's engine, made when the
        // standby started): the engine's, not the snapshot's.
        cfg.copy_slots = prepared.copy_slots;
    }
    match vgpu::engine_misfit(prepared, &cfg) {
        Some(why) => Err(StandbyError::Misfit(format!(
            "its GPU ({spec}) differs from the prepared engine's (--gpu): {why}"
        ))),
        None => Ok(cfg),
    }
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    /// A cuda snapshot of a build before the adaptive default (no `ck_path`: fixed) fits a
    /// standby started with the default and runs on its engine's path; the other keys the
    /// engine is made from still decide.
    #[test]
    fn the_request_path_is_the_standbys() {
        let prepared = GpuConfig::parse("vram=64M,backend=cuda,preempt=auto").unwrap();
        let got = fit_gpu("mode=full,backend=cuda,vram=64M,preempt=auto", &prepared).unwrap();
        assert_eq!(got.ck_path, pgpu::cuda::CkPathChoice::adaptive());
        let fixed = GpuConfig::parse("vram=64M,backend=cuda,preempt=auto,ck_path=fixed").unwrap();
        let got = fit_gpu(&prepared.spec(), &fixed).unwrap();
        assert_eq!(got.ck_path, pgpu::cuda::CkPathChoice::Fixed);
        let e = fit_gpu(
            "mode=full,backend=cuda,vram=64M,preempt=checkpoint",
            &prepared,
        );
        assert!(matches!(e, Err(StandbyError::Misfit(m)) if m.contains("preempt")));
    }

    /// The copy slots are the standby engine's either way: a snapshot with them fits a standby
    /// without, and takes none (its engine made none); one without takes the standby's.
    #[test]
    fn the_copy_slots_are_the_standbys() {
        let plain = GpuConfig::parse("vram=64M,backend=cuda").unwrap();
        let slots = GpuConfig::parse("vram=64M,backend=cuda,copy_slots=64M").unwrap();
        assert_eq!(fit_gpu(&slots.spec(), &plain).unwrap().copy_slots, 0);
        assert_eq!(fit_gpu(&plain.spec(), &slots).unwrap().copy_slots, 64 << 20);
    }
}
