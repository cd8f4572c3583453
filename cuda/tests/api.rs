//! The driver API through the Rust library (the same functions the C ABI exports), on the sim
//! backend: contexts, modules from PTX text, launches, copies, globals, events, and the errors
//! (bad pointers, bad parameters, unknown names, a faulting kernel's sticky error).

use std::ffi::{CString, c_void};
use std::ptr::{null, null_mut};

use cuda::api::*;
use cuda::result::*;

const PTX: &str = include_str!("kernels.ptx");

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "driver call failed: {r}");
}

/// A fresh context on this test's thread, with the test module loaded.
fn setup() -> (Handle, Handle) {
    ok(cuInit(0));
    let mut ctx = null_mut();
    // SAFETY: out-pointers to locals.
    unsafe { ok(cuCtxCreate_v2(&mut ctx, 0, 0)) };
    let text = CString::new(PTX).unwrap();
    let mut module = null_mut();
    // SAFETY: NUL-terminated PTX text.
    unsafe { ok(cuModuleLoadData(&mut module, text.as_ptr().cast())) };
    (ctx, module)
}

fn function(module: Handle, name: &str) -> Result<Handle, CUresult> {
    let mut f = null_mut();
    let n = CString::new(name).unwrap();
    // SAFETY: out-pointer to a local, a NUL-terminated name.
    match unsafe { cuModuleGetFunction(&mut f, module, n.as_ptr()) } {
        CUDA_SUCCESS => Ok(f),
        e => Err(e),
    }
}

fn alloc(bytes: usize) -> CUdeviceptr {
    let mut p = 0;
    // SAFETY: out-pointer to a local.
    unsafe { ok(cuMemAlloc_v2(&mut p, bytes)) };
    p
}

fn htod(dst: CUdeviceptr, v: &[u32]) {
    // SAFETY: the slice's bytes.
    unsafe { ok(cuMemcpyHtoD_v2(dst, v.as_ptr().cast(), v.len() * 4)) };
}

fn dtoh(src: CUdeviceptr, n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    // SAFETY: the vector's bytes.
    unsafe { ok(cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), src, n * 4)) };
    v
}

/// Launches vecadd over `n` elements with kernelParams.
fn vecadd(f: Handle, a: u64, b: u64, c: u64, n: u32, stream: Handle) -> CUresult {
    let args: [*mut c_void; 4] = [
        (&raw const a).cast_mut().cast(),
        (&raw const b).cast_mut().cast(),
        (&raw const c).cast_mut().cast(),
        (&raw const n).cast_mut().cast(),
    ];
    let mut args = args;
    // SAFETY: four pointers to values of the parameters' sizes.
    unsafe {
        cuLaunchKernel(
            f,
            n.div_ceil(64),
            1,
            1,
            64,
            1,
            1,
            0,
            stream,
            args.as_mut_ptr(),
            null_mut(),
        )
    }
}

#[test]
fn vecadd_with_a_constant_and_a_device_global() {
    let (ctx, module) = setup();
    let f = function(module, "vecadd").unwrap();
    let n = 1000u32;
    let a: Vec<u32> = (0..n).collect();
    let b: Vec<u32> = (0..n).map(|i| 2 * i + 1).collect();
    let (da, db, dc) = (alloc(4000), alloc(4000), alloc(4000));
    htod(da, &a);
    htod(db, &b);
    ok(vecadd(f, da, db, dc, n, null_mut()));
    ok(cuCtxSynchronize());
    let c = dtoh(dc, n as usize);
    assert!(
        c.iter()
            .enumerate()
            .all(|(i, &v)| v == 3 * (3 * i as u32 + 1)),
        "{:?}",
        &c[..4]
    );

    // __constant__ through cuModuleGetGlobal: the scale becomes 5.
    let (mut p, mut size) = (0u64, 0usize);
    let name = CString::new("scale").unwrap();
    // SAFETY: out-pointers to locals, a NUL-terminated name.
    unsafe {
        ok(cuModuleGetGlobal_v2(
            &mut p,
            &mut size,
            module,
            name.as_ptr(),
        ))
    };
    assert_eq!(size, 4);
    assert_eq!(dtoh(p, 1), vec![3]);
    htod(p, &[5]);
    ok(vecadd(f, da, db, dc, n, null_mut()));
    assert_eq!(dtoh(dc, 2), vec![5, 5 * 4]);
    // The kernel counted its two launches in a __device__ variable.
    let name = CString::new("launches").unwrap();
    // SAFETY: as above; size may be null.
    unsafe {
        ok(cuModuleGetGlobal_v2(
            &mut p,
            null_mut(),
            module,
            name.as_ptr(),
        ))
    };
    assert_eq!(dtoh(p, 1), vec![2]);
    let missing = CString::new("nothing").unwrap();
    // SAFETY: as above.
    let r = unsafe { cuModuleGetGlobal_v2(&mut p, null_mut(), module, missing.as_ptr()) };
    assert_eq!(r, CUDA_ERROR_NOT_FOUND);

    // Memsets and device-to-device copies, checked on their bytes.
    ok(cuMemsetD32_v2(dc, 0xdead_beef, 10));
    assert_eq!(dtoh(dc, 11)[9..], [0xdead_beef, 5 * (3 * 10 + 1)]);
    ok(cuMemsetD8_v2(dc, 0x11, 3));
    assert_eq!(dtoh(dc, 1), vec![0xdead_beef & 0xff00_0000 | 0x11_1111]);
    ok(cuMemcpyDtoD_v2(dc, da, 4000));
    assert_eq!(dtoh(dc, n as usize), a);
    ok(cuModuleUnload(module));
    for p in [da, db, dc] {
        ok(cuMemFree_v2(p));
    }
    ok(cuCtxDestroy_v2(ctx));
}

