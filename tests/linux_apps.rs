//! The CUDA application suite (apps/, unmodified nvcc-built programs) in the Linux guest: every
//! program runs at `small` size, one after another in one boot, over the project's
//! libcudart.so.13 / libcuda.so.1 and their guest backend, in full and in para mode, on the
//! software GPU. The programs, their libraries (as `ldd` resolves them) and the CUDA libraries
//! are packed into one read-only ext2 image the way `--run` packs one program
//! (`vmm::linux::run`), attached with `--disk`, and run by /init (`vgpu_prog=`).
//!
//! Needs the Linux guest (guest-images/linux/build.sh), the suite (apps/build.sh: the pinned
//! nvcc from PyPI) and `cargo build --release` (the libraries): any of them missing is a
//! failure, except a toolchain that cannot be installed at all (no network), which skips with
//! the reason, as the suite's own test does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

mod linux_support;

/// The image: every program under bin/, the libraries under lib/, and a run.sh that runs each
/// program at `small` and exits with the number that failed.
fn image(suite: &apps::Suite) -> PathBuf {
    let lib_dir = root().join("target/release");
    for f in ["libcudart.so.13", "libcuda.so.1"] {
        assert!(
            lib_dir.join(f).exists(),
            "{} is missing: cargo build --release builds it",
            lib_dir.join(f).display()
        );
    }
    let first = suite.dir.join(&suite.programs[0]);
    let mut c = vmm::linux::run::collect(&first, &[], &lib_dir).expect("collect the libraries");
    for p in &suite.programs[1..] {
        let more = vmm::linux::run::collect(&suite.dir.join(p), &[], &lib_dir).expect("collect");
        for (k, v) in more.files {
            c.files.entry(k).or_insert(v);
        }
    }
    let fatbin = suite.dir.join("drvapi.fatbin");
    if fatbin.exists() {
        c.files.insert("bin/drvapi.fatbin".into(), fatbin);
    }
    let mut script =
        String::from("export LD_LIBRARY_PATH=/run/prog/lib\ncd /run/work || exit 125\nfailed=0\n");
    for p in &suite.programs {
        script += &format!("/run/prog/bin/{p} small || failed=$((failed + 1))\n");
    }
    script += "echo \"apps-in-guest: $failed failed\"\nexit $failed\n";
    c.script = script;
    let cache = root().join("target/linux-apps-image");
    std::fs::create_dir_all(&cache).unwrap();
    vmm::linux::run::build_cached(&c, &cache).expect("build the image")
}

/// The suite and its image, made once per test process (apps/build.sh rewrites its program
/// list: two tests building at once could read it empty); `None` without a toolchain.
fn prepared() -> Option<&'static (apps::Suite, PathBuf)> {
    static READY: std::sync::OnceLock<Option<(apps::Suite, PathBuf)>> = std::sync::OnceLock::new();
    READY
        .get_or_init(|| match apps::build(&root().join("target")) {
            Ok(suite) => {
                assert!(
                    !suite.programs.is_empty(),
                    "apps/build.sh listed no programs"
                );
                let img = image(&suite);
                Some((suite, img))
            }
            Err(apps::Error::NoToolchain(why)) => {
                eprintln!("SKIPPED: the CUDA toolchain cannot be installed here: {why}");
                None
            }
            Err(e) => panic!("apps/build.sh: {e}"),
        })
        .as_ref()
}

fn run_in_guest(mode: &str) {
    let Some((suite, img)) = prepared() else {
        return;
    };
    let Some(dir) = linux_support::guest_dir() else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .env("VGPU_LINUX_DIR", dir)
        .args(["--guest", "linux", "--memory", "512", "--timeout", "1500"])
        .args(["--gpu", &format!("mode={mode}")])
        .args(["--disk", &format!("{},ro", img.display())])
        .args(["--cmdline", "vgpu_prog=apps"])
        .stdin(Stdio::null())
        .output()
        .expect("run vgpu-vmm");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    for p in &suite.programs {
        let v = text
            .lines()
            .find_map(|l| apps::Verdict::parse(p, l))
            .unwrap_or_else(|| panic!("{mode}: no verdict line from {p}:\n{text}"));
        assert!(v.pass, "{mode}: {p} failed: {}\n{text}", v.reason);
    }
    assert!(text.contains("apps-in-guest: 0 failed"), "{text}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{mode}: the VM's exit code\n{text}"
    );
}

#[test]
fn every_app_passes_in_the_linux_guest_in_full_mode() {
    run_in_guest("full");
}

#[test]
fn every_app_passes_in_the_linux_guest_in_para_mode() {
    run_in_guest("para");
}
