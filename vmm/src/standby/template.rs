//! A standby's template (`vgpu-vmm --standby --template DIR`, issue 24): a snapshot of the image
//! the standby will most likely restore, read when the standby is prepared. It is hostile input
//! like any snapshot: read and checked as `--restore` reads one ([`crate::snapshot::load`]),
//! it must fit what the standby prepares ([`super::fit_config`]), and its GPU image's sections
//! before VRAM are decoded as a restore decodes them, the whole file's length and CRC-32 checked
//! against the manifest (`vgpu::snapshot::head::read_head`); a template refused there refuses
//! the standby's start. Its GPU modules are then loaded into the prepared engine
//! (`vgpu::Preloaded`, the PTX rewrite and JIT on cuda), and the engine's transfer slots sized
//! to its image (`vram_reserve_writes`): a restore of the same image finds its modules in the
//! engine's content cache. A restore of another image works as without a template: the held
//! modules it does not name are released first ([`Template::fit_image`]), its own load as cold.

use std::io::Seek;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use vgpu::GpuConfig;

use super::{StandbyConfig, StandbyError};
use crate::snapshot::gpu::CheckedReader;
use crate::snapshot::load::{GpuImage, Loaded};

/// A template read and checked, before the engine exists.
#[derive(Debug)]
pub struct Checked {
    dir: PathBuf,
    loaded: Loaded,
    /// Its GPU's configuration as a restore would build it (`Standby::fit`).
    gpu: Option<GpuConfig>,
    since: Instant,
}

/// A template put into a standby.
#[derive(Debug)]
pub struct Template {
    pub dir: PathBuf,
    /// Its modules, loaded into the engine and held until the restore took them.
    pub preloaded: Option<vgpu::Preloaded>,
    /// How many modules it loaded.
    pub modules: usize,
    /// Reading, checking and loading it, ms.
    pub ms: f64,
}

fn refuse(dir: &Path, why: impl std::fmt::Display) -> StandbyError {
    StandbyError::Template {
        dir: dir.display().to_string(),
        why: why.to_string(),
    }
}

/// Reads and checks the snapshot in `dir` as a template of a standby prepared for `cfg`.
pub fn check(dir: &Path, cfg: &StandbyConfig) -> Result<Checked, StandbyError> {
    let since = Instant::now();
    let loaded = crate::snapshot::load::load(dir).map_err(|e| refuse(dir, e))?;
    let gpu = super::fit_config(cfg, &loaded.manifest).map_err(|e| refuse(dir, e))?;
    Ok(Checked {
        dir: dir.to_path_buf(),
        loaded,
        gpu,
        since,
    })
}

/// Bytes a restore of `img` writes into VRAM at most (its transfer slots' size).
fn image_bytes(img: &GpuImage) -> u64 {
    let base = img
        .vram_base
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map_or(0, |m| m.len());
    img.bytes.saturating_add(base)
}

/// The module texts of `img` (sections before VRAM, decoded for a device of `cfg` on
/// `engine`), with the whole file's length and CRC-32 checked too if `whole`. The file's
/// position is left at 0.
fn image_modules(
    img: &GpuImage,
    cfg: &GpuConfig,
    engine: &dyn pgpu::EngineSnapshot,
    whole: bool,
) -> Result<Vec<Arc<str>>, String> {
    let mut file = &img.file;
    file.rewind().map_err(|e| e.to_string())?;
    let mut rd = CheckedReader::new(
        std::io::BufReader::with_capacity(1 << 20, file),
        img.bytes,
        img.crc32,
    );
    let head = vgpu::snapshot::head::read_head(&mut rd, cfg, engine.info());
    // The file's CRC-32 first: a corrupted file is reported as such, not by the section it
    // broke.
    let rest = match whole {
        true => std::io::copy(&mut rd, &mut std::io::sink()).map(|_| ()),
        false => Ok(()),
    };
    file.rewind().map_err(|e| e.to_string())?;
    rest.map_err(|e| e.to_string())?;
    Ok(head.map_err(|e| e.to_string())?.modules)
}

impl Checked {
    /// Puts the template into the standby's `engine` (made for its GPU): its image checked
    /// whole, its modules loaded, the engine's transfer slots sized to it.
    pub fn prepare(self, engine: Option<&vgpu::PreparedEngine>) -> Result<Template, StandbyError> {
        let dir = &self.dir;
        let preloaded = match (&self.loaded.gpu, &self.gpu, engine) {
            (Some(img), Some(cfg), Some(engine)) => {
                let texts = image_modules(img, cfg, engine.engine(), true)
                    .map_err(|e| refuse(dir, format!("its GPU image: {e}")))?;
                let p = engine.preload(cfg, &texts).map_err(|e| refuse(dir, e))?;
                engine
                    .engine()
                    .vram_reserve_writes(image_bytes(img))
                    .map_err(|e| StandbyError::Engine(vgpu::VgpuError::Engine(e)))?;
                Some(p)
            }
            _ => None,
        };
        let modules = preloaded.as_ref().map_or(0, |p| p.len());
        let ms = self.since.elapsed().as_secs_f64() * 1e3;
        log::info!(
            "standby: template {}: {modules} GPU modules loaded in {ms:.1} ms",
            dir.display()
        );
        Ok(Template {
            dir: self.dir,
            preloaded,
            modules,
            ms,
        })
    }
}

impl Template {
    /// Before snapshot `r` (whose GPU a device of `cfg` restores) is put in: releases the held
    /// modules its image does not name, so that the engine's module table holds no more than
    /// a cold restore's would. An image whose sections cannot be read (the restore refuses it)
    /// releases them all.
    pub fn fit_image(
        &mut self,
        r: &Loaded,
        cfg: Option<&GpuConfig>,
        engine: &dyn pgpu::EngineSnapshot,
    ) {
        let Some(p) = self.preloaded.as_mut() else {
            return;
        };
        let texts = match (&r.gpu, cfg) {
            (Some(img), Some(cfg)) if img.vram_base.is_none() => {
                image_modules(img, cfg, engine, false).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        let released = p.keep_only(&texts);
        if released > 0 {
            log::debug!("standby: {released} template modules the snapshot does not use released");
        }
    }

    /// Counts the restore's modules the template held as cached (`report`'s module ids), then
    /// releases the template's loads.
    pub fn settle(&mut self, report: &mut crate::snapshot::restore_report::RestoreReport) {
        let Some(p) = self.preloaded.take() else {
            return;
        };
        let cached = report.module_ids.iter().filter(|&&id| p.holds(id)).count();
        report.modules_cached = cached;
        report.modules_cold = report.module_ids.len() - cached;
    }
}
