//! `vgpu-bench migrate --short` end to end: real `vgpu-vmm` VMs (KVM) running the `fairness`
//! guest with its outputs in VRAM: a paused snapshot restored, a stop-and-copy and a live
//! migration (every moved guest must finish `ok=1`, or the experiment fails), and a live
//! snapshot of a running VM; asserts on what the run measured, the guest's slowdown during the
//! live snapshots and during the live migration included. Needs `vgpu-vmm` built in the
//! same target directory (as `cargo test --workspace` or `cargo build -p vmm` leaves it).

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

/// The two full runs one at a time: each asserts on what its guest did during the live
/// copies (VRAM dirtied across rounds), which a second run's VMs on the same 2 cores can
/// starve.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `vgpu-bench migrate --short ARGS` into a fresh `out` named after `tag` (one run at a
/// time); it must succeed: its stdout, its summary.json and `out` (removed by the caller).
fn short_run(tag: &str, args: &[&str]) -> (String, serde_json::Value, PathBuf) {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("vgpu-bench-migrate{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .args(["migrate", "--short"])
        .args(args)
        .arg("--out")
        .arg(&out)
        .arg("--vmm")
        .arg(vmm())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    (stdout, s, out)
}

#[test]
fn short_migrate_run_measures_snapshots_and_migrations() {
    let (stdout, s, out) = short_run("", &[]);
    assert!(stdout.starts_with("migrate (sim): snapshot "), "{stdout}");
    // `--incoming` destinations, which have no standby preparation.
    assert_eq!(s["dest"], "incoming", "{s}");
    assert!(
        s["live_migration"]["dest"]["dest_standby_prepared_ms"].is_null(),
        "{s}"
    );
    let pos = |v: &serde_json::Value| v.as_f64().is_some_and(|x| x > 0.0);
    assert!(pos(&s["snapshot_paused"]["ms"]), "{s}");
    assert!(pos(&s["snapshot_paused"]["disk_bytes"]), "{s}");
    assert!(pos(&s["restore_to_running_ms"]), "{s}");
    assert!(pos(&s["stop_copy"]["downtime_ms"]), "{s}");
    assert!(pos(&s["live_migration"]["downtime_ms"]), "{s}");
    // A live migration is paused for part of its time only.
    let live = &s["live_migration"];
    assert!(
        live["downtime_ms"].as_f64().unwrap() < live["total_ms"].as_f64().unwrap(),
        "{s}"
    );
    // The GPU ran during the pre-copy, and VRAM went over in more than one round.
    let report = &live["first_report"];
    assert_eq!(report["gpu_running"], true, "{s}");
    let vram_rounds = report["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["vram_bytes"].as_u64().unwrap() > 0)
        .count();
    assert!(vram_rounds > 1, "{s}");
    let snap = &s["live_snapshot"];
    assert_eq!(snap["first_report"]["gpu_running"], true, "{s}");
    assert!(pos(&snap["kernels_per_s_before"]), "{s}");
    assert!(snap["slowdown"].as_f64().is_some(), "{s}");
    // The slowdown counted by the GPU's launches: 3 windows (the VM's first live snapshot
    // and two more), each with a live window, and baselines in which the guest's GPU
    // launched kernels.
    let w = &snap["launch_windows"];
    assert_eq!(w["windows"], 3, "{s}");
    assert!(w["baseline_launches"].as_u64().unwrap() > 0, "{s}");
    for win in w["per_window"].as_array().unwrap() {
        assert!(pos(&win["live_ms"]), "{win}: {s}");
        // The tail after the resume (the VM runs on): counted, with the round-0 parts.
        assert!(pos(&win["tail_ms"]), "{win}: {s}");
        assert!(win["parts"]["round0_ms"].as_f64().is_some(), "{win}: {s}");
    }
    assert!(pos(&w["tail_ms"]), "{s}");
    // The split of the first windows from the others, and the median of the one rep.
    assert!(w["slowdown_without_tail"].as_f64().is_some(), "{s}");
    assert!(w["slowdown_first_windows"].as_f64().is_some(), "{s}");
    assert!(w["slowdown_later_windows"].as_f64().is_some(), "{s}");
    assert_eq!(w["slowdown_per_rep"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(w["slowdown_median_of_reps"], w["slowdown"], "{s}");
    // The slowdown during the live migration, counted the same way: one window (the one
    // rep's migration) with a baseline on the source in which the guest launched kernels, the
    // source's live window and downtime, and the destination's first window after the
    // switch-over (kernels launched there too), kept apart.
    let m = &live["launch_windows"];
    assert_eq!(m["windows"], 1, "{s}");
    assert!(m["baseline_launches"].as_u64().unwrap() > 0, "{s}");
    assert!(pos(&m["baseline_ms"]) && pos(&m["live_ms"]), "{s}");
    assert!(pos(&m["launches_per_s_before"]), "{s}");
    // The downtime in the window is the migration's own.
    assert_eq!(m["paused_ms"], live["downtime_ms"], "{s}");
    assert_eq!(m["tail_ms"], 0.0, "{s}");
    let slow = m["slowdown"].as_f64().unwrap();
    assert!(slow.is_finite() && slow <= 1.0, "{s}");
    assert_eq!(live["slowdown"], m["slowdown"], "{s}");
    assert!(
        m["slowdown_rounds"].as_f64().is_some_and(|x| x <= 1.0),
        "{s}"
    );
    assert!(
        m["launches_lost"].as_f64().is_some_and(f64::is_finite),
        "{s}"
    );
    assert_eq!(m["slowdown_per_rep"].as_array().unwrap().len(), 1, "{s}");
    let d = &m["dest_first_window"];
    assert!(pos(&d["ms"]) && d["launches"].as_u64().unwrap() > 0, "{s}");
    assert!(d["slowdown"].as_f64().is_some_and(|x| x <= 1.0), "{s}");
    let win = &m["per_window"][0];
    assert!(win["parts"]["round0_ms"].as_f64().is_some(), "{s}");
    assert_eq!(win["dest_launches"], d["launches"], "{s}");
    // The source's parts of both migrations' downtime.
    for m in ["stop_copy", "live_migration"] {
        for k in [
            "src_pause_vcpus_ms",
            "src_pause_gpu_ms",
            "src_gpu_image_ms",
            "src_end_ms",
        ] {
            assert!(s[m]["src"][k].as_f64().is_some(), "{m}.src.{k}: {s}");
        }
    }
    // The CSV has the measurements and the rounds; the chart has a bar group per round.
    let csv = std::fs::read_to_string(out.join("migrate.csv")).unwrap();
    for m in [
        "snapshot,0",
        "restore,0",
        "stop_copy,0",
        "live_migrate,0",
        "live_snapshot,0",
    ] {
        assert!(csv.contains(m), "{m}: {csv}");
    }
    assert!(csv.contains("live_migrate_round,0,0,"), "{csv}");
    let svg = std::fs::read_to_string(out.join("migrate-rounds.svg")).unwrap();
    assert!(
        svg.contains("migrate paused") && svg.contains("snapshot 0"),
        "{svg}"
    );
    // Only the results are left behind.
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--dest standby`: every destination a standby prepared before its migration (`ctl
/// incoming`); the same figures, the standby's preparation apart, the engine ready for the
/// rounds at once.
#[test]
fn short_migrate_run_into_standbys_reports_their_preparation_apart() {
    let (stdout, s, out) = short_run("-sb", &["--dest", "standby"]);
    assert!(
        stdout.starts_with("migrate (sim, destinations standbys prepared in "),
        "{stdout}"
    );
    assert_eq!(s["dest"], "standby", "{s}");
    for m in ["stop_copy", "live_migration"] {
        let d = &s[m]["dest"];
        assert!(
            d["dest_standby_prepared_ms"].as_f64().unwrap() > 0.0,
            "{m}: {s}"
        );
        assert!(d["dest_switch_ms"].as_f64().unwrap() > 0.0, "{m}: {s}");
    }
    let d = &s["live_migration"]["dest"];
    assert_eq!(d["dest_prepared"], 1.0, "{s}");
    assert!(d["dest_engine_ms"].as_f64().unwrap() < 5.0, "{s}");
    assert!(d["dest_vram_pages_early"].as_f64().unwrap() > 0.0, "{s}");
    assert_eq!(
        s["live_migration"]["dest_ready_outcomes"][0], "prepared",
        "{s}"
    );
    assert!(s["live_migration"]["slowdown"].as_f64().is_some(), "{s}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_unwritable_out_is_refused_before_any_vm_starts() {
    let file = std::env::temp_dir().join(format!("vgpu-bench-migrate-file-{}", std::process::id()));
    std::fs::write(&file, b"mine").unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .args(["migrate", "--short", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"mine",
        "the file is left alone"
    );
    let _ = std::fs::remove_file(&file);
}

/// `--live-migration-only`: the live migration measured alone, the other figures null; a
/// launch's GPU time before and during the migration in its window.
#[test]
fn a_live_migration_only_run_measures_it_alone() {
    let (stdout, s, out) = short_run("-lo", &["--live-migration-only"]);
    // The skipped figures print as "-".
    assert!(
        stdout.starts_with(
            "migrate (sim): snapshot - (0.0 MiB on disk), restore -, stop-and-copy downtime -"
        ),
        "{stdout}"
    );
    assert_eq!(s["live_migration_only"], true, "{s}");
    assert!(
        s["snapshot_paused"].is_null() && s["live_snapshot"].is_null(),
        "{s}"
    );
    assert!(s["restore_to_running_ms"].is_null(), "{s}");
    assert!(s["stop_copy"]["downtime_ms"].is_null(), "{s}");
    let m = &s["live_migration"];
    assert!(m["downtime_ms"].as_f64().unwrap() > 0.0, "{s}");
    assert!(m["slowdown"].as_f64().is_some(), "{s}");
    let w = &m["launch_windows"]["per_window"][0];
    assert!(w["before_gpu_us_per_launch"].as_f64().unwrap() > 0.0, "{s}");
    let csv = std::fs::read_to_string(out.join("migrate.csv")).unwrap();
    assert!(
        csv.lines().any(|l| l.starts_with("live_migrate,0,")),
        "{csv}"
    );
    assert!(
        !csv.lines()
            .any(|l| l.starts_with("snapshot,") || l.starts_with("live_snapshot")),
        "{csv}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
