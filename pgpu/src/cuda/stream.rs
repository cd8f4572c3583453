//! A job stream: a non-blocking CUDA stream (so the hypervisor's synchronous copies on the legacy
//! stream do not wait for kernels) with a pair of events that time each sub-launch and an origin
//! event that marks the start of an `execute`/`resume` call (for its GPU time).

use std::time::Duration;

use super::sys;

use super::driver::{DrvError, ck};

/// A stream and its timing events.
#[derive(Debug)]
pub struct Stream {
    pub stream: sys::CUstream,
    start: sys::CUevent,
    end: sys::CUevent,
    origin: sys::CUevent,
}

// SAFETY: stream and event handles are usable from any thread with the context current; a
// stream is used by one job at a time (taken from the engine's pool).
unsafe impl Send for Stream {}

impl Stream {
    /// Creates a stream and its events (the context must be current).
    pub fn new() -> Result<Stream, DrvError> {
        Self::with_priority(false)
    }

    /// As [`Stream::new`], at the context's greatest stream priority when `high` (the GPU's
    /// front end picks work of higher-priority streams first).
    pub fn with_priority(high: bool) -> Result<Stream, DrvError> {
        let mut s = Stream {
            stream: std::ptr::null_mut(),
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
            origin: std::ptr::null_mut(),
        };
        // SAFETY: out-pointers to fields; each handle is destroyed once in Drop when non-null.
        unsafe {
            let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
            if high {
                let (mut least, mut greatest) = (0, 0);
                ck(
                    "cuCtxGetStreamPriorityRange",
                    sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
                )?;
                ck(
                    "cuStreamCreateWithPriority",
                    sys::cuStreamCreateWithPriority(&mut s.stream, flags, greatest),
                )?;
            } else {
                ck("cuStreamCreate", sys::cuStreamCreate(&mut s.stream, flags))?;
            }
            ck("cuEventCreate", sys::cuEventCreate(&mut s.start, 0))?;
            ck("cuEventCreate", sys::cuEventCreate(&mut s.end, 0))?;
            ck("cuEventCreate", sys::cuEventCreate(&mut s.origin, 0))?;
        }
        Ok(s)
    }

    /// Records the start event.
    pub fn mark_start(&self) -> Result<(), DrvError> {
        // SAFETY: live event and stream.
        ck("cuEventRecord", unsafe {
            sys::cuEventRecord(self.start, self.stream)
        })
    }

    /// Records the end event (after the work to time).
    pub fn mark_end(&self) -> Result<(), DrvError> {
        // SAFETY: live event and stream.
        ck("cuEventRecord", unsafe {
            sys::cuEventRecord(self.end, self.stream)
        })
    }

    /// Records the origin event (start of a call).
    pub fn mark_origin(&self) -> Result<(), DrvError> {
        // SAFETY: live event and stream.
        ck("cuEventRecord", unsafe {
            sys::cuEventRecord(self.origin, self.stream)
        })
    }

    /// Whether the end event has completed (without waiting).
    pub fn end_done(&self) -> Result<bool, DrvError> {
        // SAFETY: live event.
        let r = unsafe { sys::cuEventQuery(self.end) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            super::driver::count_call();
            return Ok(false);
        }
        ck("cuEventQuery", r).map(|_| true)
    }

    /// Waits for the end event.
    pub fn sync_end(&self) -> Result<(), DrvError> {
        // SAFETY: live event.
        ck("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.end)
        })
    }

    /// Time from the start event to the end event (both completed).
    pub fn start_to_end(&self) -> Result<Duration, DrvError> {
        // SAFETY: live events.
        unsafe { elapsed(self.start, self.end) }
    }

    /// Waits for the end event; returns the time from the start event to it.
    pub fn wait_end(&self) -> Result<Duration, DrvError> {
        // SAFETY: live events; out-pointer to a local.
        unsafe {
            ck("cuEventSynchronize", sys::cuEventSynchronize(self.end))?;
            elapsed(self.start, self.end)
        }
    }

    /// Time from the start event to `ev` (both completed; `ev` may be another stream's).
    pub fn start_to(&self, ev: sys::CUevent) -> Result<Duration, DrvError> {
        // SAFETY: live events of one context.
        unsafe { elapsed(self.start, ev) }
    }

    /// Time from `ev` to the end event (both completed; signed: `ev` may come after it).
    pub fn to_end_signed_us(&self, ev: sys::CUevent) -> Result<f64, DrvError> {
        let mut ms = 0f32;
        // SAFETY: live events of one context; out-pointer to a local.
        ck("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, ev, self.end)
        })?;
        Ok(f64::from(ms) * 1e3)
    }

    /// Time from this stream's origin event to `other`'s end event (both completed).
    pub fn origin_to_end(&self, other: &Stream) -> Result<Duration, DrvError> {
        // SAFETY: live events of one context.
        unsafe { elapsed(self.origin, other.end) }
    }
}

/// # Safety
/// Both events are live and completed.
unsafe fn elapsed(a: sys::CUevent, b: sys::CUevent) -> Result<Duration, DrvError> {
    let mut ms = 0f32;
    // SAFETY: live events (caller); out-pointer to a local.
    ck("cuEventElapsedTime", unsafe {
        sys::cuEventElapsedTime_v2(&mut ms, a, b)
    })?;
    Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: handles created in `new`, destroyed once.
        unsafe {
            if !self.start.is_null() {
                sys::cuEventDestroy_v2(self.start);
            }
            if !self.end.is_null() {
                sys::cuEventDestroy_v2(self.end);
            }
            if !self.origin.is_null() {
                sys::cuEventDestroy_v2(self.origin);
            }
            if !self.stream.is_null() {
                sys::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}
