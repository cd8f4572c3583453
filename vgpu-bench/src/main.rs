//! `vgpu-bench`: the experiment binary. One subcommand per experiment; each writes
//! `--out DIR/summary.json` plus a CSV of its raw rows and prints a one-line summary.
//!
//! - `ptx`: interpreter throughput (thread-instructions per second per core) on suite kernels.
//! - `preempt`: preempt-to-saved and restore-to-running latency percentiles of a running kernel.

mod error;
mod exp_preempt;
mod exp_ptx;
mod report;
mod runner;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "vgpu-bench", about = "vgpu-vmm experiments")]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.cmd {
        Cmd::Ptx(a) => exp_ptx::run(a),
        Cmd::Preempt(a) => exp_preempt::run(a),
    };
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-bench: {e}");
            ExitCode::FAILURE
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
        let cli = Cli::parse_from(["vgpu-bench", "preempt", "--size", "huge"]);
        let Cmd::Preempt(a) = cli.cmd else { panic!() };
        assert!(matches!(
            exp_preempt::run(&a),
            Err(error::BenchError::Invalid(_))
        ));
    }
}
