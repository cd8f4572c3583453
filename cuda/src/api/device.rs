//! `cuInit`, the driver version, devices (one: ordinal 0), the primary context and contexts
//! with this thread's context stack.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::{CUdevice, Handle, check_device, check_flags, ffi, handle, key, out};
use crate::device::DeviceInfo;
use crate::result::*;
use crate::state::{self, try_with as with};
use crate::stats;

/// What `cuDriverGetVersion` and `cuCtxGetApiVersion` say: CUDA 13.0.
pub const DRIVER_VERSION: c_int = 13000;

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    ffi("cuInit", || {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match state::with(|g| g.initialize()) {
            CUDA_SUCCESS => Ok(()),
            e => Err(e),
        }
    })
}

/// # Safety
/// `v` must be valid for a write of an `int` (or null: `CUDA_ERROR_INVALID_VALUE`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // SAFETY: the caller's out-pointer.
    ffi("cuDriverGetVersion", || unsafe { out(v, DRIVER_VERSION) })
}

/// Runs `f` on the device's description (after `cuInit`).
fn info<T>(
    dev: CUdevice,
    f: impl FnOnce(&DeviceInfo) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    with(|g| {
        let i = g.inited()?;
        check_device(dev)?;
        f(&i.info)
    })
}

/// # Safety
/// `d` must be valid for a write of a `CUdevice`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) -> CUresult {
    ffi("cuDeviceGet", || {
        with(|g| g.inited().map(|_| ()))?;
        if d.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_device(ordinal)?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(d, 0) }
    })
}

/// # Safety
/// `n` must be valid for a write of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    ffi("cuDeviceGetCount", || {
        with(|g| g.inited().map(|_| ()))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(n, 1) }
    })
}

/// # Safety
/// `name` must be valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetName", || {
        let text = info(dev, |i| Ok(i.name.clone()))?;
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = text.len().min(len as usize - 1);
        // SAFETY: `n + 1 <= len` bytes of the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        Ok(())
    })
}

/// # Safety
/// `bytes` must be valid for a write of a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    ffi("cuDeviceTotalMem_v2", || {
        let t = info(dev, |i| Ok(i.total_mem))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(bytes, t as usize) }
    })
}

/// # Safety
/// `major`, `minor` must be valid for writes of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceComputeCapability", || {
        let (a, b) = info(dev, |i| Ok(i.compute_capability))?;
        // SAFETY: the caller's out-pointers.
        unsafe {
            out(major, a as c_int)?;
            out(minor, b as c_int)
        }
    })
}

/// The value of a device attribute (0 for features this device does not have).
pub fn attribute(i: &DeviceInfo, attrib: u32) -> Option<i64> {
    let v: i64 = match attrib {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => i.max_threads_per_block.into(),
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X => i.max_block_dim[0].into(),
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => i.max_block_dim[1].into(),
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => i.max_block_dim[2].into(),
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i.max_grid_dim[0].into(),
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y => i.max_grid_dim[1].into(),
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => i.max_grid_dim[2].into(),
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK
        | CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => i.shared_mem_per_block.into(),
        CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => i.total_constant_memory.into(),
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => i.warp_size.into(),
        CU_DEVICE_ATTRIBUTE_MAX_PITCH => i64::from(i32::MAX),
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK
        | CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => i.regs_per_block.into(),
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE => i.clock_rate_khz.into(),
        CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT => 32,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => i.multiprocessor_count.into(),
        CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY => 1,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS => 1,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => 2,
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => i.memory_clock_rate_khz.into(),
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => i.global_memory_bus_width.into(),
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => i.l2_cache_size.into(),
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => {
            i.max_threads_per_multiprocessor.into()
        }
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 1,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => i.compute_capability.0.into(),
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => i.compute_capability.1.into(),
        CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => {
            i.shared_mem_per_multiprocessor.into()
        }
        CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK => 0,
        CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED => 1,
        a if a < 256 => 0,
        _ => return None,
    };
    Some(v)
}

