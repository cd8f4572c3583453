//! Streams and events: created through the driver (a `cudaStream_t` is the driver's `CUstream`,
//! a `cudaEvent_t` its `CUevent`), remembered so that a handle the program never got is
//! refused with `cudaErrorInvalidResourceHandle` before it reaches the driver.

use std::ffi::{c_int, c_uint};

use super::per_thread;
use crate::context::{self, check_event, check_stream};
use crate::driver::Handle;
use crate::error::*;
use crate::ffi::Out;

fn create_stream(out: Out<Handle>, flags: c_uint, priority: Option<c_int>) -> Res {
    let d = context::ctx()?;
    if out.is_null() || flags > 1 {
        return fail(INVALID_VALUE);
    }
    let mut s: Handle = std::ptr::null_mut();
    // SAFETY: `s` receives the stream; plain values.
    cu(unsafe {
        match priority {
            Some(p) if d.has("cuStreamCreateWithPriority") => {
                d.stream_create_with_priority(&mut s, flags, p)
            }
            _ => d.stream_create(&mut s, flags),
        }
    })?;
    context::add_handle(true, s);
    out.set(s)
}

crate::error::api! {
    /// `cudaStreamCreate`.
    fn cudaStreamCreate(out: Out<Handle>) { create_stream(out, 0, None) }
}

crate::error::api! {
    /// `cudaStreamCreateWithFlags` (`cudaStreamNonBlocking` = 1, as the driver's).
    fn cudaStreamCreateWithFlags(out: Out<Handle>, flags: c_uint) { create_stream(out, flags, None) }
}

crate::error::api! {
    /// `cudaStreamCreateWithPriority`.
    fn cudaStreamCreateWithPriority(out: Out<Handle>, flags: c_uint, priority: c_int) {
        create_stream(out, flags, Some(priority))
    }
}

crate::error::api! {
    /// `cudaStreamDestroy`.
    fn cudaStreamDestroy(stream: Handle) {
        let d = context::ctx()?;
        if stream.is_null() {
            return fail(INVALID_RESOURCE_HANDLE);
        }
        context::remove_handle(true, stream)?;
        // SAFETY: a stream this runtime created.
        cu(unsafe { d.stream_destroy(stream) })
    }
}

fn sync(stream: Handle) -> Res {
    let d = context::ctx()?;
    // SAFETY: a default stream or one this runtime created.
    cu(unsafe { d.stream_synchronize(check_stream(stream)?) })
}

crate::error::api! {
    /// `cudaStreamSynchronize`.
    fn cudaStreamSynchronize(stream: Handle) { sync(stream) }
}

crate::error::api! {
    /// `cudaStreamSynchronize` with the per-thread default stream.
    fn cudaStreamSynchronize_ptsz(stream: Handle) { sync(per_thread(stream)) }
}

fn query(stream: Handle) -> Res {
    let d = context::ctx()?;
    // SAFETY: a default stream or one this runtime created.
    cu(unsafe { d.stream_query(check_stream(stream)?) })
}

crate::error::api! {
    /// `cudaStreamQuery`: `cudaErrorNotReady` while work is pending.
    fn cudaStreamQuery(stream: Handle) { query(stream) }
}

crate::error::api! {
    /// `cudaStreamQuery` with the per-thread default stream.
    fn cudaStreamQuery_ptsz(stream: Handle) { query(per_thread(stream)) }
}

fn wait_event(stream: Handle, event: Handle, flags: c_uint) -> Res {
    let d = context::ctx()?;
    let (s, e) = (check_stream(stream)?, check_event(event)?);
    // SAFETY: checked handles of this runtime.
    cu(unsafe { d.stream_wait_event(s, e, flags) })
}

crate::error::api! {
    /// `cudaStreamWaitEvent`.
    fn cudaStreamWaitEvent(stream: Handle, event: Handle, flags: c_uint) { wait_event(stream, event, flags) }
}

crate::error::api! {
    /// `cudaStreamWaitEvent` with the per-thread default stream.
    fn cudaStreamWaitEvent_ptsz(stream: Handle, event: Handle, flags: c_uint) {
        wait_event(per_thread(stream), event, flags)
    }
}

crate::error::api! {
    /// `cudaStreamGetPriority`.
    fn cudaStreamGetPriority(stream: Handle, priority: Out<c_int>) {
        let d = context::ctx()?;
        let mut p = 0;
        // SAFETY: a checked stream; `p` receives the priority.
        cu(unsafe { d.stream_get_priority(check_stream(stream)?, &mut p) })?;
        priority.set(p)
    }
}

