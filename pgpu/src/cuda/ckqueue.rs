//! `StatusRead::Queued` (issue 23): the status words of a preempted launch come back by a
//! copy the *request* enqueues on the job stream behind the kernel (`cuMemcpyDtoHAsync` into
//! pinned host memory, then an event), so the GPU copies the records the moment the last CTA
//! exits and the host, once it notices the end, waits for no further round trip. Pinned
//! buffers are pooled per engine (`cuMemAllocHost` costs far more than a preemption); the
//! same pool type holds `StatusRead::Mirror`'s status mirrors (`PinPool::take_mirror`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::driver::{Ctx, DrvError, ck};
use super::sys;

/// Pinned buffers kept idle (their sizes summed) before further ones are freed.
const MAX_IDLE_BYTES: usize = 16 << 20;

/// The engine's idle pinned buffers.
#[derive(Debug)]
pub struct PinPool {
    ctx: Ctx,
    idle: Mutex<Vec<Pinned>>,
}

/// One pinned host buffer.
#[derive(Debug)]
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// Its device address (`cuMemHostGetDevicePointer`).
    pub dev: u64,
}

// SAFETY: pinned host memory owned by whoever holds the `Pinned`; freed once (`PinPool::free`).
unsafe impl Send for Pinned {}

impl Pinned {
    /// The first `n` bytes (after the copy into them completed).
    pub fn bytes(&self, n: usize) -> &[u8] {
        // SAFETY: `ptr` holds `len` bytes (zeroed at allocation, then written by copies).
        unsafe { std::slice::from_raw_parts(self.ptr, n.min(self.len)) }
    }
}

impl PinPool {
    pub fn new(ctx: Ctx) -> PinPool {
        PinPool {
            ctx,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A buffer of at least `len` bytes (the context must be current).
    pub fn take(&self, len: usize) -> Result<Pinned, DrvError> {
        {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = idle.iter().position(|p| p.len >= len) {
                return Ok(idle.swap_remove(i));
            }
        }
        let len = len.max(1).next_multiple_of(64 << 10);
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        ck("cuMemAllocHost_v2", unsafe {
            sys::cuMemAllocHost_v2(&mut p, len)
        })?;
        // SAFETY: the allocation just made, `len` bytes.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is the pinned allocation just made; out-pointer to a local.
        let r = ck("cuMemHostGetDevicePointer_v2", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0)
        });
        let pin = Pinned {
            ptr: p.cast(),
            len,
            dev,
        };
        if let Err(e) = r {
            Self::free(pin);
            return Err(e);
        }
        Ok(pin)
    }

    /// Whether an idle buffer would serve `take(len)` (no allocation).
    pub fn has_idle(&self, len: usize) -> bool {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.iter().any(|p| p.len >= len)
    }

    /// The first `n` words, each merged with `before` (see `merge_mirror`), then zeroed (the
    /// kernel that stored them has ended).
    pub fn take_mirror(&self, p: &Pinned, n: usize, before: &[u32]) -> Vec<u32> {
        let n = n.min(p.len / 4);
        let words = p.ptr.cast::<u32>();
        (0..n)
            .map(|g| {
                // SAFETY: word `g` < len / 4 of the pinned buffer (4-aligned: allocations
                // are page-aligned); no kernel writes it any more.
                let v = unsafe { std::ptr::read_volatile(words.add(g)) };
                if v != 0 {
                    // SAFETY: as above.
                    unsafe { std::ptr::write_volatile(words.add(g), 0) };
                }
                merge_mirror(v, before.get(g).copied())
            })
            .collect()
    }

    /// Gives `p` back (no copy into it may be pending).
    pub fn give(&self, p: Pinned) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = idle.iter().map(|p| p.len).sum();
        if held + p.len <= MAX_IDLE_BYTES {
            idle.push(p);
        } else {
            drop(idle);
            Self::free(p);
        }
    }

    fn free(p: Pinned) {
        // SAFETY: a `cuMemAllocHost` buffer, freed once, no copy pending.
        unsafe { sys::cuMemFreeHost(p.ptr.cast()) };
    }
}

impl Drop for PinPool {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        for p in self
            .idle
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            Self::free(p);
        }
    }
}