/// # Safety
/// `pi` must be valid for a write of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_uint,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetAttribute", || {
        let mut v = info(dev, |i| {
            attribute(i, attrib).ok_or(CUDA_ERROR_INVALID_VALUE)
        })?;
        if attrib == CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY {
            // Managed memory needs host buffers at their device address: the sim backend.
            let kind = with(|g| Ok(g.inited()?.kind))?;
            v = i64::from(kind == crate::backend::BackendKind::Sim);
        }
        // SAFETY: the caller's out-pointer.
        unsafe {
            out(
                pi,
                v.clamp(i64::from(c_int::MIN), i64::from(c_int::MAX)) as c_int,
            )
        }
    })
}

/// # Safety
/// `uuid` must be valid for 16 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut u8, dev: CUdevice) -> CUresult {
    ffi("cuDeviceGetUuid_v2", || {
        let name = info(dev, |i| Ok(i.name.clone()))?;
        if uuid.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut id = *b"vgpu-vmm-libcuda";
        for (k, b) in name.bytes().enumerate() {
            id[k % 16] ^= b;
        }
        // SAFETY: 16 bytes of the caller's buffer.
        unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), uuid, 16) };
        Ok(())
    })
}

/// # Safety
/// As [`cuDeviceGetUuid_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut u8, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

/// # Safety
/// `pctx` must be valid for a write of a `CUcontext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxRetain", || {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = with(|g| {
            g.inited()?;
            check_device(dev)?;
            let h = match g.primary.ctx {
                Some(h) => h,
                None => {
                    let flags = g.primary.flags;
                    let h = g.create_context(flags, true)?;
                    g.primary.ctx = Some(h);
                    h
                }
            };
            g.primary.refs += 1;
            Ok(h)
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pctx, handle(h)) }
    })
}