crate::error::api! {
    /// `cudaStreamGetFlags`.
    fn cudaStreamGetFlags(stream: Handle, flags: Out<c_uint>) {
        let d = context::ctx()?;
        let mut f = 0;
        // SAFETY: a checked stream; `f` receives the flags.
        cu(unsafe { d.stream_get_flags(check_stream(stream)?, &mut f) })?;
        flags.set(f)
    }
}

crate::error::api! {
    /// `cudaDeviceGetStreamPriorityRange` (either output may be null).
    fn cudaDeviceGetStreamPriorityRange(least: Out<c_int>, greatest: Out<c_int>) {
        let d = context::ctx()?;
        let (mut l, mut g) = (0, 0);
        // SAFETY: locals receive the values.
        cu(unsafe { d.ctx_get_stream_priority_range(&mut l, &mut g) })?;
        if !least.is_null() {
            least.set(l)?;
        }
        if !greatest.is_null() {
            greatest.set(g)?;
        }
        Ok(())
    }
}

fn create_event(out: Out<Handle>, flags: c_uint) -> Res {
    let d = context::ctx()?;
    if out.is_null() || flags & !0xF != 0 {
        return fail(INVALID_VALUE);
    }
    let mut e: Handle = std::ptr::null_mut();
    // SAFETY: `e` receives the event (flags: blocking sync 1, disable timing 2, interprocess 4).
    cu(unsafe { d.event_create(&mut e, flags) })?;
    context::add_handle(false, e);
    out.set(e)
}

crate::error::api! {
    /// `cudaEventCreate`.
    fn cudaEventCreate(out: Out<Handle>) { create_event(out, 0) }
}

crate::error::api! {
    /// `cudaEventCreateWithFlags`.
    fn cudaEventCreateWithFlags(out: Out<Handle>, flags: c_uint) { create_event(out, flags) }
}

fn record(event: Handle, stream: Handle, flags: c_uint) -> Res {
    let d = context::ctx()?;
    let (e, s) = (check_event(event)?, check_stream(stream)?);
    // SAFETY: checked handles of this runtime.
    cu(unsafe {
        if flags == 0 {
            d.event_record(e, s)
        } else {
            d.event_record_with_flags(e, s, flags)
        }
    })
}

crate::error::api! {
    /// `cudaEventRecord`.
    fn cudaEventRecord(event: Handle, stream: Handle) { record(event, stream, 0) }
}

crate::error::api! {
    /// `cudaEventRecord` with the per-thread default stream.
    fn cudaEventRecord_ptsz(event: Handle, stream: Handle) { record(event, per_thread(stream), 0) }
}

crate::error::api! {
    /// `cudaEventRecordWithFlags`.
    fn cudaEventRecordWithFlags(event: Handle, stream: Handle, flags: c_uint) { record(event, stream, flags) }
}

crate::error::api! {
    /// `cudaEventRecordWithFlags` with the per-thread default stream.
    fn cudaEventRecordWithFlags_ptsz(event: Handle, stream: Handle, flags: c_uint) {
        record(event, per_thread(stream), flags)
    }
}

crate::error::api! {
    /// `cudaEventQuery`: `cudaErrorNotReady` until the recorded work is done.
    fn cudaEventQuery(event: Handle) {
        let d = context::ctx()?;
        // SAFETY: a checked event.
        cu(unsafe { d.event_query(check_event(event)?) })
    }
}

crate::error::api! {
    /// `cudaEventSynchronize`.
    fn cudaEventSynchronize(event: Handle) {
        let d = context::ctx()?;
        // SAFETY: a checked event.
        cu(unsafe { d.event_synchronize(check_event(event)?) })
    }
}

crate::error::api! {
    /// `cudaEventElapsedTime`, in milliseconds.
    fn cudaEventElapsedTime(ms: Out<f32>, start: Handle, end: Handle) {
        let d = context::ctx()?;
        let (s, e) = (check_event(start)?, check_event(end)?);
        let mut t = 0.0f32;
        // SAFETY: checked events; `t` receives the time.
        cu(unsafe {
            if d.has("cuEventElapsedTime_v2") { d.event_elapsed_time(&mut t, s, e) } else { d.event_elapsed_time_v1(&mut t, s, e) }
        })?;
        ms.set(t)
    }
}

crate::error::api! {
    /// `cudaEventDestroy`.
    fn cudaEventDestroy(event: Handle) {
        let d = context::ctx()?;
        context::remove_handle(false, event)?;
        // SAFETY: an event this runtime created.
        cu(unsafe { d.event_destroy(event) })
    }
}
