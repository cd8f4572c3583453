//! Modules (PTX text, or a fat binary through `cuda-fatbin`), their functions and
//! globals, function attributes, `cuLaunchKernel` and the occupancy calculator.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::time::Instant;

use super::{CUdeviceptr, Handle, c_str, ffi, handle, key, out};
use crate::device::Launch;
use crate::module_image::{self, ImageError};
use crate::result::*;
use crate::state::{FuncRec, ModuleRec, try_with as with};
use crate::stats;

/// Why an image was refused: in the thread's load log (`CU_JIT_ERROR_LOG_BUFFER`), and on
/// stderr unless the caller asked for the log (the runtime does, and prints one line itself).
fn image_err(e: ImageError) -> CUresult {
    if !QUIET.with(std::cell::Cell::get) {
        eprintln!("libcuda (vgpu): module: {e}");
    }
    set_log(e.to_string());
    match e {
        ImageError::Null => CUDA_ERROR_INVALID_VALUE,
        ImageError::Elf | ImageError::NoUsablePtx(_) => CUDA_ERROR_NO_BINARY_FOR_GPU,
        ImageError::Fatbin(_) | ImageError::TooLong | ImageError::Unknown => {
            CUDA_ERROR_INVALID_IMAGE
        }
    }
}

/// What the current device runs (for the choice of PTX in a fat binary).
fn limits() -> Result<module_image::PtxLimits, CUresult> {
    with(|g| {
        let i = &g.inited()?.info;
        Ok(module_image::PtxLimits {
            max_arch: i.max_ptx_arch,
            max_isa: i.max_ptx_isa,
        })
    })
}

thread_local! {
    /// Why this thread's last module load failed (for `CU_JIT_ERROR_LOG_BUFFER`).
    static LOAD_LOG: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    /// Set while a load's caller takes the error log itself (`cuModuleLoadDataEx` with
    /// `CU_JIT_ERROR_LOG_BUFFER`): then nothing is printed.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn set_log(text: String) {
    LOAD_LOG.with(|l| *l.borrow_mut() = text);
}

/// Loads PTX text into the current context.
pub(crate) fn load_ptx(module: *mut Handle, ptx: &str) -> Result<(), CUresult> {
    if module.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let t = Instant::now();
    set_log(String::new());
    let parsed = ptx::parse(ptx).map_err(|e| {
        if !QUIET.with(std::cell::Cell::get) {
            eprintln!("libcuda (vgpu): PTX refused: {e}");
        }
        set_log(format!("PTX refused: {e}"));
        CUDA_ERROR_INVALID_PTX
    })?;
    let entries: HashMap<String, ptx::EntryInfo> = parsed
        .entries()
        .map(|e| (e.name.clone(), e.clone()))
        .collect();
    drop(parsed);
    let h = with(|g| {
        let (ch, ctx) = g.cur()?;
        let id = ctx.dev_call(|d| d.module_load(ptx).inspect_err(|e| set_log(e.to_string())))?;
        let h = g.handle();
        g.modules.insert(
            h,
            ModuleRec {
                ctx: ch,
                id,
                entries,
                globals: Vec::new(),
            },
        );
        Ok(h)
    })?;
    stats::call("cuModuleLoadData", ptx.len() as u64, t, None);
    // SAFETY: checked not null; the caller's out-pointer.
    unsafe { out(module, handle(h)) }
}

/// # Safety
/// `module` must be valid for a write; `image` must point to PTX text (NUL-terminated) or a
/// fat binary.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CUresult {
    ffi("cuModuleLoadData", || {
        // SAFETY: the caller's image.
        let text =
            unsafe { module_image::ptx_from_ptr(image.cast(), limits()?) }.map_err(image_err)?;
        load_ptx(module, &text)
    })
}

