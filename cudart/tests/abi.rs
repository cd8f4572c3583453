//! The exported C functions called as a program calls them, where no GPU is needed:
//! registration and the launch configuration stack through `__cuda*`, the last-error rules,
//! error strings as C strings, an unimplemented export, and the answers without a driver.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;

use cudart::api::misc::*;
use cudart::api::register::*;
use cudart::error;
use cudart::ffi::{Dim3, Out};

unsafe extern "C" {
    // Two of the generated unimplemented exports.
    fn cudaGraphCreate(graph: *mut *mut c_void, flags: u32) -> i32;
    fn cudaMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) -> i32;
}

/// A fat binary of one (empty) PTX entry and its `.nvFatBinSegment` wrapper, leaked like the
/// program's own data.
fn wrapper() -> *mut c_void {
    let mut fb = Vec::new();
    fb.extend(0xBA55_ED50u32.to_le_bytes());
    fb.extend(1u16.to_le_bytes());
    fb.extend(16u16.to_le_bytes());
    fb.extend(0u64.to_le_bytes());
    let fb: &'static [u8] = Box::leak(fb.into_boxed_slice());
    let mut w = [0u64; 3];
    w[0] = 0x4662_43B1 | (1 << 32);
    w[1] = fb.as_ptr() as u64;
    Box::leak(Box::new(w)).as_mut_ptr().cast()
}

#[test]
fn registration_get_kernel_and_call_configuration() {
    static STUB: u8 = 0;
    static OTHER: u8 = 0;
    let stub = &STUB as *const u8 as *const c_void;
    // SAFETY: a wrapper as nvcc emits, a NUL-terminated name.
    let h = unsafe { __cudaRegisterFatBinary(wrapper()) };
    assert!(!h.is_null());
    // SAFETY: as nvcc's code calls it.
    unsafe {
        __cudaRegisterFunction(
            h,
            stub.cast(),
            null_mut(),
            c"_Z4kernPi".as_ptr(),
            -1,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
        )
    };
    __cudaRegisterFatBinaryEnd(h);
    let mut k: *mut c_void = null_mut();
    // SAFETY: `k` is a valid output.
    let r = unsafe { __cudaGetKernel(Out::new(&mut k), stub) };
    assert_eq!(r, 0);
    assert_eq!(k as *const c_void, stub);
    // SAFETY: as above, for a host address never registered.
    let r = unsafe { __cudaGetKernel(Out::new(&mut k), &OTHER as *const u8 as *const c_void) };
    assert_eq!(r, error::INVALID_DEVICE_FUNCTION);
    assert_eq!(cudaGetLastError(), error::INVALID_DEVICE_FUNCTION);

    let g = Dim3 { x: 7, y: 2, z: 1 };
    let b = Dim3 { x: 128, y: 1, z: 1 };
    assert_eq!(
        __cudaPushCallConfiguration(g, b, 512, 0x2 as *mut c_void),
        0
    );
    let (mut g2, mut b2, mut s2, mut st2) = (Dim3::default(), Dim3::default(), 0usize, null_mut());
    // SAFETY: valid outputs.
    let r = unsafe {
        __cudaPopCallConfiguration(
            Out::new(&mut g2),
            Out::new(&mut b2),
            Out::new(&mut s2),
            Out::new(&mut st2),
        )
    };
    assert_eq!((r, g2, b2, s2, st2 as usize), (0, g, b, 512, 2));
    // Nothing pushed: an error, not a crash.
    // SAFETY: valid outputs.
    let r = unsafe {
        __cudaPopCallConfiguration(
            Out::new(&mut g2),
            Out::new(&mut b2),
            Out::new(&mut s2),
            Out::new(&mut st2),
        )
    };
    assert_eq!(r, error::MISSING_CONFIGURATION);

    __cudaUnregisterFatBinary(h);
    // SAFETY: valid output; the stub is forgotten with its fat binary.
    let r = unsafe { __cudaGetKernel(Out::new(&mut k), stub) };
    assert_eq!(r, error::INVALID_DEVICE_FUNCTION);
    // Hostile handles and names are ignored.
    __cudaUnregisterFatBinary(0x1234 as *mut *mut c_void);
    // SAFETY: null pointers are what is being tested.
    unsafe {
        __cudaRegisterFunction(
            h,
            stub.cast(),
            null_mut(),
            std::ptr::null(),
            -1,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
        );
        assert!(!__cudaRegisterFatBinary(null_mut()).is_null());
    }
    cudaGetLastError();
}

#[test]
fn error_strings_are_c_strings() {
    // SAFETY: the functions return static NUL-terminated strings.
    unsafe {
        assert_eq!(CStr::from_ptr(cudaGetErrorString(1)), c"invalid argument");
        assert_eq!(
            CStr::from_ptr(cudaGetErrorName(700)),
            c"cudaErrorIllegalAddress"
        );
        assert_eq!(
            CStr::from_ptr(cudaGetErrorString(-5)),
            c"unrecognized error code"
        );
    }
}

#[test]
fn unimplemented_exports_say_not_supported() {
    std::thread::spawn(|| {
        let mut g = null_mut();
        // SAFETY: the stub ignores its arguments.
        let r = unsafe { cudaGraphCreate(&mut g, 0) };
        assert_eq!(r, error::NOT_SUPPORTED);
        assert_eq!(cudaPeekAtLastError(), error::NOT_SUPPORTED);
        assert_eq!(cudaGetLastError(), error::NOT_SUPPORTED);
        assert_eq!(cudaGetLastError(), error::SUCCESS);
        // SAFETY: as above.
        let r = unsafe { cudaMemPoolCreate(&mut g, std::ptr::null()) };
        assert_eq!(r, error::NOT_SUPPORTED);
        assert!(g.is_null());
    })
    .join()
    .unwrap();
}

#[test]
fn versions_and_no_driver() {
    let mut v = 0;
    // SAFETY: valid output.
    let r = unsafe { cudaRuntimeGetVersion(Out::new(&mut v)) };
    assert_eq!(r, 0);
    assert_eq!(v, 13000);
    // SAFETY: null output is refused.
    let r = unsafe { cudaRuntimeGetVersion(Out::new(null_mut())) };
    assert_eq!(r, error::INVALID_VALUE);
    if cudart::driver::driver().is_ok() {
        eprintln!("skipped the no-driver part: a libcuda.so.1 is loadable here");
        return;
    }
    let mut n = 5;
    // SAFETY: valid output.
    let r = unsafe { cudart::api::device::cudaGetDeviceCount(Out::new(&mut n)) };
    assert_eq!(r, error::INSUFFICIENT_DRIVER);
    assert_eq!(n, 0);
    // SAFETY: valid output.
    let r = unsafe { cudaDriverGetVersion(Out::new(&mut v)) };
    assert_eq!(r, 0);
    assert_eq!(v, 0);
    let mut p = null_mut();
    // SAFETY: valid output.
    let r = unsafe { cudart::api::memory::cudaMalloc(Out::new(&mut p), 16) };
    assert_eq!(r, error::INSUFFICIENT_DRIVER);
}
