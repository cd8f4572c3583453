//! What the application suite's integration tests share: where the libraries are, and the
//! suite built (or the reason it cannot be, when the CUDA toolchain cannot be installed).

use std::path::{Path, PathBuf};

/// `target/<profile>`: a test binary is `target/<profile>/deps/<name>-<hash>`; the project's
/// `libcudart.so.13` and `libcuda.so.1` are there.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// The suite built under the target directory of `lib`; `None` (the reason printed) only when
/// the CUDA toolchain cannot be installed here (apps/build.sh exits 3). Any other build error
/// fails the test.
pub fn built_suite(lib: &Path) -> Option<apps::Suite> {
    match apps::build(lib.parent().expect("the target directory")) {
        Ok(s) => Some(s),
        Err(apps::Error::NoToolchain(log)) => {
            eprintln!("SKIPPED: the CUDA toolchain cannot be installed here:\n{log}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}
