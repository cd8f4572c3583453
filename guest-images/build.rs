//! Builds the bare-metal guest programs in `guests/` (their own cargo workspace) for the host
//! target as static, position-dependent ELF images laid out by `guests/linker.ld`, and
//! generates `images.rs`, which embeds each one by name.
//!
//! Only the host target is needed: the guests are `#![no_std]` and linked with `-nostdlib`. It is
//! named explicitly (`--target`) so that the flags apply to the guests and not to host-side build
//! scripts and proc macros of their dependencies.
//! The nested cargo must not inherit this build's cargo/rustc variables (an outer `RUSTFLAGS`,
//! clippy's wrapper, the jobserver), so they are removed from its environment.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let guests = manifest.join("guests");
    println!("cargo:rerun-if-changed={}", guests.display());
    // Everything the guests are built from: their workspace, the ABI, the driver, the suite.
    for dep in ["abi", "driver", "../suite", "../hw"] {
        println!("cargo:rerun-if-changed={}", manifest.join(dep).display());
    }

    let linker_script = guests.join("linker.ld");
    let flags = [
        "-C".to_string(),
        "relocation-model=static".into(),
        "-C".into(),
        "code-model=small".into(),
        "-C".into(),
        "no-redzone=y".into(),
        "-C".into(),
        "target-cpu=x86-64".into(),
        "-C".into(),
        "link-arg=-nostdlib".into(),
        "-C".into(),
        "link-arg=-static".into(),
        "-C".into(),
        "link-arg=-no-pie".into(),
        "-C".into(),
        format!(
            "link-arg=-Wl,-T,{},--build-id=none",
            linker_script.display()
        ),
    ]
    .join("\x1f");

    let target_dir = out.join("guest-target");
    // An explicit --target keeps the bare-metal flags away from build scripts and proc macros
    // of the guests' dependencies, which run on the host as ordinary programs.
    let triple = env::var("HOST").expect("cargo sets HOST");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--bins")
        .arg("--target")
        .arg(&triple)
        .arg("--manifest-path")
        .arg(guests.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let inherited = (key.starts_with("CARGO") && key != "CARGO_HOME")
            || key.starts_with("RUSTC_WORKSPACE_WRAPPER")
            || matches!(
                key.as_str(),
                "RUSTFLAGS" | "RUSTDOCFLAGS" | "CLIPPY_ARGS" | "MAKEFLAGS" | "MFLAGS"
            );
        if inherited {
            cmd.env_remove(&key);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags);
    let status = cmd
        .status()
        .expect("failed to start cargo for the guest images");
    assert!(
        status.success(),
        "building the guest images failed (see the output above)"
    );

    let mut names: Vec<String> = std::fs::read_dir(guests.join("programs/src/bin"))
        .expect("guests/programs/src/bin exists")
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(String::from))
        .collect();
    names.sort();
    let mut code = String::from(
        "/// Every bundled guest image: (name, ELF bytes).\npub static IMAGES: &[(&str, &[u8])] = &[\n",
    );
    for name in &names {
        let elf = target_dir.join(&triple).join("release").join(name);
        assert!(
            Path::new(&elf).exists(),
            "guest image {} was not built",
            elf.display()
        );
        writeln!(
            code,
            "    ({name:?}, include_bytes!({:?})),",
            elf.display().to_string()
        )
        .expect("write to String");
    }
    code.push_str("];\n");
    std::fs::write(out.join("images.rs"), code).expect("write images.rs");
}
