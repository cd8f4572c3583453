//! Unmodified programs built by nvcc 13.0 (`-cudart shared`, compressed PTX for compute_80 and
//! compute_90, as apps/build.sh builds) run with `LD_LIBRARY_PATH=target/release`: this
//! runtime over a `libcuda.so.1` — the project's (target/<profile>/libcuda.so.1, from
//! `cargo build --release -p cuda`), or the directory in `VGPU_TEST_LIBCUDA_DIR` (NVIDIA's on
//! a GPU machine). Skipped, with the reason, where nvcc or a driver library is missing.
//! `plumbing_over_a_driver_double` runs them over tests/double/libcuda.c instead (gcc-built):
//! the runtime's own path from registration to launch, without any real driver.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The driver library's directory, if there is one to run over.
fn libcuda_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("VGPU_TEST_LIBCUDA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(common::profile_dir);
    dir.join("libcuda.so.1").exists().then_some(dir)
}

/// Builds `tests/cuda/<name>.cu` with `flags` into target/<profile>/cudart-programs/<out>.
fn build(wheel: &Path, name: &str, out: &str, flags: &[&str]) -> PathBuf {
    let dir = common::profile_dir().join("cudart-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(out);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cuda")
        .join(format!("{name}.cu"));
    // `-cudart shared` links -lcudart: the wheel has only libcudart.so.13, so link against a
    // directory of ours holding the symlink (the wheel stays untouched).
    let link = dir.join("lib");
    std::fs::create_dir_all(&link).unwrap();
    let so = link.join("libcudart.so");
    // Tests build in parallel: another may have made the link between the look and the making.
    if so.symlink_metadata().is_err()
        && let Err(e) = std::os::unix::fs::symlink(wheel.join("lib/libcudart.so.13"), &so)
    {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::AlreadyExists,
            "{}: {e}",
            so.display()
        );
    }
    let path = format!(
        "{}:{}",
        wheel.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(wheel.join("bin/nvcc"))
        .env("PATH", path)
        .args(["-cudart", "shared"])
        .arg(format!("-L{}", link.display()))
        .arg(format!("-L{}", wheel.join("lib").display()))
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("nvcc runs");
    assert!(
        out.status.success(),
        "nvcc {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

const DEFAULT_FLAGS: &[&str] = &[
    "-gencode",
    "arch=compute_80,code=compute_80",
    "-gencode",
    "arch=compute_90,code=compute_90",
];

/// Runs a program over this runtime and the driver in `drv`.
fn run(exe: &Path, drv: &Path) -> Output {
    run_with(exe, drv, &[], &[])
}

/// `run` with arguments and extra environment variables.
fn run_with(exe: &Path, drv: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    // The runtime alone in its directory, so that the driver comes from `drv` even where
    // target/<profile> also holds the project's libcuda.so.1.
    let rt = common::profile_dir().join("cudart-runtime");
    std::fs::create_dir_all(&rt).unwrap();
    if rt.join("libcudart.so.13").symlink_metadata().is_err() {
        let _ = std::os::unix::fs::symlink("../deps/libcudart.so", rt.join("libcudart.so.13"));
    }
    let lib = format!("{}:{}", rt.display(), drv.display());
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .envs(env.iter().copied())
        .env("LD_LIBRARY_PATH", lib)
        .env_remove("LD_PRELOAD");
    // Bounded time: a hang is a failure, not a stuck test.
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} did not finish in 300 s", exe.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn setup() -> Option<(PathBuf, PathBuf)> {
    let Some(wheel) = common::cuda_wheel().filter(|w| w.join("bin/nvcc").is_file()) else {
        eprintln!("skipped: no nvcc (run apps/build.sh, or set C=<site-packages>/nvidia/cu13)");
        return None;
    };
    let Some(drv) = libcuda_dir() else {
        eprintln!(
            "skipped: no libcuda.so.1 in target/<profile> (cargo build --release -p cuda) or VGPU_TEST_LIBCUDA_DIR"
        );
        return None;
    };
    Some((wheel, drv))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn kernels_and_symbols() {
    let Some((wheel, drv)) = setup() else { return };
    let exe = build(&wheel, "symbols", "symbols", DEFAULT_FLAGS);
    let o = run(&exe, &drv);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("symbols ok"),
        "{}",
        text(&o)
    );
}

#[test]
fn runtime_api() {
    let Some((wheel, drv)) = setup() else { return };
    let exe = build(&wheel, "api", "api", DEFAULT_FLAGS);
    let o = run(&exe, &drv);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("api ok"),
        "{}",
        text(&o)
    );
    // The unimplemented function is named once, though called twice.
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("cudaGraphCreate is not supported").count(),
        1,
        "{}",
        text(&o)
    );
}

