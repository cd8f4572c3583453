//! What nvcc's generated host code calls: registration at start-up (`__cudaRegisterFatBinary`,
//! `__cudaRegisterFunction`, `__cudaRegisterVar`, ... — bookkeeping only, no driver call, since
//! they run from static constructors), the launch configuration stack of `<<<...>>>`, and
//! `__cudaInitModule` for managed variables.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Mutex;

use crate::callconf::{self, CallConfig};
use crate::context::{self, with_registry};
use crate::driver::Handle;
use crate::error::*;
use crate::fatbin;
use crate::ffi::{Dim3, Out};
use crate::registry::Var;

/// Handle address -> fat binary index.
static HANDLES: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);

/// The fat binary index of a handle the program passes back; `None` for unknown ones.
pub fn fatbin_of(handle: *mut *mut c_void) -> Option<usize> {
    let g = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref()?.get(&(handle as usize)).copied()
}

/// A C string of the program's, copied; `None` for null or non-UTF-8-safe... any bytes are kept.
fn c_string(p: *const c_char) -> Option<std::ffi::CString> {
    if p.is_null() {
        return None;
    }
    // SAFETY: nvcc's registration code passes NUL-terminated names from the program's image.
    Some(unsafe { CStr::from_ptr(p) }.to_owned())
}

/// Registers one translation unit's fat binary; returns the handle its other calls pass.
///
/// # Safety
/// `fat` is null or the `.nvFatBinSegment` wrapper (or a fat binary) nvcc emitted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __cudaRegisterFatBinary(fat: *mut c_void) -> *mut *mut c_void {
    guard("__cudaRegisterFatBinary", std::ptr::null_mut(), || {
        // SAFETY: per this function's contract.
        let image = unsafe { fatbin::image_of(fat) }.map_or(0, |p| p as usize);
        if image == 0 {
            crate::error::say!(
                "libcudart: __cudaRegisterFatBinary was given no fat binary (its kernels will not launch)"
            );
        }
        let idx = with_registry(|r| r.add_fatbin(image));
        // Like NVIDIA's, the handle points at the registered wrapper pointer.
        let handle = Box::leak(Box::new(fat)) as *mut *mut c_void;
        let mut g = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(HashMap::new)
            .insert(handle as usize, idx);
        handle
    })
}

/// End of one fat binary's registrations. Loading stays lazy (first launch or symbol use).
#[unsafe(no_mangle)]
pub extern "C" fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

/// At exit: forgets the fat binary. The driver is not called (it may be shutting down too);
/// the process's exit frees its modules.
#[unsafe(no_mangle)]
pub extern "C" fn __cudaUnregisterFatBinary(handle: *mut *mut c_void) {
    guard("__cudaUnregisterFatBinary", (), || {
        if let Some(idx) = fatbin_of(handle) {
            with_registry(|r| r.remove_fatbin(idx));
        }
    })
}

/// Registers a kernel: its host stub address and device (mangled) name.
///
/// # Safety
/// As nvcc's generated code calls it: `device_name` a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterFunction(
    handle: *mut *mut c_void,
    host_fun: *const c_char,
    _device_fun: *mut c_char,
    device_name: *const c_char,
    _thread_limit: c_int,
    _tid: *mut c_void,
    _bid: *mut c_void,
    _block: *mut c_void,
    _grid: *mut c_void,
    _warp_size: *mut c_int,
) {
    guard("__cudaRegisterFunction", (), || {
        let (Some(idx), Some(name)) = (fatbin_of(handle), c_string(device_name)) else {
            return;
        };
        if !host_fun.is_null() {
            with_registry(|r| r.add_function(idx, host_fun as usize, name));
        }
    })
}

/// Registers a `__device__` / `__constant__` variable: host shadow address -> device name.
///
/// # Safety
/// As nvcc's generated code calls it: `device_name` a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterVar(
    handle: *mut *mut c_void,
    host_var: *mut c_char,
    _device_address: *mut c_char,
    device_name: *const c_char,
    _ext: c_int,
    size: usize,
    constant: c_int,
    _global: c_int,
) {
    guard("__cudaRegisterVar", (), || {
        register_var(handle, host_var as usize, device_name, size, constant, None)
    })
}