/// JIT options: the error log buffer (`CU_JIT_ERROR_LOG_BUFFER` with its size) receives why
/// a load failed, the info log buffer an empty text; the others are accepted and ignored (the
/// engines compile PTX their own way).
///
/// # Safety
/// As [`cuModuleLoadData`]; `options`/`values` hold `num_options` entries, log buffers of the
/// sizes given with them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut Handle,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_uint,
    values: *mut *mut c_void,
) -> CUresult {
    let wants_log = num_options > 0
        && num_options <= 64
        && !options.is_null()
        && !values.is_null()
        // SAFETY: the program promises `num_options` entries.
        && unsafe { std::slice::from_raw_parts(options, num_options as usize) }
            .contains(&CU_JIT_ERROR_LOG_BUFFER);
    QUIET.with(|q| q.set(wants_log));
    // SAFETY: same contract.
    let r = unsafe { cuModuleLoadData(module, image) };
    QUIET.with(|q| q.set(false));
    if num_options == 0 || options.is_null() || values.is_null() || num_options > 64 {
        return r;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the program promises `num_options` entries in both arrays.
        let opts = unsafe { std::slice::from_raw_parts(options, num_options as usize) };
        // SAFETY: as above.
        let vals = unsafe { std::slice::from_raw_parts_mut(values, num_options as usize) };
        let log = LOAD_LOG.with(|l| l.borrow().clone());
        for (buf_key, size_key, text) in [
            (
                CU_JIT_ERROR_LOG_BUFFER,
                CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                log.as_str(),
            ),
            (
                CU_JIT_INFO_LOG_BUFFER,
                CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                "",
            ),
        ] {
            let find = |key: u32| opts.iter().position(|&o| o == key);
            let (Some(i), Some(j)) = (find(buf_key), find(size_key)) else {
                continue;
            };
            let size = vals[j] as usize;
            let buf = vals[i].cast::<u8>();
            if buf.is_null() || size == 0 {
                continue;
            }
            let n = text.len().min(size - 1);
            // SAFETY: the program's log buffer of `size` bytes; n + 1 <= size.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n);
                *buf.add(n) = 0;
            }
            vals[j] = std::ptr::without_provenance_mut(n);
        }
    });
    r
}

/// # Safety
/// As [`cuModuleLoadData`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut Handle,
    fatbin: *const c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuModuleLoadData(module, fatbin) }
}

/// # Safety
/// `module` must be valid for a write; `fname` a NUL-terminated path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(module: *mut Handle, fname: *const c_char) -> CUresult {
    ffi("cuModuleLoad", || {
        // SAFETY: the caller's string.
        let path = unsafe { c_str(fname, 4096) }?;
        let meta = std::fs::metadata(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        if meta.len() > module_image::MAX_PTX as u64 {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        let text = module_image::ptx_from_bytes(&bytes, limits()?).map_err(image_err)?;
        load_ptx(module, &text)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    ffi("cuModuleUnload", || {
        let t = Instant::now();
        with(|g| {
            let m = g
                .modules
                .get(&key(module))
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let (c, id) = (m.ctx, m.id);
            let (_, ctx) = g.ctx(c)?;
            ctx.dev_call(|d| d.module_unload(id))?;
            if let Some(m) = g.modules.remove(&key(module))
                && let Some(ctx) = g.contexts.get_mut(&c)
            {
                for p in m.globals {
                    ctx.globals.remove(&p);
                }
            }
            g.functions.retain(|_, f| f.module != key(module));
            Ok(())
        })?;
        stats::call("cuModuleUnload", 0, t, Some(stats::Phase::Close));
        Ok(())
    })
}

/// # Safety
/// `func` must be valid for a write; `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    func: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetFunction", || {
        // SAFETY: the caller's string.
        let name = unsafe { c_str(name, 4096) }?;
        if func.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = with(|g| {
            let mk = key(module);
            if let Some((h, _)) = g
                .functions
                .iter()
                .find(|(_, f)| f.module == mk && f.entry == name)
            {
                return Ok(*h);
            }
            let m = g.modules.get(&mk).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let info = m.entries.get(&name).cloned().ok_or(CUDA_ERROR_NOT_FOUND)?;
            let c = m.ctx;
            let max_dynamic_shared = g
                .inited()?
                .info
                .shared_mem_per_block
                .saturating_sub(info.static_shared_bytes);
            let h = g.handle();
            g.functions.insert(
                h,
                FuncRec {
                    ctx: c,
                    module: mk,
                    entry: name.clone(),
                    info,
                    max_dynamic_shared,
                },
            );
            Ok(h)
        })?;
        // SAFETY: checked not null; the caller's out-pointer.
        unsafe { out(func, handle(h)) }
    })
}