#[test]
fn host_threads() {
    let Some((wheel, drv)) = setup() else { return };
    let exe = build(&wheel, "threads", "threads", DEFAULT_FLAGS);
    let o = run(&exe, &drv);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("threads ok"),
        "{}",
        text(&o)
    );
}

#[test]
fn kernel_fault_is_sticky() {
    let Some((wheel, drv)) = setup() else { return };
    let exe = build(&wheel, "fault", "fault", DEFAULT_FLAGS);
    let o = run(&exe, &drv);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("fault ok"),
        "{}",
        text(&o)
    );
}

#[test]
fn sass_only_program_gets_one_clear_line() {
    let Some((wheel, drv)) = setup() else { return };
    if std::env::var_os("VGPU_TEST_LIBCUDA_DIR").is_some() {
        eprintln!("skipped: a real GPU driver may run sm_90 SASS");
        return;
    }
    let exe = build(
        &wheel,
        "symbols",
        "symbols-sass",
        &["-gencode", "arch=compute_90,code=sm_90"],
    );
    let o = run(&exe, &drv);
    assert!(!o.status.success(), "{}", text(&o));
    // The line comes from this runtime (it names the program and what the fat binary holds)
    // or, where the driver library explains the refusal itself, from the driver: at least one
    // line gives the fix, and the runtime says it at most once.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains("arch=compute_80,code=compute_80")),
        "{}",
        text(&o)
    );
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no usable code"))
        .collect();
    assert!(ours.len() <= 1, "{}", text(&o));
    if let Some(l) = ours.first() {
        assert!(
            l.contains("symbols-sass") && l.contains("SASS for sm_90"),
            "{l}"
        );
    }
}

#[test]
fn plumbing_over_a_driver_double() {
    let Some(wheel) = common::cuda_wheel().filter(|w| w.join("bin/nvcc").is_file()) else {
        eprintln!("skipped: no nvcc (run apps/build.sh, or set C=<site-packages>/nvidia/cu13)");
        return;
    };
    let dir = common::profile_dir().join("cudart-double");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/double/libcuda.c");
    let Some(cc) = common::output(
        Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(dir.join("libcuda.so.1"))
            .arg(&src),
    ) else {
        eprintln!("skipped: gcc is not installed");
        return;
    };
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );

    let exe = build(&wheel, "symbols", "symbols-double", DEFAULT_FLAGS);
    let o = run_with(&exe, &dir, &[], &[("DOUBLE_STATS", "1")]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("symbols ok"),
        "{}",
        text(&o)
    );
    // One fat binary loaded once (lazily, for the first symbol copy), three launches.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("double: loads=1 launches=3"),
        "{}",
        text(&o)
    );

    let o = run_with(&exe, &dir, &[], &[("DOUBLE_NO_BINARY", "1")]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("no usable code")
                && l.contains("PTX 9.0 for compute_80")
                && l.contains("refused the module; second line"))
            .count(),
        1,
        "{}",
        text(&o)
    );

    // Four threads at once: the runtime makes its context current on each (the double refuses
    // calls on a thread without one).
    let exe = build(&wheel, "threads", "threads-double", DEFAULT_FLAGS);
    let o = run(&exe, &dir);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("threads ok"),
        "{}",
        text(&o)
    );

    // The runtime's own cost per launch (the double's launch does nothing).
    let exe = build(&wheel, "launch", "launch", DEFAULT_FLAGS);
    let o = run_with(&exe, &dir, &["200000"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    let us: f64 = out
        .trim()
        .rsplit('=')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::MAX);
    eprintln!("runtime cost per launch over the double: {us} us");
    assert!(o.status.success() && us < 50.0, "{}", text(&o));
}
