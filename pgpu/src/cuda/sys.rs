//! The CUDA driver's entry points as the cuda engine calls them: cudarc's raw bindings (its
//! types and constants, re-exported) with the functions resolved from a library this module
//! opens itself. cudarc opens `libcuda.so` by name, and in a process where vgpu-vmm's own
//! driver library (`cuda` crate, `libcuda.so.1`) is loaded that name is *that* library: the
//! in-process `cuda` backend of libcuda.so.1 runs this engine, which must reach NVIDIA's
//! driver. So the library is chosen here:
//! 1. `VGPU_REAL_LIBCUDA` (a path), if set;
//! 2. `libcuda.so.1` by name (what a VMM process finds);
//! 3. if that is vgpu-vmm's own (or missing): the driver's standard locations by absolute path,
//!    then `libcuda.so` by name, opened with `RTLD_DEEPBIND` (the driver's own symbols first,
//!    not those of the libcuda.so.1 already in the process).
//!
//! A library exporting `vgpu_cuda_marker` (vgpu-vmm's own) is never taken. A function whose
//! symbol is missing returns `CUDA_ERROR_NOT_FOUND` (no panic); `driver::Ctx::open` checks
//! every symbol it needs up front.

use std::sync::OnceLock;

pub use cudarc::driver::sys::*;
use libloading::Library;

/// The marker symbol of vgpu-vmm's own driver library.
pub const MARKER: &str = "vgpu_cuda_marker";

/// Standard places of NVIDIA's driver library.
const STANDARD_PATHS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

static LIB: OnceLock<Result<(Library, String), String>> = OnceLock::new();

/// Opens a candidate; `Err` with the reason if it is missing or is vgpu-vmm's own library.
fn try_open(name: &str, deep: bool) -> Result<Library, String> {
    // SAFETY: loading the driver runs its initialisers, which is what using it means; the
    // candidates are the driver's names and paths (or the user's VGPU_REAL_LIBCUDA).
    let lib: Library = unsafe {
        if deep {
            libloading::os::unix::Library::open(
                Some(name),
                libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
            )
            .map(Library::from)
        } else {
            Library::new(name)
        }
    }
    .map_err(|e| format!("{name}: {e}"))?;
    // SAFETY: a look-up only; the symbol is never used.
    if unsafe { lib.get::<*const u8>(MARKER.as_bytes()) }.is_ok() {
        return Err(format!(
            "{name}: vgpu-vmm's own libcuda, not NVIDIA's driver"
        ));
    }
    Ok(lib)
}

fn open() -> &'static Result<(Library, String), String> {
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os("VGPU_REAL_LIBCUDA") {
            let p = p.to_string_lossy().into_owned();
            return try_open(&p, true)
                .map(|l| (l, p))
                .map_err(|e| format!("VGPU_REAL_LIBCUDA: {e}"));
        }
        // The usual case (a VMM process): the driver by its soname.
        let mut tried = Vec::new();
        match try_open("libcuda.so.1", false) {
            Ok(l) => return Ok((l, "libcuda.so.1".into())),
            Err(e) => tried.push(e),
        }
        // vgpu-vmm's own library holds the name (or there is none by it): the driver's
        // standard paths, then the development name, each with its own symbols first.
        let names = STANDARD_PATHS
            .iter()
            .copied()
            .filter(|p| std::path::Path::new(p).exists())
            .chain(["libcuda.so"]);
        for name in names {
            match try_open(name, true) {
                Ok(l) => return Ok((l, name.to_string())),
                Err(e) => tried.push(e),
            }
        }
        Err(tried.join("; "))
    })
}

/// Whether NVIDIA's driver could be loaded (loads it on first call).
///
/// # Safety
/// Loading a library runs its initialisers.
pub unsafe fn is_culib_present() -> bool {
    open().is_ok()
}

/// Which library was loaded (name or path), or why none was.
pub fn library() -> Result<&'static str, &'static str> {
    match open() {
        Ok((_, name)) => Ok(name),
        Err(e) => Err(e),
    }
}

/// Whether the loaded driver has `name`.
pub fn has_symbol(name: &str) -> bool {
    symbol::<unsafe extern "C" fn()>(name).is_some()
}

fn symbol<F: Copy>(name: &str) -> Option<F> {
    let (lib, _) = open().as_ref().ok()?;
    // SAFETY: `F` is the function type cudarc declares for this driver entry point.
    unsafe { lib.get::<F>(name.as_bytes()).ok().map(|s| *s) }
}

macro_rules! driver_fns {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
        /// The entry points resolved here (each shadows cudarc's function of that name).
        pub const FUNCTIONS: &[&str] = &[$(stringify!($name)),*];
        $(
            /// The driver's function of this name, from the library chosen above.
            ///
            /// # Safety
            /// As the driver API function: valid pointers and handles.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $ty),*) -> CUresult {
                type F = unsafe extern "C" fn($($ty),*) -> CUresult;
                static S: OnceLock<Option<F>> = OnceLock::new();
                match S.get_or_init(|| symbol::<F>(stringify!($name))) {
                    // SAFETY: the caller upholds the driver function's contract.
                    Some(f) => unsafe { f($($arg),*) },
                    None => CUresult::CUDA_ERROR_NOT_FOUND,
                }
            }
        )*
    };
}

