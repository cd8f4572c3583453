//! Links the cdylib under the driver's real soname, `libcuda.so.1`, and leaves
//! `<target>/<profile>/libcuda.so.1` as a relative symlink to cargo's `libcuda.so`, so that
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

/// Creates `dir/libcuda.so.1 -> libcuda.so` unless something that is not that symlink is there.
fn link_real_name(dir: &Path) {
    let link = dir.join("libcuda.so.1");
    match std::fs::read_link(&link) {
        Ok(target) if target == Path::new("libcuda.so") => {}
        Ok(_) => println!(
            "cargo:warning={} is another symlink; left alone",
            link.display()
        ),
        Err(_) if link.symlink_metadata().is_ok() => {
            println!(
                "cargo:warning={} exists and is not a symlink; left alone",
                link.display()
            )
        }
        Err(_) => {
            if let Err(e) = std::os::unix::fs::symlink("libcuda.so", &link) {
                println!("cargo:warning=could not create {}: {e}", link.display());
            }
        }
    }
}
