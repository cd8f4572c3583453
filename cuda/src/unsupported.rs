//! The functions cuda.h declares that this library does not implement: each is exported,
//! returns `CUDA_ERROR_NOT_SUPPORTED` and names itself once on stderr (never aborts, never
//! hangs). The list is generated (`gen_unsupported.rs`, by `gen/generate.py`).

use std::collections::HashSet;
use std::sync::Mutex;

static REPORTED: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// Writes "libcuda: NAME is not supported" the first time `name` is called.
pub fn report(name: &'static str) {
    let first = match REPORTED.lock() {
        Ok(mut set) => set.get_or_insert_with(HashSet::new).insert(name),
        Err(_) => false,
    };
    if first {
        eprintln!("libcuda (vgpu): {name} is not supported (CUDA_ERROR_NOT_SUPPORTED)");
    }
}

/// Defines each name as an exported function returning `CUDA_ERROR_NOT_SUPPORTED`, and
/// [`UNSUPPORTED`], the table `cuGetProcAddress` serves them from. The functions take no
/// arguments: under the C calling convention a caller's arguments are simply ignored.
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {
        $(
            #[unsafe(no_mangle)]
            #[allow(non_snake_case)]
            pub extern "C" fn $name() -> $crate::result::CUresult {
                $crate::unsupported::report(stringify!($name));
                $crate::gen_consts::CUDA_ERROR_NOT_SUPPORTED
            }
        )*
        /// (name, function) of every exported NOT_SUPPORTED function.
        pub static UNSUPPORTED: &[(&str, extern "C" fn() -> $crate::result::CUresult)] =
            &[$((stringify!($name), $name)),*];
    };
}
pub(crate) use not_supported;
