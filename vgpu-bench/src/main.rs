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