/// # Safety
/// `dptr`, `bytes` each null or valid for a write; `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetGlobal_v2", || {
        // SAFETY: the caller's string.
        let name = unsafe { c_str(name, 4096) }?;
        let (p, n) = with(|g| {
            let m = g
                .modules
                .get(&key(module))
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let (c, id) = (m.ctx, m.id);
            let (_, ctx) = g.ctx(c)?;
            let (p, n) = ctx.dev_call(|d| d.module_global(id, &name))?;
            // The variable's range is device memory the program may copy to and from.
            ctx.globals.insert(p, n);
            if let Some(m) = g.modules.get_mut(&key(module)) {
                m.globals.push(p);
            }
            Ok((p, n))
        })?;
        // SAFETY: the caller's out-pointers, each optional.
        unsafe {
            if !dptr.is_null() {
                out(dptr, p)?;
            }
            if !bytes.is_null() {
                out(bytes, n as usize)?;
            }
        }
        Ok(())
    })
}

/// Runs `f` on a function's record.
fn func<T>(
    f: Handle,
    body: impl FnOnce(&mut FuncRec, u32) -> Result<T, CUresult>,
) -> Result<T, CUresult> {
    with(|g| {
        let smem = g.inited()?.info.shared_mem_per_block;
        let rec = g
            .functions
            .get_mut(&key(f))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        body(rec, smem)
    })
}

/// The threads per block a kernel allows (`.maxntid` / `.reqntid`, else the device's 1024).
fn max_threads(info: &ptx::EntryInfo) -> u32 {
    info.reqntid
        .or(info.maxntid)
        .map(|d| d[0].saturating_mul(d[1]).saturating_mul(d[2]).min(1024))
        .unwrap_or(1024)
}

/// # Safety
/// `pi` must be valid for a write of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_uint, f: Handle) -> CUresult {
    ffi("cuFuncGetAttribute", || {
        let v = func(f, |r, _| {
            Ok(match attrib {
                CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => max_threads(&r.info) as c_int,
                CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => r.info.static_shared_bytes as c_int,
                CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES => 0,
                CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => r.info.local_bytes_per_thread as c_int,
                CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
                CU_FUNC_ATTRIBUTE_PTX_VERSION | CU_FUNC_ATTRIBUTE_BINARY_VERSION => 80,
                CU_FUNC_ATTRIBUTE_CACHE_MODE_CA => 0,
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => r.max_dynamic_shared as c_int,
                CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
                a if a < 32 => 0,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            })
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pi, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(f: Handle, attrib: c_uint, value: c_int) -> CUresult {
    ffi("cuFuncSetAttribute", || {
        func(f, |r, smem| match attrib {
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
                let v = u32::try_from(value).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
                if v.saturating_add(r.info.static_shared_bytes) > smem {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                r.max_dynamic_shared = v;
                Ok(())
            }
            CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT if (-1..=100).contains(&value) => {
                Ok(())
            }
            CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH
            | CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT
            | CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH
            | CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            | CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE => {
                Err(CUDA_ERROR_NOT_SUPPORTED)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        })
    })
}

/// Accepted and ignored (a hint).
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(f: Handle, config: c_uint) -> CUresult {
    ffi("cuFuncSetCacheConfig", || {
        func(f, |_, _| {
            if config > CU_FUNC_CACHE_PREFER_EQUAL {
                Err(CUDA_ERROR_INVALID_VALUE)
            } else {
                Ok(())
            }
        })
    })
}

/// # Safety
/// `offset`, `size` each null or valid for a write of a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: Handle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    ffi("cuFuncGetParamInfo", || {
        let (o, s) = func(f, |r, _| {
            r.info
                .params
                .get(index)
                .map(|p| (p.offset as usize, p.size as usize))
                .ok_or(CUDA_ERROR_INVALID_VALUE)
        })?;
        // SAFETY: the caller's out-pointers, each optional.
        unsafe {
            if !offset.is_null() {
                out(offset, o)?;
            }
            if !size.is_null() {
                out(size, s)?;
            }
        }
        Ok(())
    })
}

/// # Safety
/// `module` must be valid for a write of a `CUmodule`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetModule(module: *mut Handle, f: Handle) -> CUresult {
    ffi("cuFuncGetModule", || {
        let m = func(f, |r, _| Ok(r.module))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(module, handle(m)) }
    })
}

