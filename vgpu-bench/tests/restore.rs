//! `vgpu-bench restore` end to end: real `vgpu-vmm` VMs (KVM), the `count` guest (no GPU) and
//! the `fairness` guest (sim GPU) snapshotted, each restore run cold (`--restore`), into a
//! standby (`--standby`, then `restore` on its socket) and into a standby with the snapshot as
//! its template (`--template`); every restored guest must finish as
//! it should (the count guest with the same output in every run) or the experiment fails.
//! Asserts on what the run measured. Needs `vgpu-vmm` built in the same target directory.

use std::path::{Path, PathBuf};
use std::process::Command;

fn vmm() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_vgpu-bench")).with_file_name("vgpu-vmm");
    assert!(
        p.is_file(),
        "{}: missing; build it first (cargo build -p vmm)",
        p.display()
    );
    p
}

fn run(tag: &str, extra: &[&str]) -> serde_json::Value {
    let out = std::env::temp_dir().join(format!("vgpu-bench-restore-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .arg("restore")
        .args(extra)
        .arg("--out")
        .arg(&out)
        .arg("--vmm")
        .arg(vmm())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("restore (sim, "), "{stdout}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let csv = std::fs::read_to_string(out.join("restore.csv")).unwrap();
    let reps = s["reps"].as_u64().unwrap() as usize;
    assert_eq!(csv.lines().count(), 1 + 3 * reps, "{csv}");
    let _ = std::fs::remove_dir_all(&out);
    s
}

/// The standby made the VM, vCPUs and RAM slots before the request; the cold path after.
fn check(s: &serde_json::Value) {
    let ms = |mode: &str, k: &str| s[mode]["restore_to_running_ms"][k].as_f64().unwrap();
    for mode in ["cold", "standby", "template"] {
        assert!(
            ms(mode, "p50") > 0.0 && ms(mode, "p50") <= ms(mode, "p90"),
            "{s}"
        );
        assert!(ms(mode, "p90") <= ms(mode, "max"), "{s}");
    }
    let part = |mode: &str, k: &str| s[mode]["parts_median_ms"][k].as_f64().unwrap();
    assert!(
        part("cold", "vm_ms") > 0.0 && part("cold", "vcpus_ms") > 0.0,
        "{s}"
    );
    for mode in ["standby", "template"] {
        assert_eq!(
            (part(mode, "vm_ms"), part(mode, "vcpus_ms")),
            (0.0, 0.0),
            "{s}"
        );
        assert!(s[mode]["prepared_median_ms"].as_f64().unwrap() > 0.0, "{s}");
    }
    assert!(
        s["template"]["template_median_ms"].as_f64().unwrap() > 0.0,
        "{s}"
    );
    assert!(s["standby"]["template_median_ms"].is_null(), "{s}");
    assert!(
        s["standby"]["request_to_answer_ms"]["p50"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{s}"
    );
    assert!(s["cold"]["request_to_answer_ms"].is_null(), "{s}");
}

#[test]
fn restore_of_the_count_guest_cold_and_into_a_standby() {
    let s = run("count", &["--reps", "2", "--memory-mib", "64"]);
    assert_eq!(s["guest"], "count");
    check(&s);
}

#[test]
fn restore_of_a_sim_gpu_guest_cold_and_into_a_standby() {
    let s = run(
        "fairness",
        &[
            "--guest",
            "fairness",
            "--reps",
            "1",
            "--memory-mib",
            "64",
            "--vram-mib",
            "64",
        ],
    );
    assert_eq!(s["guest"], "fairness");
    check(&s);
    assert!(
        s["standby"]["parts_median_ms"]["gpu_restore_ms"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{s}"
    );
    // The guest's modules: loaded cold without a template, all from the cache with it.
    let part = |mode: &str, k: &str| s[mode]["parts_median_ms"][k].as_f64().unwrap();
    assert!(part("standby", "modules_cold") >= 1.0, "{s}");
    assert_eq!(part("standby", "modules_cached"), 0.0, "{s}");
    assert_eq!(part("template", "modules_cold"), 0.0, "{s}");
    assert_eq!(
        part("template", "modules_cached"),
        part("standby", "modules_cold"),
        "{s}"
    );
}
