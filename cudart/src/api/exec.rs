//! Kernel execution: launches (`__cudaLaunchKernel` from nvcc's stubs, `cudaLaunchKernel`,
//! cooperative launches, host functions), kernel attributes and occupancy.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;

use super::per_thread;
use crate::context::{self, check_stream, with_registry};
use crate::driver::Handle;
use crate::error::*;
use crate::ffi::{Dim3, Out};
use crate::gen_structs::cudaFuncAttributes;

/// Launches the registered kernel whose host stub is `host`.
fn launch(
    host: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared: usize,
    stream: Handle,
    cooperative: bool,
) -> Res {
    let d = context::ctx()?;
    let stream = check_stream(stream)?;
    if host.is_null() {
        return fail(INVALID_DEVICE_FUNCTION);
    }
    if [grid.x, grid.y, grid.z, block.x, block.y, block.z].contains(&0) {
        return fail(INVALID_CONFIGURATION);
    }
    let f = context::function(d, host as usize)?;
    let shared = c_uint::try_from(shared).map_err(|_| CudaError(INVALID_VALUE))?;
    // SAFETY: `f` is a loaded kernel; `args` holds one pointer per kernel parameter (nvcc's stub
    // or the program builds it, as CUDA requires); no `extra`.
    cu(unsafe {
        if cooperative {
            d.launch_cooperative_kernel(
                f, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared, stream, args,
            )
        } else {
            d.launch_kernel(
                f,
                grid.x,
                grid.y,
                grid.z,
                block.x,
                block.y,
                block.z,
                shared,
                stream,
                args,
                std::ptr::null_mut(),
            )
        }
    })
}

crate::error::api! {
    /// The launch nvcc 13's stubs make (`kernel` from `__cudaGetKernel`).
    fn __cudaLaunchKernel(kernel: Handle, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Handle) {
        launch(kernel, grid, block, args, shared, stream, false)
    }
}

crate::error::api! {
    /// `__cudaLaunchKernel` with the per-thread default stream.
    fn __cudaLaunchKernel_ptsz(kernel: Handle, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Handle) {
        launch(kernel, grid, block, args, shared, per_thread(stream), false)
    }
}

crate::error::api! {
    /// `cudaLaunchKernel(func, grid, block, args, shared, stream)`.
    fn cudaLaunchKernel(func: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Handle) {
        launch(func, grid, block, args, shared, stream, false)
    }
}

crate::error::api! {
    /// `cudaLaunchKernel` with the per-thread default stream.
    fn cudaLaunchKernel_ptsz(func: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Handle) {
        launch(func, grid, block, args, shared, per_thread(stream), false)
    }
}

crate::error::api! {
    /// `cudaLaunchCooperativeKernel`.
    fn cudaLaunchCooperativeKernel(func: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Handle) {
        launch(func, grid, block, args, shared, stream, true)
    }
}

crate::error::api! {
    /// `cudaLaunchCooperativeKernel` with the per-thread default stream.
    fn cudaLaunchCooperativeKernel_ptsz(func: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Handle) {
        launch(func, grid, block, args, shared, per_thread(stream), true)
    }
}

type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

fn host_func(stream: Handle, f: HostFn, data: *mut c_void) -> Res {
    let d = context::ctx()?;
    let stream = check_stream(stream)?;
    if f.is_none() {
        return fail(INVALID_VALUE);
    }
    // SAFETY: the driver calls `f(data)` later, as the program asked.
    cu(unsafe { d.launch_host_func(stream, f, data) })
}

crate::error::api! {
    /// `cudaLaunchHostFunc`.
    fn cudaLaunchHostFunc(stream: Handle, f: HostFn, data: *mut c_void) { host_func(stream, f, data) }
}

crate::error::api! {
    /// `cudaLaunchHostFunc` with the per-thread default stream.
    fn cudaLaunchHostFunc_ptsz(stream: Handle, f: HostFn, data: *mut c_void) { host_func(per_thread(stream), f, data) }
}

/// The driver's kernel for a host stub, with the context current.
fn kernel(func: *const c_void) -> Res<(&'static crate::driver::Driver, Handle)> {
    let d = context::ctx()?;
    if func.is_null() {
        return fail(INVALID_DEVICE_FUNCTION);
    }
    Ok((d, context::function(d, func as usize)?))
}

