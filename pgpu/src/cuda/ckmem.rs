//! Engine-owned device memory of checkpointed launches: one buffer per job holding the flag (a
//! `u32` at offset 0) and, from [`SAVE_OFF`], the save area. Buffers are zeroed once when
//! allocated (`cuMemAlloc` + `cuMemsetD8`) and come back to a pool when their job completes,
//! all zero: a job never preempted wrote nothing there (`DevBuf::clean`), one that was
//! preempted and resumed is scrubbed first (`DevBuf::scrub`: its status words are all done =
//! 0 again, but the registers and shared memory its threads saved stay in the area, and a
//! later job of another entry or form, whose records have another stride, would read them as
//! status words). An uncontended launch pays no allocation (`cuMemFree` would also synchronise
//! the device). A buffer dropped dirty (a context never resumed) is freed. Also the engine's
//! signal stream and the flag write a preemption request makes.
//!
//! Every synchronous `cuMemcpy*`/`cuMemset*` on a buffer runs on the legacy default stream,
//! which job streams (non-blocking) do not wait for, and may return before it lands (a
//! memset on device memory, or the DMA of a copy from pageable memory): writes to a buffer
//! wait for the legacy stream (`sync_legacy`) before a kernel may use it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::sys;

use super::driver::{Ctx, DrvError, ck, sync_legacy};
use super::stream::Stream;

/// Offset of the save area in a job's buffer (the flag is at 0).
pub const SAVE_OFF: u64 = 256;

/// Idle buffers kept (their sizes summed) before further ones are freed, at least (see
/// [`idle_cap`]).
const MAX_IDLE_BYTES: u64 = 256 << 20;

/// Granule of the pool's buffers.
const GRANULE: u64 = 64 << 10;

/// The size of the buffer a save area of `area` bytes takes.
fn buffer_bytes(area: u64) -> u64 {
    (SAVE_OFF + area).next_multiple_of(GRANULE)
}

/// Idle bytes the pool keeps for an engine whose largest save area is `max_area`: 256 MiB, or
/// two buffers of the largest area if that is more. A flat 256 MiB never kept the buffer of a
/// 256 MiB area (the limit's default: 256 MiB + its header), so every launch of such a kernel
/// allocated, zeroed and freed it — `cuMemFree` synchronising the device — and one alternating
/// with another kernel (bfs: 256 + 32 MiB) evicted the other's. Bounded by the configuration.
pub(crate) fn idle_cap(max_area: u64) -> u64 {
    MAX_IDLE_BYTES.max(buffer_bytes(max_area.min(u64::MAX / 4)).saturating_mul(2))
}

/// Whether an idle set of `held` bytes keeps one more buffer of `size` under `cap`.
fn keeps(held: u64, size: u64, cap: u64) -> bool {
    held.saturating_add(size) <= cap
}

/// How a preemption request writes the flag while the kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlagWrite {
    /// `cuStreamWriteValue32` on the engine's own non-blocking signal stream (after an event
    /// wait that orders it behind the launch's flag clear): executed by the GPU's front end,
    /// never queued behind the kernel nor waiting for an SM.
    #[default]
    WriteValue,
    /// A synchronous 4-byte `cuMemcpyHtoD` on the legacy stream (job streams are
    /// non-blocking, so it does not wait for the kernel).
    Memcpy,
    /// As `WriteValue`, on a signal stream of the context's greatest priority, and without
    /// the event wait when the launch's flag clear has already completed (`cuEventQuery`).
    WriteValuePriority,
    /// The flag is a host-pinned, device-mapped word (`ckpath::HostFlags`): cleared and
    /// raised by plain CPU stores, no driver call at all; the kernel's polls read it across
    /// PCIe (a round trip each, hidden by the software-pipelined poll). Falls back to a
    /// device flag raised by `cuStreamWriteValue32` when the engine's 64 words are all held.
    HostMapped,
    /// The write is enqueued *at launch* (after the kernel, so that a stream sharing a
    /// hardware queue with the job stream never holds the kernel back) on a stream of the
    /// job's own, gated by a `cuStreamWaitValue32` (`EQ` the launch's fresh value) on a
    /// host-pinned word: the GPU's front end waits on the word and writes the device flag
    /// when a request stores the value (no driver call at request time, and the kernel still
    /// polls device memory), then stores the value into the slot's `AT_ARMED` word. A launch
    /// that ends unrequested opens the gate itself and waits for that word (bounded, then
    /// `cuStreamSynchronize`) before its buffer is reused. A request the kernel has not acted
    /// on after `notice::LATE_AFTER` is written again by the driver (logged). Falls back to
    /// `WriteValue` without a free word or without `cuStreamWaitValue32_v2`.
    Armed,
}

