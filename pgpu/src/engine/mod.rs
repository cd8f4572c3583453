//! The `Engine` trait: the physical GPU as the hypervisor sees it, and the types it speaks.
//!
//! Shaped so that both the software GPU (`sim`) and a CUDA driver backend fit: the hypervisor owns
//! VRAM allocation and hands the engine physical ranges; the engine owns address spaces whose
//! mappings are the shadow page tables (it never sees a guest page table); jobs (copies, kernel
//! launches) run in one address space, can be preempted from another thread, and come back with a
//! saved context (in memory, serializable to bytes) that resumes later. See `pgpu/README.md`.
//!
//! The core trait is [`Engine`] (memory, spaces, copies, modules, jobs); what only snapshots,
//! restores and live migration need — bulk VRAM access, re-targeting saved contexts, dirty
//! logging — is the extension [`EngineSnapshot`], with defaults any engine can take.
//!
//! Files: `types` (ids, mappings, jobs, info), `fault`, `context` (saved contexts, outcomes),
//! `preempt` (the preemption handle), `error`, `snapshot` (the extension trait), `bulk` (its
//! default bulk VRAM calls).

use std::ptr::NonNull;

pub mod bulk;
pub mod bulk_par;
mod context;
mod error;
mod fault;
pub(crate) mod preempt;
mod snapshot;
mod types;

pub(crate) use context::ContextRepr;
pub use context::{LiveContext, Outcome, ParamPatch, SavedContext};
pub use error::{EngineError, MapError};
pub use fault::{FaultKind, JobFault, KernelSite};
pub use preempt::PreemptHandle;
pub use snapshot::EngineSnapshot;
pub use types::*;

/// The physical GPU as the hypervisor sees it.
///
/// All methods take `&self` and are callable from several threads: one job per call of
/// [`Engine::execute`]/[`Engine::resume`] runs on the calling thread (plus the engine's workers),
/// and [`PreemptHandle::request`] from any other thread makes it return
/// [`Outcome::Preempted`] at its next preemption point.
pub trait Engine: Send + Sync {
    /// Name, VRAM size, page sizes and limits.
    fn info(&self) -> &EngineInfo;

    /// Reads physical VRAM for the hypervisor's own use (shadow structures, BAR1 aperture).
    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError>;
    /// Writes physical VRAM for the hypervisor's own use.
    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError>;
    /// Fills physical VRAM with `byte` (scrubbing a partition before it changes hands).
    fn vram_fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), EngineError>;

    /// Registers host memory (a VM's guest RAM) so that mappings can point at it.
    ///
    /// # Safety
    /// `base..base+len` must be readable and writable memory that stays valid, and is not freed or
    /// remapped, until `unregister_host_region` succeeds for the returned id. The engine's kernels
    /// and copies access it concurrently with other users (as DMA would).
    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError>;
    /// Allocates `len` bytes of zeroed host memory owned by the engine (a multiple of the largest
    /// page size) and registers it as a host region. The VMM may back guest RAM with it: this is
    /// the form a CUDA engine can map at arbitrary GPU VAs (cuMemCreate on the host), where
    /// registering existing memory is not. The pointer is valid until `unregister_host_region`.
    fn alloc_host_region(&self, len: u64) -> Result<(HostRegionId, NonNull<u8>), EngineError>;
    /// Unregisters a host region (freeing it if the engine allocated it); refused while any
    /// address space maps it.
    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError>;

    /// Creates an address space over a VA window.
    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError>;
    /// Destroys an address space; refused while a job runs in it.
    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError>;
    /// Maps a range. Overlaps with existing mappings are rejected (unmap first); refused while
    /// a job runs in the space. All-or-nothing.
    fn map(&self, space: SpaceId, mapping: &Mapping) -> Result<(), EngineError>;
    /// Maps several ranges, all or nothing (a shadow-table rebuild, a para-virt MAP_BATCH): on
    /// error nothing of the batch stays mapped and `EngineError::BatchEntry` names the entry.
    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError>;
    /// Unmaps every page inside `va..va+len`, returning the bytes unmapped (holes are skipped).
    /// A large page that straddles an end of the range is an error and nothing changes.
    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError>;
    /// What `va` maps to in `space` (target address of that byte, permission, page size).
    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError>;

    /// Copies host bytes to `va` through the space's MMU (synchronous; faults come back as
    /// `EngineError::CopyFault`, with nothing written past the fault).
    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError>;
    /// Copies from `va` through the space's MMU into a host buffer (synchronous).
    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError>;

    /// Loads PTX text within `limits` (host bytes, deadline, cancel flag: a hostile text is
    /// refused within them, `EngineError::{HostBudget, LoadDeadline, LoadCancelled}`).
    /// Identical text gives the same id (content cache; loads are counted and each needs an
    /// `unload_module`). Errors carry the loader's text for the guest.
    fn load_module(&self, ptx: &str, limits: &LoadLimits) -> Result<LoadedModule, EngineError>;
    /// Drops one load of a module; the module goes when the last load is dropped. Jobs already
    /// running keep it alive; saved contexts referring to it can no longer be resumed.
    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError>;

    /// Runs a job until it completes, faults or is preempted.
    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError>;
    /// Does the one-time work a first run of `job` would do lazily (the cuda engine: resolving
    /// its kernel's functions, which loads them onto the device, making streams, allocating a
    /// save area of its size into the pool), so that its run — under a grant of a shared
    /// GPU — starts at once. Called on the VM's own thread before it asks for the GPU; nothing
    /// of the job runs and nothing the guest sees changes. An error is not the job's: the run
    /// does the work itself (and reports what fails then).
    fn prepare(&self, _job: &Job) -> Result<(), EngineError> {
        Ok(())
    }

    /// Does ahead, for every entry of a loaded module, the part of [`Engine::prepare`] that
    /// does not depend on a launch's grid (the cuda engine: each entry's functions resolved
    /// and loaded onto the device, in every form, and the streams its launches take), for a
    /// module loaded before the VM that will launch it (a standby's template). Nothing runs;
    /// an error only leaves the work to the first run.
    fn prepare_module(&self, _module: ModuleId) -> Result<(), EngineError> {
        Ok(())
    }

    /// Whether a run of `job` would find everything [`Engine::prepare`] makes (cheap, no
    /// device work): the caller prepares, and hands a grant back first, only when not.
    fn prepared(&self, _job: &Job) -> bool {
        true
    }

    /// Where a launch's GPU time goes, so far (cuda's sliced launches; zero where not measured):
    /// see [`LaunchTiming`].
    fn launch_timing(&self) -> LaunchTiming {
        LaunchTiming::default()
    }

    /// Counters of the checkpoint preemption method (`PreemptMethod::Checkpoint`: modules
    /// transformed, fallbacks and why, preemptions, bytes saved); `None` with another method.
    fn checkpoint_stats(&self) -> Option<crate::ckpt::CkptStats> {
        None
    }

    /// Resumes a preempted job from its saved context (in the space it was saved from). The
    /// context is consumed; on `Err` nothing ran and the job is lost (its space or module is
    /// gone, or the bytes are invalid).
    fn resume(
        &self,
        context: SavedContext,
        preempt: &PreemptHandle,
    ) -> Result<Outcome, EngineError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_is_object_safe() {
        fn takes(_: Option<&dyn Engine>) {}
        takes(None);
        assert_eq!(PageSize::Size2M.bytes(), 2 << 20);
        assert_eq!(PageSize::Size4K.bytes(), 4096);
    }
}

