//! CUDA programs in the Linux guest: the guest backend of libcuda (`cuda::backend::guest`),
//! driven by `cuda-guest-check` (cuda/src/bin/cuda_guest_check.rs, built static, on a
//! read-only disk the guest mounts), with several processes on the virtual GPU at once, in full and para
//! mode: a process whose kernel faults gets the sticky illegal-address error while another
//! process's launches, copies and fills run on and check out against the CPU; a process killed
//! while it holds a slot leaves it to be taken back by the next one.
//!
//! Needs the Linux guest (guest-images/linux/build.sh, as tests/linux.rs); VGPU_SKIP_LINUX=1
//! skips it on a machine that cannot build it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The Linux guest (build.sh's) and a read-only ext2 image holding `cuda-guest-check`, which
/// the guest mounts at `/mnt` (its first disk, `/dev/vda`; the root image is the last), built
/// once per test process.
fn guest_dir() -> Option<&'static (PathBuf, PathBuf)> {
    if std::env::var_os("VGPU_SKIP_LINUX").is_some_and(|v| v == "1") {
        eprintln!("VGPU_SKIP_LINUX=1: Linux guest test skipped");
        return None;
    }
    static DIR: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    let dir = DIR.get_or_init(build);
    match dir {
        Ok(d) => Some(d),
        Err(e) => panic!("the Linux guest with the CUDA check cannot be built: {e}"),
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("{what} failed ({}):\n{text}", out.status));
    }
    Ok(text)
}

/// The guest's directory and the program's image.
fn build() -> Result<(PathBuf, PathBuf), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = run(
        &mut Command::new(root.join("guest-images/linux/build.sh")),
        "guest-images/linux/build.sh",
    )?;
    let vmlinux = text
        .lines()
        .find_map(|l| l.strip_prefix("vmlinux: "))
        .map(PathBuf::from)
        .ok_or_else(|| format!("build.sh printed no vmlinux:\n{text}"))?;
    let cache = vmlinux.parent().unwrap().to_path_buf();
    // The program, static and small as build.sh builds the guest tools (same flags and
    // target directory, so their common crates are built once).
    let target = "x86_64-unknown-linux-gnu";
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for v in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cargo.env_remove(v);
    }
    cargo
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=symbols",
        )
        .args(["build", "--quiet", "--release", "-p", "cuda", "--bin"])
        .args(["cuda-guest-check", "--target", target])
        .args(["--config", "profile.release.opt-level=\"s\""])
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        .args(["--config", "profile.release.panic=\"abort\""])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(cache.join("tools-target"));
    run(&mut cargo, "building cuda-guest-check")?;
    let bin = cache.join(format!("tools-target/{target}/release/cuda-guest-check"));
    let dir = cache.join("cuda-check");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("files")).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::copy(&bin, dir.join("files/cuda-guest-check"))
        .map_err(|e| format!("copy {}: {e}", bin.display()))?;
    let image = dir.join("check.ext2");
    let mke2fs = ["/usr/sbin/mke2fs", "/sbin/mke2fs"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("no mke2fs (build.sh installs e2fsprogs)")?;
    run(
        Command::new(mke2fs)
            .args(["-q", "-F", "-t", "ext2", "-b", "4096", "-m", "0", "-d"])
            .arg(dir.join("files"))
            .arg(&image)
            .arg("8M"),
        "mke2fs",
    )?;
    Ok((cache, image))
}