impl std::fmt::Display for FlagWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlagWrite::WriteValue => "write-value",
            FlagWrite::Memcpy => "memcpy",
            FlagWrite::WriteValuePriority => "write-value-priority",
            FlagWrite::HostMapped => "host-mapped",
            FlagWrite::Armed => "armed",
        })
    }
}

impl std::str::FromStr for FlagWrite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write-value" => Ok(FlagWrite::WriteValue),
            "memcpy" => Ok(FlagWrite::Memcpy),
            "write-value-priority" => Ok(FlagWrite::WriteValuePriority),
            "host-mapped" => Ok(FlagWrite::HostMapped),
            "armed" => Ok(FlagWrite::Armed),
            o => Err(format!(
                "unknown flag write {o:?} (write-value|write-value-priority|host-mapped|armed|memcpy)"
            )),
        }
    }
}

/// Idle buffers.
#[derive(Debug)]
pub struct Pool {
    ctx: Ctx,
    /// (device pointer, size, whether its header may be non-zero: `DevBuf::flag_raised` or
    /// `DevBuf::mirror_set`; a buffer taken has both set from it, so its first launch clears
    /// the header, flag and mirror address together).
    idle: Mutex<Vec<(u64, u64, bool)>>,
    /// Idle bytes kept ([`idle_cap`]).
    max_idle: u64,
    /// Buffers allocated so far.
    pub allocs: AtomicU64,
}

impl Pool {
    /// A pool for save areas of at most `max_area` bytes.
    pub fn new(ctx: Ctx, max_area: u64) -> Arc<Pool> {
        Arc::new(Pool {
            ctx,
            idle: Mutex::new(Vec::new()),
            max_idle: idle_cap(max_area),
            allocs: AtomicU64::new(0),
        })
    }

    /// Whether an idle buffer would serve `take(area)`.
    pub fn has_idle(&self, area: u64) -> bool {
        let need = SAVE_OFF + area;
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.iter()
            .any(|&(_, s, _)| s >= need && s <= need.saturating_mul(2).max(64 << 10))
    }

    /// Whether a new buffer for `take(area)` would be kept idle once given back (the pool
    /// holds at most [`idle_cap`]): else preparing one is pointless.
    pub fn would_keep(&self, area: u64) -> bool {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let held = idle.iter().map(|&(_, s, _)| s).sum::<u64>();
        keeps(held, buffer_bytes(area), self.max_idle)
    }

    /// A zeroed buffer of at least `SAVE_OFF + area` bytes.
    pub fn take(self: &Arc<Pool>, area: u64) -> Result<DevBuf, DrvError> {
        let need = SAVE_OFF + area;
        {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let best = idle
                .iter()
                .enumerate()
                .filter(|(_, (_, s, _))| *s >= need && *s <= need.saturating_mul(2).max(64 << 10))
                .min_by_key(|(_, (_, s, _))| *s)
                .map(|(i, _)| i);
            if let Some(i) = best {
                let (ptr, size, dirty) = idle.swap_remove(i);
                return Ok(DevBuf {
                    ptr,
                    size,
                    clean: false,
                    retired: false,
                    flag_raised: dirty,
                    mirror_set: dirty,
                    pool: self.clone(),
                });
            }
        }
        let size = buffer_bytes(area);
        let mut ptr: sys::CUdeviceptr = 0;
        self.ctx.bind()?;
        // SAFETY: out-pointer to a local; the size is bounded by the caller's limit.
        ck("cuMemAlloc_v2", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, size as usize)
        })?;
        self.allocs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the allocation just made, `size` bytes.
        if let Err(e) = ck("cuMemsetD8_v2", unsafe {
            sys::cuMemsetD8_v2(ptr, 0, size as usize)
        })
        .and_then(|_| sync_legacy())
        {
            // SAFETY: allocated above, freed once.
            unsafe { sys::cuMemFree_v2(ptr) };
            return Err(e);
        }
        Ok(DevBuf {
            ptr,
            size,
            clean: false,
            retired: false,
            flag_raised: false,
            mirror_set: false,
            pool: self.clone(),
        })
    }
}

