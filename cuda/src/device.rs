//! The device interface every backend implements: what the CUDA driver API needs from a GPU,
//! and nothing more. One `Device` is one CUDA context's view of one GPU: its own address space,
//! its own memory, its own modules, one in-order queue of work.
//!
//! Ordering contract (the driver API layer relies on it):
//! - Work is executed in the order it is issued. [`Device::launch`], [`Device::copy_dtod`],
//!   [`Device::memset`] and [`Device::marker`] may return before the work is done;
//!   [`Device::copy_htod`] returns once `src` has been consumed (the caller may reuse it);
//!   [`Device::copy_dtoh`] returns once `dst` holds the data (all earlier work done first).
//! - [`Device::wait`] / [`Device::synchronize`] return after the work issued before the
//!   marker / everything issued so far has finished, with the first error that work hit.
//! - An error from executed work (a kernel fault, a timeout) is *sticky*: the driver API layer
//!   records it for the context and fails every later call, like a real driver. A backend
//!   reports it once, from the call that observes it.
//!
//! Addresses are GPU virtual addresses ([`DevPtr`]) in the context's own space; a backend never
//! lets one context name another's memory.

use thiserror::Error;

/// A GPU virtual address in the context's address space.
pub type DevPtr = u64;

/// A loaded module, as the backend numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleId(pub u64);

/// A point in the work queue, for events (`cuEventRecord`) and stream synchronisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Marker(pub u64);

/// What the device reports of itself (`cuDeviceGetAttribute`, `cudaGetDeviceProperties`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// Marketing name (`cuDeviceGetName`).
    pub name: String,
    /// Memory the context may allocate, in bytes (`cuDeviceTotalMem`).
    pub total_mem: u64,
    /// Compute capability reported to programs (major, minor).
    pub compute_capability: (u32, u32),
    /// Highest `compute_XX` PTX target the backend accepts (80 for sm_80...): the fat-binary
    /// loader picks the highest PTX entry not above it.
    pub max_ptx_arch: u32,
    /// Highest PTX ISA version the backend accepts, as major*10+minor (90 for 9.0).
    pub max_ptx_isa: u32,
    pub multiprocessor_count: u32,
    pub clock_rate_khz: u32,
    pub memory_clock_rate_khz: u32,
    pub global_memory_bus_width: u32,
    pub l2_cache_size: u32,
    pub max_threads_per_block: u32,
    pub max_block_dim: [u32; 3],
    pub max_grid_dim: [u32; 3],
    pub warp_size: u32,
    /// Static + dynamic shared memory a block may use, in bytes.
    pub shared_mem_per_block: u32,
    pub shared_mem_per_multiprocessor: u32,
    pub max_threads_per_multiprocessor: u32,
    pub regs_per_block: u32,
    pub total_constant_memory: u32,
}

/// One kernel launch, its parameters already laid out as the PTX entry's `.param` space
/// (each parameter at its natural alignment, in declaration order).
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    pub module: ModuleId,
    pub entry: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    pub params: &'a [u8],
}

/// Host memory the GPU reaches directly (`cuMemHostAlloc`, `cudaHostAlloc`): where the
/// process sees it and where the GPU does. Owned by the backend until [`Device::host_free`].
#[derive(Clone, Copy, Debug)]
pub struct HostBuf {
    pub host: *mut u8,
    pub dev: DevPtr,
    pub len: u64,
}

/// A device failure, mapped to `CUresult` by the driver API layer.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DeviceError {
    #[error("no GPU: {0}")]
    NoDevice(String),
    #[error("out of device memory ({0} bytes asked)")]
    OutOfMemory(u64),
    #[error("invalid value: {0}")]
    InvalidValue(String),
    #[error("the module is refused: {0}")]
    InvalidPtx(String),
    #[error("no kernel named {0}")]
    NotFound(String),
    #[error("launch refused: {0}")]
    LaunchFailed(String),
    /// A kernel or copy touched an address the context does not map (sticky).
    #[error("illegal address: {0}")]
    IllegalAddress(String),
    /// A kernel ran past the time limit (sticky).
    #[error("timeout: {0}")]
    Timeout(String),
    /// Any other failure of executed work (sticky).
    #[error("device fault: {0}")]
    Fault(String),
    #[error("not supported by this backend: {0}")]
    NotSupported(String),
}

impl DeviceError {
    /// Whether the error ends the context (a real driver's sticky errors).
    pub fn is_sticky(&self) -> bool {
        matches!(
            self,
            DeviceError::IllegalAddress(_) | DeviceError::Timeout(_) | DeviceError::Fault(_)
        )
    }
}

/// One CUDA context's GPU.
pub trait Device: Send {
    fn info(&self) -> &DeviceInfo;
    /// Allocates `bytes` (> 0) of device memory, 256-byte aligned at least.
    fn mem_alloc(&mut self, bytes: u64) -> Result<DevPtr, DeviceError>;
    /// Frees an allocation by its base address (waits for work using it to finish).
    fn mem_free(&mut self, ptr: DevPtr) -> Result<(), DeviceError>;
    /// (free, total) device memory of this context, in bytes.
    fn mem_info(&self) -> (u64, u64);
    /// Page-locked host memory mapped into the GPU's space (zeroed).
    fn host_alloc(&mut self, bytes: u64) -> Result<HostBuf, DeviceError>;
    /// Frees a [`HostBuf`] by its host pointer.
    fn host_free(&mut self, host: *mut u8) -> Result<(), DeviceError>;
    /// Host → device; returns once `src` is consumed.
    fn copy_htod(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError>;
    /// Device → host; returns once `dst` is filled (after all earlier work).
    fn copy_dtoh(&mut self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError>;
    /// Device → device, queued.
    fn copy_dtod(&mut self, dst: DevPtr, src: DevPtr, bytes: u64) -> Result<(), DeviceError>;
    /// Fills `count` elements of `elem` bytes (1, 2 or 4) at `dst` with `value`, queued.
    fn memset(&mut self, dst: DevPtr, value: u32, elem: u8, count: u64) -> Result<(), DeviceError>;
    /// Loads a module from PTX text (the fat-binary layer has already chosen and decompressed
    /// it). Globals (`.global`, `.const`) are placed and initialised by the backend.
    fn module_load(&mut self, ptx: &str) -> Result<ModuleId, DeviceError>;
    fn module_unload(&mut self, module: ModuleId) -> Result<(), DeviceError>;
    /// Address and size of a module's `.global` / `.const` variable (`cuModuleGetGlobal`).
    fn module_global(&mut self, module: ModuleId, name: &str)
    -> Result<(DevPtr, u64), DeviceError>;
    /// Queues a kernel launch.
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), DeviceError>;
    /// A marker after everything issued so far.
    fn marker(&mut self) -> Result<Marker, DeviceError>;
    /// Whether the work before `marker` has finished (`cuEventQuery`), without waiting.
    fn query(&mut self, marker: Marker) -> Result<bool, DeviceError>;
    /// Waits for the work before `marker`.
    fn wait(&mut self, marker: Marker) -> Result<(), DeviceError>;
    /// Monotonic nanoseconds at which the work before `marker` finished (after [`Device::wait`]
    /// or a true [`Device::query`]): `cuEventElapsedTime`.
    fn marker_time_ns(&mut self, marker: Marker) -> Result<u64, DeviceError>;
    /// Waits for everything issued so far.
    fn synchronize(&mut self) -> Result<(), DeviceError>;
}
