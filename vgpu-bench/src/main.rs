//! `vgpu-bench`: the experiment binary. One subcommand per experiment; each writes
//! `--out DIR/summary.json` plus a CSV of its raw rows and prints a one-line summary.
//!
//! - `ptx`: interpreter throughput (thread-instructions per second per core) on suite kernels.
//! - `preempt`: preempt-to-saved and restore-to-running latency percentiles of a running kernel.
//! - `overhead`: the suite under native, full-virtualization and para-virtualization
//!   configurations: per benchmark and phase time, slowdown vs native and MMIO exits.
//! - `fairness`: N VMs sharing one GPU through `vgpud`: Jain's index, share error vs weights,
//!   utilization, preemption and switch latency, per-VM throughput.
//! - `priority`: a latency-sensitive VM beside N backlogged ones under timeslice, priority and
//!   fikit (filling) scheduling, against the VM alone: request latency, LP throughput,
//!   utilization.
//! - `snapshot`: VRAM checkpoint and restore speed (bulk engine calls and whole-device
//!   save/restore) to and from memory and files.
//! - `migrate`: snapshot, restore, stop-and-copy and live migration of a GPU VM running
//!   kernels: times, sizes, downtime, bytes per pre-copy round, slowdown during a live snapshot
//!   and during a live migration.
//! - `restore`: restore to running, cold `--restore` against a `--standby` process (made
//!   before the request) and one with the snapshot as its `--template` (its GPU modules loaded
//!   before the request): p50/p90 and their parts.
//! - `apps`: the CUDA application suite (unmodified nvcc-built programs, apps/) natively and in
//!   VMs (pt, full, para, vgpud): per program the library's phases, GPU-side and whole-run time.

mod apps_exec;
mod apps_output;
mod apps_preempt;
mod backend;
mod chart;
mod chart_axis;
mod chart_cdf;
mod cpus;
mod error;
mod exp_apps;
mod exp_fairness;
mod exp_migrate;
mod exp_overhead;
mod exp_preempt;
mod exp_priority;
mod exp_ptx;
mod exp_restore;
mod exp_snapshot;
mod exp_soak;
mod fairness_calib;
mod fairness_chart;
mod fairness_guest;
mod fairness_metrics;
mod fairness_native;
mod fairness_output;
mod fairness_restart;
mod fairness_window;
mod migrate_rep;
mod migrate_slowdown;
mod migrate_vm;
mod mounts;
mod native;
mod native_load;
mod overhead_output;
mod overhead_pt;
mod overhead_split;
mod overhead_vm;
mod preempt_breakdown;
mod preempt_env;
mod preempt_requester;
mod priority_guest;
mod priority_metrics;
mod priority_native;
mod priority_output;
mod procs;
mod progress;
mod report;
mod runner;
mod snapshot_vgpu;
mod snapshot_vram;
mod soak_actions;
mod soak_leak;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "vgpu-bench",
    about = "vgpu-vmm experiments",
    after_help = "Exit status: 0 when the experiment ran and its results were written; 1 when it \
failed (an engine error, a wrong result, a VM or daemon that failed, results not written); 2 on \
a usage error (bad option, --out not a writable directory)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Interpreter throughput in thread-instructions per second per core.
    Ptx(exp_ptx::Args),
    /// Preemption and restore latency percentiles of a running kernel.
    Preempt(exp_preempt::Args),
    /// Virtualization overhead: the suite under native, full-virt and para-virt configurations.
    Overhead(exp_overhead::Args),
    /// Fairness: N VMs sharing one GPU through vgpud under a scheduling policy.
    Fairness(exp_fairness::Args),
    /// Priority: a latency-sensitive VM beside N backlogged VMs: alone, timeslice, priority, fikit.
    Priority(exp_priority::Args),
    /// Snapshot: VRAM save and restore speed, engine level and whole device.
    Snapshot(exp_snapshot::Args),
    /// Snapshot, restore and (live) migration of a GPU VM running kernels.
    Migrate(exp_migrate::Args),
    /// Restore to running: cold `--restore` against a standby process prepared before, without
    /// and with the snapshot as its template.
    Restore(exp_restore::Args),
    /// The CUDA application suite (unmodified nvcc-built programs) natively and in VMs.
    Apps(exp_apps::Args),
    /// Soak: VMs through vgpud for a long time under daemon restarts, kills, pauses, snapshots
    /// and migrations; every result checked, the daemon checked for leaks.
    Soak(exp_soak::Args),
    /// One plain CUDA process of a native anchor (started by the experiments).
    #[command(hide = true)]
    NativeLoad(native_load::Args),
}