/// Boots the guest with `--gpu GPU` running `cmd`; the VMM's exit code and console output.
fn boot(guest: &(PathBuf, PathBuf), gpu: &str, cmd: &str) -> (i32, String) {
    let (dir, image) = guest;
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .env("VGPU_LINUX_DIR", dir)
        .args([
            "--guest",
            "linux",
            "--gpu",
            gpu,
            "--timeout",
            "1200",
            "--disk",
        ])
        .arg(format!("{},ro", image.display()))
        .args(["--cmdline", &format!("vgpu_run=\"{cmd}\"")])
        .stdin(Stdio::null())
        .output()
        .expect("run vgpu-vmm");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The shell script the guest runs: a first process, two at once (one faults), a killed
/// holder, and a process that takes its slot back.
const SCRIPT: &str = "mount -t ext2 -o ro /dev/vda /mnt; export PATH=/mnt:/bin; \
    cuda-guest-check info; echo info=$?; \
    cuda-guest-check vadd 100000 --ready /tmp/ready --until /tmp/faulted > /tmp/vadd.out & V=$!; \
    n=0; until [ -f /tmp/ready ] || ! kill -0 $V || [ $n -ge 300 ]; do sleep 1; n=$((n+1)); done; \
    cuda-guest-check fault --wait /tmp/ready --done /tmp/faulted; echo fault=$?; \
    wait $V; echo vadd=$?; cat /tmp/vadd.out; \
    cuda-guest-check hold > /tmp/hold.out & H=$!; \
    n=0; until grep -q slot= /tmp/hold.out || ! kill -0 $H || [ $n -ge 300 ]; do sleep 1; n=$((n+1)); done; \
    cat /tmp/hold.out; kill -9 $H; wait $H; \
    cuda-guest-check info; echo info2=$?";

fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?}:\n{out}"))
}

/// Boots with `SCRIPT` and then `more`, and checks `SCRIPT`'s lines; returns the output.
fn check(dir: &(PathBuf, PathBuf), gpu: &str, para: bool, more: &str) -> String {
    let (code, out) = boot(dir, gpu, &format!("{SCRIPT}{more}"));
    assert_eq!(code, 0, "{out}");
    let first = line(&out, "CHECK info ");
    assert!(
        first.contains("ok=1 slot=0")
            && first.contains(&format!("para={para}"))
            && first.contains("first=true reclaimed=[]"),
        "{out}"
    );
    assert!(out.contains("info=0"), "{out}");
    // The faulting process: its own sticky illegal-address error.
    let fault = line(&out, "CHECK fault ");
    assert!(fault.contains("ok=1 slot=1"), "{out}");
    assert!(
        fault.contains("sticky=\"illegal address: KERNEL_FAULT (fault kind 11)"),
        "{out}"
    );
    assert!(out.contains("fault=0"), "{out}");
    // The other process ran on while it faulted, and its results are right.
    let vadd = line(&out, "CHECK vadd ");
    assert!(
        vadd.contains("ok=1 slot=0") && vadd.contains("n=100000") && vadd.contains("globals=ok"),
        "{out}"
    );
    let iters: u32 = vadd
        .split_whitespace()
        .find_map(|w| w.strip_prefix("iters="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        iters > 0,
        "vadd ran launches while the other faulted:\n{out}"
    );
    assert!(out.contains("vadd=0"), "{out}");
    // A killed holder's slot is taken back by the next process.
    assert!(out.contains("CHECK hold slot=0"), "{out}");
    let last = out
        .lines()
        .filter(|l| l.starts_with("CHECK info "))
        .nth(1)
        .unwrap_or_else(|| panic!("second info:\n{out}"));
    assert!(
        last.contains("ok=1 slot=0") && last.contains("first=false reclaimed=[0]"),
        "{out}"
    );
    assert!(out.contains("info2=0"), "{out}");
    out
}

/// Full mode, then two processes copying memory at once, each keeping its own bytes (in the
/// same boot: a boot costs ~40 s of CI). The guest kernel switches only x87/SSE register state
/// (no XSAVE under PVM), so /init keeps glibc off AVX registers (guest-images/linux/init.sh);
/// without that, a copy's first 64 bytes came back as the other process's.
#[test]
fn two_cuda_processes_at_once_in_full_mode_one_faults_then_two_copy_at_once() {
    let Some(dir) = guest_dir() else { return };
    let out = check(
        dir,
        "mode=full",
        false,
        "; cuda-guest-check copies 30 0 & cuda-guest-check copies 30 1; wait",
    );
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("CHECK copies "))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l.contains("ok=1")), "{out}");
}

#[test]
fn two_cuda_processes_at_once_in_para_mode_one_faults() {
    let Some(dir) = guest_dir() else { return };
    check(dir, "mode=para", true, "");
}