/// Registers a `__managed__` variable; `__cudaInitModule` later stores its address in
/// `*host_ptr_slot`.
///
/// # Safety
/// As nvcc's generated code calls it.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterManagedVar(
    handle: *mut *mut c_void,
    host_ptr_slot: *mut *mut c_void,
    _device_address: *mut c_char,
    device_name: *const c_char,
    _ext: c_int,
    size: usize,
    constant: c_int,
    _global: c_int,
) {
    guard("__cudaRegisterManagedVar", (), || {
        let slot = host_ptr_slot as usize;
        register_var(handle, slot, device_name, size, constant, Some(slot))
    })
}

/// Loads the fat binary's module now and points its managed variables' host pointers at them
/// (called by nvcc's code at the first host access of a managed variable). 1 on success.
#[unsafe(no_mangle)]
pub extern "C" fn __cudaInitModule(handle: *mut *mut c_void) -> c_char {
    guard("__cudaInitModule", 0, || {
        let r = (|| -> Res {
            let idx = fatbin_of(handle).ok_or(CudaError(INVALID_RESOURCE_HANDLE))?;
            let d = context::ctx()?;
            context::module(d, idx)?;
            for v in with_registry(|r| r.managed_vars(idx)) {
                let slot = v.managed_slot.unwrap_or(0);
                let (addr, _) = context::symbol(d, slot)?;
                // SAFETY: `slot` is where nvcc's code keeps the managed variable's pointer
                // (registered by `__cudaRegisterManagedVar`, non-null).
                unsafe { Out::new(slot as *mut *mut c_void) }.set(addr as *mut c_void)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => 1,
            Err(e) => {
                set_last(e.0);
                0
            }
        }
    })
}

/// `<<<grid, block, shared, stream>>>`: pushes the configuration the stub pops. Returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn __cudaPushCallConfiguration(
    grid: Dim3,
    block: Dim3,
    shared: usize,
    stream: Handle,
) -> u32 {
    guard("__cudaPushCallConfiguration", 0, || {
        callconf::push(CallConfig {
            grid,
            block,
            shared,
            stream,
        });
        0
    })
}

crate::error::api! {
    /// Pops the configuration pushed for this launch into the stub's locals.
    fn __cudaPopCallConfiguration(grid: Out<Dim3>, block: Out<Dim3>, shared: Out<usize>, stream: Out<Handle>) {
        let c = callconf::pop().ok_or(CudaError(MISSING_CONFIGURATION))?;
        grid.set(c.grid)?;
        block.set(c.block)?;
        shared.set(c.shared)?;
        stream.set(c.stream)
    }
}

crate::error::api! {
    /// The kernel handle a stub launches with: the registered host stub address itself.
    fn __cudaGetKernel(kernel: Out<Handle>, fun: *const c_void) {
        if with_registry(|r| r.function(fun as usize).is_none()) {
            return fail(INVALID_DEVICE_FUNCTION);
        }
        kernel.set(fun as Handle)
    }
}

/// Records a registered variable under `host` (its shadow, or for a managed variable the slot
/// that will receive its address); nothing for an unknown handle, a null `host` or a bad name
/// (the checks of [`fatbin_of`] and `c_string`).
fn register_var(
    handle: *mut *mut c_void,
    host: usize,
    device_name: *const c_char,
    size: usize,
    constant: c_int,
    managed_slot: Option<usize>,
) {
    let (Some(fatbin), Some(name)) = (fatbin_of(handle), c_string(device_name)) else {
        return;
    };
    if host != 0 {
        let var = Var {
            fatbin,
            name,
            size,
            constant: constant != 0,
            managed_slot,
        };
        with_registry(|r| r.add_var(host, var));
    }
}