impl Pool {
    /// Non-zero bytes in the save areas of the idle buffers (every buffer the pool would hand
    /// out must be all zero): read back synchronously, for tests on a GPU.
    pub fn idle_nonzero_bytes(&self) -> Result<u64, DrvError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.ctx.bind()?;
        let mut n = 0u64;
        for (ptr, size, _) in idle {
            let mut v = vec![0u8; (size - SAVE_OFF) as usize];
            // SAFETY: an idle allocation of this pool, `size` bytes; host buffer of that length
            // minus the flag part.
            ck("cuMemcpyDtoH_v2", unsafe {
                sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), ptr + SAVE_OFF, v.len())
            })?;
            n += v.iter().filter(|&&b| b != 0).count() as u64;
        }
        Ok(n)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        for (ptr, _, _) in self
            .idle
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: an allocation of this pool, idle, freed once.
            unsafe { sys::cuMemFree_v2(ptr) };
        }
    }
}

/// One job's flag and save area in device memory.
#[derive(Debug)]
pub struct DevBuf {
    pub ptr: u64,
    pub size: u64,
    /// Set when the job completed (the area is all zero again): the buffer returns to the pool.
    pub clean: bool,
    /// Whether the flag word (offset 0) may be non-zero, or a write to it may still be
    /// pending: a request raised it (or a job's armed write ran) since the buffer was zeroed or
    /// its flag last cleared. A launch on a buffer whose flag is down enqueues no clear
    /// (`ckpt::needs_clear`); the flag is only ever written by a request (the kernel reads
    /// it), and a job whose request fired lets the write land before the buffer goes back.
    pub flag_raised: bool,
    /// Whether the header's status-mirror address (`ptx::ckpt::MIRROR_OFF`) may be non-zero:
    /// a run with a mirror wrote it there (`StatusRead::Mirror`). A later run without one
    /// writes 0 over it (or clears the header with the flag), else its kernel would store
    /// status words into another run's pinned mirror.
    pub mirror_set: bool,
    /// A job's armed flag write on it never completed ([`DevBuf::retire`]): the write may still
    /// land, so the buffer is never pooled nor freed (its memory could be handed out again),
    /// whatever job holds it later (a saved context's resumed runs included).
    pub retired: bool,
    pool: Arc<Pool>,
}

/// What becomes of a buffer dropped: kept for the next job, freed, or leaked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pool,
    Free,
    Leak,
}

/// The fate of a dropped buffer: a retired one is leaked whatever else holds; a clean one is
/// pooled when the pool `has_room` (asked only then); any other is freed.
fn fate(retired: bool, clean: bool, has_room: impl FnOnce() -> bool) -> Fate {
    if retired {
        Fate::Leak
    } else if clean && has_room() {
        Fate::Pool
    } else {
        Fate::Free
    }
}

impl DevBuf {
    /// A job's armed flag write on this buffer never completed: it may land at any time, so
    /// the buffer is never reused nor freed (leaked when dropped, logged).
    pub fn retire(&mut self) {
        self.retired = true;
    }

    /// Device address of the flag.
    pub fn flag(&self) -> u64 {
        self.ptr
    }
    /// Device address of the save area.
    pub fn area(&self) -> u64 {
        self.ptr + SAVE_OFF
    }

