//! Devices: count, selection, flags, synchronisation, reset, limits, attributes and
//! `cudaGetDeviceProperties` (CUDA 13's `cudaDeviceProp`, filled from the driver's attributes).

use std::ffi::{c_char, c_int, c_uint};

use crate::context;
use crate::driver::Driver;
use crate::error::*;
use crate::ffi::Out;
use crate::gen_structs::{attr::*, cudaDeviceProp};

crate::error::api! {
    /// `cudaGetDeviceCount` (0 and the error when there is no driver or device).
    fn cudaGetDeviceCount(count: Out<c_int>) {
        match context::device_count() {
            Ok(n) => count.set(n),
            Err(e) => {
                count.set(0)?;
                Err(e)
            }
        }
    }
}

crate::error::api! {
    /// `cudaSetDevice`: the calling thread's device, its context initialised.
    fn cudaSetDevice(dev: c_int) { context::set_device(dev) }
}

crate::error::api! {
    /// `cudaInitDevice`: initialises the device's context without selecting it.
    fn cudaInitDevice(dev: c_int, _device_flags: c_uint, _flags: c_uint) {
        let old = context::current_device();
        context::set_device(dev)?;
        context::set_device(old)
    }
}

crate::error::api! {
    /// `cudaGetDevice`.
    fn cudaGetDevice(dev: Out<c_int>) { dev.set(context::current_device()) }
}

crate::error::api! {
    /// `cudaChooseDevice`: device 0 (the properties are not compared).
    fn cudaChooseDevice(dev: Out<c_int>, _prop: *const cudaDeviceProp) {
        context::device_count()?;
        dev.set(0)
    }
}

crate::error::api! {
    /// `cudaSetDeviceFlags`.
    fn cudaSetDeviceFlags(flags: c_uint) {
        if flags & !0xFF != 0 {
            return fail(INVALID_VALUE);
        }
        context::set_flags(flags)
    }
}

crate::error::api! {
    /// `cudaGetDeviceFlags`.
    fn cudaGetDeviceFlags(flags: Out<c_uint>) { flags.set(context::flags()?) }
}

crate::error::api! {
    /// `cudaDeviceSynchronize`.
    fn cudaDeviceSynchronize() {
        let d = context::ctx()?;
        // SAFETY: no arguments; a context is current.
        cu(unsafe { d.ctx_synchronize() })
    }
}

crate::error::api! {
    /// `cudaDeviceReset`.
    fn cudaDeviceReset() { context::reset() }
}

crate::error::api! {
    /// `cudaDeviceSetLimit` (cudaLimit numbers are CUlimit's).
    fn cudaDeviceSetLimit(limit: c_int, value: usize) {
        let d = context::ctx()?;
        // SAFETY: plain values.
        cu(unsafe { d.ctx_set_limit(limit, value) })
    }
}

crate::error::api! {
    /// `cudaDeviceGetLimit`.
    fn cudaDeviceGetLimit(value: Out<usize>, limit: c_int) {
        let d = context::ctx()?;
        let mut v = 0;
        // SAFETY: `v` receives the value.
        cu(unsafe { d.ctx_get_limit(&mut v, limit) })?;
        value.set(v)
    }
}

crate::error::api! {
    /// `cudaDeviceSetCacheConfig`.
    fn cudaDeviceSetCacheConfig(config: c_int) {
        let d = context::ctx()?;
        // SAFETY: a plain value.
        cu(unsafe { d.ctx_set_cache_config(config) })
    }
}

crate::error::api! {
    /// `cudaDeviceGetCacheConfig`.
    fn cudaDeviceGetCacheConfig(config: Out<c_int>) {
        let d = context::ctx()?;
        let mut c = 0;
        // SAFETY: `c` receives the value.
        cu(unsafe { d.ctx_get_cache_config(&mut c) })?;
        config.set(c)
    }
}

crate::error::api! {
    /// `cudaDeviceGetAttribute` (cudaDeviceAttr numbers are CUdevice_attribute's).
    fn cudaDeviceGetAttribute(value: Out<c_int>, attr: c_int, dev: c_int) {
        context::check_device(dev)?;
        let d = context::drv()?;
        if value.is_null() {
            return fail(INVALID_VALUE);
        }
        let mut v = 0;
        // SAFETY: `v` receives the value; `dev` was checked.
        cu(unsafe { d.device_get_attribute(&mut v, attr, dev) })?;
        value.set(v)
    }
}

