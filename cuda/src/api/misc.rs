//! Error names and texts, `cuGetProcAddress` (NVIDIA's runtime resolves the driver through
//! it), the profiler switches.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use super::{c_str, ffi, out};
use crate::result::*;

fn texts() -> &'static HashMap<u32, (CString, CString)> {
    static T: OnceLock<HashMap<u32, (CString, CString)>> = OnceLock::new();
    T.get_or_init(|| {
        crate::gen_errors::ERRORS
            .iter()
            .filter_map(|(v, n, t)| Some((*v, (CString::new(*n).ok()?, CString::new(*t).ok()?))))
            .collect()
    })
}

/// # Safety
/// `p` must be valid for a write of a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, p: *mut *const c_char) -> CUresult {
    ffi("cuGetErrorString", || match texts().get(&code) {
        // SAFETY: the caller's out-pointer; the text is static.
        Some((_, t)) => unsafe { out(p, t.as_ptr()) },
        None => {
            // SAFETY: as above.
            let _ = unsafe { out(p, std::ptr::null()) };
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

/// # Safety
/// `p` must be valid for a write of a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, p: *mut *const c_char) -> CUresult {
    ffi("cuGetErrorName", || match texts().get(&code) {
        // SAFETY: the caller's out-pointer; the name is static.
        Some((n, _)) => unsafe { out(p, n.as_ptr()) },
        None => {
            // SAFETY: as above.
            let _ = unsafe { out(p, std::ptr::null()) };
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

fn table() -> &'static HashMap<&'static str, (usize, bool)> {
    static T: OnceLock<HashMap<&'static str, (usize, bool)>> = OnceLock::new();
    T.get_or_init(|| {
        let mut m: HashMap<&'static str, (usize, bool)> = crate::gen_unsupported::UNSUPPORTED
            .iter()
            .map(|(n, f)| (*n, (*f as usize, false)))
            .collect();
        m.extend(
            super::gen_proc::implemented()
                .into_iter()
                .map(|(n, f)| (n, (f, true))),
        );
        m
    })
}

/// The function a runtime means by `symbol` (a base name such as `cuMemAlloc`): the one
/// cuda.h's renaming macro names (`cuMemAlloc_v2`), else the name itself (implemented, or an
/// exported stub).
pub fn resolve(symbol: &str) -> Option<usize> {
    let name = super::gen_proc::ALIASES
        .iter()
        .find(|(a, _)| *a == symbol)
        .map_or(symbol, |(_, b)| *b);
    table().get(name).map(|(f, _)| *f)
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    status: *mut c_int,
) -> Result<(), CUresult> {
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's string.
    let name = unsafe { c_str(symbol, 256) }?;
    let found = resolve(&name);
    // SAFETY: checked not null; the caller's out-pointers (status optional).
    unsafe {
        out(
            pfn,
            found.map_or(std::ptr::null_mut(), |f| f as *mut c_void),
        )?;
        if !status.is_null() {
            out(
                status,
                if found.is_some() {
                    CU_GET_PROC_ADDRESS_SUCCESS as c_int
                } else {
                    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND as c_int
                },
            )?;
        }
    }
    found.map(|_| ()).ok_or(CUDA_ERROR_NOT_FOUND)
}

/// # Safety
/// `symbol` a NUL-terminated name; `pfn` valid for a write; `status` null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _cuda_version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    ffi("cuGetProcAddress_v2", || proc_address(symbol, pfn, status))
}

/// # Safety
/// `symbol` a NUL-terminated name; `pfn` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _cuda_version: c_int,
    _flags: u64,
) -> CUresult {
    ffi("cuGetProcAddress", || {
        proc_address(symbol, pfn, std::ptr::null_mut())
    })
}

/// Nothing to start: the library's own timing is `VGPU_CUDA_STATS`.
#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStart() -> CUresult {
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStop() -> CUresult {
    CUDA_SUCCESS
}
