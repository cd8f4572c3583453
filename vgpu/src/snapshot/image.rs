//! What a snapshot holds besides VRAM, in memory: the pause control, the configuration it was
//! taken under (`ConfImage`, encoded here), the worker's state (`WorkerImage`; its sections in
//! `worker_image`) and the register file (`RegsImage`, in `regs_image`). Decoding validates
//! every field against this device's configuration before anything is applied
//! (docs/snapshot.md, "Virtual GPU").

use std::sync::Arc;

use pgpu::{ModuleId, SavedContext};

use super::SnapshotError;
use super::format::{Dec, Enc};
use crate::methods::MethodState;
use crate::pushbuf::{DecodeError, MethodCall};

pub use super::regs_image::{ChanRegsImage, RegsImage};

/// Pause control, in the register lock: set by `Vgpu::pause`, acknowledged by the worker.
#[derive(Debug, Default)]
pub struct PauseCtl {
    /// A pause is requested: the worker parks before its next turn.
    pub requested: bool,
    /// The worker is parked (its state is in `image`).
    pub parked: bool,
    /// `image` was replaced by a restore: the worker takes it back when it unparks.
    pub restored: bool,
    pub image: Option<Box<WorkerImage>>,
}

/// The worker's state.
#[derive(Debug, Clone)]
pub struct WorkerImage {
    /// The last TLB-flush epoch handled eagerly.
    pub seen_epoch: u64,
    /// Where the round-robin continues.
    pub next: u32,
    /// Per channel: pushbuffer and method state of the current binding.
    pub chans: Vec<Option<ChanImage>>,
    /// Cached modules, least recently used first.
    pub modules: Vec<ModuleImage>,
    /// Jobs preempted by pauses (at most one per channel: a channel whose job a pause
    /// preempted keeps it until its next turn, while other channels may run and be paused).
    pub suspended: Vec<SuspendedImage>,
}

/// A cached module: its text; `id` and `host_bytes` of the engine module (on export the old
/// engine's, after a restore the reloaded one's).
#[derive(Debug, Clone)]
pub struct ModuleImage {
    pub text: Arc<str>,
    pub id: ModuleId,
    pub host_bytes: u64,
}

/// A channel's pushbuffer position and method registers.
#[derive(Debug, Clone)]
pub struct ChanImage {
    pub methods: MethodState,
    pub calls: Vec<MethodCall>,
    pub pos: u32,
    pub in_segment: bool,
    pub decode_error: Option<DecodeError>,
}

/// A job preempted by the pause.
#[derive(Debug, Clone)]
pub struct SuspendedImage {
    pub channel: u32,
    /// The engine (`EngineInfo::name`) whose context this is.
    pub backend: String,
    pub gpu_ns: u64,
    /// Index of its module in `WorkerImage::modules` (launches).
    pub module: Option<u32>,
    pub context: SavedContext,
}

/// The configuration a snapshot was taken under (what the guest saw).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfImage {
    pub vram: u64,
    pub channels: u32,
    pub va_base: u64,
    pub va_size: u64,
    /// The PAGE_SIZES register.
    pub page_sizes: u32,
    /// The engine's name.
    pub backend: String,
}

impl ConfImage {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.vram)
            .u32(self.channels)
            .u64(self.va_base)
            .u64(self.va_size)
            .u32(self.page_sizes)
            .bytes(self.backend.as_bytes());
        e.0
    }

    pub fn decode(b: &[u8]) -> Result<Self, SnapshotError> {
        let mut d = Dec::new(b, "CONF");
        let c = ConfImage {
            vram: d.u64()?,
            channels: d.u32()?,
            va_base: d.u64()?,
            va_size: d.u64()?,
            page_sizes: d.u32()?,
            backend: d.string(64, "backend name")?,
        };
        d.end()?;
        Ok(c)
    }

    /// Refuses a snapshot the guest could tell apart from this device.
    pub fn check(&self, here: &ConfImage) -> Result<(), SnapshotError> {
        let same = |what: &'static str, saved: u64, here: u64| {
            if saved == here {
                Ok(())
            } else {
                Err(SnapshotError::Config { what, saved, here })
            }
        };
        same("VRAM size", self.vram, here.vram)?;
        same(
            "channels",
            u64::from(self.channels),
            u64::from(here.channels),
        )?;
        same("VA base", self.va_base, here.va_base)?;
        same("VA size", self.va_size, here.va_size)?;
        // The guest may use any page size it was offered.
        if self.page_sizes & !here.page_sizes != 0 {
            return Err(SnapshotError::Config {
                what: "page sizes (PAGE_SIZES bits)",
                saved: u64::from(self.page_sizes),
                here: u64::from(here.page_sizes),
            });
        }
        Ok(())
    }
}
