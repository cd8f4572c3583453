//! `EngineSnapshot`: the part of the engine contract only snapshots, restores and live
//! migration use — bulk VRAM access (docs/snapshot.md, "VRAM"), re-targeting saved contexts at
//! a restored VM's new spaces and modules, and dirty logging (issue 17; `crate::dirty`). Every
//! method has a default on top of the core [`Engine`], always correct; the sim and cuda
//! engines override what they do faster or exactly.

use std::ops::ControlFlow;

use super::{Engine, EngineError, MapTarget, ModuleId, ParamPatch, SavedContext, SpaceId, bulk};

/// The snapshot and dirty-log extension of [`Engine`].
pub trait EngineSnapshot: Engine {
    // ---- Bulk VRAM access (snapshot, restore, migration of a partition; docs/snapshot.md,
    // "VRAM"). Defaults in `bulk.rs` on top of vram_read/vram_write/vram_fill; the cuda engine
    // overrides them (GPU kernels, pinned double-buffered copies), the sim engine scans its
    // memory in place. Pages are 4 KiB (`bulk::VRAM_PAGE`) whatever the engine's page sizes.

    /// Which pages of `pages` × 4 KiB at `pa` (4 KiB aligned) are not all zero: bit `i % 64` of
    /// `bitmap[i / 64]` is set for page `i` and cleared otherwise (`bitmap` holds at least
    /// `pages.div_ceil(64)` words; bits past `pages` are cleared).
    fn vram_nonzero_pages(
        &self,
        pa: u64,
        pages: u64,
        bitmap: &mut [u64],
    ) -> Result<(), EngineError> {
        bulk::nonzero_pages(self, pa, pages, bitmap)
    }

    /// Reads the runs `(pa, len)` (whole 4 KiB pages) and hands their bytes to `sink` in order,
    /// as consecutive pieces of whole pages; a piece never spans two runs. `sink` returning
    /// `Break` stops the reads and `Ok(Break)` comes back. The cuda engine fills the next piece
    /// while `sink` runs.
    fn vram_read_runs(
        &self,
        runs: &[(u64, u64)],
        sink: &mut bulk::PageSink<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        bulk::read_runs(self, runs, sink)
    }

    /// As [`EngineSnapshot::vram_read_runs`], with the pieces handed over a batch at a time (the
    /// same bytes in the same order, in pieces that are whole pages and never span two runs —
    /// where a run is cut into pieces is the engine's; each batch valid only during the call).
    /// The default hands `vram_read_runs`' pieces one per batch; the cuda engine hands each
    /// pinned slot's pieces at once; the sim engine its copy threads' batches.
    fn vram_read_runs_batched(
        &self,
        runs: &[(u64, u64)],
        sink: &mut bulk::BatchSink<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        bulk::read_runs_batched(self, runs, sink)
    }

    /// Writes the pages `source` produces: each call gets a buffer (a whole number of pages)
    /// and an empty list, fills the buffer's first pages and pushes each one's destination
    /// (a 4 KiB aligned physical address) to the list; an empty list ends the writes, `Break`
    /// stops them (`Ok(Break)`). A page listed twice in one call: which bytes win is undefined.
    /// The cuda engine transfers one buffer while `source` fills the next.
    fn vram_write_pages(
        &self,
        source: &mut bulk::PageSource<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        bulk::write_pages(self, source)
    }

    /// Makes `len` bytes at `pa` zero (whole 4 KiB pages). The default finds the non-zero
    /// pages first and fills only those (memory never touched stays untouched: a sim engine's
    /// VRAM is an anonymous mapping); the cuda engine runs the device memset.
    fn vram_zero(&self, pa: u64, len: u64) -> Result<(), EngineError> {
        bulk::zero(self, pa, len)
    }

    /// Makes ahead what writes of about `bytes` of pages need (the cuda engine: its pinned
    /// transfer slots, sized to `bytes`, which later `vram_write_pages` calls take as they are
    /// instead of allocating their own; about 40 ms of a first restore on an H100), so that a
    /// restore known to come (a standby's, `vgpu-vmm --standby`) does not make them. Nothing
    /// the partition holds changes. The default has nothing to make.
    fn vram_reserve_writes(&self, _bytes: u64) -> Result<(), EngineError> {
        Ok(())
    }
    // ---- end of bulk VRAM access

    /// Re-targets a saved context of this engine at another space and (for a launch) module:
    /// the same job after a VM snapshot was restored, where the shadow space and the reloaded
    /// module have new ids; `patch` (a launch only) changes eight bytes of its parameters. The
    /// context is validated as far as the engine can without running it (a launch's state
    /// against the module). Engines that cannot refuse with `EngineError::BadContext`.
    fn retarget_context(
        &self,
        context: SavedContext,
        space: SpaceId,
        module: Option<ModuleId>,
        patch: Option<ParamPatch>,
    ) -> Result<SavedContext, EngineError> {
        let _ = (context, space, module, patch);
        Err(EngineError::BadContext(format!(
            "the {} engine cannot re-target saved contexts",
            self.info().name
        )))
    }

    // ---- Dirty logging for live snapshots and migration (issue 17; `crate::dirty`). The
    // defaults keep no log and report every page dirty on every harvest: always correct. ----

    /// What [`EngineSnapshot::dirty_log_start`] would say, without starting anything (a live
    /// copy prepares the device's write sets before the start when it is not `Exact`).
    fn dirty_log_kind(&self) -> crate::dirty::DirtyLogKind {
        crate::dirty::DirtyLogKind::Everything
    }
    /// Starts logging which 4 KiB pages change in VRAM and in the host regions registered now:
    /// jobs' stores, atomics and copy destinations, and `vram_write`/`vram_fill`. A restart
    /// clears the log. Says whether harvests will be exact.
    fn dirty_log_start(&self) -> Result<crate::dirty::DirtyLogKind, EngineError> {
        Ok(crate::dirty::DirtyLogKind::Everything)
    }
    /// Stops logging.
    fn dirty_log_stop(&self) {}
    /// ORs into `bits` (bit `i`: the page at `at` + `i` × 4096; `len` bytes, whole pages) the
    /// pages written since the previous harvest of them (or the start), and clears them. Pages
    /// a job in progress may still write stay reported until it ends.
    fn dirty_log_harvest(
        &self,
        at: MapTarget,
        len: u64,
        bits: &mut [u64],
    ) -> Result<(), EngineError> {
        let _ = at;
        crate::dirty::set_all(bits, len);
        Ok(())
    }

    // ---- Write-set validation (`ptx::ckpt::bounds`, issue 24). The defaults have no flag
    // words: a device then cannot run validated write sets. ----

    /// A fresh zeroed 32-bit flag word of engine-owned memory that kernels of `space` can
    /// store to, by its VA (`st.global.u32`); `None` if the engine has none (or none left).
    /// The sim engine lets no other space's kernels reach it; the cuda engine's words are in
    /// its context's memory, which a kernel can address like its other engine-owned buffers.
    /// Give it back with [`EngineSnapshot::free_flag`].
    fn alloc_flag(&self, space: SpaceId) -> Result<Option<u64>, EngineError> {
        let _ = space;
        Ok(None)
    }
    /// Reads and clears the flag word at `va` (from `alloc_flag`), after the jobs that may
    /// store to it ended: whether one stored a non-zero value since the last take.
    fn take_flag(&self, va: u64) -> Result<bool, EngineError> {
        Err(EngineError::Backend(format!("no flag word at {va:#x}")))
    }
    /// Gives the flag word at `va` back.
    fn free_flag(&self, va: u64) {
        let _ = va;
    }
}
