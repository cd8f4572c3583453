//! `vgpu-bench priority --short` end to end: the real `vgpud` and real `vgpu-vmm` VMs (KVM), the
//! `infer` guest (HP) alone and beside one `fairness` guest (LP) under timeslice, priority and
//! fikit; asserts on structure and correctness (every mode ran, every result checked), not on
//! timing targets. Needs `vgpu-vmm` and `vgpud` built in the same target directory.

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
fn short_priority_run_compares_every_mode_with_the_hp_vm_alone() {
    let (vmm, vgpud) = (bin("vgpu-vmm"), bin("vgpud"));
    let out = std::env::temp_dir().join(format!("vgpu-bench-priority-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .args(["priority", "--short", "--out"])
        .arg(&out)
        .arg("--vmm")
        .arg(&vmm)
        .arg("--vgpud")
        .arg(&vgpud)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("priority: 1 LP VMs 1 s:"), "{stdout}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["all_ok"], true, "{s}");
    assert_eq!(s["lp_vms"], 1);
    let modes = s["modes"].as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, ["alone", "timeslice", "priority", "fikit"]);
    for m in modes {
        let hp = &m["hp"];
        assert_eq!(m["ok"], true, "{m}");
        assert_eq!(hp["exit_code"], 0, "{m}");
        assert_eq!(hp["mismatches"], 0, "{m}");
        assert!(hp["requests"].as_u64().unwrap() >= 2, "{m}");
        assert!(hp["latency_us"]["p50"].as_f64().unwrap() > 0.0, "{m}");
        let util = m["gpu"]["utilization"].as_f64().unwrap();
        assert!(util > 0.0 && util <= 1.0 + 1e-6, "{m}");
        let lp = m["lp"]["guests"].as_array().unwrap();
        if m["mode"] == "alone" {
            assert!(lp.is_empty(), "{m}");
            assert_eq!(m["targets"], serde_json::Value::Null, "{m}");
            assert_eq!(hp["p50_ratio_to_alone"], 1.0, "{m}");
        } else {
            assert_eq!(lp.len(), 1, "{m}");
            for g in lp {
                assert_eq!(
                    (g["ok"].as_bool(), g["exit_code"].as_i64()),
                    (Some(true), Some(0)),
                    "{m}"
                );
                assert!(g["done"].as_u64().unwrap() > 0, "{m}");
            }
            assert!(m["lp"]["kernels_per_s"].as_f64().unwrap() > 0.0, "{m}");
            assert!(m["lp"]["gpu_share"].as_f64().unwrap() > 0.0, "{m}");
            assert!(hp["p99_ratio_to_alone"].as_f64().unwrap() > 0.0, "{m}");
            assert!(
                m["targets"]["utilization_at_least_95pct"].is_boolean(),
                "{m}"
            );
        }
        // The daemon saw the VMs with the mode's priorities.
        let dir = out.join(m["mode"].as_str().unwrap());
        let rep: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("vgpud.json")).unwrap())
                .unwrap();
        let vms = rep["vms"].as_array().unwrap();
        assert_eq!(vms.len(), 1 + lp.len(), "{rep}");
        let hp_vm = vms
            .iter()
            .find(|v| v["name"] == "hp")
            .expect("hp registered");
        assert_eq!(hp_vm["priority"], m["hp_priority"], "{m}");
        assert!(hp_vm["completed"].as_u64().unwrap() > 0, "{hp_vm}");
    }
    let csv = std::fs::read_to_string(out.join("priority.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(csv.starts_with("mode,sched,"), "{csv}");
    let svg = std::fs::read_to_string(out.join("priority-latency.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("fikit ("), "{svg}");
    let gpu = std::fs::read_to_string(out.join("priority-gpu.svg")).unwrap();
    assert!(
        gpu.contains("<svg") && gpu.contains("utilization") && gpu.contains("fikit"),
        "{gpu}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
