//! The cuda side of a move (`backend=cuda`, shared): the VM process owns its CUDA context, so
//! moving to GPU N means a second cuda engine on device N in this process. The VM's engine is
//! a `pgpu::switch::SwitchEngine` around the cuda engine (every holder keeps its ids); a move
//! makes the new engine (context, VRAM), hands it guest RAM (`CudaEngine::share_host_region`:
//! the same host memory, now mapped for device N too) and loads every module there (the JIT
//! compile, guest running) — `SwitchEngine::stage`; pre-copy rounds write VRAM into it
//! through the bulk/host path; paused, the last dirty pages go and `SwitchEngine::commit`
//! rebuilds the spaces there and swaps. The old engine (its context and VRAM) goes once the
//! job the pause preempted has resumed on the new one (its saved context holds it until then).

use std::sync::Arc;

use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::switch::{Staged, SwitchEngine};
use pgpu::{EngineSnapshot, HostRegionId, LoadLimits};
use vgpu_proto::proto::Placement;

use super::MoveError;

/// A shared cuda VM's engine: the switch every holder uses, the cuda engine behind it now,
/// and the configuration a new one is made with.
pub(crate) struct CudaShared {
    pub switch: Arc<SwitchEngine>,
    pub cuda: Arc<CudaEngine>,
    pub cfg: CudaConfig,
    pub gpu: Placement,
}

/// The new engine of a cuda move, staged.
pub(crate) struct CudaTarget {
    pub staged: Staged,
    pub cuda: Arc<CudaEngine>,
    /// The engine in use until the switch (its context made current again after each write
    /// into the new one from inside its bulk read).
    pub old: Arc<CudaEngine>,
}

impl CudaTarget {
    /// Writes `b` at `pa` of the new engine's VRAM, from inside the old engine's bulk read.
    pub fn write(&self, pa: u64, b: &[u8]) -> std::io::Result<()> {
        let r = self.staged.engine().vram_write(pa, b);
        self.old.make_current().map_err(std::io::Error::other)?;
        r.map_err(std::io::Error::other)
    }
}

/// The most bytes a module reload at the stage may take in host memory (each was loaded
/// within the VM's budget before; this bounds a second copy of one).
const RELOAD_HOST_BYTES: u64 = 1 << 30;

impl CudaShared {
    /// A cuda engine on the daemon's device `device` (a CUDA ordinal the daemon names: checked
    /// against the driver's count by the engine), with this VM's configuration; guest RAM
    /// handed over, modules loaded. The guest keeps running meanwhile.
    pub fn stage(&self, device: u32) -> Result<CudaTarget, MoveError> {
        let device = i32::try_from(device)
            .map_err(|_| MoveError::Map(format!("device ordinal {device} out of range")))?;
        if device == self.cfg.device {
            return Err(MoveError::Map(format!(
                "the target is CUDA device {device}, the one this VM runs on"
            )));
        }
        // The source engine's configuration, `bulk_slot_bytes` too: the target makes its copy
        // slots here, while the guest runs on the source (its copies may wait behind that
        // allocation, as in a first live copy), and holds them beside the source's until the
        // move ends; the move's page writes need slots on the target either way.
        let cfg = CudaConfig {
            device,
            ..self.cfg.clone()
        };
        let cuda = Arc::new(CudaEngine::new(cfg).map_err(MoveError::Engine)?);
        let (from, to) = (self.cuda.clone(), cuda.clone());
        let mut handover = move |id: HostRegionId| -> Result<HostRegionId, pgpu::EngineError> {
            to.share_host_region(&from, id)
        };
        let limits = LoadLimits {
            max_host_bytes: RELOAD_HOST_BYTES,
            ..LoadLimits::default()
        };
        let staged = self
            .switch
            .stage(
                cuda.clone() as Arc<dyn EngineSnapshot>,
                Some(&mut handover),
                &limits,
            )
            .map_err(MoveError::Engine)?;
        Ok(CudaTarget {
            staged,
            cuda,
            old: self.cuda.clone(),
        })
    }
}
