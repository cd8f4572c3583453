//! The cuda engine's bulk VRAM calls (`EngineSnapshot::vram_nonzero_pages`, `vram_read_runs`,
//! `vram_write_pages`, `vram_zero`; docs/snapshot.md, "VRAM"):
//!
//! - which pages are non-zero: a kernel (`bulk.ptx`, one warp per 4 KiB page) ORs each page at
//!   HBM speed and sets one bit per non-zero page; only the bitmap crosses PCIe;
//! - reads: two slots, each a pinned (page-locked) host buffer and a device staging buffer of
//!   up to [`SLOT`] bytes with a page list; a gather kernel packs the slot's pages (any order, any
//!   run lengths) into the staging buffer and one asynchronous copy brings them to the pinned
//!   buffer, while the caller's sink consumes the other slot (a slot of one contiguous run is
//!   copied straight from VRAM);
//! - writes: the caller's source fills one slot's pinned buffer while the other slot's pages
//!   go up and a scatter kernel puts them in place;
//! - zeroing: the device memset.
//!
//! All on one non-blocking stream of the engine's; one bulk call at a time (a mutex). The
//! kernels and the stream are made with the engine (`CudaEngine::new`: a module load, on cuda
//! a JIT, and its wait for the device, would otherwise fall into the first live copy, while the
//! guest's kernels run). The slots are made on first use and sized to the calls: the next
//! power of two of the pages a call moves, from [`MIN_SLOT`] up to [`SLOT`], grown (never
//! shrunk) when a larger call comes. A live copy of a guest that writes little VRAM thus never
//! pins 2 × 64 MiB of host memory and allocates as much device memory (about 40 ms on an H100
//! in the first live copy of a VM, while its kernels wait); writes (restores, the destination
//! of a migration), whose size is not known in advance, take whole slots — unless the slots
//! were reserved for the writes beforehand (`vram_reserve_writes`: a standby sizes them to the
//! GPU image it will restore, before the request), which the writes then use as they are.

use std::ffi::c_void;
use std::ops::ControlFlow;

use super::sys;

use super::driver::{Ctx, DrvError, ck};
use super::engine::CudaEngine;
use crate::engine::EngineError;
use crate::engine::bulk::{
    BatchSink, PageSource, VRAM_PAGE as PAGE, check_bitmap, check_pages, check_sourced,
};
use crate::sync::lock;

/// Bytes of a slot's buffers, at most.
pub const SLOT: u64 = 64 << 20;
/// Pages of a slot, at most.
const SLOT_PAGES: u64 = SLOT / PAGE;
/// Bytes of a slot's buffers, at least.
pub const MIN_SLOT: u64 = 1 << 20;
/// Threads per block of the kernels (8 warps, a page each).
const THREADS: u32 = 256;

/// The kernels (`vram_nonzero`, `vram_gather`, `vram_scatter`; each takes three u64
/// parameters). Public so that the tests run them on the sim interpreter too.
pub const PTX: &str = include_str!("bulk.ptx");

/// One staging slot.
struct Slot {
    /// Pinned host buffer of `slot_pages` pages (up to `SLOT` bytes).
    host: *mut u8,
    /// Pinned page list (`slot_pages` device addresses).
    list_host: *mut u64,
    /// Device staging buffer of `slot_pages` pages, and its page list.
    dev: u64,
    list_dev: u64,
    /// Recorded after the slot's last transfer.
    done: sys::CUevent,
    /// Whether `done` was recorded and not waited for.
    busy: bool,
}

/// The kernels, the stream and the slots.
pub struct Bulk {
    ctx: Ctx,
    module: sys::CUmodule,
    nonzero: sys::CUfunction,
    gather: sys::CUfunction,
    scatter: sys::CUfunction,
    stream: sys::CUstream,
    slots: Vec<Slot>,
    /// Pages each slot holds (0: no slots yet).
    slot_pages: u64,
    /// Pages of the slots writes take ([`SLOT_PAGES`] unless `reserve_writes` sized them).
    write_pages: u64,
    /// The slots were made ahead at a fixed size (`reserve_fixed`): never regrown.
    fixed: bool,
    /// Blocks per launch at most (a grid-stride loop does the rest).
    max_blocks: u32,
}

