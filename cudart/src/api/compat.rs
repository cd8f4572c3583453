//! Functions real programs and libraries (Thrust/CUB, older samples) call that have a simple,
//! correct equivalent over what the runtime already does: stream-ordered allocation as
//! synchronise-then-allocate, stream callbacks as host functions, prefetch/advice hints as
//! no-ops, peer copies on one device, no stream capture.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::memory::{D2D, copy};
use super::per_thread;
use crate::context::{self, MemKind, check_stream};
use crate::driver::{DevPtr, Handle};
use crate::error::*;
use crate::ffi::Out;
use crate::gen_structs::attr::{PCI_BUS_ID, PCI_DEVICE_ID, PCI_DOMAIN_ID};

fn sync(stream: Handle) -> Res {
    let d = context::ctx()?;
    // SAFETY: a checked stream.
    cu(unsafe { d.stream_synchronize(check_stream(stream)?) })
}

fn malloc_async(ptr: Out<*mut c_void>, size: usize, stream: Handle) -> Res {
    sync(stream)?;
    let d = context::ctx()?;
    if ptr.is_null() {
        return fail(INVALID_VALUE);
    }
    let mut p: DevPtr = 0;
    if size > 0 {
        // SAFETY: `p` receives the address.
        cu(unsafe { d.mem_alloc(&mut p, size) })?;
        context::add_alloc(p, size as u64, MemKind::Device);
    }
    ptr.set(p as *mut c_void)
}

fn free_async(p: *mut c_void, stream: Handle) -> Res {
    sync(stream)?;
    let d = context::ctx()?;
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: the driver checks that the address is an allocation's start.
    cu(unsafe { d.mem_free(p as DevPtr) })?;
    context::remove_alloc(p as u64);
    Ok(())
}

crate::error::api! {
    /// `cudaMallocAsync`: the stream's earlier work done, then an ordinary allocation.
    fn cudaMallocAsync(ptr: Out<*mut c_void>, size: usize, stream: Handle) { malloc_async(ptr, size, stream) }
}

crate::error::api! {
    /// `cudaMallocAsync` with the per-thread default stream.
    fn cudaMallocAsync_ptsz(ptr: Out<*mut c_void>, size: usize, stream: Handle) {
        malloc_async(ptr, size, per_thread(stream))
    }
}

crate::error::api! {
    /// `cudaFreeAsync`: the stream's earlier work done, then an ordinary free.
    fn cudaFreeAsync(p: *mut c_void, stream: Handle) { free_async(p, stream) }
}

crate::error::api! {
    /// `cudaFreeAsync` with the per-thread default stream.
    fn cudaFreeAsync_ptsz(p: *mut c_void, stream: Handle) { free_async(p, per_thread(stream)) }
}

/// `cudaStreamCallback_t`.
type StreamCallback = Option<unsafe extern "C" fn(Handle, c_int, *mut c_void)>;

/// What a stream callback's host function carries.
struct Callback {
    f: unsafe extern "C" fn(Handle, c_int, *mut c_void),
    stream: Handle,
    data: *mut c_void,
}

unsafe extern "C" fn run_callback(p: *mut c_void) {
    // SAFETY: `p` is the Box<Callback> leaked by `add_callback`, run exactly once by the driver.
    let cb = unsafe { Box::from_raw(p.cast::<Callback>()) };
    // SAFETY: the program's callback with the arguments CUDA documents.
    unsafe { (cb.f)(cb.stream, SUCCESS, cb.data) };
}

fn add_callback(stream: Handle, f: StreamCallback, data: *mut c_void, flags: c_uint) -> Res {
    let d = context::ctx()?;
    let stream = check_stream(stream)?;
    let (Some(f), 0) = (f, flags) else {
        return fail(INVALID_VALUE);
    };
    let cb = Box::into_raw(Box::new(Callback { f, stream, data }));
    // SAFETY: the driver calls `run_callback(cb)` once, after the stream's earlier work.
    let r = cu(unsafe { d.launch_host_func(stream, Some(run_callback), cb.cast()) });
    if r.is_err() {
        // SAFETY: not handed to the driver: reclaimed here.
        drop(unsafe { Box::from_raw(cb) });
    }
    r
}

crate::error::api! {
    /// `cudaStreamAddCallback`, as a host function on the stream.
    fn cudaStreamAddCallback(stream: Handle, f: StreamCallback, data: *mut c_void, flags: c_uint) {
        add_callback(stream, f, data, flags)
    }
}

