//! Modules loaded into a prepared engine before the restore that uses them (a standby's
//! template, `vgpu-vmm --standby --template DIR`; issue 24): the engine's content cache
//! (`Engine::load_module`: identical text gives the same module, its loads counted) then serves
//! the restore's loads of the same texts without a PTX rewrite or a JIT; their entries are
//! prepared too (`Engine::prepare_module`: on cuda resolved and loaded onto the device). [`Preloaded`] holds
//! one load of each until it is released; released after the restore, the restored device's
//! own loads are all that is left, as after a cold restore. Texts the restored image does not
//! name are released before it loads its own ([`Preloaded::keep_only`]), so that the engine's
//! module table holds no more than a cold restore would.

use std::sync::Arc;

use pgpu::{EngineSnapshot, ModuleId};

use crate::snapshot::head::ModuleBudget;
use crate::{GpuConfig, PreparedEngine};

/// A module of the image the engine refused (its load's error).
#[derive(Debug, thiserror::Error)]
#[error("module {index} of the GPU image: {why}")]
pub struct PreloadError {
    pub index: usize,
    pub why: pgpu::EngineError,
}

/// See the module documentation. Dropping it releases every load it holds.
pub struct Preloaded {
    engine: Arc<dyn EngineSnapshot>,
    held: Vec<(Arc<str>, ModuleId)>,
}

impl std::fmt::Debug for Preloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preloaded")
            .field("modules", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl PreparedEngine {
    /// The engine, shared.
    pub fn shared(&self) -> Arc<dyn EngineSnapshot> {
        match self {
            PreparedEngine::Sim(e) => e.clone(),
            PreparedEngine::Cuda(e, _) => e.clone(),
        }
    }

    /// Loads `texts` (a GPU image's modules, read and checked by
    /// `vgpu::snapshot::head::read_head`) into this engine within the host memory of a device
    /// of configuration `cfg` (`hostmem=`, as a restore charges them) and its job time limit
    /// each; a text the engine refuses refuses them all (none stays loaded).
    pub fn preload(&self, cfg: &GpuConfig, texts: &[Arc<str>]) -> Result<Preloaded, PreloadError> {
        let mut p = Preloaded {
            engine: self.shared(),
            held: Vec::with_capacity(texts.len()),
        };
        let mut budget = ModuleBudget::of(cfg);
        for (i, text) in texts.iter().enumerate() {
            let limits = budget.limits(text, None);
            let m = p
                .engine
                .load_module(text, &limits)
                .map_err(|why| PreloadError { index: i, why })?;
            budget.charge(text, m.host_bytes);
            p.held.push((text.clone(), m.id));
            // Its entries resolved and loaded onto the device too (best effort: what fails is
            // left to the first run).
            if let Err(e) = p.engine.prepare_module(m.id) {
                log::debug!("vgpu: prepare preloaded module {i}: {e}");
            }
        }
        Ok(p)
    }
}

impl Preloaded {
    /// Modules held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether `id` is one of the modules held (a restore's load that got it was served by the
    /// engine's cache).
    pub fn holds(&self, id: ModuleId) -> bool {
        self.held.iter().any(|(_, m)| *m == id)
    }

    /// Releases the modules whose text is not in `texts`; returns how many were released.
    pub fn keep_only(&mut self, texts: &[Arc<str>]) -> usize {
        let before = self.held.len();
        let (keep, drop): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(t, _)| texts.iter().any(|x| x == t));
        self.held = keep;
        self.release(&drop);
        before - self.held.len()
    }

    fn release(&self, modules: &[(Arc<str>, ModuleId)]) {
        for (_, id) in modules {
            if let Err(e) = self.engine.unload_module(*id) {
                log::warn!("vgpu: release preloaded module {id:?}: {e}");
            }
        }
    }
}

impl Drop for Preloaded {
    fn drop(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.release(&held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
        .visible .entry k(.param .u64 p)\n{\n    ret;\n}\n";

    /// A preloaded text is served by the engine's cache (the same id), kept only while named,
    /// and released on drop: a load after that is a new module.
    #[test]
    fn preloaded_modules_are_served_by_the_cache_until_released() {
        let cfg = GpuConfig::parse("vram=8M").unwrap();
        let p = crate::Vgpu::prepare_engine(&cfg).unwrap().unwrap();
        let other = PTX.replace(".entry k", ".entry other");
        let texts: Vec<Arc<str>> = vec![PTX.into(), other.as_str().into()];
        let mut pre = p.preload(&cfg, &texts).unwrap();
        assert_eq!(pre.len(), 2);
        let e = p.shared();
        let hit = e.load_module(PTX, &pgpu::LoadLimits::default()).unwrap();
        assert!(pre.holds(hit.id));
        assert_eq!(pre.keep_only(&texts[..1]), 1);
        let again = e.load_module(&other, &pgpu::LoadLimits::default()).unwrap();
        assert!(!pre.holds(again.id), "released, loaded afresh");
        drop(pre);
        // The restore's own load of PTX keeps it: released once more, it goes.
        e.unload_module(hit.id).unwrap();
        let fresh = e.load_module(PTX, &pgpu::LoadLimits::default()).unwrap();
        assert_ne!(fresh.id, hit.id);
        // A text the engine refuses refuses the preload.
        let bad: Vec<Arc<str>> = vec![PTX.into(), "not ptx".into()];
        let err = p.preload(&cfg, &bad).unwrap_err().to_string();
        assert!(err.contains("module 1"), "{err}");
    }
}