/// # Safety
/// `kernel_params` / `extra`: see `params::lay_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ffi("cuLaunchKernel", || {
        let t = Instant::now();
        with(|g| {
            let rec = g.functions.get(&key(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let info = rec.info.clone();
            let entry = rec.entry.clone();
            let (fctx, module, max_dyn) = (rec.ctx, rec.module, rec.max_dynamic_shared);
            let mid = g.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?.id;
            let dinfo = g.inited()?.info.clone();
            // The host backend runs a launch before returning: its kernel time ends there.
            let synchronous = g.inited()?.kind != crate::backend::BackendKind::Guest;
            let grid = [gx, gy, gz];
            let block = [bx, by, bz];
            if grid.contains(&0) || block.contains(&0) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
            if threads > u64::from(max_threads(&info).min(dinfo.max_threads_per_block))
                || (0..3)
                    .any(|i| block[i] > dinfo.max_block_dim[i] || grid[i] > dinfo.max_grid_dim[i])
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            if shared > max_dyn {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: the program's argument arrays (see params::lay_out).
            let params = unsafe {
                crate::params::lay_out(
                    &info,
                    kernel_params.cast_const().cast(),
                    extra.cast_const().cast(),
                )
            }
            .map_err(|e| {
                eprintln!("libcuda (vgpu): cuLaunchKernel {entry}: {e}");
                CUDA_ERROR_INVALID_VALUE
            })?;
            let (sctx, ctx) = g.stream_ctx(key(stream))?;
            if sctx != fctx {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            let launch = Launch {
                module: mid,
                entry: &entry,
                grid,
                block,
                shared_bytes: shared,
                params: &params,
            };
            let overhead = t.elapsed().as_nanos() as u64;
            stats::launched(t, overhead);
            let r = ctx.dev_call(|d| d.launch(&launch));
            if synchronous {
                stats::kernels_done();
            }
            r
        })?;
        stats::call("cuLaunchKernel", 0, t, None);
        Ok(())
    })
}

/// A launch whose blocks must all be resident at once (grid-wide synchronisation): refused
/// with `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` when the grid exceeds what the device holds
/// (occupancy × multiprocessors), else an ordinary launch.
///
/// # Safety
/// As [`cuLaunchKernel`] (`kernelParams` only).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    let fits = ffi("cuLaunchCooperativeKernel", || {
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        let blocks = u64::from(gx) * u64::from(gy) * u64::from(gz);
        let block = c_int::try_from(threads).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let (per_sm, sms) = with(|g| {
            let sms = u64::from(g.inited()?.info.multiprocessor_count);
            Ok((occupancy(g, f, block, shared as usize)?, sms))
        })?;
        if blocks > per_sm.max(0) as u64 * sms {
            return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
        Ok(())
    });
    if fits != CUDA_SUCCESS {
        return fits;
    }
    // SAFETY: same contract as cuLaunchKernel.
    unsafe {
        cuLaunchKernel(
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            stream,
            kernel_params,
            std::ptr::null_mut(),
        )
    }
}