#[test]
fn struct_by_value_through_extra_and_kernel_params() {
    let (ctx, module) = setup();
    let f = function(module, "bystruct").unwrap();
    let out = alloc(8);
    #[repr(C)]
    struct S {
        x: u32,
        y: u32,
        z: u64,
    }
    let s = S {
        x: 1,
        y: 2,
        z: 1000,
    };
    let mut args: [*mut c_void; 2] = [
        (&raw const s).cast_mut().cast(),
        (&raw const out).cast_mut().cast(),
    ];
    // SAFETY: pointers to a 16-byte struct and a u64.
    unsafe {
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
            null_mut(),
        ))
    };
    let mut v = 0u64;
    // SAFETY: 8 bytes into a local.
    unsafe { ok(cuMemcpyDtoH_v2((&raw mut v).cast(), out, 8)) };
    assert_eq!(v, 1 + 2 * 16 + 1000);
    // The same through `extra`: one buffer laid out as the .param space (24 bytes).
    let mut buf = [0u8; 24];
    buf[0..4].copy_from_slice(&7u32.to_le_bytes());
    buf[4..8].copy_from_slice(&1u32.to_le_bytes());
    buf[16..24].copy_from_slice(&out.to_le_bytes());
    let mut size: usize = buf.len();
    let mut extra: [*mut c_void; 5] = [
        std::ptr::without_provenance_mut(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
        buf.as_mut_ptr().cast(),
        2 as *mut c_void,
        (&raw mut size).cast(),
        null_mut(),
    ];
    // SAFETY: a well-formed extra array.
    unsafe {
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            null_mut(),
            extra.as_mut_ptr(),
        ))
    };
    // SAFETY: as above.
    unsafe { ok(cuMemcpyDtoH_v2((&raw mut v).cast(), out, 8)) };
    assert_eq!(v, 7 + 16);
    // A wrong buffer size is refused before anything runs.
    // SAFETY: the size the extra array points at.
    unsafe { *extra[3].cast::<usize>() = 16 };
    // SAFETY: as above, with the wrong size.
    let r = unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            null_mut(),
            extra.as_mut_ptr(),
        )
    };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    // A null among kernelParams, and no parameters at all, are refused too.
    let mut bad: [*mut c_void; 2] = [(&raw const s).cast_mut().cast(), null_mut()];
    // SAFETY: the null is caught.
    let r = unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            bad.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    // SAFETY: no parameters.
    let r = unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, null_mut(), null_mut(), null_mut()) };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    // A block of 2048 threads is too large.
    // SAFETY: valid arguments, invalid shape.
    let r = unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            2048,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    ok(cuCtxDestroy_v2(ctx));
}

