//! The CUDA driver seen through cudarc's raw bindings: loading libcuda at run time (a clear error,
//! never a panic, where there is none), the process's one context (the device's primary
//! context), and turning `CUresult` codes into text.

use std::ffi::{CStr, c_int};

use super::sys;

use crate::engine::EngineError;

/// A failed driver call: which call and the driver's name and text for the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrvError {
    pub call: &'static str,
    pub code: sys::CUresult,
}

impl DrvError {
    /// Whether the code is one of the sticky errors that poison the context.
    pub fn is_sticky(&self) -> bool {
        use sys::CUresult::*;
        matches!(
            self.code,
            CUDA_ERROR_ILLEGAL_ADDRESS
                | CUDA_ERROR_ILLEGAL_INSTRUCTION
                | CUDA_ERROR_MISALIGNED_ADDRESS
                | CUDA_ERROR_INVALID_ADDRESS_SPACE
                | CUDA_ERROR_INVALID_PC
                | CUDA_ERROR_LAUNCH_FAILED
                | CUDA_ERROR_HARDWARE_STACK_ERROR
                | CUDA_ERROR_ASSERT
                | CUDA_ERROR_LAUNCH_TIMEOUT
                | CUDA_ERROR_ECC_UNCORRECTABLE
                | CUDA_ERROR_CONTEXT_IS_DESTROYED
        )
    }
}

impl std::fmt::Display for DrvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: out-pointers to locals; the driver returns static strings or leaves them null.
        unsafe {
            sys::cuGetErrorName(self.code, &mut name);
            sys::cuGetErrorString(self.code, &mut text);
        }
        let s = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: non-null pointers from cuGetError* point at static NUL-terminated text.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        write!(f, "{}: {} ({})", self.call, s(name), s(text))
    }
}

impl From<DrvError> for EngineError {
    fn from(e: DrvError) -> Self {
        EngineError::Backend(e.to_string())
    }
}

thread_local! {
    /// Driver calls this thread made through [`ck`] (or counted by [`count_call`]).
    static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Driver calls the calling thread has made so far (checked by [`ck`], or counted by
/// [`count_call`]): a run's host work is the difference across it (`hostcost`).
pub fn calls() -> u64 {
    CALLS.with(std::cell::Cell::get)
}

/// Counts one driver call whose result is not checked by [`ck`] (a query that may say "not
/// ready").
pub fn count_call() {
    CALLS.with(|c| c.set(c.get().wrapping_add(1)));
}

/// `Ok` for `CUDA_SUCCESS`, else the error naming `call` (and counts the call: [`calls`]).
pub fn ck(call: &'static str, code: sys::CUresult) -> Result<(), DrvError> {
    count_call();
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DrvError { call, code })
    }
}

/// Every driver entry point the engine calls (checked when the engine is created).
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8_v2",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpy2D_v2",
    "cuMemsetD32Async",
    "cuStreamWaitEvent",
    "cuEventQuery",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetParamInfo",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuLaunchKernel",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuCtxGetStreamPriorityRange",
    "cuMemHostGetDevicePointer_v2",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
];

/// The process's CUDA context on one device.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    pub ctx: sys::CUcontext,
    pub device: sys::CUdevice,
}