    /// Reads `len` bytes of the save area (synchronous).
    pub fn read_area(&self, len: u64) -> Result<Vec<u8>, DrvError> {
        let mut v = vec![0u8; len.min(self.size - SAVE_OFF) as usize];
        self.pool.ctx.bind()?;
        // SAFETY: inside the allocation; host buffer of that length.
        ck("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), self.area(), v.len())
        })?;
        Ok(v)
    }

    /// Writes the save area's first bytes (synchronous: the copy has landed when this
    /// returns). A `cuMemcpyHtoD` from pageable memory returns once the bytes are staged,
    /// before its DMA lands, and the job stream the next kernel runs on does not wait for the
    /// legacy stream: without the wait, an escalated restarting launch's resume kernel could
    /// read the still-zero (all done) status words, every thread return at once, and the
    /// launch complete with its output never written (issue 23, `preempt=auto` under vgpud).
    pub fn write_area(&self, data: &[u8]) -> Result<(), DrvError> {
        if data.len() as u64 > self.size - SAVE_OFF {
            return Err(DrvError {
                call: "save area write",
                code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            });
        }
        self.pool.ctx.bind()?;
        // SAFETY: inside the allocation; host buffer of that length.
        ck("cuMemcpyHtoD_v2", unsafe {
            sys::cuMemcpyHtoD_v2(self.area(), data.as_ptr().cast(), data.len())
        })
        .and_then(|_| sync_legacy())
    }

    /// Zeroes the save area's first `len` bytes (synchronous: `cuMemsetD8` on device memory
    /// returns before it runs, so the legacy stream is waited for; a late memset would zero
    /// the status words the buffer's next job wrote) and marks the buffer clean, so that it
    /// goes back to the pool; on an error it stays dirty (freed when dropped).
    pub fn scrub(&mut self, len: u64) -> Result<(), DrvError> {
        let len = len.min(self.size - SAVE_OFF);
        self.pool.ctx.bind()?;
        // SAFETY: the first `len` bytes of the area lie inside the allocation (clamped above).
        ck("cuMemsetD8_v2", unsafe {
            sys::cuMemsetD8_v2(self.area(), 0, len as usize)
        })?;
        sync_legacy()?;
        self.clean = true;
        Ok(())
    }

    /// The status words of `threads` records of `stride` bytes (one strided copy).
    pub fn statuses(&self, threads: u64, stride: u32) -> Result<Vec<u32>, DrvError> {
        let mut v = vec![0u32; threads as usize];
        if threads == 0 {
            return Ok(v);
        }
        self.pool.ctx.bind()?;
        // Every field spelled out: all-zero is NOT a valid CUDA_MEMCPY2D (its memory-type enums
        // have no zero variant; `mem::zeroed` aborts the process).
        let c = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: self.area(),
            srcArray: std::ptr::null_mut(),
            srcPitch: stride as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            dstHost: v.as_mut_ptr().cast(),
            dstDevice: 0,
            dstArray: std::ptr::null_mut(),
            dstPitch: 4,
            WidthInBytes: 4,
            Height: threads as usize,
        };
        // SAFETY: `threads` records of `stride` bytes lie in the area (the caller sized it with
        // the plan); the host buffer holds `threads` words.
        ck("cuMemcpy2D_v2", unsafe { sys::cuMemcpy2D_v2(&c) })?;
        Ok(v)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
        let room = || {
            let held: u64 = idle.iter().map(|&(_, s, _)| s).sum();
            keeps(held, self.size, self.pool.max_idle)
        };
        match fate(self.retired, self.clean, room) {
            Fate::Pool => {
                idle.push((self.ptr, self.size, self.flag_raised || self.mirror_set));
                return;
            }
            Fate::Leak => {
                log::warn!(
                    "cuda: checkpoint buffer of {} bytes at {:#x} leaked: an armed flag write on                      it never completed",
                    self.size,
                    self.ptr
                );
                return;
            }
            Fate::Free => drop(idle),
        }
        if self.pool.ctx.bind().is_ok() {
            // SAFETY: an allocation of the pool, not idle, freed once.
            unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// The engine's signal stream (flag writes of the `WriteValue` method) and whether the driver
/// has `cuStreamWriteValue32_v2` (looked up when the stream is made, not at engine creation, so
/// that a driver without it only loses this method: `Memcpy` is used instead).
#[derive(Debug)]
pub struct Signal(pub Stream, pub bool);

/// Whether libcuda exports `cuStreamWriteValue32_v2` (cudarc panics on a missing symbol).
pub fn has_write_value() -> bool {
    // SAFETY: the library is loaded (the engine exists); a look-up calls nothing.
    unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(b"cuStreamWriteValue32_v2")
            .is_ok()
    }
}

// SAFETY: stream handles are usable from any thread with the context current; the driver
// serialises the enqueues of a stream.
unsafe impl Sync for Signal {}