/// Destroys the primary context (release to zero, reset).
fn drop_primary(g: &mut state::Global) -> Result<(), CUresult> {
    if let Some(h) = g.primary.ctx.take() {
        let t = std::time::Instant::now();
        g.destroy_context(h)?;
        stats::call("cuDevicePrimaryCtxRelease", 0, t, Some(stats::Phase::Close));
    }
    g.primary.refs = 0;
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxRelease_v2", || {
        with(|g| {
            g.inited()?;
            check_device(dev)?;
            if g.primary.refs == 0 {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            g.primary.refs -= 1;
            if g.primary.refs == 0 {
                drop_primary(g)?;
            }
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    ffi("cuDevicePrimaryCtxReset_v2", || {
        with(|g| {
            g.inited()?;
            check_device(dev)?;
            drop_primary(g)
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxReset_v2(dev)
}

/// # Safety
/// `flags`, `active` must be valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    ffi("cuDevicePrimaryCtxGetState", || {
        let (f, a) = with(|g| {
            g.inited()?;
            check_device(dev)?;
            Ok((g.primary.flags, g.primary.ctx.is_some()))
        })?;
        // SAFETY: the caller's out-pointers.
        unsafe {
            out(flags, f)?;
            out(active, c_int::from(a))
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    ffi("cuDevicePrimaryCtxSetFlags_v2", || {
        check_flags(flags, CU_CTX_FLAGS_MASK)?;
        with(|g| {
            g.inited()?;
            check_device(dev)?;
            g.primary.flags = flags;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    cuDevicePrimaryCtxSetFlags_v2(dev, flags)
}

fn create(pctx: *mut Handle, flags: c_uint, dev: CUdevice) -> Result<(), CUresult> {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_flags(flags, CU_CTX_FLAGS_MASK)?;
    let h = with(|g| {
        g.inited()?;
        check_device(dev)?;
        g.create_context(flags, false)
    })?;
    state::push_current(h);
    // SAFETY: checked not null; the caller's out-pointer.
    unsafe { out(pctx, handle(h)) }
}

/// `cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)`: a new context, made
/// current (pushed on this thread's stack).
///
/// # Safety
/// `pctx` must be valid for a write of a `CUcontext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut Handle,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ffi("cuCtxCreate_v2", || create(pctx, flags, dev))
}

/// # Safety
/// As [`cuCtxCreate_v2`] (the same signature).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut Handle, flags: c_uint, dev: CUdevice) -> CUresult {
    ffi("cuCtxCreate", || create(pctx, flags, dev))
}

/// `cuCtxCreate_v3(pctx, CUexecAffinityParam *params, int numParams, flags, dev)`: execution
/// affinity (SM counts) is not supported; none given is a plain create.
///
/// # Safety
/// `pctx` must be valid for a write of a `CUcontext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut Handle,
    params: *mut c_void,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ffi("cuCtxCreate_v3", || {
        if !params.is_null() && num_params > 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    })
}

/// `cuCtxCreate_v4(pctx, CUctxCreateParams *params, flags, dev)` (cuda.h's `cuCtxCreate`):
/// execution affinity and CIG parameters are not supported; null params is a plain create.
///
/// # Safety
/// `pctx` must be valid for a write of a `CUcontext`; `params` null or readable
/// (`{void *execAffinityParams; int numExecAffinityParams; void *cigParams;}`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut Handle,
    params: *const c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    ffi("cuCtxCreate_v4", || {
        if !params.is_null() {
            #[repr(C)]
            struct CtxCreateParams {
                exec_affinity: *const c_void,
                num_exec_affinity: c_int,
                cig: *const c_void,
            }
            // SAFETY: the program promises a CUctxCreateParams.
            let p = unsafe { params.cast::<CtxCreateParams>().read_unaligned() };
            if (!p.exec_affinity.is_null() && p.num_exec_affinity > 0) || !p.cig.is_null() {
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        create(pctx, flags, dev)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    ffi("cuCtxDestroy_v2", || {
        let t = std::time::Instant::now();
        with(|g| {
            g.inited()?;
            let h = key(ctx);
            if !g.contexts.contains_key(&h) {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            if g.primary.ctx == Some(h) {
                // The primary context is released, not destroyed.
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            g.destroy_context(h)
        })?;
        stats::call("cuCtxDestroy_v2", 0, t, Some(stats::Phase::Close));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy(ctx: Handle) -> CUresult {
    cuCtxDestroy_v2(ctx)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    ffi("cuCtxSetCurrent", || {
        let h = key(ctx);
        with(|g| {
            g.inited()?;
            if h != 0 && !g.contexts.contains_key(&h) {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            Ok(())
        })?;
        state::set_current(h);
        Ok(())
    })
}

/// # Safety
/// `pctx` must be valid for a write of a `CUcontext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    ffi("cuCtxGetCurrent", || {
        with(|g| g.inited().map(|_| ()))?;
        let h = state::current();
        let live = state::with(|g| g.contexts.contains_key(&h));
        // SAFETY: the caller's out-pointer.
        unsafe { out(pctx, handle(if live { h } else { 0 })) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    ffi("cuCtxPushCurrent_v2", || {
        let h = key(ctx);
        with(|g| {
            g.inited()?;
            if !g.contexts.contains_key(&h) {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            Ok(())
        })?;
        state::push_current(h);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent(ctx: Handle) -> CUresult {
    cuCtxPushCurrent_v2(ctx)
}

/// # Safety
/// `pctx` must be null or valid for a write of a `CUcontext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    ffi("cuCtxPopCurrent_v2", || {
        with(|g| g.inited().map(|_| ()))?;
        let h = state::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { out(pctx, handle(h))? };
        }
        Ok(())
    })
}

/// # Safety
/// As [`cuCtxPopCurrent_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut Handle) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuCtxPopCurrent_v2(pctx) }
}

/// Waits for the current context's work (charged to the kernels phase if launches were in
/// flight).
pub(crate) fn sync_ctx(ctx: &mut state::Ctx) -> Result<(), CUresult> {
    let r = ctx.dev_call(|d| d.synchronize());
    stats::kernels_done();
    r
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    ffi("cuCtxSynchronize", || {
        let t = std::time::Instant::now();
        with(|g| sync_ctx(g.cur()?.1))?;
        stats::call("cuCtxSynchronize", 0, t, None);
        Ok(())
    })
}

/// `cuCtxSynchronize_v2(CUcontext)`: waits for the given context (null: the current one).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: Handle) -> CUresult {
    ffi("cuCtxSynchronize_v2", || {
        let t = std::time::Instant::now();
        with(|g| sync_ctx(g.ctx(key(ctx))?.1))?;
        stats::call("cuCtxSynchronize", 0, t, None);
        Ok(())
    })
}

/// `cuCtxGetDevice_v2(CUdevice *, CUcontext)`: the given context's device (null: current).
///
/// # Safety
/// `dev` must be valid for a write of a `CUdevice`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: Handle) -> CUresult {
    ffi("cuCtxGetDevice_v2", || {
        with(|g| g.ctx(key(ctx)).map(|_| ()))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(dev, 0) }
    })
}

/// # Safety
/// `dev` must be valid for a write of a `CUdevice`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    ffi("cuCtxGetDevice", || {
        with(|g| g.cur().map(|_| ()))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(dev, 0) }
    })
}

/// # Safety
/// `flags` must be valid for a write of an `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    ffi("cuCtxGetFlags", || {
        let f = with(|g| g.cur().map(|(_, c)| c.flags))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(flags, f) }
    })
}

/// # Safety
/// `version` must be valid for a write of an `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: Handle, version: *mut c_uint) -> CUresult {
    ffi("cuCtxGetApiVersion", || {
        with(|g| g.ctx(key(ctx)).map(|_| ()))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(version, DRIVER_VERSION as c_uint) }
    })
}

/// # Safety
/// `id` must be valid for a write of an `unsigned long long`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: Handle, id: *mut u64) -> CUresult {
    ffi("cuCtxGetId", || {
        let h = with(|g| g.ctx(key(ctx)).map(|(h, _)| h))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(id, h) }
    })
}

/// # Safety
/// `value` must be valid for a write of a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_uint) -> CUresult {
    ffi("cuCtxGetLimit", || {
        with(|g| g.cur().map(|_| ()))?;
        let v = match limit {
            CU_LIMIT_STACK_SIZE => 1024,
            CU_LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
            CU_LIMIT_MALLOC_HEAP_SIZE => 8 << 20,
            CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => 2048,
            CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH => 2,
            CU_LIMIT_MAX_L2_FETCH_GRANULARITY => 64,
            CU_LIMIT_PERSISTING_L2_CACHE_SIZE => 0,
            _ => return Err(CUDA_ERROR_UNSUPPORTED_LIMIT),
        };
        // SAFETY: the caller's out-pointer.
        unsafe { out(value, v) }
    })
}

