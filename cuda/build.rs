//! Links the cdylib under the driver's real soname, `libcuda.so.1`, and leaves
//! `<target>/<profile>/libcuda.so.1` as a relative symlink to cargo's `deps/libcuda.so`, so that
//! `LD_LIBRARY_PATH=target/release ./prog` finds it by the name programs import.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(dir) = profile_dir() {
        link_real_name(&dir);
    }
}

/// `<target>/<profile>` from OUT_DIR = `<target>/<profile>/build/<pkg>-<hash>/out`.
fn profile_dir() -> Option<PathBuf> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let build = out.parent()?.parent()?;
    if build.file_name()? != "build" {
        return None;
    }
    Some(build.parent()?.to_path_buf())
}

/// Creates `dir/libcuda.so.1 -> deps/libcuda.so` (cargo leaves the cdylib in `deps/` for `cargo
/// test` and `cargo build` alike, and copies it up to `dir/libcuda.so` only for `cargo build`),
/// replacing this script's earlier `-> libcuda.so` link, unless something else is there.
fn link_real_name(dir: &Path) {
    let path = dir.join("libcuda.so.1");
    let want = Path::new("deps/libcuda.so");
    match std::fs::read_link(&path) {
        Ok(t) if t == want => return,
        Ok(t) if t == Path::new("libcuda.so") => {
            let _ = std::fs::remove_file(&path);
        }
        _ if path.symlink_metadata().is_ok() => {
            println!(
                "cargo:warning={} exists and is not this build's symlink; left as it is",
                path.display()
            );
            return;
        }
        _ => {}
    }
    if let Err(e) = std::os::unix::fs::symlink(want, &path) {
        println!("cargo:warning=cannot create {}: {e}", path.display());
    }
}
