//! `vgpu-bench soak`, CI-sized: the real `vgpud` and three real `vgpu-vmm` VMs (KVM) through it
//! for 30 s while one random action a second hits them (daemon SIGKILLed and restarted, VM
//! killed, paused, snapshotted, snapshot-restored, migrated). Asserts on what the run saw: no
//! wrong result anywhere a VM ended, the daemon restarted under the VMs at least once and
//! adopted them, no descriptor or memory left behind in the daemon, every VRAM partition back to
//! free at its exit (its report). Needs `vgpu-vmm` and
//! `vgpud` built in the same target directory (as `cargo test --workspace` leaves them).

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_vgpu-bench")).with_file_name(name);
    assert!(
        p.is_file(),
        "{}: missing; build it first (cargo build -p vmm -p vgpud)",
        p.display()
    );
    p
}

#[test]
fn a_short_soak_loses_nothing_and_leaks_nothing() {
    let out = std::env::temp_dir().join(format!("vgpu-bench-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // Seed 4 draws daemon restarts among its first actions (the choices of a seed are fixed).
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .args([
            "soak",
            "--duration-s",
            "30",
            "--vms",
            "3",
            "--vm-seconds",
            "10",
            "--action-every-ms",
            "1000",
            "--revoke-after-ms",
            "2000",
            "--seed",
            "4",
            "--out",
        ])
        .arg(&out)
        .arg("--vmm")
        .arg(bin("vgpu-vmm"))
        .arg("--vgpud")
        .arg(bin("vgpud"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap_or_default();
    assert!(run.status.success(), "{stdout}\n{stderr}\n{summary}");
    let s: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(s["pass"], true, "{s}");
    assert_eq!(s["vms"]["wrong"], 0, "{s}");
    assert!(s["vms"]["ok"].as_u64().unwrap() >= 3, "{s}");
    assert!(s["actions"]["total"].as_u64().unwrap() >= 10, "{s}");
    assert_eq!(s["actions"]["failed"], 0, "{s}");
    assert!(s["daemon"]["restarts"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["leak_free"], true, "{s}");
    let end = &s["daemon"]["end"];
    assert_eq!(end["vms"], 0, "{s}");
    assert!(end["fds"].as_u64().unwrap() <= s["daemon"]["fresh"]["fds"].as_u64().unwrap());
    // Every VRAM partition back to free in the last daemon's exit report (it adopted VMs of
    // the killed ones, which then ended, moved or were killed): one GPU, all of it free, no
    // channel in use, no VM registered.
    let leak = &s["leak"];
    for k in ["no_vm", "fds", "rss", "vram_partitions_free"] {
        assert_eq!(leak[k], true, "{k}: {s}");
    }
    let v = &s["daemon"]["vram_end"];
    assert_eq!(v["all_free"], true, "{s}");
    assert_eq!(v["registered"].as_array().map(Vec::len), Some(0), "{s}");
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{s}");
    // --vms 3: 48 MiB a VM and 64 MiB more.
    assert_eq!(gpus[0]["vram"], (48 * 3 + 64) << 20, "{s}");
    assert_eq!(gpus[0]["vram_free"], gpus[0]["vram"], "{s}");
    assert_eq!(gpus[0]["vram_held"], 0, "{s}");
    assert_eq!(gpus[0]["channels_used"], 0, "{s}");
    let _ = std::fs::remove_dir_all(&out);
}