/// Accepted and ignored (the engines have no such knobs).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_uint, _value: usize) -> CUresult {
    ffi("cuCtxSetLimit", || {
        with(|g| g.cur().map(|_| ()))?;
        if limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE {
            return Err(CUDA_ERROR_UNSUPPORTED_LIMIT);
        }
        Ok(())
    })
}

/// # Safety
/// `config` must be valid for a write of a `CUfunc_cache`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_uint) -> CUresult {
    ffi("cuCtxGetCacheConfig", || {
        with(|g| g.cur().map(|_| ()))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(config, CU_FUNC_CACHE_PREFER_NONE) }
    })
}

/// Accepted and ignored (a hint).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(config: c_uint) -> CUresult {
    ffi("cuCtxSetCacheConfig", || {
        with(|g| g.cur().map(|_| ()))?;
        if config > CU_FUNC_CACHE_PREFER_EQUAL {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

/// # Safety
/// `least`, `greatest` must each be null or valid for a write of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    ffi("cuCtxGetStreamPriorityRange", || {
        with(|g| g.cur().map(|_| ()))?;
        // SAFETY: the caller's out-pointers, each optional.
        unsafe {
            if !least.is_null() {
                out(least, 0)?;
            }
            if !greatest.is_null() {
                out(greatest, -5)?;
            }
        }
        Ok(())
    })
}
