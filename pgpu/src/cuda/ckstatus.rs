//! Reading a checkpointed launch's status words on the cuda engine (`StatusRead`: a strided
//! or contiguous copy, the queued copy of `ckqueue`, the kernel's own mirror), and the raw
//! timing trace of one run that becomes its `CkBreakdown`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ckmem::DevBuf;
use super::ckpath::{CONTIGUOUS_MAX_BYTES, CkBreakdown, StatusRead, pick_statuses};
use super::ckqueue::{Pinned, Queued};
use super::engine::CudaEngine;
use super::stream::Stream;
use super::sys;
use crate::engine::EngineError;

impl CudaEngine {
    /// For a run reading by `StatusRead::Queued` (records spanning at most
    /// `CONTIGUOUS_MAX_BYTES`): the copy a request enqueues behind the kernel, and its pinned
    /// destination.
    pub(crate) fn queue_statuses(
        &self,
        buf: &DevBuf,
        stream: &Stream,
        n: u64,
        stride: u32,
        read: StatusRead,
    ) -> Result<Option<(Arc<Queued>, Pinned)>, EngineError> {
        let span = n.saturating_mul(u64::from(stride));
        if read != StatusRead::Queued || span > CONTIGUOUS_MAX_BYTES {
            return Ok(None);
        }
        let pin = self
            .ck_path
            .pins
            .take(span as usize)
            .map_err(|e| self.drv(e))?;
        match Queued::new(self.ctx, stream.stream, buf.area(), &pin, span as usize) {
            Ok(q) => Ok(Some((Arc::new(q), pin))),
            Err(e) => {
                self.ck_path.pins.give(pin);
                Err(self.drv(e))
            }
        }
    }

    /// For a run reading by `StatusRead::Mirror` (at most `CONTIGUOUS_MAX_BYTES` of words): a
    /// zeroed pinned mirror of `n` status words.
    pub(crate) fn take_mirror(
        &self,
        n: u64,
        read: StatusRead,
    ) -> Result<Option<super::ckqueue::Pinned>, EngineError> {
        let span = n.saturating_mul(4);
        if read != StatusRead::Mirror || span > CONTIGUOUS_MAX_BYTES {
            return Ok(None);
        }
        self.ck_path
            .mirrors
            .take(span as usize)
            .map(Some)
            .map_err(|e| self.drv(e))
    }

    /// The status words of `n` records, read back as the run's `read` says (`Contiguous`:
    /// one copy of the span; every other: strided).
    pub(crate) fn read_statuses(
        &self,
        buf: &DevBuf,
        n: u64,
        stride: u32,
        read: StatusRead,
    ) -> Result<Vec<u32>, EngineError> {
        let span = n.saturating_mul(u64::from(stride));
        let r = if read == StatusRead::Contiguous && span <= CONTIGUOUS_MAX_BYTES {
            buf.read_area(span)
                .map(|b| pick_statuses(&b, n as usize, stride as usize))
        } else {
            buf.statuses(n, stride)
        };
        r.map_err(|e| self.drv(e))
    }
}

/// Host instants and GPU times of one checkpointed kernel run (`CkBreakdown`'s raw form).
pub(crate) struct Trace {
    /// The hook's flag write: called, returned.
    pub(crate) fire: Option<(Instant, Instant)>,
    pub(crate) noticed: Instant,
    pub(crate) kernel: Duration,
    pub(crate) host: bool,
    pub(crate) synced: Option<Instant>,
    pub(crate) write_to_end: Option<f64>,
    /// `EndWait::Notice`: how the end was noticed (`None`: no slot, waited as `Sync`).
    pub(crate) noticed_by: Option<super::notice::Noticed>,
    /// `Armed`: the driver wrote the flag of a late request.
    pub(crate) late: bool,
    /// `Armed`: enqueuing the gated write failed (logged; the stream is synchronised).
    pub(crate) arm_failed: bool,
    /// The request came before the launch was enqueued: every thread stops at (or next to)
    /// its entry point, which shows nothing of the restart hazard (`ckpt::stalled`).
    pub(crate) early: bool,
}

impl Trace {
    pub(crate) fn breakdown(
        &self,
        path: String,
        requested: Option<Instant>,
        statuses: Instant,
        ready: Instant,
    ) -> CkBreakdown {
        let req = requested.or(self.fire.map(|f| f.0)).unwrap_or(self.noticed);
        let us = |t: Instant| t.saturating_duration_since(req).as_secs_f64() * 1e6;
        let synced = self.synced.unwrap_or(self.noticed);
        CkBreakdown {
            path,
            fire_us: self.fire.map_or(0.0, |f| us(f.1)),
            end_noticed_us: us(self.noticed),
            write_to_end_gpu_us: self.write_to_end,
            kernel_gpu_us: self.kernel.as_secs_f64() * 1e6,
            signal_sync_us: synced.saturating_duration_since(self.noticed).as_secs_f64() * 1e6,
            statuses_us: statuses.saturating_duration_since(synced).as_secs_f64() * 1e6,
            ready_us: us(ready),
        }
    }
}

/// GPU µs from the flag write's `done` event to the kernel's end; `None` if the write came
/// before the kernel started (the flag was already up) or the event was never recorded.
pub(crate) fn write_to_end(stream: &Stream, done: sys::CUevent) -> Option<f64> {
    let to_end = stream.to_end_signed_us(done).ok()?;
    let from_start = stream.start_to(done).ok();
    // `start_to` clamps at 0: a write before the start reads as 0 and counts as "before".
    match from_start {
        Some(d) if d > Duration::ZERO => Some(to_end),
        _ => None,
    }
}