/// [`Engine::launch_timing`]: cumulative counters that split a launch's GPU time (a job's, from
/// an event recorded before its first sub-launch to the end of its last) into the kernels' own
/// time on the device and what is around them, e.g. host time in the driver's launch calls
/// (issue 24: the guest's jobs took ~15% more GPU time beside a live migration's copy; the
/// kernels' own time did not grow, the copy jobs' did: docs/performance.md, session 18).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchTiming {
    /// Sub-launches issued.
    pub sub_launches: u64,
    /// Device time of the sub-launches, each from the event recorded just before its
    /// `cuLaunchKernel` to the one after it, ns. An idle stream's start event completes at
    /// once, so this includes the launch call's submission; less `launch_call_ns`, it is
    /// about the kernels' own time.
    pub kernel_ns: u64,
    /// Host time of the sub-launches' driver calls (those two events and `cuLaunchKernel`), ns.
    pub launch_call_ns: u64,
    /// Host time from the call that records a launch's origin event (where its GPU time
    /// starts) to its first sub-launch's calls, ns: on an idle stream, GPU time too. A
    /// preempted launch counts it again at each resume.
    pub origin_gap_ns: u64,
    /// Host time of the copy jobs' copy calls (`cuMemcpyDtoDAsync`), ns.
    pub copy_call_ns: u64,
    /// Host time of the copy jobs' waits for their copies (`cuStreamSynchronize`), ns.
    pub copy_wait_ns: u64,
}

impl LaunchTiming {
    /// The sums of `self` and `other` (an engine's counters after another's, `SwitchEngine`).
    pub fn plus(self, other: LaunchTiming) -> LaunchTiming {
        LaunchTiming {
            sub_launches: self.sub_launches.saturating_add(other.sub_launches),
            kernel_ns: self.kernel_ns.saturating_add(other.kernel_ns),
            launch_call_ns: self.launch_call_ns.saturating_add(other.launch_call_ns),
            origin_gap_ns: self.origin_gap_ns.saturating_add(other.origin_gap_ns),
            copy_call_ns: self.copy_call_ns.saturating_add(other.copy_call_ns),
            copy_wait_ns: self.copy_wait_ns.saturating_add(other.copy_wait_ns),
        }
    }
}
