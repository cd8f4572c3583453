//! Build script: links `libcudart.so` as `libcudart.so.13` (soname, and the `libcudart.so.13`
//! symbol version node nvcc-built programs import from: `cudaMalloc@libcudart.so.13`), for
//! every name NVIDIA's library exports (gen/nvidia-exports.txt); and leaves
//! `target/<profile>/libcudart.so.13`, a relative symlink to `deps/libcudart.so`, so that
//! `LD_LIBRARY_PATH=target/release ./prog` finds the library under its real name.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=gen/nvidia-exports.txt");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let names = std::fs::read_to_string("gen/nvidia-exports.txt")
        .expect("gen/nvidia-exports.txt is committed");
    let mut script = String::from("libcudart.so.13 {\n  global:\n");
    for n in names.lines().filter(|l| !l.trim().is_empty()) {
        script += &format!("    {};\n", n.trim());
    }
    script += "};\n";
    let map = out.join("libcudart.map");
    std::fs::write(&map, script).expect("OUT_DIR is writable");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.13");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );

    // OUT_DIR is <target>/<profile>/build/cudart-<hash>/out.
    if let Some(profile) = out.ancestors().nth(3) {
        link(profile);
    }
}

/// Creates `profile/libcudart.so.13 -> deps/libcudart.so` (cargo leaves the cdylib in `deps/` for `cargo
/// test` and `cargo build` alike, and copies it up to `profile/libcudart.so` only for `cargo build`),
/// replacing this script's earlier `-> libcudart.so` link, unless something else is there.
fn link(profile: &Path) {
    let path = profile.join("libcudart.so.13");
    let want = Path::new("deps/libcudart.so");
    match std::fs::read_link(&path) {
        Ok(t) if t == want => return,
        Ok(t) if t == Path::new("libcudart.so") => {
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