// SAFETY: a CUcontext handle may be used from any thread (made current with cuCtxSetCurrent).
unsafe impl Send for Ctx {}
// SAFETY: as above; the driver synchronises calls on a context internally.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Loads libcuda (if present), initialises the driver and retains the primary context of
    /// device `ordinal`.
    pub fn open(ordinal: i32) -> Result<Ctx, EngineError> {
        // SAFETY: only tries to dlopen the library names; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            let why = sys::library().err().unwrap_or_default();
            return Err(EngineError::Backend(format!(
                "CUDA driver not found: libcuda.so could not be loaded ({why})"
            )));
        }
        // cudarc panics on a missing symbol at its first call: check them all up front, so an
        // old driver is a clear error too.
        let missing: Vec<&str> = SYMBOLS
            .iter()
            .copied()
            .filter(|name| !sys::has_symbol(name))
            .collect();
        if !missing.is_empty() {
            return Err(EngineError::Backend(format!(
                "CUDA driver too old (CUDA 12.8+ driver API needed): missing {}",
                missing.join(", ")
            )));
        }
        // SAFETY: plain driver calls with out-pointers to locals.
        unsafe {
            ck("cuInit", sys::cuInit(0))?;
            let mut count: c_int = 0;
            ck("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
            if ordinal < 0 || ordinal >= count {
                return Err(EngineError::Backend(format!(
                    "CUDA device {ordinal} not present ({count} devices)"
                )));
            }
            let mut device: sys::CUdevice = 0;
            ck("cuDeviceGet", sys::cuDeviceGet(&mut device, ordinal))?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            ck(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, device),
            )?;
            ck("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            Ok(Ctx { ctx, device })
        }
    }

    /// Makes the context current on the calling thread (every engine entry point does this).
    pub fn bind(&self) -> Result<(), DrvError> {
        // SAFETY: the context stays retained for the engine's lifetime.
        ck("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// A device attribute.
    pub fn attribute(&self, attr: sys::CUdevice_attribute) -> Result<i32, DrvError> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a local.
        ck("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut v, attr, self.device)
        })?;
        Ok(v)
    }

    /// The device's name.
    pub fn name(&self) -> String {
        let mut buf = [0 as std::ffi::c_char; 128];
        // SAFETY: the buffer is 128 bytes long as told.
        let r = unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), 128, self.device) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return String::from("unknown");
        }
        // SAFETY: the driver NUL-terminates within the buffer.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Releases the primary context (after every resource of the engine is gone).
    pub fn release(&self) {
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// Waits for the legacy default stream, where the synchronous `cuMemcpy*`/`cuMemset*` calls run:
/// a host-to-device copy from pageable memory may return before its DMA lands, and job streams
/// (non-blocking) do not wait for the legacy stream.
pub fn sync_legacy() -> Result<(), DrvError> {
    // SAFETY: the null stream handle names the legacy default stream.
    ck("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(std::ptr::null_mut())
    })
}

/// One CUDA device of the host, as [`devices`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal (what `CudaConfig::device` takes).
    pub ordinal: u32,
    /// The driver's name for it (`cuDeviceGetName`).
    pub name: String,
    /// Its memory in bytes (`cuDeviceTotalMem`).
    pub memory: u64,
}

/// The host's CUDA devices (at most `max`; more is an error, not a silent cut), through
/// NVIDIA's driver loaded as the engine loads it. No driver, a driver that cannot initialise
/// (no device: `CUDA_ERROR_NO_DEVICE`) or no device at all is an error with the reason.
/// Retains no context: a daemon that only arbitrates never creates one.
pub fn devices(max: usize) -> Result<Vec<DeviceInfo>, EngineError> {
    // SAFETY: only tries to dlopen the library names; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        let why = sys::library().err().unwrap_or_default();
        return Err(EngineError::Backend(format!(
            "CUDA driver not found: libcuda.so could not be loaded ({why})"
        )));
    }
    let mut count: c_int = 0;
    // SAFETY: plain driver calls with out-pointers to locals (a missing symbol returns
    // CUDA_ERROR_NOT_FOUND, never calls anything).
    unsafe {
        ck("cuInit", sys::cuInit(0))?;
        ck("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
    }
    let count = usize::try_from(count).unwrap_or(0);
    if count == 0 {
        return Err(EngineError::Backend(
            "the CUDA driver reports no device".into(),
        ));
    }
    if count > max {
        return Err(EngineError::Backend(format!(
            "the CUDA driver reports {count} devices; at most {max} are supported"
        )));
    }
    let mut out = Vec::with_capacity(count);
    for ordinal in 0..count {
        let mut device: sys::CUdevice = 0;
        let mut bytes: usize = 0;
        // SAFETY: out-pointers to locals; `ordinal` is below the driver's count.
        unsafe {
            ck(
                "cuDeviceGet",
                sys::cuDeviceGet(&mut device, ordinal as c_int),
            )?;
            ck(
                "cuDeviceTotalMem",
                sys::cuDeviceTotalMem_v2(&mut bytes, device),
            )?;
        }
        let ctx = Ctx {
            ctx: std::ptr::null_mut(),
            device,
        };
        out.push(DeviceInfo {
            ordinal: ordinal as u32,
            name: ctx.name(),
            memory: bytes as u64,
        });
    }
    Ok(out)
}