crate::error::api! {
    /// `cudaGetDeviceProperties`: CUDA 13's `cudaDeviceProp`, every field the driver reports
    /// (fields it has no attribute for stay 0).
    fn cudaGetDeviceProperties(prop: Out<cudaDeviceProp>, dev: c_int) {
        context::check_device(dev)?;
        if prop.is_null() {
            return fail(INVALID_VALUE);
        }
        prop.set(properties(context::drv()?, dev)?)
    }
}

/// The properties of device `dev` (checked by the caller).
pub fn properties(d: &Driver, dev: c_int) -> Res<cudaDeviceProp> {
    let get = |a: c_int| {
        let mut v = 0;
        // SAFETY: `v` receives the value.
        if unsafe { d.device_get_attribute(&mut v, a, dev) } == 0 {
            v
        } else {
            0
        }
    };
    let sz = |a| get(a).max(0) as usize;
    // SAFETY: all-zero bytes are a valid cudaDeviceProp (integers and arrays of them).
    let mut p: cudaDeviceProp = unsafe { std::mem::zeroed() };
    // SAFETY: the buffer holds 256 chars, the length passed.
    cu(unsafe { d.device_get_name(p.name.as_mut_ptr(), p.name.len() as c_int - 1, dev) })?;
    p.name[255] = 0 as c_char;
    let mut total = 0;
    // SAFETY: `total` receives the size.
    cu(unsafe { d.device_total_mem(&mut total, dev) })?;
    p.totalGlobalMem = total;
    // SAFETY: the uuid field is 16 bytes; left zero if the driver has none.
    unsafe { d.device_get_uuid(p.uuid.as_mut_ptr(), dev) };
    let mut major = 0;
    // SAFETY: `major` receives the value; a device without a compute capability is an error.
    cu(unsafe { d.device_get_attribute(&mut major, COMPUTE_CAPABILITY_MAJOR, dev) })?;
    p.major = major;
    p.minor = get(COMPUTE_CAPABILITY_MINOR);
    p.sharedMemPerBlock = sz(MAX_SHARED_MEMORY_PER_BLOCK);
    p.regsPerBlock = get(MAX_REGISTERS_PER_BLOCK);
    p.warpSize = get(WARP_SIZE);
    p.memPitch = sz(MAX_PITCH);
    p.maxThreadsPerBlock = get(MAX_THREADS_PER_BLOCK);
    p.maxThreadsDim = [
        get(MAX_BLOCK_DIM_X),
        get(MAX_BLOCK_DIM_Y),
        get(MAX_BLOCK_DIM_Z),
    ];
    p.maxGridSize = [
        get(MAX_GRID_DIM_X),
        get(MAX_GRID_DIM_Y),
        get(MAX_GRID_DIM_Z),
    ];
    p.totalConstMem = sz(TOTAL_CONSTANT_MEMORY);
    p.textureAlignment = sz(TEXTURE_ALIGNMENT);
    p.texturePitchAlignment = sz(TEXTURE_PITCH_ALIGNMENT);
    p.multiProcessorCount = get(MULTIPROCESSOR_COUNT);
    p.integrated = get(INTEGRATED);
    p.canMapHostMemory = get(CAN_MAP_HOST_MEMORY);
    p.maxTexture1D = get(MAXIMUM_TEXTURE1D_WIDTH);
    p.maxTexture2D = [get(MAXIMUM_TEXTURE2D_WIDTH), get(MAXIMUM_TEXTURE2D_HEIGHT)];
    p.maxTexture3D = [
        get(MAXIMUM_TEXTURE3D_WIDTH),
        get(MAXIMUM_TEXTURE3D_HEIGHT),
        get(MAXIMUM_TEXTURE3D_DEPTH),
    ];
    p.surfaceAlignment = sz(SURFACE_ALIGNMENT);
    p.concurrentKernels = get(CONCURRENT_KERNELS);
    p.ECCEnabled = get(ECC_ENABLED);
    p.pciBusID = get(PCI_BUS_ID);
    p.pciDeviceID = get(PCI_DEVICE_ID);
    p.pciDomainID = get(PCI_DOMAIN_ID);
    p.tccDriver = get(TCC_DRIVER);
    p.asyncEngineCount = get(ASYNC_ENGINE_COUNT);
    p.unifiedAddressing = get(UNIFIED_ADDRESSING);
    p.memoryBusWidth = get(GLOBAL_MEMORY_BUS_WIDTH);
    p.l2CacheSize = get(L2_CACHE_SIZE);
    p.persistingL2CacheMaxSize = get(MAX_PERSISTING_L2_CACHE_SIZE);
    p.maxThreadsPerMultiProcessor = get(MAX_THREADS_PER_MULTIPROCESSOR);
    p.streamPrioritiesSupported = get(STREAM_PRIORITIES_SUPPORTED);
    p.globalL1CacheSupported = get(GLOBAL_L1_CACHE_SUPPORTED);
    p.localL1CacheSupported = get(LOCAL_L1_CACHE_SUPPORTED);
    p.sharedMemPerMultiprocessor = sz(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    p.regsPerMultiprocessor = get(MAX_REGISTERS_PER_MULTIPROCESSOR);
    p.managedMemory = get(MANAGED_MEMORY);
    p.isMultiGpuBoard = get(MULTI_GPU_BOARD);
    p.multiGpuBoardGroupID = get(MULTI_GPU_BOARD_GROUP_ID);
    p.hostNativeAtomicSupported = get(HOST_NATIVE_ATOMIC_SUPPORTED);
    p.pageableMemoryAccess = get(PAGEABLE_MEMORY_ACCESS);
    p.concurrentManagedAccess = get(CONCURRENT_MANAGED_ACCESS);
    p.computePreemptionSupported = get(COMPUTE_PREEMPTION_SUPPORTED);
    p.canUseHostPointerForRegisteredMem = get(CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
    p.cooperativeLaunch = get(COOPERATIVE_LAUNCH);
    p.sharedMemPerBlockOptin = sz(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    p.pageableMemoryAccessUsesHostPageTables = get(PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
    p.directManagedMemAccessFromHost = get(DIRECT_MANAGED_MEM_ACCESS_FROM_HOST);
    p.maxBlocksPerMultiProcessor = get(MAX_BLOCKS_PER_MULTIPROCESSOR);
    p.accessPolicyMaxWindowSize = get(MAX_ACCESS_POLICY_WINDOW_SIZE);
    p.reservedSharedMemPerBlock = sz(RESERVED_SHARED_MEMORY_PER_BLOCK);
    p.hostRegisterSupported = get(HOST_REGISTER_SUPPORTED);
    p.sparseCudaArraySupported = get(SPARSE_CUDA_ARRAY_SUPPORTED);
    p.hostRegisterReadOnlySupported = get(READ_ONLY_HOST_REGISTER_SUPPORTED);
    p.timelineSemaphoreInteropSupported = get(TIMELINE_SEMAPHORE_INTEROP_SUPPORTED);
    p.memoryPoolsSupported = get(MEMORY_POOLS_SUPPORTED);
    p.gpuDirectRDMASupported = get(GPU_DIRECT_RDMA_SUPPORTED);
    p.gpuDirectRDMAFlushWritesOptions = get(GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS) as u32;
    p.gpuDirectRDMAWritesOrdering = get(GPU_DIRECT_RDMA_WRITES_ORDERING);
    p.memoryPoolSupportedHandleTypes = get(MEMPOOL_SUPPORTED_HANDLE_TYPES) as u32;
    p.deferredMappingCudaArraySupported = get(DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED);
    p.ipcEventSupported = get(IPC_EVENT_SUPPORTED);
    p.clusterLaunch = get(CLUSTER_LAUNCH);
    p.unifiedFunctionPointers = get(UNIFIED_FUNCTION_POINTERS);
    p.deviceNumaConfig = get(NUMA_CONFIG);
    p.deviceNumaId = get(NUMA_ID);
    p.mpsEnabled = get(MPS_ENABLED);
    p.hostNumaId = get(HOST_NUMA_ID);
    p.gpuPciDeviceID = get(GPU_PCI_DEVICE_ID) as u32;
    p.gpuPciSubsystemID = get(GPU_PCI_SUBSYSTEM_ID) as u32;
    p.hostNumaMultinodeIpcSupported = get(HOST_NUMA_MULTINODE_IPC_SUPPORTED);
    Ok(p)
}
