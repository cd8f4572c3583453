//! Every export of NVIDIA's `libcudart.so.13` this library does not implement (listed in
//! `gen_unsupported.rs` by `gen/generate.py`) exists here too: it returns
//! `cudaErrorNotSupported`, records it as the last error, and names itself once on stderr.
//! Never an abort, never a hang.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{NOT_SUPPORTED, set_last};

/// What each unimplemented function does; `said` makes the message once per function.
pub fn report(func: &str, said: &AtomicBool) -> i32 {
    if !said.swap(true, Ordering::Relaxed) {
        crate::error::say!(
            "libcudart: {func} is not supported by this CUDA runtime (vgpu-vmm); it returns cudaErrorNotSupported"
        );
    }
    set_last(NOT_SUPPORTED);
    NOT_SUPPORTED
}

/// Defines one unimplemented export. Its C arguments are ignored (the x86-64 C ABI lets a
/// function ignore what it was passed).
macro_rules! not_supported {
    ($name:ident) => {
        /// Not implemented: returns `cudaErrorNotSupported` and names itself once on stderr.
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> i32 {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            $crate::unsupported::report(stringify!($name), &SAID)
        }
    };
}
pub(crate) use not_supported;