crate::error::api! {
    /// `cudaFuncGetAttributes`: each field from the driver's `cuFuncGetAttribute` (0 where the
    /// driver has no value).
    fn cudaFuncGetAttributes(attr: Out<cudaFuncAttributes>, func: *const c_void) {
        let (d, f) = kernel(func)?;
        let get = |a: c_int| {
            let mut v = 0;
            // SAFETY: `v` receives an int; `f` is a loaded kernel.
            if unsafe { d.func_get_attribute(&mut v, a, f) } == 0 { v } else { 0 }
        };
        let sz = |a| get(a).max(0) as usize;
        // SAFETY: all-zero bytes are a valid cudaFuncAttributes (integers only).
        let mut out: cudaFuncAttributes = unsafe { std::mem::zeroed() };
        out.maxThreadsPerBlock = get(0);
        out.sharedSizeBytes = sz(1);
        out.constSizeBytes = sz(2);
        out.localSizeBytes = sz(3);
        out.numRegs = get(4);
        out.ptxVersion = get(5);
        out.binaryVersion = get(6);
        out.cacheModeCA = get(7);
        out.maxDynamicSharedSizeBytes = get(8);
        out.preferredShmemCarveout = get(9);
        out.clusterDimMustBeSet = get(10);
        out.requiredClusterWidth = get(11);
        out.requiredClusterHeight = get(12);
        out.requiredClusterDepth = get(13);
        out.nonPortableClusterSizeAllowed = get(14);
        out.clusterSchedulingPolicyPreference = get(15);
        attr.set(out)
    }
}

crate::error::api! {
    /// `cudaFuncSetAttribute` (cudaFuncAttribute numbers are CUfunction_attribute's).
    fn cudaFuncSetAttribute(func: *const c_void, attr: c_int, value: c_int) {
        let (d, f) = kernel(func)?;
        // SAFETY: plain values for a loaded kernel.
        cu(unsafe { d.func_set_attribute(f, attr, value) })
    }
}

crate::error::api! {
    /// `cudaFuncSetCacheConfig`.
    fn cudaFuncSetCacheConfig(func: *const c_void, config: c_int) {
        let (d, f) = kernel(func)?;
        // SAFETY: plain values for a loaded kernel.
        cu(unsafe { d.func_set_cache_config(f, config) })
    }
}

crate::error::api! {
    /// `cudaGetFuncBySymbol`: the driver's `CUfunction` for a host stub.
    fn cudaGetFuncBySymbol(out: Out<Handle>, func: *const c_void) {
        out.set(kernel(func)?.1)
    }
}

/// Names handed out by `cudaFuncGetName` (kept for the process's life).
static NAMES: Mutex<Option<HashMap<usize, &'static std::ffi::CStr>>> = Mutex::new(None);

crate::error::api! {
    /// `cudaFuncGetName`: the kernel's device (mangled) name.
    fn cudaFuncGetName(name: Out<*const c_char>, func: *const c_void) {
        let mut g = NAMES.lock().unwrap_or_else(|e| e.into_inner());
        let map = g.get_or_insert_with(HashMap::new);
        let s = match map.get(&(func as usize)) {
            Some(s) => *s,
            None => {
                let n = with_registry(|r| r.function(func as usize).map(|f| f.name.clone()))
                    .ok_or(CudaError(INVALID_DEVICE_FUNCTION))?;
                let s: &'static std::ffi::CStr = Box::leak(n.into_boxed_c_str());
                map.insert(func as usize, s);
                s
            }
        };
        name.set(s.as_ptr())
    }
}

fn occupancy(
    n: Out<c_int>,
    func: *const c_void,
    block: c_int,
    shared: usize,
    flags: c_uint,
) -> Res {
    let (d, f) = kernel(func)?;
    let mut v = 0;
    // SAFETY: `v` receives an int; plain values for a loaded kernel.
    cu(unsafe { d.occupancy_max_active_blocks(&mut v, f, block, shared, flags) })?;
    n.set(v)
}

crate::error::api! {
    /// `cudaOccupancyMaxActiveBlocksPerMultiprocessor`.
    fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(n: Out<c_int>, func: *const c_void, block: c_int, shared: usize) {
        occupancy(n, func, block, shared, 0)
    }
}

crate::error::api! {
    /// `cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`.
    fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: Out<c_int>, func: *const c_void, block: c_int, shared: usize, flags: c_uint) {
        occupancy(n, func, block, shared, flags)
    }
}

crate::error::api! {
    /// `cudaOccupancyAvailableDynamicSMemPerBlock`.
    fn cudaOccupancyAvailableDynamicSMemPerBlock(bytes: Out<usize>, func: *const c_void, blocks: c_int, block: c_int) {
        let (d, f) = kernel(func)?;
        let mut v = 0;
        // SAFETY: `v` receives a size_t; plain values for a loaded kernel.
        cu(unsafe { d.occupancy_available_dynamic_smem(&mut v, f, blocks, block) })?;
        bytes.set(v)
    }
}