/// # Safety
/// `dyn_smem` must be valid for a write of a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    dyn_smem: *mut usize,
    f: Handle,
    blocks: c_int,
    block: c_int,
) -> CUresult {
    ffi("cuOccupancyAvailableDynamicSMemPerBlock", || {
        if blocks <= 0 || block <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = with(|g| {
            let d = g.inited()?.info.clone();
            let rec = g.functions.get(&key(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let per_block =
                (d.shared_mem_per_multiprocessor / blocks as u32).min(d.shared_mem_per_block);
            Ok(per_block.saturating_sub(rec.info.static_shared_bytes))
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(dyn_smem, v as usize) }
    })
}

/// Blocks of `block` threads with `dyn_smem` dynamic shared memory one multiprocessor holds.
fn occupancy(
    g: &mut crate::state::Global,
    f: Handle,
    block: c_int,
    dyn_smem: usize,
) -> Result<c_int, CUresult> {
    let d = g.inited()?.info.clone();
    let rec = g.functions.get(&key(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if block <= 0 || block as u32 > max_threads(&rec.info) {
        return Ok(0);
    }
    let warps = (block as u32).div_ceil(d.warp_size.max(1));
    let by_threads = d.max_threads_per_multiprocessor / (warps * d.warp_size.max(1));
    let smem = u64::from(rec.info.static_shared_bytes) + dyn_smem as u64;
    let by_smem = u64::from(d.shared_mem_per_multiprocessor)
        .checked_div(smem)
        .map_or(u32::MAX, |n| n.min(u64::from(u32::MAX)) as u32);
    Ok(by_threads.min(by_smem).min(32) as c_int)
}

/// # Safety
/// `blocks` must be valid for a write of an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut c_int,
    f: Handle,
    block: c_int,
    dyn_smem: usize,
    _flags: c_uint,
) -> CUresult {
    ffi("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        let n = with(|g| occupancy(g, f, block, dyn_smem))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(blocks, n) }
    })
}

/// # Safety
/// As the `WithFlags` form.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    f: Handle,
    block: c_int,
    dyn_smem: usize,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block, dyn_smem, 0) }
}

/// `size_t (*)(int blockSize)`: dynamic shared memory for a block size.
pub type B2DSize = Option<unsafe extern "C" fn(c_int) -> usize>;

/// # Safety
/// `min_grid`, `block` must be valid for writes of an `int`; `b2d`, if given, a function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: Handle,
    b2d: B2DSize,
    dyn_smem: usize,
    limit: c_int,
    _flags: c_uint,
) -> CUresult {
    ffi("cuOccupancyMaxPotentialBlockSize", || {
        if min_grid.is_null() || block.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (sms, max_block) = with(|g| {
            let sms = g.inited()?.info.multiprocessor_count as c_int;
            let rec = g.functions.get(&key(f)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            Ok((sms, max_threads(&rec.info) as c_int))
        })?;
        let cap = if limit > 0 {
            limit.min(max_block)
        } else {
            max_block
        };
        let mut best = (0, 0);
        let mut b = (cap / 32) * 32;
        while b >= 32 {
            // SAFETY: the program's callback, as the driver calls it.
            let smem = b2d.map_or(dyn_smem, |cb| unsafe { cb(b) });
            let n = with(|g| occupancy(g, f, b, smem))?;
            if n * b > best.0 * best.1 {
                best = (n, b);
            }
            b -= 32;
        }
        if best.1 == 0 {
            best = (1, cap.max(1));
        }
        // SAFETY: checked not null; the caller's out-pointers.
        unsafe {
            out(min_grid, best.0 * sms)?;
            out(block, best.1)
        }
    })
}

/// # Safety
/// As the `WithFlags` form.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: Handle,
    b2d: B2DSize,
    dyn_smem: usize,
    limit: c_int,
) -> CUresult {
    // SAFETY: same contract.
    unsafe {
        cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block, f, b2d, dyn_smem, limit, 0)
    }
}