/// Raw handles a preemption hook uses (called from the requesting thread).
#[derive(Clone, Copy)]
pub struct FlagHook {
    pub ctx: Ctx,
    pub flag: u64,
    /// Recorded on the job stream after the flag was cleared; null when the launch enqueued no
    /// clear (its buffer's flag was down: `DevBuf::flag_raised`), so a write waits for nothing.
    pub cleared: sys::CUevent,
    pub signal: sys::CUstream,
    pub method: FlagWrite,
    /// Recorded behind the flag write (timing the breakdown's `write_to_end_gpu_us`).
    pub done: sys::CUevent,
    /// The host word of `HostMapped` (the kernel's flag) and of `Armed` (the gate).
    pub host: Option<super::ckpath::HostWord>,
    /// What a request stores to `host`: 1 (`HostMapped`), the launch's value (`Armed`).
    pub host_value: u32,
    /// `Armed`: the gate word's device address.
    pub gate: u64,
    /// `Armed`: device address of the word the armed write's completion stores
    /// `host_value` to.
    pub armed_done: u64,
    /// `Armed`: the engine's signal stream, for the driver's write of a late request.
    pub fallback: sys::CUstream,
}

// SAFETY: CUDA handles usable from any thread with the context current; the events outlive
// every call of the hook (the job gives them back only after removing the hook).
unsafe impl Send for FlagHook {}
// SAFETY: as above.
unsafe impl Sync for FlagHook {}

