//! The request path's engine-wide resources: the signal stream (`CudaEngine::signal`), the
//! host-mapped flag words (`CudaEngine::host_flags`), and the two events a checkpointed
//! launch's request path uses — `cleared` (recorded on the job stream behind the flag's clear,
//! which a flag write waits for) and `done` (recorded behind the flag write, for the
//! breakdown's timing) — pooled per engine: a launch takes a pair and gives it back, instead
//! of `cuEventCreate` twice and `cuEventDestroy` twice per launch (issue 23's never-preempted
//! cost: about 4-6 µs of host time on each launch). A pair is reused only
//! after its launch's hook is gone and any write it was recorded behind has landed (the job
//! synchronises the signal stream when its flag was raised); a pair whose use may still be
//! pending (an error, an armed write that never completed) is destroyed or leaked, never
//! reused.

use std::sync::Mutex;

use super::ckmem::{FlagWrite, Signal};
use super::ckpath::HostFlags;
use super::driver::{DrvError, ck};
use super::engine::CudaEngine;
use super::stream::Stream;
use super::sys;
use crate::engine::EngineError;

impl CudaEngine {
    /// The engine's signal stream (flag writes of the `WriteValue` methods), made on first
    /// use.
    pub(crate) fn signal(&self) -> Result<&Signal, EngineError> {
        if let Some(s) = self.signal.get() {
            return Ok(s);
        }
        let high = self.cfg.flag_write == FlagWrite::WriteValuePriority;
        let s = Stream::with_priority(high).map_err(|e| self.drv(e))?;
        let ok = super::ckmem::has_write_value();
        if !ok {
            log::warn!(
                "cuda: no cuStreamWriteValue32_v2 in this driver: checkpoint flags by memcpy"
            );
        }
        let _ = self.signal.set(Signal(s, ok));
        self.signal
            .get()
            .ok_or_else(|| EngineError::Backend("signal stream".into()))
    }

    /// The engine's host flag words (`FlagWrite::HostMapped`), made on first use; `None`
    /// (logged once) if the driver refused the pinned page.
    pub(crate) fn host_flags(&self) -> Option<&HostFlags> {
        let r = self.ck_path.host_flags.get_or_init(|| {
            HostFlags::new(self.ctx).map_err(|e| {
                log::warn!("cuda: no host-mapped checkpoint flags ({e}): device flags instead");
                e.to_string()
            })
        });
        r.as_ref().ok()
    }
}

/// Pairs kept idle at most (one per launch running at once; more are destroyed).
const MAX_IDLE: usize = 64;

/// One launch's `cleared` and `done` events (`cleared` without timing).
#[derive(Debug)]
pub struct CkEvents {
    pub cleared: sys::CUevent,
    pub done: sys::CUevent,
}

// SAFETY: event handles are usable from any thread with the context current; a pair is used
// by one launch at a time (taken from the pool).
unsafe impl Send for CkEvents {}

impl CkEvents {
    /// Creates a pair (the context must be current).
    fn new() -> Result<CkEvents, DrvError> {
        let mut ev = CkEvents {
            cleared: std::ptr::null_mut(),
            done: std::ptr::null_mut(),
        };
        // SAFETY: out-pointers to fields; each handle is destroyed once in Drop when non-null.
        unsafe {
            ck(
                "cuEventCreate",
                sys::cuEventCreate(
                    &mut ev.cleared,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                ),
            )?;
            ck("cuEventCreate", sys::cuEventCreate(&mut ev.done, 0))?;
        }
        Ok(ev)
    }
}

impl Drop for CkEvents {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; the pair's launch no longer uses them (a
        // pending record completes first: the driver releases the event then).
        unsafe {
            for ev in [self.cleared, self.done] {
                if !ev.is_null() {
                    sys::cuEventDestroy_v2(ev);
                }
            }
        }
    }
}

/// The engine's idle pairs.
#[derive(Debug, Default)]
pub struct EventPool {
    idle: Mutex<Vec<CkEvents>>,
    /// Pairs created so far (the pool was empty).
    made: std::sync::atomic::AtomicU64,
}

impl EventPool {
    /// An idle pair, else a new one (the context must be current).
    pub fn take(&self) -> Result<CkEvents, DrvError> {
        if let Some(ev) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(ev);
        }
        let ev = CkEvents::new()?;
        self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(ev)
    }

    /// Gives a pair back for the next launch: only once nothing recorded on it is still to
    /// come from its launch (see the file's comment).
    pub fn give(&self, ev: CkEvents) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(ev);
        }
    }

    /// Pairs created so far.
    pub fn made(&self) -> u64 {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a pair is idle (a launch would create none).
    pub fn has_idle(&self) -> bool {
        !self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}
