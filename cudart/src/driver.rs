//! The CUDA driver API as this runtime uses it: `libcuda.so.1` is opened at first use (as
//! NVIDIA's runtime opens it) and each `cu*` entry point is resolved by its CUDA 13 name. An
//! entry point the loaded driver lacks answers `CUDA_ERROR_NOT_SUPPORTED` and is named once on
//! stderr, so the runtime runs over NVIDIA's driver and over this project's alike.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use libloading::Library;

/// A driver API status (`CUresult`).
pub type CuResult = c_int;
/// `CUdeviceptr`.
pub type DevPtr = u64;
/// Any opaque driver handle (`CUcontext`, `CUmodule`, `CUfunction`, `CUstream`, `CUevent`).
pub type Handle = *mut c_void;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;

/// `CU_JIT_ERROR_LOG_BUFFER` / `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES` (cuModuleLoadDataEx options).
pub const CU_JIT_ERROR_LOG_BUFFER: c_int = 5;
pub const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` and its values.
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

macro_rules! driver_api {
    ($( $name:ident = $sym:literal ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
        /// The resolved entry points; `None` where the driver lacks one.
        pub struct Driver {
            $( $name: Option<unsafe extern "C" fn($($ty),*) -> CuResult>, )*
        }

        impl Driver {
            fn resolve(lib: &Library) -> Self {
                Self {
                    $( $name: {
                        // SAFETY: the symbol is the driver's C function of this CUDA 13
                        // signature (cuda.h); the library stays loaded for the process's life.
                        unsafe { lib.get::<unsafe extern "C" fn($($ty),*) -> CuResult>(
                            concat!($sym, "\0").as_bytes()) }.ok().map(|s| *s)
                    }, )*
                }
            }

            $(
                /// Calls the driver's entry point of the same name (CUDA 13 name in `driver.rs`).
                ///
                /// # Safety
                /// The arguments must be valid for the driver function, as cuda.h documents.
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn $name(&self, $($arg: $ty),*) -> CuResult {
                    match self.$name {
                        // SAFETY: the caller upholds the driver function's contract.
                        Some(f) => unsafe { f($($arg),*) },
                        None => {
                            static SAID: AtomicBool = AtomicBool::new(false);
                            missing($sym, &SAID)
                        }
                    }
                }
            )*

            /// Whether the driver has each named entry point (for choosing fallbacks).
            pub fn has(&self, sym: &str) -> bool {
                match sym {
                    $( $sym => self.$name.is_some(), )*
                    _ => false,
                }
            }
        }
    };
}

driver_api! {
    init = "cuInit"(flags: c_uint);
    driver_get_version = "cuDriverGetVersion"(v: *mut c_int);
    device_get = "cuDeviceGet"(dev: *mut c_int, ordinal: c_int);
    device_get_count = "cuDeviceGetCount"(n: *mut c_int);
    device_get_name = "cuDeviceGetName"(name: *mut c_char, len: c_int, dev: c_int);
    device_get_attribute = "cuDeviceGetAttribute"(v: *mut c_int, attr: c_int, dev: c_int);
    device_total_mem = "cuDeviceTotalMem_v2"(bytes: *mut usize, dev: c_int);
    device_get_uuid = "cuDeviceGetUuid_v2"(uuid: *mut u8, dev: c_int);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain"(ctx: *mut Handle, dev: c_int);
    primary_ctx_reset = "cuDevicePrimaryCtxReset_v2"(dev: c_int);
    primary_ctx_set_flags = "cuDevicePrimaryCtxSetFlags_v2"(dev: c_int, flags: c_uint);
    ctx_create = "cuCtxCreate_v4"(ctx: *mut Handle, params: *mut c_void, flags: c_uint, dev: c_int);
    ctx_destroy = "cuCtxDestroy_v2"(ctx: Handle);
    ctx_set_current = "cuCtxSetCurrent"(ctx: Handle);
    ctx_synchronize = "cuCtxSynchronize"();
    ctx_set_limit = "cuCtxSetLimit"(limit: c_int, value: usize);
    ctx_get_limit = "cuCtxGetLimit"(value: *mut usize, limit: c_int);
    ctx_set_cache_config = "cuCtxSetCacheConfig"(config: c_int);
    ctx_get_cache_config = "cuCtxGetCacheConfig"(config: *mut c_int);
    ctx_get_stream_priority_range = "cuCtxGetStreamPriorityRange"(least: *mut c_int, greatest: *mut c_int);
    module_load_data = "cuModuleLoadData"(module: *mut Handle, image: *const c_void);
    module_load_data_ex = "cuModuleLoadDataEx"(module: *mut Handle, image: *const c_void, n: c_uint, options: *mut c_int, values: *mut *mut c_void);
    module_unload = "cuModuleUnload"(module: Handle);
    module_get_function = "cuModuleGetFunction"(f: *mut Handle, module: Handle, name: *const c_char);
    module_get_global = "cuModuleGetGlobal_v2"(dptr: *mut DevPtr, bytes: *mut usize, module: Handle, name: *const c_char);
    mem_alloc = "cuMemAlloc_v2"(dptr: *mut DevPtr, bytes: usize);
    mem_alloc_managed = "cuMemAllocManaged"(dptr: *mut DevPtr, bytes: usize, flags: c_uint);
    mem_free = "cuMemFree_v2"(dptr: DevPtr);
    mem_get_info = "cuMemGetInfo_v2"(free: *mut usize, total: *mut usize);
    mem_alloc_host = "cuMemAllocHost_v2"(p: *mut *mut c_void, bytes: usize);
    mem_host_alloc = "cuMemHostAlloc"(p: *mut *mut c_void, bytes: usize, flags: c_uint);
    mem_free_host = "cuMemFreeHost"(p: *mut c_void);
    mem_host_register = "cuMemHostRegister_v2"(p: *mut c_void, bytes: usize, flags: c_uint);
    mem_host_unregister = "cuMemHostUnregister"(p: *mut c_void);
    mem_host_get_device_pointer = "cuMemHostGetDevicePointer_v2"(dptr: *mut DevPtr, p: *mut c_void, flags: c_uint);
    mem_host_get_flags = "cuMemHostGetFlags"(flags: *mut c_uint, p: *mut c_void);
    memcpy_htod = "cuMemcpyHtoD_v2"(dst: DevPtr, src: *const c_void, bytes: usize);
    memcpy_dtoh = "cuMemcpyDtoH_v2"(dst: *mut c_void, src: DevPtr, bytes: usize);
    memcpy_dtod = "cuMemcpyDtoD_v2"(dst: DevPtr, src: DevPtr, bytes: usize);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2"(dst: DevPtr, src: *const c_void, bytes: usize, stream: Handle);
    memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2"(dst: *mut c_void, src: DevPtr, bytes: usize, stream: Handle);
    memcpy_dtod_async = "cuMemcpyDtoDAsync_v2"(dst: DevPtr, src: DevPtr, bytes: usize, stream: Handle);
    memset_d8 = "cuMemsetD8_v2"(dst: DevPtr, value: u8, count: usize);
    memset_d8_async = "cuMemsetD8Async"(dst: DevPtr, value: u8, count: usize, stream: Handle);
    pointer_get_attribute = "cuPointerGetAttribute"(data: *mut c_void, attr: c_int, ptr: DevPtr);
    launch_kernel = "cuLaunchKernel"(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void);
    launch_cooperative_kernel = "cuLaunchCooperativeKernel"(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut *mut c_void);
    launch_host_func = "cuLaunchHostFunc"(stream: Handle, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void);
    func_get_attribute = "cuFuncGetAttribute"(v: *mut c_int, attr: c_int, f: Handle);
    func_set_attribute = "cuFuncSetAttribute"(f: Handle, attr: c_int, v: c_int);
    func_set_cache_config = "cuFuncSetCacheConfig"(f: Handle, config: c_int);
    occupancy_max_active_blocks = "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"(n: *mut c_int, f: Handle, block: c_int, shared: usize, flags: c_uint);
    occupancy_available_dynamic_smem = "cuOccupancyAvailableDynamicSMemPerBlock"(bytes: *mut usize, f: Handle, blocks: c_int, block: c_int);
    stream_create = "cuStreamCreate"(stream: *mut Handle, flags: c_uint);
    stream_create_with_priority = "cuStreamCreateWithPriority"(stream: *mut Handle, flags: c_uint, priority: c_int);
    stream_synchronize = "cuStreamSynchronize"(stream: Handle);
    stream_query = "cuStreamQuery"(stream: Handle);
    stream_destroy = "cuStreamDestroy_v2"(stream: Handle);
    stream_wait_event = "cuStreamWaitEvent"(stream: Handle, event: Handle, flags: c_uint);
    stream_get_priority = "cuStreamGetPriority"(stream: Handle, priority: *mut c_int);
    stream_get_flags = "cuStreamGetFlags"(stream: Handle, flags: *mut c_uint);
    event_create = "cuEventCreate"(event: *mut Handle, flags: c_uint);
    event_record = "cuEventRecord"(event: Handle, stream: Handle);
    event_record_with_flags = "cuEventRecordWithFlags"(event: Handle, stream: Handle, flags: c_uint);
    event_query = "cuEventQuery"(event: Handle);
    event_synchronize = "cuEventSynchronize"(event: Handle);
    event_elapsed_time = "cuEventElapsedTime_v2"(ms: *mut f32, start: Handle, end: Handle);
    event_elapsed_time_v1 = "cuEventElapsedTime"(ms: *mut f32, start: Handle, end: Handle);
    event_destroy = "cuEventDestroy_v2"(event: Handle);
    profiler_start = "cuProfilerStart"();
    profiler_stop = "cuProfilerStop"();
    get_proc_address = "cuGetProcAddress_v2"(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int);
}

fn missing(sym: &str, said: &AtomicBool) -> CuResult {
    if !said.swap(true, Ordering::Relaxed) {
        crate::error::say!(
            "libcudart: the loaded libcuda.so.1 has no {sym}: calls needing it fail with cudaErrorNotSupported"
        );
    }
    CUDA_ERROR_NOT_SUPPORTED
}

/// Why the driver could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot open libcuda.so.1: {0}")]
    Open(#[from] libloading::Error),
}

/// The process's driver, opened at first call; `Err` if `libcuda.so.1` cannot be opened.
pub fn driver() -> Result<&'static Driver, &'static LoadError> {
    static DRIVER: OnceLock<Result<Driver, LoadError>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: opening the CUDA driver runs its initialisers, which have no
            // preconditions; it is never unloaded (leaked below) so resolved symbols stay valid.
            let lib = unsafe { Library::new("libcuda.so.1") }?;
            let drv = Driver::resolve(&lib);
            std::mem::forget(lib);
            Ok(drv)
        })
        .as_ref()
}
