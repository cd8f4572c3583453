//! Helpers shared by the integration tests: where the built library is, where CUDA's wheel is.

#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>`: the test binary is `target/<profile>/deps/<test>-<hash>`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf()
}

/// The CUDA 13.0 wheel directory (`nvidia/cu13`): `$C`, the apps script's toolchain under
/// target/, or the pinned venv of the dev machine; `None` if none is there.
pub fn cuda_wheel() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(c) = std::env::var("C") {
        candidates.push(c.into());
    }
    let target = profile_dir()
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_default();
    candidates.push("/tmp/nvccvenv/lib/python3.11/site-packages/nvidia/cu13".into());
    // The apps script's toolchain keeps the wheel in a venv: venv/lib/python3.X/site-packages.
    if let Ok(libs) = std::fs::read_dir(target.join("cuda-toolchain/venv/lib")) {
        candidates.extend(
            libs.flatten()
                .map(|e| e.path().join("site-packages/nvidia/cu13")),
        );
    }
    candidates
        .into_iter()
        .find(|c| c.join("include/driver_types.h").is_file())
}

/// Runs a command; its stdout, or `None` if it could not be started.
pub fn output(cmd: &mut std::process::Command) -> Option<std::process::Output> {
    cmd.output().ok()
}