impl FlagHook {
    /// Makes `stream`'s next work wait for the launch's flag clear, if it enqueued one.
    fn after_clear(&self, stream: sys::CUstream) -> Result<(), super::driver::DrvError> {
        if self.cleared.is_null() {
            return Ok(());
        }
        // SAFETY: live stream and event (recorded by the launch before the hook was attached).
        ck("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream, self.cleared, 0)
        })
    }

    /// `Armed`: enqueues the gated flag write on `signal` (the job's own stream), behind the
    /// flag's clear, with `done` and the completion word behind it.
    pub fn arm(&self) -> Result<(), super::driver::DrvError> {
        self.after_clear(self.signal)?;
        // SAFETY: live streams and events; `gate` and `armed_done` are words of a pinned slot
        // and `flag` the job's device buffer, all held until the completion word came (or the
        // stream was synchronised) after the kernel.
        unsafe {
            ck(
                "cuStreamWaitValue32_v2",
                sys::cuStreamWaitValue32_v2(
                    self.signal,
                    self.gate,
                    self.host_value,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
                ),
            )?;
            ck(
                "cuStreamWriteValue32_v2",
                sys::cuStreamWriteValue32_v2(self.signal, self.flag, 1, 0),
            )?;
            ck("cuEventRecord", sys::cuEventRecord(self.done, self.signal))?;
            ck(
                "cuStreamWriteValue32_v2",
                sys::cuStreamWriteValue32_v2(self.signal, self.armed_done, self.host_value, 0),
            )
        }
    }

    /// `Armed`, a request not acted on in time: the flag written by the driver on the
    /// engine's signal stream (after the clear), as `WriteValue` does.
    pub fn fire_driver(&self) {
        if self.ctx.bind().is_err() {
            return;
        }
        let r = self.after_clear(self.fallback).and_then(|_| {
            // SAFETY: live stream; `flag` is the job's device buffer, alive while the hook is
            // attached (the job synchronises this stream after a late request).
            ck("cuStreamWriteValue32_v2", unsafe {
                sys::cuStreamWriteValue32_v2(self.fallback, self.flag, 1, 0)
            })
        });
        if let Err(e) = r {
            log::warn!("cuda: the driver's write of a late armed flag failed: {e}");
        }
    }

    /// Raises the flag, ordered after the launch's clear.
    pub fn fire(&self) {
        if let Some(w) = self.host {
            // Cleared by the launching thread before the launch (and the hook attached):
            // program order. `Armed`: the gate opens, the front end writes the flag.
            w.store(self.host_value);
            return;
        }
        if self.ctx.bind().is_err() {
            return;
        }
        let r = match self.method {
            // SAFETY: live stream and events; `flag` is the job's device buffer, alive while
            // the hook is attached.
            FlagWrite::WriteValuePriority | FlagWrite::HostMapped | FlagWrite::Armed => unsafe {
                let waited = if self.cleared.is_null()
                    || sys::cuEventQuery(self.cleared) == sys::CUresult::CUDA_SUCCESS
                {
                    Ok(())
                } else {
                    self.after_clear(self.signal)
                };
                waited.and_then(|_| {
                    ck(
                        "cuStreamWriteValue32_v2",
                        sys::cuStreamWriteValue32_v2(self.signal, self.flag, 1, 0),
                    )
                })
            },
            // SAFETY: live stream and event; `flag` is the job's device buffer, alive while
            // the hook is attached.
            FlagWrite::WriteValue => self.after_clear(self.signal).and_then(|_| {
                // SAFETY: live stream; `flag` is the job's device buffer, alive while the
                // hook is attached.
                ck("cuStreamWriteValue32_v2", unsafe {
                    sys::cuStreamWriteValue32_v2(self.signal, self.flag, 1, 0)
                })
            }),
            FlagWrite::Memcpy => {
                let one = 1u32;
                let cleared = if self.cleared.is_null() {
                    Ok(())
                } else {
                    // SAFETY: live event, recorded behind the launch's clear.
                    ck("cuEventSynchronize", unsafe {
                        sys::cuEventSynchronize(self.cleared)
                    })
                };
                cleared
                    .and_then(|_| {
                        // SAFETY: 4 bytes from a local to the job's flag.
                        ck("cuMemcpyHtoD_v2", unsafe {
                            sys::cuMemcpyHtoD_v2(self.flag, (&one as *const u32).cast(), 4)
                        })
                    })
                    // Landed before the hook returns (the job then synchronises the signal
                    // stream, not this one): a late write would raise the flag of the buffer's
                    // next job.
                    .and_then(|_| sync_legacy())
            }
        };
        let stream = match self.method {
            FlagWrite::Memcpy => std::ptr::null_mut(),
            _ => self.signal,
        };
        // SAFETY: live event (given back by the job after the hook is removed) and stream.
        let r =
            r.and_then(|_| unsafe { ck("cuEventRecord", sys::cuEventRecord(self.done, stream)) });
        if let Err(e) = r {
            log::warn!("cuda: raising the checkpoint flag failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer of the largest save area the configuration allows is kept idle, beside
    /// another of the same size (two kernels alternating, as bfs's expand and advance): with
    /// the flat 256 MiB of before, a 256 MiB area's buffer was never kept.
    #[test]
    fn the_largest_allowed_area_is_kept_beside_another() {
        let max = 256 << 20;
        let cap = idle_cap(max);
        let big = buffer_bytes(max);
        assert!(big > MAX_IDLE_BYTES, "256 MiB + its header");
        assert!(!keeps(0, big, MAX_IDLE_BYTES), "what the flat cap did");
        assert!(keeps(0, big, cap));
        assert!(keeps(big, big, cap));
        assert!(!keeps(2 * big, GRANULE, cap), "still bounded");
        // Small limits keep the old 256 MiB; absurd ones do not overflow.
        assert_eq!(idle_cap(1 << 20), MAX_IDLE_BYTES);
        assert!(idle_cap(u64::MAX) > MAX_IDLE_BYTES);
        assert_eq!(buffer_bytes(0), GRANULE);
        assert_eq!(buffer_bytes(GRANULE - SAVE_OFF), GRANULE);
        assert_eq!(buffer_bytes(GRANULE - SAVE_OFF + 1), 2 * GRANULE);
    }

    /// A retired buffer (an armed flag write on it never completed) is never pooled nor
    /// freed, even once its job completed (`clean`); others as before.
    #[test]
    fn a_retired_buffer_is_leaked_never_pooled() {
        let asked = std::cell::Cell::new(false);
        let room = || {
            asked.set(true);
            true
        };
        assert_eq!(fate(true, true, room), Fate::Leak);
        assert!(!asked.get(), "the pool is not even asked");
        assert_eq!(fate(true, false, || true), Fate::Leak);
        assert_eq!(fate(false, true, || true), Fate::Pool);
        assert_eq!(fate(false, true, || false), Fate::Free);
        assert_eq!(fate(false, false, || true), Fate::Free);
    }
}
