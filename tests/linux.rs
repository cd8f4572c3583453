//! The Linux guest in real KVM: a minimal Linux 6.1 built by guest-images/linux/build.sh
//! (cached under target/linux-guest; the first run builds the kernel, minutes) boots with
//! `--guest linux`, sees the virtual GPU on its PCI bus, and runs the workload suite and a
//! user's PTX kernel from Linux user space through gpu-driver (vgpu-linux-tools), in full and
//! para mode; the escape attempts of `vgpu-run attack` and a runaway kernel are contained.
//!
//! When the guest cannot be built (no apt, no compiler) these tests FAIL. To skip them on a
//! machine that cannot build it, set VGPU_SKIP_LINUX=1 (CI never does).

use std::path::Path;
use std::process::{Command, Stdio};

mod linux_support;
use linux_support::guest_dir;

/// Boots the Linux guest with `--gpu GPU` running `cmd` (a shell command line in the guest);
/// returns the VMM's exit code and the console output. The 20-minute `--timeout` is only a
/// backstop against a hung guest: a boot takes ~30 s of emulated kernel on a quiet machine, but
/// took 270-290 s on a two-core machine at load average 13.
fn boot(dir: &Path, gpu: &str, cmd: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .env("VGPU_LINUX_DIR", dir)
        .args(["--guest", "linux", "--gpu", gpu, "--timeout", "1200"])
        .args(["--cmdline", &format!("vgpu_run=\"{cmd}\"")])
        .stdin(Stdio::null())
        .output()
        .expect("run vgpu-vmm");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// Every `RESULT` line between the first `INIT` and `workloads: n/n ok` says ok=1, and there
/// is one per workload of the suite.
fn assert_suite_passed(out: &str) {
    let results: Vec<&str> = out.lines().filter(|l| l.starts_with("RESULT ")).collect();
    let n = suite::all().count();
    assert_eq!(results.len(), n, "one RESULT per workload:\n{out}");
    assert!(results.iter().all(|l| l.contains(" ok=1 ")), "{out}");
    assert!(out.contains(&format!("workloads: {n}/{n} ok")), "{out}");
}

/// Para mode: lspci and vgpu-smi show the vGPU; the suite passes. (One boot: each costs ~30 s
/// of emulated kernel.)
#[test]
fn linux_guest_sees_the_vgpu_and_passes_the_suite_in_para_mode() {
    let Some(dir) = guest_dir() else { return };
    let (code, out) = boot(dir, "mode=para", "lspci -v; vgpu-smi && vgpu-run suite");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("vgpu-linux: /init running"), "{out}");
    assert!(
        out.contains("3D controller [0302]: Device 1234:9a01"),
        "{out}"
    );
    assert!(out.contains("VRAM           : 256 MiB"), "{out}");
    assert!(out.contains("Mode           : para"), "{out}");
    assert!(out.contains("para=true"), "{out}");
    assert_suite_passed(&out);
}

/// Full mode: the suite passes; a user's PTX kernel gives the right numbers; the escape
/// attempts are contained, a runaway user kernel too, and the GPU still works afterwards.
#[test]
fn linux_guest_full_mode_suite_user_ptx_and_attacks() {
    let Some(dir) = guest_dir() else { return };
    let square = "vgpu-run square.ptx --entry square --grid 2 --block 4 \
                  --arg ramp:u32:8 --arg out:u32:8 --arg u32:3 --arg u32:7";
    let cmd = format!(
        "vgpu-run suite mode=full; echo suite=$?; {square}; echo square=$?; \
         vgpu-run attack mode=full; echo attack=$?; \
         vgpu-run runaway.ptx --entry runaway; echo runaway=$?; {square}"
    );
    let (code, out) = boot(dir, "mode=full,timeout_ms=300", &cmd);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("para=false"), "{out}");
    assert_suite_passed(&out);
    assert!(out.contains("suite=0"), "{out}");
    // y[i] = i*i + 3 for i < n = 7; the last element stays 0.
    let want = "BUF 1 u32 n=8: 3 4 7 12 19 28 39 0";
    assert_eq!(out.matches(want).count(), 2, "{out}");
    assert!(out.contains("square=0"), "{out}");
    let attacks: Vec<&str> = out.lines().filter(|l| l.starts_with("ATTACK ")).collect();
    assert!(attacks.len() >= 13, "{out}");
    assert!(attacks.iter().all(|l| l.contains("contained=1")), "{out}");
    for name in [
        "pte_vram_outside",
        "pte_sysmem_outside",
        "doorbell_beyond_quota",
        "kernel_never_ends",
    ] {
        assert!(
            out.contains(&format!("ATTACK name={name} contained=1")),
            "{name}:\n{out}"
        );
    }
    assert!(out.contains("attack=0"), "{out}");
    assert!(out.contains("PTX entry=runaway ok=0"), "{out}");
    assert!(out.contains("runaway=1"), "{out}");
}

/// Snapshot and restore of a running Linux guest (no GPU): snapshotted through the API socket
/// while a shell loop prints and sleeps, the original stopped, the snapshot restored: the loop
/// carries on where it was (timers, the KVM clock, the UART and the irqchips restored) and the
/// guest ends with the loop's exit status.
#[test]
fn linux_guest_snapshot_restores_and_finishes() {
    let Some(dir) = guest_dir() else { return };
    let tmp = std::env::temp_dir().join(format!("vgpu-linux-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let socket = tmp.join("api.sock");
    let out1 = tmp.join("first.out");
    let snap = tmp.join("snap");
    let cmd = "for i in $(seq 1 12); do echo L$i $((i * i)); sleep 0.2; done";
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .env("VGPU_LINUX_DIR", dir)
        .args(["--guest", "linux", "--timeout", "1200", "--api-socket"])
        .arg(&socket)
        .args(["--cmdline", &format!("vgpu_run=\"{cmd}\"")])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out1).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&out1)
        .unwrap_or_default()
        .contains("L3 9")
    {
        assert!(
            start.elapsed().as_secs() < 1200,
            "the guest never printed L3"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let ctl = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .arg("ctl")
        .arg(&socket)
        .arg("snapshot")
        .arg(&snap)
        .arg("--paused")
        .output()
        .unwrap();
    assert!(ctl.status.success(), "{ctl:?}");
    // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
    let r = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(r, 0);
    child.wait().unwrap();
    let before = std::fs::read_to_string(&out1).unwrap();
    assert!(!before.contains("L12 144"), "{before}");
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .arg("--restore")
        .arg(&snap)
        .args(["--timeout", "1200"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let after = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!(out.status.code(), Some(0), "{after}");
    let both = format!("{before}{after}");
    let lines: Vec<&str> = both
        .lines()
        .filter(|l| l.starts_with('L') && l[1..].starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    let want: Vec<String> = (1..=12).map(|i| format!("L{i} {}", i * i)).collect();
    assert_eq!(lines, want, "{both}");
    assert!(after.contains("exited 0"), "{after}");
}
