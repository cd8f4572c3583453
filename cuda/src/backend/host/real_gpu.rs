//! What the cuda engine's GPU is, asked of NVIDIA's driver (through `pgpu::cuda::sys`, the
//! real driver even in this process), for `cuDeviceGetAttribute` on the `cuda` backend.

use pgpu::cuda::sys;

/// The attributes the library reports from the real GPU.
pub struct RealGpu {
    pub name: String,
    pub cc: (u32, u32),
    pub sms: u32,
    pub clock_khz: u32,
    pub mem_clock_khz: u32,
    pub bus_width: u32,
    pub l2: u32,
    pub smem_per_sm: u32,
    pub threads_per_sm: u32,
}

/// Asks the driver (the engine has initialised it); H100 values where a query fails.
pub fn query(ordinal: i32) -> RealGpu {
    use sys::CUdevice_attribute::*;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointer to a local; the engine has called cuInit.
    let ok = unsafe { sys::cuDeviceGet(&mut dev, ordinal) } == sys::CUresult::CUDA_SUCCESS;
    let attr = |a: sys::CUdevice_attribute, dflt: u32| -> u32 {
        let mut v = 0;
        // SAFETY: out-pointer to a local, a device handle from cuDeviceGet.
        let r = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
        if ok && r == sys::CUresult::CUDA_SUCCESS && v >= 0 {
            v as u32
        } else {
            dflt
        }
    };
    let mut name = [0 as std::ffi::c_char; 128];
    // SAFETY: the buffer's length is passed; the driver NUL-terminates within it.
    let named = ok
        && unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 127, dev) }
            == sys::CUresult::CUDA_SUCCESS;
    let name = if named {
        // SAFETY: NUL-terminated within the buffer (last byte never written: length 127).
        unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        "NVIDIA GPU".into()
    };
    RealGpu {
        name,
        cc: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
        ),
        sms: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132),
        clock_khz: attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1_980_000),
        mem_clock_khz: attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2_619_000),
        bus_width: attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120),
        l2: attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20),
        smem_per_sm: attr(
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            233_472,
        ),
        threads_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
    }
}
