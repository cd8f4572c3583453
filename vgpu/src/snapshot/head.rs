//! The sections of a GPU image before its VRAM (CONF, REGS, CHAN, MODS, CTXT, PARA): the limit a
//! restore reads each of them within ([`Limits`], from the device's configuration and its
//! engine's limits), and [`read_head`], which reads and checks them without a device as a
//! restore does (the doorbell's page and the para-virtual spaces, which need the VM, aside):
//! a standby's template (`vgpu-vmm --standby --template DIR`, issue 24) has its modules loaded
//! into the engine before the snapshot to restore is known, and a standby's restore learns
//! which of them the snapshot uses.

use std::sync::Arc;

use pgpu::{EngineInfo, PageSize};

use super::image::{ChanImage, ConfImage, RegsImage, SuspendedImage, WorkerImage};
use super::{SnapshotError, format, para_image};
use crate::{GpuConfig, methods, regs};

/// Bytes of the CONF section at most.
pub(crate) const CONF_LIMIT: u64 = 4096;

/// What a restore reads of each section before VRAM, at most.
pub(crate) struct Limits {
    pub regs: u64,
    pub chan: u64,
    pub mods: u64,
    pub max_modules: usize,
    /// Bytes of module text in all.
    pub max_total: u64,
    pub ctxt: u64,
    /// Bytes of saved contexts in all.
    pub max_context: usize,
}

impl Limits {
    /// The limits of a device of configuration `cfg` on an engine described by `info`.
    pub(crate) fn of(cfg: &GpuConfig, info: &EngineInfo) -> Limits {
        let (vram, channels) = (cfg.vram, u64::from(cfg.channels));
        let l = &info.limits;
        let max_total = (l.max_ptx_bytes_total as u64).min(cfg.hostmem);
        let max_context = (l.max_context_bytes as u64).min(cfg.hostmem) as usize;
        Limits {
            regs: 1024 + 32 * channels + 13 * (vram >> 12),
            chan: 64
                + channels
                    * (32 + 4 * methods::MethodState::WORDS as u64 + 8 * u64::from(regs::MAX_PUSH)),
            mods: 4 + max_total + 4 * l.max_modules as u64,
            max_modules: l.max_modules,
            max_total,
            ctxt: max_context as u64 + 4 + 128 * channels,
            max_context,
        }
    }
}

/// The configuration the guest of a device of configuration `cfg` on an engine described by
/// `info` sees (what a snapshot's CONF must match).
pub(crate) fn conf_of(cfg: &GpuConfig, info: &EngineInfo) -> ConfImage {
    let page_sizes = info.page_sizes.iter().fold(0, |m, p| match p {
        PageSize::Size4K => m | 1,
        PageSize::Size2M => m | 2,
    });
    ConfImage {
        vram: cfg.vram,
        channels: cfg.channels,
        va_base: cfg.va_base,
        va_size: cfg.va_size,
        page_sizes,
        backend: info.name.clone(),
    }
}

/// The host memory a device of configuration `cfg` lets its modules use (`hostmem=`), charged
/// load by load in the image's order: a restore's reload and a standby's preload of the same
/// texts admit the same modules.
pub(crate) struct ModuleBudget {
    left: u64,
    timeout: std::time::Duration,
}

impl ModuleBudget {
    pub(crate) fn of(cfg: &GpuConfig) -> ModuleBudget {
        ModuleBudget {
            left: cfg.hostmem,
            timeout: cfg.job_timeout,
        }
    }

    /// The limits of the next load, of `text` (its own bytes are charged too).
    pub(crate) fn limits(
        &self,
        text: &str,
        cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
    ) -> pgpu::LoadLimits {
        pgpu::LoadLimits {
            max_host_bytes: self.left.saturating_sub(text.len() as u64),
            deadline: Some(std::time::Instant::now() + self.timeout),
            cancel,
        }
    }

    /// Charges a load of `text` that took `host_bytes` of the engine's host memory.
    pub(crate) fn charge(&mut self, text: &str, host_bytes: u64) {
        self.left = self
            .left
            .saturating_sub(host_bytes.saturating_add(text.len() as u64));
    }
}

/// What [`read_head`] found.
#[derive(Debug, Clone)]
pub struct ImageHead {
    /// The module texts, in the image's order.
    pub modules: Vec<Arc<str>>,
    /// Jobs preempted by the pause that the image resumes.
    pub suspended: usize,
}

/// Reads the sections of the image on `input` before its VRAM, for a device of configuration
/// `cfg` on an engine described by `info`, checking each as a restore does (its framing, CRC-32
/// and limit; the configuration the guest saw; registers, channels, modules and preempted jobs
/// decoded). Reads nothing past the PARA section: the caller checks the rest of the file (its
/// length and CRC-32) or leaves it.
pub fn read_head(
    input: &mut dyn std::io::Read,
    cfg: &GpuConfig,
    info: &EngineInfo,
) -> Result<ImageHead, SnapshotError> {
    let lim = Limits::of(cfg, info);
    let here = conf_of(cfg, info);
    let mut rd = format::SnapReader::new(input)?;
    ConfImage::decode(&rd.section(format::CONF, CONF_LIMIT)?)?.check(&here)?;
    let regs = RegsImage::decode(&rd.section(format::REGS, lim.regs)?, cfg.vram, cfg.channels)?;
    let jobs = read_jobs(&mut rd, &lim, &regs, cfg.lazy_shadowing, &here.backend)?;
    rd.section(format::PARA, para_image::LIMIT)?;
    Ok(ImageHead {
        modules: jobs.texts,
        suspended: jobs.suspended.len(),
    })
}

/// The CHAN, MODS and CTXT sections that follow REGS, as [`read_jobs`] decodes them.
pub(crate) struct Jobs {
    pub seen_epoch: u64,
    pub next: u32,
    pub chans: Vec<Option<ChanImage>>,
    /// The module texts, in the image's order.
    pub texts: Vec<Arc<str>>,
    pub suspended: Vec<SuspendedImage>,
}

/// Reads and checks the channels, the module texts and the preempted jobs (each within its
/// limit; every job's context saved by an engine of `backend`), as a restore and
/// [`read_head`] both do.
pub(crate) fn read_jobs(
    rd: &mut format::SnapReader<'_>,
    lim: &Limits,
    regs: &RegsImage,
    lazy_shadowing: bool,
    backend: &str,
) -> Result<Jobs, SnapshotError> {
    let (seen_epoch, next, chans) =
        WorkerImage::decode_chans(&rd.section(format::CHAN, lim.chan)?, regs, lazy_shadowing)?;
    let texts = WorkerImage::decode_modules(
        &rd.section(format::MODS, lim.mods)?,
        lim.max_modules,
        lim.max_total,
    )?;
    let suspended = WorkerImage::decode_suspended(
        &rd.section(format::CTXT, lim.ctxt)?,
        &chans,
        texts.len(),
        lim.max_context,
    )?;
    if let Some(s) = suspended.iter().find(|s| s.backend != backend) {
        return Err(SnapshotError::ForeignContext {
            saved: s.backend.clone(),
            here: backend.to_string(),
        });
    }
    Ok(Jobs {
        seen_epoch,
        next,
        chans,
        texts,
        suspended,
    })
}