driver_fns! {
    fn cuCtxGetStreamPriorityRange(leastPriority: *mut ::core::ffi::c_int, greatestPriority: *mut ::core::ffi::c_int);
    fn cuCtxSetCurrent(ctx: CUcontext);
    fn cuDeviceGet(device: *mut CUdevice, ordinal: ::core::ffi::c_int);
    fn cuDeviceGetAttribute(pi: *mut ::core::ffi::c_int, attrib: CUdevice_attribute, dev: CUdevice);
    fn cuDeviceGetCount(count: *mut ::core::ffi::c_int);
    fn cuDeviceGetName(name: *mut ::core::ffi::c_char, len: ::core::ffi::c_int, dev: CUdevice);
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice);
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
    fn cuDriverGetVersion(driverVersion: *mut ::core::ffi::c_int);
    fn cuEventCreate(phEvent: *mut CUevent, Flags: ::core::ffi::c_uint);
    fn cuEventDestroy_v2(hEvent: CUevent);
    fn cuEventElapsedTime_v2(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent);
    fn cuEventQuery(hEvent: CUevent);
    fn cuEventRecord(hEvent: CUevent, hStream: CUstream);
    fn cuEventSynchronize(hEvent: CUevent);
    fn cuFuncLoad(function: CUfunction);
    fn cuFuncGetParamInfo(func: CUfunction, paramIndex: usize, paramOffset: *mut usize, paramSize: *mut usize);
    fn cuGetErrorName(error: CUresult, pStr: *mut *const ::core::ffi::c_char);
    fn cuGetErrorString(error: CUresult, pStr: *mut *const ::core::ffi::c_char);
    fn cuInit(Flags: ::core::ffi::c_uint);
    fn cuLaunchKernel(f: CUfunction, gridDimX: ::core::ffi::c_uint, gridDimY: ::core::ffi::c_uint, gridDimZ: ::core::ffi::c_uint, blockDimX: ::core::ffi::c_uint, blockDimY: ::core::ffi::c_uint, blockDimZ: ::core::ffi::c_uint, sharedMemBytes: ::core::ffi::c_uint, hStream: CUstream, kernelParams: *mut *mut ::core::ffi::c_void, extra: *mut *mut ::core::ffi::c_void);
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize);
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: ::core::ffi::c_ulonglong);
    fn cuMemAllocHost_v2(pp: *mut *mut ::core::ffi::c_void, bytesize: usize);
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: ::core::ffi::c_ulonglong);
    fn cuMemFreeHost(p: *mut ::core::ffi::c_void);
    fn cuMemFree_v2(dptr: CUdeviceptr);
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags);
    fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut ::core::ffi::c_void, Flags: ::core::ffi::c_uint);
    fn cuMemHostRegister_v2(p: *mut ::core::ffi::c_void, bytesize: usize, Flags: ::core::ffi::c_uint);
    fn cuMemHostUnregister(p: *mut ::core::ffi::c_void);
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: ::core::ffi::c_ulonglong);
    fn cuMemRelease(handle: CUmemGenericAllocationHandle);
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize);
    fn cuMemcpy2D_v2(pCopy: *const CUDA_MEMCPY2D);
    fn cuMemcpyDtoDAsync_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    fn cuMemcpyDtoHAsync_v2(dstHost: *mut ::core::ffi::c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream);
    fn cuMemcpyDtoH_v2(dstHost: *mut ::core::ffi::c_void, srcDevice: CUdeviceptr, ByteCount: usize);
    fn cuMemcpyHtoDAsync_v2(dstDevice: CUdeviceptr, srcHost: *const ::core::ffi::c_void, ByteCount: usize, hStream: CUstream);
    fn cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const ::core::ffi::c_void, ByteCount: usize);
    fn cuMemsetD32Async(dstDevice: CUdeviceptr, ui: ::core::ffi::c_uint, N: usize, hStream: CUstream);
    fn cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: ::core::ffi::c_uchar, N: usize);
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const ::core::ffi::c_char);
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const ::core::ffi::c_void, numOptions: ::core::ffi::c_uint, options: *mut CUjit_option, optionValues: *mut *mut ::core::ffi::c_void);
    fn cuModuleUnload(hmod: CUmodule);
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks: *mut ::core::ffi::c_int, func: CUfunction, blockSize: ::core::ffi::c_int, dynamicSMemSize: usize);
    fn cuStreamCreate(phStream: *mut CUstream, Flags: ::core::ffi::c_uint);
    fn cuStreamCreateWithPriority(phStream: *mut CUstream, flags: ::core::ffi::c_uint, priority: ::core::ffi::c_int);
    fn cuStreamDestroy_v2(hStream: CUstream);
    fn cuStreamSynchronize(hStream: CUstream);
    fn cuStreamWaitEvent(hStream: CUstream, hEvent: CUevent, Flags: ::core::ffi::c_uint);
    fn cuStreamWaitValue32_v2(stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: ::core::ffi::c_uint);
    fn cuStreamWriteValue32_v2(stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: ::core::ffi::c_uint);
}