/// One experiment, as its parsed arguments: where its results go and how it runs.
trait Experiment {
    /// `--out DIR`.
    fn out(&self) -> &std::path::Path;
    /// Runs it; the one-line summary.
    fn run(&self) -> Result<String, error::BenchError>;
}

/// Each experiment module's `Args` (with an `out` field) and `run`.
macro_rules! experiments {
    ($($module:ident),*) => {$(
        impl Experiment for $module::Args {
            fn out(&self) -> &std::path::Path {
                &self.out
            }
            fn run(&self) -> Result<String, error::BenchError> {
                $module::run(self)
            }
        }
    )*};
}

experiments!(
    exp_ptx,
    exp_preempt,
    exp_overhead,
    exp_fairness,
    exp_priority,
    exp_snapshot,
    exp_migrate,
    exp_restore,
    exp_apps,
    exp_soak
);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let exp: &dyn Experiment = match &cli.cmd {
        Cmd::Ptx(a) => a,
        Cmd::Preempt(a) => a,
        Cmd::Overhead(a) => a,
        Cmd::Fairness(a) => a,
        Cmd::Priority(a) => a,
        Cmd::Snapshot(a) => a,
        Cmd::Migrate(a) => a,
        Cmd::Restore(a) => a,
        Cmd::Apps(a) => a,
        Cmd::Soak(a) => a,
        Cmd::NativeLoad(a) => return ExitCode::from(native_load::run(a)),
    };
    let out = exp.out();
    if let Err(e) = report::prepare_out(out) {
        eprintln!("vgpu-bench: --out {}: {e}", out.display());
        return ExitCode::from(2);
    }
    let result = exp.run();
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-bench: {e}");
            match e {
                error::BenchError::UnknownWorkload(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("vgpu-bench-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn summary(dir: &std::path::Path) -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join("summary.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn ptx_experiment_writes_its_figures() {
        let out = out_dir("ptx");
        let cli = Cli::parse_from(["vgpu-bench", "ptx", "--size", "small", "--seconds", "0.05"]);
        let Cmd::Ptx(mut a) = cli.cmd else { panic!() };
        a.out = out.clone();
        let line = exp_ptx::run(&a).unwrap();
        assert!(line.starts_with("ptx: "), "{line}");
        let s = summary(&out);
        let w = s["workloads"].as_array().unwrap();
        assert_eq!(w.len(), 2);
        assert!(
            w.iter()
                .all(|r| r["thread_instructions"].as_u64().unwrap() > 0)
        );
        let csv = std::fs::read_to_string(out.join("ptx.csv")).unwrap();
        assert_eq!(csv.lines().count(), 3);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn preempt_experiment_writes_its_figures() {
        let out = out_dir("preempt");
        let cli = Cli::parse_from([
            "vgpu-bench",
            "preempt",
            "--size",
            "medium",
            "--samples",
            "6",
            "--workers",
            "1",
        ]);
        let Cmd::Preempt(mut a) = cli.cmd else {
            panic!()
        };
        a.out = out.clone();
        exp_preempt::run(&a).unwrap();
        let s = summary(&out);
        assert!(s["samples"].as_u64().unwrap() >= 6);
        assert!(s["preempt_to_saved_bytes_us"]["p50"].as_f64().unwrap() > 0.0);
        assert!(s["context_bytes"]["max"].as_f64().unwrap() > 0.0);
        let csv = std::fs::read_to_string(out.join("preempt.csv")).unwrap();
        assert!(csv.lines().count() > 6);
        let _ = std::fs::remove_dir_all(&out);
    }

    /// `preempt --short --method checkpoint` on sim: every workload preempted and resumed
    /// through the checkpoint method, no mismatch, bytes saved reported, a chart drawn.
    #[test]
    fn preempt_short_checkpoint_on_sim() {
        let out = out_dir("preempt-ck");
        let cli = Cli::parse_from([
            "vgpu-bench",
            "preempt",
            "--short",
            "--method",
            "checkpoint",
            "--poll-interval",
            "1",
        ]);
        let Cmd::Preempt(mut a) = cli.cmd else {
            panic!()
        };
        a.out = out.clone();
        let line = exp_preempt::run(&a).unwrap();
        assert!(line.contains("mismatches 0"), "{line}");
        let s = summary(&out);
        assert_eq!(s["mismatches"].as_u64(), Some(0));
        assert_eq!(s["method"], "checkpoint");
        assert!(s["samples"].as_u64().unwrap() > 0);
        assert_eq!(s["checkpoint"]["fallback_modules"].as_u64(), Some(0));
        assert!(s["checkpoint"]["saved_full_bytes"].as_u64().unwrap() > 0);
        let per = s["per_workload"].as_array().unwrap();
        // `--short`: the suite but spin, then the long kernels.
        assert_eq!(
            per.len(),
            suite::all().filter(|w| w.name != "spin").count() + suite::long::all().len()
        );
        assert!(out.join("preempt-latency.svg").is_file());
        let _ = std::fs::remove_dir_all(&out);
    }

    /// The quick overhead run end to end: native always (the suite must verify), and `full`
    /// too when a vgpu-vmm binary sits next to the test (as after `cargo test --workspace`).
    #[test]
    fn overhead_quick_writes_its_figures() {
        let out = out_dir("overhead");
        let vmm = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.parent()?.join("vgpu-vmm")))
            .filter(|p| p.is_file());
        let configs = if vmm.is_some() {
            "native,full"
        } else {
            "native"
        };
        let cli = Cli::parse_from(["vgpu-bench", "overhead", "--quick", "--configs", configs]);
        let Cmd::Overhead(mut a) = cli.cmd else {
            panic!()
        };
        a.out = out.clone();
        a.vmm = vmm.clone();
        let line = exp_overhead::run(&a).unwrap();
        assert!(line.starts_with("overhead: "), "{line}");
        let s = summary(&out);
        assert_eq!(s["sizes"], serde_json::json!(["small"]));
        let results = s["results"].as_array().unwrap();
        assert_eq!(results.len(), if vmm.is_some() { 2 } else { 1 });
        let native = &results[0];
        assert_eq!(native["config"], "native");
        assert_eq!(native["all_ok"], true, "{native}");
        let benches = native["benchmarks"].as_array().unwrap();
        assert!(benches.len() >= 13, "{native}");
        for b in benches {
            assert_eq!(b["ok"], true, "{b}");
            assert!((b["slowdown"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{b}");
            assert!(b["total_us"].as_f64().unwrap() > 0.0, "{b}");
            assert!(
                (b["slowdown_with_init"].as_f64().unwrap() - 1.0).abs() < 1e-9,
                "{b}"
            );
            let phases: u64 = ["upload", "kernel", "download", "free"]
                .iter()
                .map(|p| b["phases"][p]["mmio_exits"].as_u64().unwrap())
                .sum();
            assert_eq!(b["mmio_exits"].as_u64(), Some(phases), "{b}");
        }
        // Every kernel phase rang its doorbell: through the trapped register, or through the
        // doorbell page (taken by the device's poll).
        let kernel_traps: u64 = benches
            .iter()
            .map(|b| b["phases"]["kernel"]["mmio_exits"].as_u64().unwrap())
            .sum();
        assert!(
            kernel_traps + native["bell_doorbells"].as_u64().unwrap() >= benches.len() as u64,
            "{native}"
        );
        assert!(native["launches"].as_u64().unwrap() >= benches.len() as u64);
        assert!(native["init"]["mmio_exits"].as_u64().unwrap() > 0);
        for r in results {
            check_splits(r);
        }
        if vmm.is_some() {
            let full = &results[1];
            assert_eq!(full["config"], "full");
            assert_eq!(full["all_ok"], true, "{full}");
            assert!(full["vm_mmio_exits"].as_u64().unwrap() > 0, "{full}");
            assert!(full["geomean_slowdown"].as_f64().unwrap() > 0.0, "{full}");
            assert!(
                full["geomean_slowdown_with_init"].as_f64().unwrap() > 0.0,
                "{full}"
            );
        }
        let csv = std::fs::read_to_string(out.join("overhead.csv")).unwrap();
        assert!(csv.lines().count() > 13 * 5, "{csv}");
        for part in ["download_copy", "download_read"] {
            let rows = csv
                .lines()
                .filter(|l| l.contains(&format!(",{part},")))
                .count();
            assert_eq!(rows, benches.len() * results.len(), "{part}: {csv}");
        }
        assert!(csv.contains(",init,init_pool_warm,"), "{csv}");
        let svg = std::fs::read_to_string(out.join("overhead-small.svg")).unwrap();
        assert!(svg.contains("<svg") && svg.contains("vecadd"), "{svg}");
        let _ = std::fs::remove_dir_all(&out);
    }

    /// The download and init splits of one configuration's results: every workload's download
    /// copied into system memory (as the driver waited for it and as the device timed it, by
    /// destination) and was read; init's parts add up to no more than init.
    fn check_splits(r: &serde_json::Value) {
        let dl = &r["download_split"];
        assert!(dl["download_copy"]["us"].as_f64().unwrap() > 0.0, "{dl}");
        assert!(dl["download_read"]["us"].as_f64().unwrap() > 0.0, "{dl}");
        assert!(dl["reread_us"].as_f64().unwrap() > 0.0, "{dl}");
        let dev = &dl["device"];
        // Every workload copies its outputs out of VRAM and its inputs into it (direct=on:
        // the worker knows each destination).
        let n = r["benchmarks"].as_array().unwrap().len() as u64;
        assert!(
            dev["copy_to_sysmem"]["copies"].as_u64().unwrap() >= n,
            "{dev}"
        );
        assert!(dev["copy_to_sysmem"]["us"].as_f64().unwrap() > 0.0, "{dev}");
        assert!(
            dev["copy_to_vram"]["copies"].as_u64().unwrap() >= n,
            "{dev}"
        );
        assert!(dev["copy_to_vram"]["mib"].as_f64().unwrap() > 0.0, "{dev}");
        assert_eq!(
            dev["copy_unclassified"]["copies"].as_u64(),
            Some(0),
            "{dev}"
        );
        let init = &r["init_split"];
        let parts: f64 = [
            "probe",
            "tables",
            "pool_alloc",
            "pool_warm",
            "map",
            "channel",
        ]
        .iter()
        .map(|p| init[p]["us"].as_f64().unwrap())
        .sum();
        let total = r["init"]["us"].as_f64().unwrap();
        assert!(
            parts > 0.0 && parts <= total + 0.01,
            "{parts} vs {total}: {init}"
        );
        assert!(init["channel"]["us"].as_f64().unwrap() > 0.0, "{init}");
        assert!(init["launch_prep_us"].as_f64().unwrap() > 0.0, "{init}");
    }

    /// Xl is refused on sim before any work (it would take many minutes).
    #[test]
    fn overhead_refuses_xl_on_sim() {
        let cli = Cli::parse_from([
            "vgpu-bench",
            "overhead",
            "--sizes",
            "xl",
            "--configs",
            "native",
        ]);
        let Cmd::Overhead(mut a) = cli.cmd else {
            panic!()
        };
        a.out = out_dir("overhead-xl");
        let e = exp_overhead::run(&a).unwrap_err().to_string();
        assert!(e.contains("xl") && e.contains("real GPUs"), "{e}");
        assert!(!a.out.exists(), "the output directory was made");
    }

    #[test]
    fn overhead_refuses_bad_configurations() {
        let cli = Cli::parse_from(["vgpu-bench", "overhead", "--configs", "full,native"]);
        let Cmd::Overhead(a) = cli.cmd else { panic!() };
        assert!(matches!(
            exp_overhead::run(&a),
            Err(error::BenchError::Invalid(_))
        ));
        let cli = Cli::parse_from(["vgpu-bench", "overhead", "--configs", "native,warp"]);
        let Cmd::Overhead(a) = cli.cmd else { panic!() };
        assert!(matches!(
            exp_overhead::run(&a),
            Err(error::BenchError::Invalid(_))
        ));
    }

    /// `snapshot` on sim: every phase measured and checked (each restore of the first
    /// repetition is verified page by page inside the run), the data files gone afterwards, an
    /// existing data file refused before any work.
    #[test]
    fn snapshot_experiment_on_sim() {
        let out = out_dir("snapshot");
        let cli = Cli::parse_from([
            "vgpu-bench",
            "snapshot",
            "--vram",
            "8M",
            "--fill",
            "0.3",
            "--run-pages",
            "3",
            "--reps",
            "2",
        ]);
        let Cmd::Snapshot(mut a) = cli.cmd else {
            panic!()
        };
        a.out = out.clone();
        report::prepare_out(&out).unwrap();
        let line = exp_snapshot::run(&a).unwrap();
        assert!(line.starts_with("snapshot: sim 8M"), "{line}");
        let s = summary(&out);
        // 30% of 2048 pages in runs of 3 pages.
        let nonzero = s["nonzero_bytes"].as_u64().unwrap();
        assert!((614 * 4096..=617 * 4096).contains(&nonzero), "{nonzero}");
        for p in [
            "save_mem",
            "restore_mem",
            "restore_file_cold",
            "device_save_mem",
            "device_restore_file",
        ] {
            let ph = &s["phases"][p];
            assert!(ph["seconds"]["p50"].as_f64().unwrap() > 0.0, "{p}");
            assert_eq!(ph["vram_bytes_moved"].as_u64(), Some(nonzero), "{p}");
        }
        assert!(s["device_image_bytes"].as_u64().unwrap() > nonzero);
        let csv = std::fs::read_to_string(out.join("snapshot.csv")).unwrap();
        // A header, then 2 repetitions of the 15 phases (the lanes' file phases and the file
        // system's own ceiling among them).
        assert_eq!(csv.lines().count(), 1 + 2 * 15);
        assert!(!out.join("snapshot-vram.bin").exists());
        // A file of that name that is not ours is never overwritten.
        std::fs::write(out.join("snapshot-gpu.bin"), b"mine").unwrap();
        assert!(matches!(
            exp_snapshot::run(&a),
            Err(error::BenchError::Io { .. })
        ));
        assert_eq!(
            std::fs::read(out.join("snapshot-gpu.bin")).unwrap(),
            b"mine"
        );
        assert!(!out.join("snapshot-vram.bin").exists(), "ours, removed");
        std::fs::remove_file(out.join("snapshot-gpu.bin")).unwrap();
        // Without an NVIDIA driver, --backend cuda is an engine error, and its files go.
        if !std::path::Path::new("/dev/nvidiactl").exists() {
            a.backend = backend::Backend::Cuda;
            assert!(matches!(
                exp_snapshot::run(&a),
                Err(error::BenchError::Engine(_))
            ));
            assert!(!out.join("snapshot-vram.bin").exists());
        }
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let cli = Cli::parse_from([
            "vgpu-bench",
            "ptx",
            "--workloads",
            "nope",
            "--seconds",
            "0.01",
        ]);
        let Cmd::Ptx(a) = cli.cmd else { panic!() };
        assert!(matches!(
            exp_ptx::run(&a),
            Err(error::BenchError::UnknownWorkload(_))
        ));
        let e = Cli::try_parse_from(["vgpu-bench", "preempt", "--size", "huge"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
    }
}