#[test]
fn bad_pointers_handles_and_names_are_errors_not_crashes() {
    let (ctx, module) = setup();
    assert_eq!(
        function(module, "no_such_kernel"),
        Err(CUDA_ERROR_NOT_FOUND)
    );
    assert_eq!(
        function(0x1234 as Handle, "vecadd"),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(cuMemFree_v2(0xdead_0000), CUDA_ERROR_INVALID_VALUE);
    let p = alloc(256);
    ok(cuMemFree_v2(p));
    assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "double free");
    let d = alloc(64);
    let v = [0u8; 128];
    // SAFETY: 128 readable bytes; the device range is too small.
    let r = unsafe { cuMemcpyHtoD_v2(d, v.as_ptr().cast(), 128) };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    // SAFETY: a null host pointer is caught.
    let v1 = unsafe { cuMemcpyHtoD_v2(d, null(), 8) };
    assert_eq!(v1, CUDA_ERROR_INVALID_VALUE);
    // SAFETY: a null out-pointer is caught.
    let v2 = unsafe { cuMemAlloc_v2(null_mut(), 8) };
    assert_eq!(v2, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(
        cuCtxSetCurrent(0x5555 as Handle),
        CUDA_ERROR_INVALID_CONTEXT
    );
    assert_eq!(
        cuStreamSynchronize(0x7777 as Handle),
        CUDA_ERROR_INVALID_HANDLE
    );
    let garbage = CString::new("this is not PTX").unwrap();
    let mut m = null_mut();
    // SAFETY: a NUL-terminated string.
    let r = unsafe { cuModuleLoadData(&mut m, garbage.as_ptr().cast()) };
    assert_eq!(r, CUDA_ERROR_INVALID_IMAGE);
    let bad_ptx = CString::new(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { frobnicate; }\n",
    )
    .unwrap();
    // SAFETY: as above.
    let r = unsafe { cuModuleLoadData(&mut m, bad_ptx.as_ptr().cast()) };
    assert_eq!(r, CUDA_ERROR_INVALID_PTX);
    // The same through cuModuleLoadDataEx hands the reason back in the error log buffer.
    let mut log = [0u8; 256];
    let mut opts = [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    let mut vals: [*mut c_void; 2] = [
        log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(256),
    ];
    // SAFETY: two options with a 256-byte buffer.
    let r = unsafe {
        cuModuleLoadDataEx(
            &mut m,
            bad_ptx.as_ptr().cast(),
            2,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
        )
    };
    assert_eq!(r, CUDA_ERROR_INVALID_PTX);
    let text = std::ffi::CStr::from_bytes_until_nul(&log)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(text.contains("frobnicate"), "{text}");
    assert_eq!(vals[1] as usize, text.len());
    // Error names and texts.
    let mut s = null();
    // SAFETY: out-pointer to a local.
    unsafe { ok(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &mut s)) };
    // SAFETY: a static NUL-terminated string.
    let v3 = unsafe { std::ffi::CStr::from_ptr(s) }.to_str().unwrap();
    assert_eq!(v3, "CUDA_ERROR_ILLEGAL_ADDRESS");
    // SAFETY: out-pointer to a local.
    let v4 = unsafe { cuGetErrorString(4242, &mut s) };
    assert_eq!(v4, CUDA_ERROR_INVALID_VALUE);
    ok(cuCtxDestroy_v2(ctx));
    assert_eq!(cuCtxDestroy_v2(ctx), CUDA_ERROR_INVALID_CONTEXT);
}

#[test]
fn a_faulting_kernel_is_a_sticky_error_for_its_context_only() {
    let (ctx, module) = setup();
    let f = function(module, "vecadd").unwrap();
    let c = alloc(4096);
    // Reads from addresses no allocation maps.
    assert_eq!(
        vecadd(f, 0x1000, 0x2000, c, 64, null_mut()),
        CUDA_ERROR_ILLEGAL_ADDRESS
    );
    // Every later call on the context fails with it.
    assert_eq!(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    let mut p = 0;
    // SAFETY: out-pointer to a local.
    let v5 = unsafe { cuMemAlloc_v2(&mut p, 16) };
    assert_eq!(v5, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(
        vecadd(f, c, c, c, 64, null_mut()),
        CUDA_ERROR_ILLEGAL_ADDRESS
    );
    ok(cuCtxDestroy_v2(ctx));
    if std::env::var("VGPU_CUDA_BACKEND").as_deref() == Ok("cuda") {
        // NVIDIA's driver loses the whole process's context on a fault (one engine per
        // process): no new context in this process.
        return;
    }
    // A new context works.
    let (ctx2, module2) = setup();
    let f2 = function(module2, "vecadd").unwrap();
    let d = alloc(256);
    htod(d, &[1; 64]);
    ok(vecadd(f2, d, d, d, 64, null_mut()));
    assert_eq!(dtoh(d, 2), vec![6, 6]);
    ok(cuCtxDestroy_v2(ctx2));
}

#[test]
fn primary_context_streams_events_host_memory_and_proc_address() {
    ok(cuInit(0));
    let mut ctx = null_mut();
    // SAFETY: out-pointers to locals throughout.
    unsafe {
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let mut again = null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut again, 0));
        assert_eq!(again, ctx);
        let (mut flags, mut active) = (9, 0);
        ok(cuDevicePrimaryCtxGetState(0, &mut flags, &mut active));
        assert_eq!(active, 1);
        let mut v = 0;
        ok(cuDeviceGetAttribute(
            &mut v,
            CU_DEVICE_ATTRIBUTE_WARP_SIZE,
            0,
        ));
        assert_eq!(v, 32);
        ok(cuDeviceGetAttribute(
            &mut v,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            0,
        ));
        assert!(v >= 7);
        let mut name = [0i8; 64];
        ok(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert!(name[0] != 0);

        let text = CString::new(PTX).unwrap();
        let mut module = null_mut();
        ok(cuModuleLoadData(&mut module, text.as_ptr().cast()));
        let f = function(module, "vecadd").unwrap();
        let mut stream = null_mut();
        ok(cuStreamCreate(&mut stream, 0));
        let (mut e0, mut e1) = (null_mut(), null_mut());
        ok(cuEventCreate(&mut e0, 0));
        ok(cuEventCreate(&mut e1, 0));
        // Pinned host memory the kernel reaches through its device pointer.
        let mut h: *mut c_void = null_mut();
        ok(cuMemHostAlloc(&mut h, 1024, 2));
        let mut hd = 0;
        ok(cuMemHostGetDevicePointer_v2(&mut hd, h, 0));
        let hs = std::slice::from_raw_parts_mut(h.cast::<u32>(), 256);
        hs.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
        let out = alloc(1024);
        ok(cuEventRecord(e0, stream));
        ok(vecadd(f, hd, hd, out, 256, stream));
        ok(cuEventRecord(e1, stream));
        ok(cuEventSynchronize(e1));
        ok(cuEventQuery(e1));
        let mut ms = -1f32;
        ok(cuEventElapsedTime_v2(&mut ms, e0, e1));
        assert!(ms >= 0.0);
        let mut got = vec![0u32; 256];
        ok(cuMemcpyDtoHAsync_v2(
            got.as_mut_ptr().cast(),
            out,
            1024,
            stream,
        ));
        ok(cuStreamSynchronize(stream));
        assert!(got.iter().enumerate().all(|(i, &v)| v == 6 * i as u32));
        // cuMemcpy finds the direction from the addresses.
        ok(cuMemcpy(h as u64, out, 16));
        assert_eq!(&hs[..4], &[0, 6, 12, 18]);
        ok(cuStreamQuery(stream));
        ok(cuMemFreeHost(h));
        assert_eq!(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
        ok(cuEventDestroy_v2(e0));
        ok(cuEventDestroy_v2(e1));
        ok(cuStreamDestroy_v2(stream));
        let mut nb = null_mut();
        ok(cuStreamCreate(&mut nb, 1));
        let mut sflags = 9;
        ok(cuStreamGetFlags(nb, &mut sflags));
        assert_eq!(sflags, 1);
        ok(cuStreamDestroy_v2(nb));
        assert_eq!(cuStreamGetFlags(nb, &mut sflags), CUDA_ERROR_INVALID_HANDLE);

        // cuGetProcAddress: by base name, the newest version; a stub for the rest.
        let mut pfn = null_mut();
        let mut status = -1;
        let sym = CString::new("cuMemAlloc").unwrap();
        ok(cuGetProcAddress_v2(
            sym.as_ptr(),
            &mut pfn,
            13000,
            0,
            &mut status,
        ));
        assert_eq!(pfn as usize, cuMemAlloc_v2 as *const () as usize);
        assert_eq!(status, 0);
        let sym = CString::new("cuGraphCreate").unwrap();
        ok(cuGetProcAddress_v2(
            sym.as_ptr(),
            &mut pfn,
            13000,
            0,
            &mut status,
        ));
        let stub: extern "C" fn() -> CUresult = std::mem::transmute(pfn);
        assert_eq!(stub(), CUDA_ERROR_NOT_SUPPORTED);
        let sym = CString::new("cuNoSuchThing").unwrap();
        assert_eq!(
            cuGetProcAddress_v2(sym.as_ptr(), &mut pfn, 13000, 0, &mut status),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!(status, 1);

        // Occupancy.
        let (mut grid, mut block) = (0, 0);
        ok(cuOccupancyMaxPotentialBlockSize(
            &mut grid, &mut block, f, None, 0, 0,
        ));
        assert!((32..=1024).contains(&block) && grid > 0, "{grid} {block}");
        let mut blocks = 0;
        ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut blocks,
            f,
            256,
            0,
        ));
        assert_eq!(blocks, 8);
        let mut smem = 0usize;
        ok(cuOccupancyAvailableDynamicSMemPerBlock(
            &mut smem, f, 1, 256,
        ));
        let mut per_block = 0;
        ok(cuDeviceGetAttribute(
            &mut per_block,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            0,
        ));
        assert_eq!(smem, per_block as usize);
        // A cooperative grid larger than the device holds at once is refused.
        let (a, n) = (0u64, 0u32);
        let mut args: [*mut c_void; 4] = [
            (&raw const a).cast_mut().cast(),
            (&raw const a).cast_mut().cast(),
            (&raw const a).cast_mut().cast(),
            (&raw const n).cast_mut().cast(),
        ];
        let r = cuLaunchCooperativeKernel(
            f,
            1 << 20,
            1,
            1,
            256,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
        );
        assert_eq!(r, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        ok(cuLaunchCooperativeKernel(
            f,
            1,
            1,
            1,
            256,
            1,
            1,
            0,
            null_mut(),
            args.as_mut_ptr(),
        ));

        ok(cuDevicePrimaryCtxRelease_v2(0));
        ok(cuDevicePrimaryCtxRelease_v2(0));
        ok(cuDevicePrimaryCtxGetState(0, &mut flags, &mut active));
        assert_eq!(active, 0);
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
    }
}

#[test]
fn managed_memory_and_host_buffers_share_one_address_on_sim() {
    let (ctx, module) = setup();
    let f = function(module, "vecadd").unwrap();
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    unsafe {
        ok(cuDeviceGetAttribute(
            &mut v,
            CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
            0,
        ))
    };
    if v == 0 {
        eprintln!("SKIP: no managed memory on this backend");
        ok(cuCtxDestroy_v2(ctx));
        return;
    }
    let mut m = 0u64;
    // SAFETY: out-pointer to a local.
    unsafe { ok(cuMemAllocManaged(&mut m, 3 * 1024, 1)) };
    // The host writes through the pointer, the kernel reads and writes the same memory.
    // SAFETY: 3 KiB of managed memory at `m`, mapped in this process.
    let host = unsafe { std::slice::from_raw_parts_mut(m as *mut u32, 768) };
    host.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
    let (a, c) = (m, m + 2048);
    ok(vecadd(f, a, a, c, 256, null_mut()));
    ok(cuCtxSynchronize());
    assert!(
        host[512..]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == 6 * i as u32)
    );
    let mut managed = 0u32;
    // SAFETY: a u32 out-pointer for IS_MANAGED.
    unsafe {
        ok(cuPointerGetAttribute(
            (&raw mut managed).cast(),
            CU_POINTER_ATTRIBUTE_IS_MANAGED,
            m,
        ))
    };
    assert_eq!(managed, 1);
    // A pinned host buffer: its host pointer works in a kernel too (unified addressing).
    let mut h: *mut c_void = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { ok(cuMemHostAlloc(&mut h, 1024, 0)) };
    let mut d = 0;
    // SAFETY: as above.
    unsafe { ok(cuMemHostGetDevicePointer_v2(&mut d, h, 0)) };
    assert_eq!(d, h as u64);
    ok(vecadd(f, a, a, h as u64, 256, null_mut()));
    // SAFETY: 1 KiB of host buffer.
    let hs = unsafe { std::slice::from_raw_parts(h.cast::<u32>(), 256) };
    assert_eq!(hs[10], 60);
    assert_eq!(cuMemFreeHost(m as *mut c_void), CUDA_ERROR_INVALID_VALUE);
    ok(cuMemFree_v2(m));
    ok(cuMemFreeHost(h));
    ok(cuCtxDestroy_v2(ctx));
}

#[test]
fn threads_with_their_own_contexts_and_one_shared_context() {
    ok(cuInit(0));
    let mut shared = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { ok(cuCtxCreate_v2(&mut shared, 0, 0)) };
    let shared_key = shared as usize;
    let handles: Vec<_> = (0..4u32)
        .map(|t| {
            std::thread::spawn(move || {
                // Half the threads make their own context, half use the shared one.
                let own = t % 2 == 0;
                let ctx = if own {
                    setup().0
                } else {
                    ok(cuCtxSetCurrent(shared_key as Handle));
                    shared_key as Handle
                };
                let text = CString::new(PTX).unwrap();
                let mut module = null_mut();
                // SAFETY: NUL-terminated PTX text.
                unsafe { ok(cuModuleLoadData(&mut module, text.as_ptr().cast())) };
                let f = function(module, "vecadd").unwrap();
                let d = alloc(4 * 512);
                for round in 0..5u32 {
                    htod(d, &vec![t + round; 512]);
                    ok(vecadd(f, d, d, d, 512, null_mut()));
                    assert_eq!(dtoh(d, 512), vec![6 * (t + round); 512]);
                }
                ok(cuMemFree_v2(d));
                ok(cuModuleUnload(module));
                if own {
                    ok(cuCtxDestroy_v2(ctx));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    ok(cuCtxDestroy_v2(shared));
}

#[test]
fn mutated_modules_are_refused_or_loaded_never_a_panic() {
    let (ctx, _) = setup();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let base = PTX.as_bytes();
    let alphabet = b" \n;{}[]+-.,%$_0123456789abcxyz.global.const";
    for _ in 0..300 {
        let mut text = base.to_vec();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % text.len();
            match next() % 3 {
                0 => text[at] = alphabet[(next() as usize) % alphabet.len()],
                1 => {
                    text.remove(at);
                }
                _ => text.insert(at, alphabet[(next() as usize) % alphabet.len()]),
            }
        }
        text.retain(|&b| b != 0);
        let c = CString::new(text).unwrap();
        let mut m = null_mut();
        // SAFETY: NUL-terminated text.
        let r = unsafe { cuModuleLoadData(&mut m, c.as_ptr().cast()) };
        assert_ne!(r, CUDA_ERROR_UNKNOWN, "a panic inside the library");
        if r == CUDA_SUCCESS {
            ok(cuModuleUnload(m));
        }
    }
    ok(cuCtxDestroy_v2(ctx));
}

#[test]
fn pitched_memory_and_2d_copies() {
    let (ctx, _) = setup();
    let (mut d, mut pitch) = (0u64, 0usize);
    // SAFETY: out-pointers to locals.
    unsafe { ok(cuMemAllocPitch_v2(&mut d, &mut pitch, 40, 6, 4)) };
    assert_eq!(pitch, 512);
    // A 10x6 block of u32 from a host array with rows of 16 into the pitched memory at x=8 bytes.
    let host: Vec<u32> = (0..16 * 6).collect();
    let up = Memcpy2D {
        src_x: 0,
        src_y: 0,
        src_type: CU_MEMORYTYPE_HOST,
        src_host: host.as_ptr().cast(),
        src_device: 0,
        src_array: null_mut(),
        src_pitch: 64,
        dst_x: 8,
        dst_y: 0,
        dst_type: CU_MEMORYTYPE_DEVICE,
        dst_host: null_mut(),
        dst_device: d,
        dst_array: null_mut(),
        dst_pitch: pitch,
        width: 32,
        height: 6,
    };
    // SAFETY: a well-formed copy within both buffers.
    unsafe { ok(cuMemcpy2D_v2(&up)) };
    // Row 3 of the device memory: two untouched words, then host row 3's first 8 words.
    let row = dtoh(d + 3 * pitch as u64, 10);
    assert_eq!(row[2..], host[48..56]);
    // Back down, unified addressing on both sides, into a dense 8x6 array.
    let mut back = vec![0u32; 8 * 6];
    let down = Memcpy2D {
        src_x: 8,
        src_type: CU_MEMORYTYPE_UNIFIED,
        src_device: d,
        src_pitch: pitch,
        dst_x: 0,
        dst_type: CU_MEMORYTYPE_UNIFIED,
        dst_device: back.as_mut_ptr() as u64,
        dst_pitch: 32,
        ..up
    };
    // SAFETY: as above.
    unsafe { ok(cuMemcpy2D_v2(&down)) };
    for r in 0..6 {
        assert_eq!(back[r * 8..r * 8 + 8], host[r * 16..r * 16 + 8]);
    }
    // A copy past the allocation's end is refused.
    let past = Memcpy2D { dst_y: 1, ..up };
    // SAFETY: a copy the library refuses before touching memory.
    let r = unsafe { cuMemcpy2D_v2(&past) };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
    // ... before anything was written: row 1 still holds host row 1.
    assert_eq!(dtoh(d + pitch as u64, 10)[2..], host[16..24]);
    ok(cuMemFree_v2(d));
    ok(cuCtxDestroy_v2(ctx));
}
