//! Streams and events. A context has one in-order queue (the device's); every stream of it is
//! that queue, so `cuStreamWaitEvent` holds by construction and a stream's work is done when
//! the queue has reached the point where it was issued. Events are device markers.

use std::ffi::{c_float, c_int, c_uint, c_void};
use std::time::Instant;

use super::{Handle, check_flags, ffi, handle, key, out};
use crate::result::*;
use crate::state::{EventRec, try_with as with};
use crate::stats;

fn create_stream(ph: *mut Handle, flags: c_uint) -> Result<(), CUresult> {
    if ph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_flags(flags, CU_STREAM_NON_BLOCKING)?;
    let h = with(|g| {
        let (c, _) = g.cur()?;
        let h = g.handle();
        g.streams.insert(h, c);
        g.stream_flags.insert(h, flags);
        Ok(h)
    })?;
    // SAFETY: checked not null; the caller's out-pointer.
    unsafe { out(ph, handle(h)) }
}

/// # Safety
/// `ph` must be valid for a write of a `CUstream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    ffi("cuStreamCreate", || create_stream(ph, flags))
}

/// Priorities are accepted (all streams are the one queue).
///
/// # Safety
/// `ph` must be valid for a write of a `CUstream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut Handle,
    flags: c_uint,
    _priority: c_int,
) -> CUresult {
    ffi("cuStreamCreateWithPriority", || create_stream(ph, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(s: Handle) -> CUresult {
    ffi("cuStreamDestroy_v2", || {
        with(|g| {
            g.stream_flags.remove(&key(s));
            g.streams
                .remove(&key(s))
                .map(|_| ())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy(s: Handle) -> CUresult {
    cuStreamDestroy_v2(s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(s: Handle) -> CUresult {
    ffi("cuStreamSynchronize", || {
        let t = Instant::now();
        with(|g| super::device::sync_ctx(g.stream_ctx(key(s))?.1))?;
        stats::call("cuStreamSynchronize", 0, t, None);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(s: Handle) -> CUresult {
    ffi("cuStreamQuery", || {
        let done = with(|g| {
            let (_, ctx) = g.stream_ctx(key(s))?;
            let m = ctx.dev_call(|d| d.marker())?;
            ctx.dev_call(|d| d.query(m))
        })?;
        if done {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

/// Holds by construction (one in-order queue per context); checks the handles.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(s: Handle, ev: Handle, _flags: c_uint) -> CUresult {
    ffi("cuStreamWaitEvent", || {
        with(|g| {
            if !g.events.contains_key(&key(ev)) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            g.stream_ctx(key(s)).map(|_| ())
        })
    })
}

/// # Safety
/// `priority` must be valid for a write of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(s: Handle, priority: *mut c_int) -> CUresult {
    ffi("cuStreamGetPriority", || {
        with(|g| g.stream_ctx(key(s)).map(|_| ()))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(priority, 0) }
    })
}

/// # Safety
/// `flags` must be valid for a write of an `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(s: Handle, flags: *mut c_uint) -> CUresult {
    ffi("cuStreamGetFlags", || {
        let f = with(|g| {
            g.stream_ctx(key(s))?;
            Ok(g.stream_flags.get(&key(s)).copied().unwrap_or(0))
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(flags, f) }
    })
}

/// # Safety
/// `pctx` must be valid for a write of a `CUcontext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx(s: Handle, pctx: *mut Handle) -> CUresult {
    ffi("cuStreamGetCtx", || {
        let c = with(|g| g.stream_ctx(key(s)).map(|(c, _)| c))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pctx, handle(c)) }
    })
}

/// `void (*)(CUstream, CUresult, void *)`.
pub type StreamCallback = Option<unsafe extern "C" fn(Handle, CUresult, *mut c_void)>;
/// `void (*)(void *)`.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// Runs the callback once the stream's earlier work is done: right away, after draining the
/// queue, on the calling thread (outside the library's lock, so it may call the API, which a
/// real driver forbids anyway).
///
/// # Safety
/// `cb` must be a function callable with these arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback(
    s: Handle,
    cb: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    ffi("cuStreamAddCallback", || {
        let cb = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let status = match with(|g| super::device::sync_ctx(g.stream_ctx(key(s))?.1)) {
            Ok(()) => CUDA_SUCCESS,
            Err(e) => e,
        };
        // SAFETY: the program's callback with its own data.
        unsafe { cb(s, status, data) };
        Ok(())
    })
}

/// As [`cuStreamAddCallback`].
///
/// # Safety
/// `f` must be a function callable with `data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(s: Handle, f: HostFn, data: *mut c_void) -> CUresult {
    ffi("cuLaunchHostFunc", || {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        with(|g| super::device::sync_ctx(g.stream_ctx(key(s))?.1))?;
        // SAFETY: the program's function with its own data.
        unsafe { f(data) };
        Ok(())
    })
}

/// # Safety
/// `ph` must be valid for a write of a `CUevent`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    ffi("cuEventCreate", || {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_flags(
            flags,
            CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS,
        )?;
        if flags & CU_EVENT_INTERPROCESS != 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let h = with(|g| {
            let (c, _) = g.cur()?;
            let h = g.handle();
            g.events.insert(
                h,
                EventRec {
                    ctx: c,
                    flags,
                    marker: None,
                },
            );
            Ok(h)
        })?;
        // SAFETY: checked not null; the caller's out-pointer.
        unsafe { out(ph, handle(h)) }
    })
}

fn record(ev: Handle, s: Handle) -> Result<(), CUresult> {
    with(|g| {
        let ectx = g.events.get(&key(ev)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.ctx;
        let (sctx, ctx) = g.stream_ctx(key(s))?;
        if sctx != ectx {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let m = ctx.dev_call(|d| d.marker())?;
        if let Some(e) = g.events.get_mut(&key(ev)) {
            e.marker = Some(m);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(ev: Handle, s: Handle) -> CUresult {
    ffi("cuEventRecord", || record(ev, s))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(ev: Handle, s: Handle, flags: c_uint) -> CUresult {
    ffi("cuEventRecordWithFlags", || {
        // CU_EVENT_RECORD_DEFAULT 0, CU_EVENT_RECORD_EXTERNAL 1 (graphs only).
        check_flags(flags, 1)?;
        record(ev, s)
    })
}

/// Runs `f` on an event's context and marker (`None`: never recorded).
fn with_event<T>(
    ev: Handle,
    f: impl FnOnce(&mut crate::state::Ctx, Option<crate::device::Marker>, u32) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    with(|g| {
        let e = g.events.get(&key(ev)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let (c, m, fl) = (e.ctx, e.marker, e.flags);
        let (_, ctx) = g.ctx(c)?;
        f(ctx, m, fl)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(ev: Handle) -> CUresult {
    ffi("cuEventQuery", || {
        let done = with_event(ev, |ctx, m, _| match m {
            Some(m) => ctx.dev_call(|d| d.query(m)),
            None => Ok(true),
        })?;
        if done {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(ev: Handle) -> CUresult {
    ffi("cuEventSynchronize", || {
        let t = Instant::now();
        with_event(ev, |ctx, m, _| match m {
            Some(m) => {
                let r = ctx.dev_call(|d| d.wait(m));
                stats::kernels_done();
                r
            }
            None => Ok(()),
        })?;
        stats::call("cuEventSynchronize", 0, t, None);
        Ok(())
    })
}

/// # Safety
/// `ms` must be valid for a write of a `float`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut c_float,
    start: Handle,
    end: Handle,
) -> CUresult {
    ffi("cuEventElapsedTime_v2", || {
        if ms.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let time = |ev: Handle| {
            with_event(ev, |ctx, m, flags| {
                if flags & CU_EVENT_DISABLE_TIMING != 0 {
                    return Err(CUDA_ERROR_INVALID_HANDLE);
                }
                let m = m.ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                if !ctx.dev_call(|d| d.query(m))? {
                    return Err(CUDA_ERROR_NOT_READY);
                }
                ctx.dev_call(|d| d.marker_time_ns(m))
            })
        };
        let (a, b) = (time(start)?, time(end)?);
        let v = (b as f64 - a as f64) / 1e6;
        // SAFETY: checked not null; the caller's out-pointer.
        unsafe { out(ms, v as c_float) }
    })
}

/// # Safety
/// As [`cuEventElapsedTime_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut c_float,
    start: Handle,
    end: Handle,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime_v2(ms, start, end) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(ev: Handle) -> CUresult {
    ffi("cuEventDestroy_v2", || {
        with(|g| {
            g.events
                .remove(&key(ev))
                .map(|_| ())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(ev: Handle) -> CUresult {
    cuEventDestroy_v2(ev)
}