// SAFETY: CUDA handles are usable from any thread with the context current; the raw host
// pointers are pinned allocations owned by this value; one thread uses it at a time (mutex).
unsafe impl Send for Bulk {}

impl std::fmt::Debug for Bulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bulk").finish_non_exhaustive()
    }
}

fn func(module: sys::CUmodule, name: &std::ffi::CStr) -> Result<sys::CUfunction, DrvError> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: out-pointer to a local, NUL-terminated name, live module.
    ck("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, module, name.as_ptr())
    })?;
    // Loaded onto the device now, with the engine, rather than by CUDA's lazy loading at the
    // kernel's first launch (a restore's first scatter). Optional (CUDA 12.4+): a driver
    // without it, or a failure, leaves it lazy.
    // SAFETY: a function handle of this live module.
    let _ = unsafe { sys::cuFuncLoad(f) };
    Ok(f)
}

impl Bulk {
    /// Loads the kernels and makes the stream (the context is current); no slots yet.
    pub(crate) fn new(ctx: Ctx, sms: u32) -> Result<Bulk, EngineError> {
        let module = super::modules::load(ctx, PTX, 4096)?;
        let mut b = Bulk {
            ctx,
            module,
            nonzero: std::ptr::null_mut(),
            gather: std::ptr::null_mut(),
            scatter: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            slots: Vec::new(),
            slot_pages: 0,
            write_pages: SLOT_PAGES,
            fixed: false,
            max_blocks: sms.max(1).saturating_mul(16),
        };
        b.nonzero = func(module, c"vram_nonzero")?;
        b.gather = func(module, c"vram_gather")?;
        b.scatter = func(module, c"vram_scatter")?;
        // SAFETY: out-pointer to a field; destroyed once in Drop.
        ck("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut b.stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(b)
    }

    /// Makes the two slots of `bytes` each (rounded as [`Bulk::reserve`] does) for good: later
    /// calls use them as they are, never regrown (`CudaConfig::bulk_slot_bytes`), and a
    /// reservation of writes (`vram_reserve_writes`) keeps them too: with small fixed slots
    /// a restore goes through that many more, smaller transfers.
    pub(crate) fn reserve_fixed(&mut self, bytes: u64) -> Result<(), DrvError> {
        self.reserve(bytes.div_ceil(PAGE))?;
        self.fixed = true;
        Ok(())
    }

    /// Makes the two slots hold at least `pages` pages (the next power of two, at least
    /// [`MIN_SLOT`], at most [`SLOT`]); slots already that large, or fixed ones
    /// ([`Bulk::reserve_fixed`]), are kept. Call with nothing in flight (`with_bulk`
    /// synchronises the stream after every call).
    fn reserve(&mut self, pages: u64) -> Result<(), DrvError> {
        if self.fixed && self.slots.len() == 2 {
            return Ok(());
        }
        let have = if self.slots.len() == 2 {
            self.slot_pages
        } else {
            0
        };
        let Some(want) = slot_pages_for(pages, have) else {
            return Ok(());
        };
        self.free_slots();
        for _ in 0..2 {
            let mut s = Slot {
                host: std::ptr::null_mut(),
                list_host: std::ptr::null_mut(),
                dev: 0,
                list_dev: 0,
                done: std::ptr::null_mut(),
                busy: false,
            };
            // Pushed first so that `free_slots` frees whatever was allocated if a call below
            // fails.
            let r = (|| {
                let (mut h, mut l): (*mut c_void, *mut c_void) =
                    (std::ptr::null_mut(), std::ptr::null_mut());
                // SAFETY: out-pointers to locals and fields; sizes from `want`; each
                // allocation is freed once in `free_slots` when non-null.
                unsafe {
                    ck(
                        "cuMemAllocHost_v2",
                        sys::cuMemAllocHost_v2(&mut h, (want * PAGE) as usize),
                    )?;
                    s.host = h.cast();
                    ck(
                        "cuMemAllocHost_v2",
                        sys::cuMemAllocHost_v2(&mut l, (want * 8) as usize),
                    )?;
                    s.list_host = l.cast();
                    ck(
                        "cuMemAlloc_v2",
                        sys::cuMemAlloc_v2(&mut s.dev, (want * PAGE) as usize),
                    )?;
                    ck(
                        "cuMemAlloc_v2",
                        sys::cuMemAlloc_v2(&mut s.list_dev, (want * 8) as usize),
                    )?;
                    ck("cuEventCreate", sys::cuEventCreate(&mut s.done, 0))?;
                }
                Ok::<(), DrvError>(())
            })();
            self.slots.push(s);
            if let Err(e) = r {
                self.free_slots();
                return Err(e);
            }
        }
        self.slot_pages = want;
        Ok(())
    }

    /// Frees the slots (nothing of theirs in flight).
    fn free_slots(&mut self) {
        // SAFETY: allocations and events made in `reserve`, each released once (the slots
        // are taken out of `self`); the stream is synchronised first so that no transfer
        // uses them.
        unsafe {
            if !self.slots.is_empty() && !self.stream.is_null() {
                sys::cuStreamSynchronize(self.stream);
            }
            for s in std::mem::take(&mut self.slots) {
                if !s.host.is_null() {
                    sys::cuMemFreeHost(s.host.cast());
                }
                if !s.list_host.is_null() {
                    sys::cuMemFreeHost(s.list_host.cast());
                }
                if s.dev != 0 {
                    sys::cuMemFree_v2(s.dev);
                }
                if s.list_dev != 0 {
                    sys::cuMemFree_v2(s.list_dev);
                }
                if !s.done.is_null() {
                    sys::cuEventDestroy_v2(s.done);
                }
            }
        }
        self.slot_pages = 0;
    }

    /// Launches `f(a, n, c)` over `n` pages on the stream.
    fn launch(&self, f: sys::CUfunction, a: u64, n: u64, c: u64) -> Result<(), DrvError> {
        let warps = u64::from(THREADS / 32);
        let blocks = n.div_ceil(warps).clamp(1, u64::from(self.max_blocks)) as u32;
        let mut args = [a, n, c];
        let mut params: [*mut c_void; 3] = [
            (&mut args[0] as *mut u64).cast(),
            (&mut args[1] as *mut u64).cast(),
            (&mut args[2] as *mut u64).cast(),
        ];
        // SAFETY: a function of our module taking three u64 parameters, passed as pointers
        // to locals the driver copies at launch; our stream.
        ck("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                blocks,
                1,
                1,
                THREADS,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn sync(&self) -> Result<(), DrvError> {
        // SAFETY: our live stream.
        ck("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    /// Waits for slot `i`'s last transfer.
    fn wait(&mut self, i: usize) -> Result<(), DrvError> {
        let s = &mut self.slots[i];
        if s.busy {
            // SAFETY: a live event, recorded on our stream.
            ck("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(s.done)
            })?;
            s.busy = false;
        }
        Ok(())
    }

    /// Records slot `i`'s event after what was queued for it.
    fn mark(&mut self, i: usize) -> Result<(), DrvError> {
        let s = &mut self.slots[i];
        // SAFETY: live event and stream.
        ck("cuEventRecord", unsafe {
            sys::cuEventRecord(s.done, self.stream)
        })?;
        s.busy = true;
        Ok(())
    }

    /// Queues reading `pages` (device addresses) into slot `i`'s pinned buffer.
    fn queue_read(&mut self, i: usize, pages: &[u64]) -> Result<(), DrvError> {
        let n = pages.len() as u64;
        let s = &self.slots[i];
        let contiguous = pages.windows(2).all(|w| w[1] == w[0] + PAGE);
        if contiguous {
            // SAFETY: `n` pages of VRAM from pages[0] (checked by the caller) into the slot's
            // pinned buffer of slot_pages pages (n <= slot_pages), not in use (waited for).
            ck("cuMemcpyDtoHAsync_v2", unsafe {
                sys::cuMemcpyDtoHAsync_v2(s.host.cast(), pages[0], (n * PAGE) as usize, self.stream)
            })?;
        } else {
            // SAFETY: the pinned list holds slot_pages entries and is not in use (waited for).
            unsafe { std::ptr::copy_nonoverlapping(pages.as_ptr(), s.list_host, pages.len()) };
            // SAFETY: list and staging buffers of the slot, sized for slot_pages pages; the
            // kernel reads the listed VRAM pages (checked by the caller).
            unsafe {
                ck(
                    "cuMemcpyHtoDAsync_v2",
                    sys::cuMemcpyHtoDAsync_v2(
                        s.list_dev,
                        s.list_host.cast(),
                        (n * 8) as usize,
                        self.stream,
                    ),
                )?;
            }
            self.launch(self.gather, s.list_dev, n, s.dev)?;
            // SAFETY: as above, from the staging buffer.
            ck("cuMemcpyDtoHAsync_v2", unsafe {
                sys::cuMemcpyDtoHAsync_v2(s.host.cast(), s.dev, (n * PAGE) as usize, self.stream)
            })?;
        }
        self.mark(i)
    }

    /// Queues writing slot `i`'s first `pages.len()` pages to `pages` (device addresses).
    fn queue_write(&mut self, i: usize, pages: &[u64]) -> Result<(), DrvError> {
        let n = pages.len() as u64;
        let s = &self.slots[i];
        let contiguous = pages.windows(2).all(|w| w[1] == w[0] + PAGE);
        if contiguous {
            // SAFETY: `n` pages of VRAM from pages[0] (checked by the caller) from the slot's
            // pinned buffer, which stays untouched until the slot's event is waited for.
            ck("cuMemcpyHtoDAsync_v2", unsafe {
                sys::cuMemcpyHtoDAsync_v2(pages[0], s.host.cast(), (n * PAGE) as usize, self.stream)
            })?;
        } else {
            // SAFETY: the pinned list holds slot_pages entries and is not in use.
            unsafe { std::ptr::copy_nonoverlapping(pages.as_ptr(), s.list_host, pages.len()) };
            // SAFETY: the slot's buffers, sized for slot_pages pages, untouched by the host
            // until the slot's event is waited for; the kernel writes the listed VRAM pages
            // (checked by the caller).
            unsafe {
                ck(
                    "cuMemcpyHtoDAsync_v2",
                    sys::cuMemcpyHtoDAsync_v2(
                        s.dev,
                        s.host.cast(),
                        (n * PAGE) as usize,
                        self.stream,
                    ),
                )?;
                ck(
                    "cuMemcpyHtoDAsync_v2",
                    sys::cuMemcpyHtoDAsync_v2(
                        s.list_dev,
                        s.list_host.cast(),
                        (n * 8) as usize,
                        self.stream,
                    ),
                )?;
            }
            self.launch(self.scatter, s.list_dev, n, s.dev)?;
        }
        self.mark(i)
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        self.free_slots();
        // SAFETY: the stream and module made in `new`, each released once; the stream was
        // synchronised by `free_slots` (or never carried a transfer).
        unsafe {
            if !self.stream.is_null() {
                sys::cuStreamDestroy_v2(self.stream);
            }
            sys::cuModuleUnload(self.module);
        }
    }
}

/// The pages of the slots a call moving `pages` pages needs when they hold `have` (0: no slots):
/// `None` if those do, else the next power of two of `pages`, within [`MIN_SLOT`]..[`SLOT`].
fn slot_pages_for(pages: u64, have: u64) -> Option<u64> {
    let want = pages
        .clamp(MIN_SLOT / PAGE, SLOT_PAGES)
        .next_power_of_two()
        .min(SLOT_PAGES);
    (want > have).then_some(want)
}

/// Where a walk over runs `(pa, bytes)` is: the run, and bytes of it done.
#[derive(Debug, Default)]
struct RunCursor {
    run: usize,
    at: u64,
}

impl RunCursor {
    /// Fills `pages` (cleared first) with the device addresses (`base` + pa) of the next pages
    /// of `runs`, at most `slot_pages`; returns the slot's pieces `(offset, bytes)`, each inside
    /// one run, in order. Empty at the end of the runs.
    fn fill(
        &mut self,
        runs: &[(u64, u64)],
        base: u64,
        slot_pages: u64,
        pages: &mut Vec<u64>,
    ) -> Vec<(usize, usize)> {
        pages.clear();
        let mut pieces = Vec::new();
        while (pages.len() as u64) < slot_pages && self.run < runs.len() {
            let (pa, len) = runs[self.run];
            let at = self.at;
            let n = ((len - at) / PAGE).min(slot_pages - pages.len() as u64);
            if n > 0 {
                pieces.push((pages.len() * PAGE as usize, (n * PAGE) as usize));
                pages.extend((0..n).map(|k| base + pa + at + k * PAGE));
                self.at += n * PAGE;
            }
            if self.at == len {
                (self.run, self.at) = (self.run + 1, 0);
            }
        }
        pieces
    }
}

impl CudaEngine {
    /// Bytes of each bulk staging slot now (0: none made): for tests on a GPU.
    #[doc(hidden)]
    pub fn bulk_slot_bytes(&self) -> u64 {
        lock(&self.bulk).as_ref().map_or(0, |b| {
            if b.slots.len() == 2 {
                b.slot_pages * PAGE
            } else {
                0
            }
        })
    }

    /// Runs `f` with the bulk state (made with the engine; again here if that failed).
    fn with_bulk<T>(
        &self,
        f: impl FnOnce(&mut Bulk) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.alive()?;
        let mut g = lock(&self.bulk);
        if g.is_none() {
            *g = Some(Bulk::new(self.ctx, self.sms)?);
        }
        let b = g
            .as_mut()
            .ok_or(EngineError::Backend("bulk state".into()))?;
        let r = f(b);
        // Whatever happened, nothing of ours stays in flight.
        let s = b.sync();
        for s in &mut b.slots {
            s.busy = false;
        }
        let out = r?;
        s.map_err(|e| self.drv(e))?;
        Ok(out)
    }

    pub(crate) fn bulk_nonzero(
        &self,
        pa: u64,
        pages: u64,
        bitmap: &mut [u64],
    ) -> Result<(), EngineError> {
        check_bitmap(pa, pages, bitmap.len(), self.info.vram_size)?;
        bitmap.fill(0);
        let base = self.vram.dev(0);
        self.with_bulk(|b| {
            // The bitmap in one piece if it fits a slot (64 MiB of bits: 2 TiB of VRAM).
            b.reserve(pages.div_ceil(8).div_ceil(PAGE))
                .map_err(|e| self.drv(e))?;
            // Pages per kernel: the bitmap of a piece fits the staging buffer; a multiple of 64.
            let step = b.slot_pages * PAGE * 8;
            let mut off = 0;
            while off < pages {
                let n = (pages - off).min(step);
                let words = n.div_ceil(64) as usize;
                let s = &b.slots[0];
                // SAFETY: the staging buffer holds slot_pages × PAGE bytes >= 8 × words; our
                // stream.
                ck("cuMemsetD32Async", unsafe {
                    sys::cuMemsetD32Async(s.dev, 0, words * 2, b.stream)
                })
                .map_err(|e| self.drv(e))?;
                let (dev, host) = (s.dev, s.host);
                b.launch(b.nonzero, base + pa + off * PAGE, n, dev)
                    .map_err(|e| self.drv(e))?;
                // SAFETY: `words` u64 words from the staging buffer to the pinned buffer (both
                // slot_pages × PAGE bytes), not in use by anything else.
                ck("cuMemcpyDtoHAsync_v2", unsafe {
                    sys::cuMemcpyDtoHAsync_v2(host.cast(), dev, words * 8, b.stream)
                })
                .map_err(|e| self.drv(e))?;
                b.sync().map_err(|e| self.drv(e))?;
                // SAFETY: the copy completed; the pinned buffer holds `words` u64 words written
                // by it (u32 words, little endian: bit p % 64 of u64 word p / 64).
                let got = unsafe { std::slice::from_raw_parts(host.cast::<u8>(), words * 8) };
                let at = (off / 64) as usize;
                for (w, b8) in bitmap[at..at + words].iter_mut().zip(got.chunks_exact(8)) {
                    *w = u64::from_le_bytes(b8.try_into().unwrap_or_default());
                }
                off += n;
            }
            Ok(())
        })
    }

    pub(crate) fn bulk_read_runs(
        &self,
        runs: &[(u64, u64)],
        sink: &mut BatchSink<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        for &(pa, len) in runs {
            check_pages(pa, len, self.info.vram_size)?;
        }
        if runs.iter().all(|r| r.1 == 0) {
            return Ok(ControlFlow::Continue(()));
        }
        let base = self.vram.dev(0);
        let total: u64 = runs.iter().map(|r| r.1 / PAGE).sum();
        self.with_bulk(|b| {
            b.reserve(total).map_err(|e| self.drv(e))?;
            let slot_pages = b.slot_pages;
            let mut cursor = RunCursor::default();
            let mut pages: Vec<u64> = Vec::with_capacity(slot_pages as usize);
            let mut pending: Option<(usize, Vec<(usize, usize)>)> = None;
            let mut slot = 0usize;
            loop {
                let pieces = cursor.fill(runs, base, slot_pages, &mut pages);
                let queued = !pages.is_empty();
                if queued {
                    b.wait(slot).map_err(|e| self.drv(e))?;
                    b.queue_read(slot, &pages).map_err(|e| self.drv(e))?;
                }
                if let Some((i, ps)) = pending.take() {
                    b.wait(i).map_err(|e| self.drv(e))?;
                    let host = b.slots[i].host;
                    let pieces: Vec<&[u8]> = ps
                        .iter()
                        .map(|&(off, len)| {
                            // SAFETY: the slot's transfer completed (waited for) and nothing
                            // writes its pinned buffer until it is queued again, after the
                            // sink returns (the slices do not outlive this iteration);
                            // `off + len` <= slot_pages × PAGE.
                            unsafe { std::slice::from_raw_parts(host.add(off), len) }
                        })
                        .collect();
                    if sink(&pieces).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                if !queued {
                    return Ok(ControlFlow::Continue(()));
                }
                pending = Some((slot, pieces));
                slot ^= 1;
            }
        })
    }

    /// Reserves the slots of later writes ahead, sized to `bytes` (the next power of two of
    /// its pages, within [`MIN_SLOT`]..[`SLOT`]): writes then take these slots (or larger ones
    /// made meanwhile) instead of allocating whole ones (`vram_reserve_writes`).
    pub(crate) fn bulk_reserve_writes(&self, bytes: u64) -> Result<(), EngineError> {
        let pages = bytes.div_ceil(PAGE);
        self.with_bulk(|b| {
            b.write_pages = slot_pages_for(pages, 0).unwrap_or(SLOT_PAGES);
            b.reserve(b.write_pages).map_err(|e| self.drv(e))
        })
    }

    pub(crate) fn bulk_write_pages(
        &self,
        source: &mut PageSource<'_>,
    ) -> Result<ControlFlow<()>, EngineError> {
        let (vram, base) = (self.info.vram_size, self.vram.dev(0));
        self.with_bulk(|b| {
            // Writes take whole slots (their size is the source's), or those reserved for them.
            b.reserve(b.write_pages).map_err(|e| self.drv(e))?;
            let slot_pages = b.slot_pages;
            let mut pas = Vec::with_capacity(slot_pages as usize);
            let mut slot = 0usize;
            loop {
                b.wait(slot).map_err(|e| self.drv(e))?;
                pas.clear();
                // SAFETY: the slot's last transfer completed (waited for); its pinned buffer
                // of slot_pages × PAGE bytes is ours until queued again.
                let buf = unsafe {
                    std::slice::from_raw_parts_mut(b.slots[slot].host, (slot_pages * PAGE) as usize)
                };
                if source(buf, &mut pas).is_break() {
                    return Ok(ControlFlow::Break(()));
                }
                if pas.is_empty() {
                    return Ok(ControlFlow::Continue(()));
                }
                check_sourced(&pas, slot_pages as usize, vram)?;
                for p in pas.iter_mut() {
                    *p += base;
                }
                b.queue_write(slot, &pas).map_err(|e| self.drv(e))?;
                slot ^= 1;
            }
        })
    }

    pub(crate) fn bulk_zero(&self, pa: u64, len: u64) -> Result<(), EngineError> {
        self.alive()?;
        check_pages(pa, len, self.info.vram_size)?;
        self.vram.fill(pa, len, 0).map_err(|e| self.drv(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots sized to the calls: a few pages get the smallest slots, a large call grows them
    /// (to a power of two, never past 64 MiB), smaller calls keep what is there.
    #[test]
    fn slots_grow_to_the_calls_within_bounds() {
        let min = MIN_SLOT / PAGE;
        assert_eq!(slot_pages_for(4, 0), Some(min));
        assert_eq!(slot_pages_for(0, 0), Some(min));
        assert_eq!(slot_pages_for(4, min), None);
        assert_eq!(slot_pages_for(min + 1, min), Some(2 * min));
        assert_eq!(slot_pages_for(3000, 2 * min), Some(4096));
        assert_eq!(slot_pages_for(1 << 30, 4096), Some(SLOT_PAGES));
        assert_eq!(slot_pages_for(u64::MAX, SLOT_PAGES), None);
        assert_eq!(slot_pages_for(100, SLOT_PAGES), None);
    }

    /// Runs walked into slots of 5 pages: every page once, in order, at its address; pieces
    /// back to back in their slot, each inside one run (adjacent runs included); empty runs
    /// skipped.
    #[test]
    fn runs_are_cut_into_slots_and_pieces() {
        let runs: Vec<(u64, u64)> = vec![
            (0, 3 * PAGE),
            (10 * PAGE, 0),
            (20 * PAGE, 12 * PAGE),
            (40 * PAGE, PAGE),
            (50 * PAGE, 2 * PAGE),
            // Adjacent to the previous run, yet its own piece.
            (52 * PAGE, PAGE),
        ];
        let base = 1 << 40;
        let want: Vec<u64> = runs
            .iter()
            .flat_map(|&(pa, len)| (0..len / PAGE).map(move |k| base + pa + k * PAGE))
            .collect();
        let mut c = RunCursor::default();
        let mut pages = Vec::new();
        let mut all = Vec::new();
        let mut slots = 0;
        loop {
            let pieces = c.fill(&runs, base, 5, &mut pages);
            if pages.is_empty() {
                assert!(pieces.is_empty());
                break;
            }
            slots += 1;
            assert!(pages.len() <= 5);
            let mut off = 0;
            for &(o, n) in &pieces {
                assert_eq!(o, off, "pieces back to back");
                let first = pages[o / PAGE as usize];
                let last = pages[(o + n) / PAGE as usize - 1];
                assert_eq!(last - first, n as u64 - PAGE, "a piece is contiguous");
                let inside = runs
                    .iter()
                    .any(|&(pa, len)| first >= base + pa && last < base + pa + len);
                assert!(inside, "a piece inside one run");
                off += n;
            }
            assert_eq!(off, pages.len() * PAGE as usize);
            all.extend_from_slice(&pages);
        }
        assert_eq!(all, want);
        assert_eq!(slots, 19usize.div_ceil(5));
    }
}