/// One status from its mirror word `m` (0: the launch stored none) and the word `before` it
/// (`None`: a fresh launch, whose records started done).
pub fn merge_mirror(m: u32, before: Option<u32>) -> u32 {
    if m != 0 {
        m & !ptx::ckpt::MIRROR_MARK
    } else {
        before.unwrap_or(ptx::ckpt::STATUS_DONE)
    }
}

/// Whether the kernel is enqueued yet and whether the copy is.
#[derive(Debug, Default)]
struct QState {
    launched: bool,
    queued: bool,
}

/// One launch's queued status copy: enqueued by whichever comes second of the request and
/// the launch (the copy must follow the kernel on its stream).
#[derive(Debug)]
pub struct Queued {
    ctx: Ctx,
    stream: sys::CUstream,
    src: u64,
    dst: *mut u8,
    len: usize,
    pub event: sys::CUevent,
    st: Mutex<QState>,
}

// SAFETY: CUDA handles usable from any thread with the context current; `dst` is the pinned
// buffer the launch holds until the copy completed (`finish`).
unsafe impl Send for Queued {}
// SAFETY: as above; the state is behind a mutex.
unsafe impl Sync for Queued {}

impl Queued {
    /// `len` bytes from device address `src` into `dst` on `stream`, when asked.
    pub fn new(
        ctx: Ctx,
        stream: sys::CUstream,
        src: u64,
        dst: &Pinned,
        len: usize,
    ) -> Result<Queued, DrvError> {
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; destroyed in Drop.
        ck("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        Ok(Queued {
            ctx,
            stream,
            src,
            dst: dst.ptr,
            len: len.min(dst.len),
            event,
            st: Mutex::new(QState::default()),
        })
    }

    fn enqueue(&self) -> Result<(), DrvError> {
        self.ctx.bind()?;
        // SAFETY: `dst` is pinned and holds `len` bytes; `src` is the job's save area; the
        // stream and event are live.
        unsafe {
            ck(
                "cuMemcpyDtoHAsync_v2",
                sys::cuMemcpyDtoHAsync_v2(self.dst.cast(), self.src, self.len, self.stream),
            )?;
            ck("cuEventRecord", sys::cuEventRecord(self.event, self.stream))
        }
    }

    /// The request came: enqueue the copy if the kernel already is.
    pub fn on_request(&self) {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        if st.launched && !st.queued {
            st.queued = true;
            if let Err(e) = self.enqueue() {
                log::warn!("cuda: queuing the status copy failed: {e}");
                st.queued = false;
            }
        }
    }

    /// The kernel is enqueued: enqueue the copy if the request already came (`fired`, read
    /// under the lock: a request whose `on_request` ran before `launched` was set has set it
    /// before, so one of the two enqueues).
    pub fn on_launched(&self, fired: &AtomicBool) -> Result<(), DrvError> {
        let mut st = self.st.lock().unwrap_or_else(|e| e.into_inner());
        st.launched = true;
        if fired.load(Ordering::SeqCst) && !st.queued {
            self.enqueue()?;
            st.queued = true;
        }
        Ok(())
    }

    /// After the kernel: waits for the copy if it was enqueued; `true` if its bytes are in.
    pub fn finish(&self) -> Result<bool, DrvError> {
        let queued = self.st.lock().unwrap_or_else(|e| e.into_inner()).queued;
        if queued {
            // SAFETY: live event, recorded.
            ck("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(self.event)
            })?;
        }
        Ok(queued)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; `finish` waited for any recorded use.
        unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}

#[cfg(test)]
mod tests {
    use super::merge_mirror;
    use ptx::ckpt::{MIRROR_MARK, STATUS_DONE, STATUS_NOT_STARTED};

    #[test]
    fn mirror_words_replace_the_status_before_and_unstored_ones_keep_it() {
        // Stored this launch: the word without its mark, whatever was before.
        assert_eq!(merge_mirror(MIRROR_MARK | 5, Some(7)), 5);
        assert_eq!(
            merge_mirror(MIRROR_MARK | STATUS_DONE, Some(9)),
            STATUS_DONE
        );
        assert_eq!(
            merge_mirror(MIRROR_MARK | STATUS_NOT_STARTED, None),
            STATUS_NOT_STARTED
        );
        // Not stored: the status before a resumed launch, done for a fresh one.
        assert_eq!(merge_mirror(0, Some(4)), 4);
        assert_eq!(merge_mirror(0, None), STATUS_DONE);
    }
}
