//! `vgpu-bench overhead --quick` end to end with the pass-through baseline: native in the
//! process, `pt`, `full` and `para-multicall` as real `vgpu-vmm` VMs (KVM); every workload
//! verified in every configuration, and the ratios against pt (GPUvm's FV/PT, PV/PT) written
//! next to those against native. Needs `vgpu-vmm` built in the same target directory (as
//! `cargo test --workspace` or `cargo build -p vmm` leaves it).

use std::path::Path;
use std::process::Command;

#[test]
fn quick_overhead_run_reports_against_native_and_pass_through() {
    let vmm = Path::new(env!("CARGO_BIN_EXE_vgpu-bench")).with_file_name("vgpu-vmm");
    assert!(
        vmm.is_file(),
        "{}: missing; build it first (cargo build -p vmm)",
        vmm.display()
    );
    let out = std::env::temp_dir().join(format!("vgpu-bench-overhead-pt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .args([
            "overhead",
            "--quick",
            "--configs",
            "native,pt,full,para-multicall",
            "--out",
        ])
        .arg(&out)
        .arg("--vmm")
        .arg(&vmm)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("pt/small"), "{stdout}");
    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    let (json, csv, md, svg) = (
        read("summary.json"),
        read("overhead.csv"),
        read("overhead-table.md"),
        read("overhead-small.svg"),
    );
    let _ = std::fs::remove_dir_all(&out);
    let s: serde_json::Value = serde_json::from_str(&json).unwrap();
    let results = s["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["config"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["native", "pt", "full", "para-multicall"], "{json}");
    for r in results {
        assert_eq!(r["all_ok"], true, "{r}");
        assert_eq!(r["benchmarks"].as_array().unwrap().len(), 13, "{r}");
    }
    let pt = &results[1];
    assert_eq!(pt["gpu"], "mode=pt", "{pt}");
    assert!(pt["vm_mmio_exits"].as_u64().unwrap() > 0, "a VM: {pt}");
    // pt against itself is 1; the others have a positive ratio against it, per phase too.
    let near_one = |v: &serde_json::Value| (v.as_f64().unwrap() - 1.0).abs() < 1e-9;
    assert!(near_one(&pt["vs_pt"]["geomean_slowdown"]), "{pt}");
    for r in results {
        let v = &r["vs_pt"];
        assert!(v["geomean_slowdown"].as_f64().unwrap() > 0.0, "{r}");
        assert!(v["init"].as_f64().unwrap() > 0.0, "{r}");
        for p in ["upload", "kernel", "download", "free"] {
            assert!(
                v["phase_geomean_slowdown"][p].as_f64().unwrap() > 0.0,
                "{p}: {r}"
            );
        }
    }
    assert_eq!(s["gpuvm_table"].as_array().unwrap().len(), 4, "{json}");
    assert!(csv.starts_with(
        "config,size,benchmark,phase,time_us,slowdown,mmio_exits,ok,slowdown_vs_pt\n"
    ));
    // The split rows (init_*, download_copy/_read/_reread) carry no pt ratio.
    let split = |l: &str| {
        let phase = l.split(',').nth(3).unwrap_or_default();
        phase.starts_with("init_") || phase.starts_with("download_")
    };
    assert!(
        csv.lines()
            .filter(|l| l.starts_with("full,small,") && !split(l))
            .all(|l| !l.ends_with(',')),
        "every full row has its ratio against pt:\n{csv}"
    );
    for row in ["| native |", "| pt | ", "| full |", "| para-multicall |"] {
        assert!(md.contains(row), "{row}\n{md}");
    }
    // pt is a bar series of the chart: its legend entry.
    let legend_pt = svg
        .split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
        .filter(|t| *t == "pt")
        .count();
    assert_eq!(legend_pt, 1, "pt is a bar series of the chart");
}
