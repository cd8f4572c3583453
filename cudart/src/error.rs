//! CUDA runtime errors: `cudaError_t` values, names and messages (from CUDA 13's headers, see
//! `gen_errors.rs`), the translation of driver results, the per-thread last error, and the FFI
//! boundary every exported function goes through (no panic crosses it).

use std::cell::Cell;
use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::driver::CuResult;
pub use crate::gen_errors::*;

/// A `cudaError_t` other than `cudaSuccess`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} ({})", name(self.0), self.0)]
pub struct CudaError(pub i32);

/// What an API function's body returns.
pub type Res<T = ()> = Result<T, CudaError>;

/// Shorthand for `Err(CudaError(code))`.
pub fn fail<T>(code: i32) -> Res<T> {
    Err(CudaError(code))
}

const UNRECOGNIZED: &CStr = c"unrecognized error code";

/// `cudaGetErrorName`'s answer for `code`, as C returns it.
pub fn c_name(code: i32) -> &'static CStr {
    lookup(code).map_or(UNRECOGNIZED, |e| e.1)
}

/// `cudaGetErrorString`'s answer for `code`, as C returns it.
pub fn c_message(code: i32) -> &'static CStr {
    lookup(code).map_or(UNRECOGNIZED, |e| e.2)
}

/// `cudaGetErrorName`'s answer for `code`.
pub fn name(code: i32) -> &'static str {
    c_name(code).to_str().unwrap_or("")
}

/// `cudaGetErrorString`'s answer for `code`.
pub fn message(code: i32) -> &'static str {
    c_message(code).to_str().unwrap_or("")
}

fn lookup(code: i32) -> Option<&'static (i32, &'static CStr, &'static CStr)> {
    ERRORS.iter().find(|e| e.0 == code)
}

/// The runtime error for a driver result: CUDA numbers `cudaError_t` after `CUresult` for every
/// error both have (invalid value 1, out of memory 2, no binary for GPU 209, invalid handle 400,
/// not found 500, not ready 600, illegal address 700, not supported 801...); a driver error the
/// runtime has no number for becomes `cudaErrorUnknown`.
pub fn from_cu(r: CuResult) -> i32 {
    match r {
        0 => SUCCESS,
        r if lookup(r).is_some() => r,
        _ => UNKNOWN,
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the runtime error for the driver's result.
pub fn cu(r: CuResult) -> Res {
    match from_cu(r) {
        SUCCESS => Ok(()),
        e => fail(e),
    }
}

thread_local! {
    static LAST: Cell<i32> = const { Cell::new(SUCCESS) };
}

/// Records `code` as the thread's last error (`cudaGetLastError`). `cudaErrorNotReady` is an
/// answer, not an error, and is not recorded (as in NVIDIA's runtime).
pub fn set_last(code: i32) {
    if code != SUCCESS && code != NOT_READY {
        LAST.with(|l| l.set(code));
    }
}

/// The thread's last error; `reset` clears it (`cudaGetLastError`) or not (`cudaPeekAtLastError`).
pub fn last(reset: bool) -> i32 {
    LAST.with(|l| if reset { l.replace(SUCCESS) } else { l.get() })
}

/// Writes one line to stderr; a closed or broken stderr is ignored (`eprintln!` would panic,
/// and a panic must not escape an `extern "C"` function).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}
pub(crate) use say;

/// Runs an API function's body: a panic becomes `cudaErrorUnknown` (never unwinding into C),
/// an error is recorded as the thread's last error and returned.
pub fn boundary(func: &str, body: impl FnOnce() -> Res) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        crate::error::say!("libcudart: internal error in {func}; returning cudaErrorUnknown");
        fail(UNKNOWN)
    });
    match r {
        Ok(()) => SUCCESS,
        Err(CudaError(code)) => {
            set_last(code);
            code
        }
    }
}

/// Runs the body of an exported function that returns no `cudaError_t`; a panic gives `default`.
pub fn guard<T>(func: &str, default: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        crate::error::say!("libcudart: internal error in {func}");
        default
    })
}

/// Declares one exported runtime function returning `cudaError_t`: `#[no_mangle] extern "C"`,
/// the body runs inside [`boundary`] and returns [`Res`].
macro_rules! api {
    ($(#[doc = $d:literal])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[doc = $d])*
        ///
        /// # Safety
        /// Called from C with the arguments CUDA documents for this function; null and
        /// unknown handles are refused, other invalid pointers cannot be detected.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> i32 {
            $crate::error::boundary(stringify!($name), move || -> $crate::error::Res { $body })
        }
    };
}
pub(crate) use api;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_messages_are_cudas() {
        assert_eq!(name(1), "cudaErrorInvalidValue");
        assert_eq!(message(1), "invalid argument");
        assert_eq!(message(2), "out of memory");
        assert_eq!(name(801), "cudaErrorNotSupported");
        assert_eq!(message(801), "operation not supported");
        assert_eq!(message(0), "no error");
        assert_eq!(name(12345), "unrecognized error code");
        assert_eq!(name(-1), "unrecognized error code");
        assert_eq!(
            (INVALID_VALUE, NOT_SUPPORTED, ILLEGAL_ADDRESS),
            (1, 801, 700)
        );
        assert_eq!(
            (NO_KERNEL_IMAGE_FOR_DEVICE, INVALID_RESOURCE_HANDLE),
            (209, 400)
        );
    }

    #[test]
    fn driver_results_map_to_runtime_errors() {
        assert_eq!(cu(0), Ok(()));
        assert_eq!(cu(700), fail(ILLEGAL_ADDRESS));
        assert_eq!(cu(209), fail(NO_KERNEL_IMAGE_FOR_DEVICE));
        assert_eq!(cu(222), fail(UNSUPPORTED_PTX_VERSION));
        assert_eq!(cu(500), fail(SYMBOL_NOT_FOUND));
        // CUDA_ERROR_CONTEXT_ALREADY_CURRENT (202) has no runtime number.
        assert_eq!(cu(202), fail(UNKNOWN));
    }

    #[test]
    fn last_error_semantics() {
        std::thread::spawn(|| {
            assert_eq!(last(false), SUCCESS);
            assert_eq!(boundary("t", || fail(INVALID_VALUE)), INVALID_VALUE);
            assert_eq!(boundary("t", || Ok(())), SUCCESS);
            assert_eq!(boundary("t", || fail(NOT_READY)), NOT_READY);
            assert_eq!(last(false), INVALID_VALUE);
            assert_eq!(last(true), INVALID_VALUE);
            assert_eq!(last(true), SUCCESS);
            assert_eq!(boundary("t", || panic!("boom")), UNKNOWN);
            assert_eq!(last(true), UNKNOWN);
        })
        .join()
        .unwrap();
    }
}