crate::error::api! {
    /// `cudaStreamAddCallback` with the per-thread default stream.
    fn cudaStreamAddCallback_ptsz(stream: Handle, f: StreamCallback, data: *mut c_void, flags: c_uint) {
        add_callback(per_thread(stream), f, data, flags)
    }
}

crate::error::api! {
    /// `cudaStreamIsCapturing`: never (this runtime has no stream capture).
    fn cudaStreamIsCapturing(stream: Handle, status: Out<c_int>) {
        context::ctx()?;
        check_stream(stream)?;
        status.set(0)
    }
}

crate::error::api! {
    /// `cudaStreamIsCapturing` with the per-thread default stream.
    fn cudaStreamIsCapturing_ptsz(stream: Handle, status: Out<c_int>) {
        context::ctx()?;
        check_stream(per_thread(stream))?;
        status.set(0)
    }
}

crate::error::api! {
    /// `cudaThreadExchangeStreamCaptureMode`: the mode is kept as it was (no capture here).
    fn cudaThreadExchangeStreamCaptureMode(mode: Out<c_int>) {
        mode.get().map(|_| ())
    }
}

crate::error::api! {
    /// `cudaMemPrefetchAsync`: a hint; nothing to move where the driver keeps managed memory.
    fn cudaMemPrefetchAsync(p: *const c_void, _count: usize, _location: u64, _flags: c_uint, stream: Handle) {
        context::ctx()?;
        check_stream(stream)?;
        if p.is_null() { fail(INVALID_VALUE) } else { Ok(()) }
    }
}

crate::error::api! {
    /// `cudaMemAdvise`: a hint, accepted.
    fn cudaMemAdvise(p: *const c_void, _count: usize, _advice: c_int, _location: u64) {
        context::ctx()?;
        if p.is_null() { fail(INVALID_VALUE) } else { Ok(()) }
    }
}

crate::error::api! {
    /// `cudaDeviceCanAccessPeer`: no peer access between devices.
    fn cudaDeviceCanAccessPeer(can: Out<c_int>, dev: c_int, peer: c_int) {
        context::check_device(dev)?;
        context::check_device(peer)?;
        can.set(0)
    }
}

fn peer_copy(
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    n: usize,
    stream: Option<Handle>,
) -> Res {
    context::check_device(dst_dev)?;
    context::check_device(src_dev)?;
    if dst_dev != src_dev {
        return fail(NOT_SUPPORTED);
    }
    let cur = context::current_device();
    context::set_device(dst_dev)?;
    let d = context::ctx()?;
    let r = stream
        .map(check_stream)
        .transpose()
        .and_then(|s| copy(d, dst as u64, src as u64, n, D2D, s));
    context::set_device(cur)?;
    r
}

crate::error::api! {
    /// `cudaMemcpyPeer`: within one device (copies between devices are not supported).
    fn cudaMemcpyPeer(dst: *mut c_void, dst_dev: c_int, src: *const c_void, src_dev: c_int, n: usize) {
        peer_copy(dst, dst_dev, src, src_dev, n, None)
    }
}

crate::error::api! {
    /// `cudaMemcpyPeerAsync`: within one device.
    fn cudaMemcpyPeerAsync(dst: *mut c_void, dst_dev: c_int, src: *const c_void, src_dev: c_int, n: usize, stream: Handle) {
        peer_copy(dst, dst_dev, src, src_dev, n, Some(stream))
    }
}

crate::error::api! {
    /// `cudaDeviceGetPCIBusId`: "domain:bus:device.0" from the driver's attributes.
    fn cudaDeviceGetPCIBusId(buf: *mut c_char, len: c_int, dev: c_int) {
        context::check_device(dev)?;
        let d = context::drv()?;
        if buf.is_null() || len <= 0 {
            return fail(INVALID_VALUE);
        }
        let get = |a| {
            let mut v = 0;
            // SAFETY: `v` receives the value.
            cu(unsafe { d.device_get_attribute(&mut v, a, dev) }).map(|_| v)
        };
        let id = format!("{:04x}:{:02x}:{:02x}.0", get(PCI_DOMAIN_ID)?, get(PCI_BUS_ID)?, get(PCI_DEVICE_ID)?);
        let n = id.len().min(len as usize - 1);
        // SAFETY: the program's buffer holds `len` bytes; `n + 1 <= len` are written.
        unsafe {
            std::ptr::copy_nonoverlapping(id.as_ptr().cast::<c_char>(), buf, n);
            *buf.add(n) = 0;
        }
        Ok(())
    }
}
