//! `vgpu`: the multi-call binary of the Linux guest's tools. Called as `vgpu-smi`, `vgpu-run`,
//! `vgpu-exit` or `lspci` (links in the root image), or as `vgpu COMMAND ...`.

use std::process::ExitCode;

use vgpu_linux_tools::args::Args;
use vgpu_linux_tools::{ToolError, attack, exit, pci, run_ptx, run_suite, smi};

const USAGE: &str = "usage:
  vgpu-smi                         the virtual GPU: PCI identity, VRAM, channels, mode
  vgpu-run suite [size=small|medium|large] [only=NAME] [mode=full|para] [tables=vram|sysmem]
                 [sys_mib=N] [timeout_s=N] [ptx=vram] [buffers=sysmem]
  vgpu-run FILE.ptx --entry NAME [--grid X,Y,Z] [--block X,Y,Z] [--arg SPEC]... [--print N]
                 SPEC: u32:V i32:V u64:V i64:V f32:V f64:V in:T:V,V.. out:T:N ramp:T:N
                 (T: u32 i32 f32 u64)
  vgpu-run attack [only=NAME] [mode=full|para]   escape attempts; exit 0 if all contained
  vgpu-exit CODE                   stop the VM with exit code CODE
  lspci [-v]                       PCI functions (from sysfs)";

fn run(cmd: &str, rest: &[String]) -> Result<u8, ToolError> {
    match cmd {
        "vgpu-smi" | "smi" => smi::main(rest),
        "vgpu-exit" | "exit" => exit::main(rest),
        "lspci" => pci::lspci(rest),
        "vgpu-run" | "run" => match rest.split_first() {
            Some((w, _)) if w == "--help" || w == "-h" => {
                println!("{USAGE}");
                Ok(0)
            }
            Some((w, tail)) if w == "suite" => run_suite::main(&Args::parse(tail)?),
            Some((w, tail)) if w == "attack" => attack::main(&Args::parse(tail)?),
            Some((w, tail)) if w.ends_with(".ptx") => run_ptx::main(w, &Args::parse(tail)?),
            _ => {
                println!("{USAGE}");
                Ok(2)
            }
        },
        _ => {
            println!("{USAGE}");
            Ok(2)
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let name = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    let (cmd, rest) = if name == "vgpu" {
        match argv.get(1) {
            Some(c) => (c.clone(), &argv[2..]),
            None => {
                println!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    } else {
        (name, &argv[1..])
    };
    match run(&cmd, rest) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            println!("{cmd}: {e}");
            ExitCode::from(match e {
                ToolError::Bad(_) => 2,
                _ => 3,
            })
        }
    }
}
