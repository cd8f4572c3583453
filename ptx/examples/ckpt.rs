//! Print the preemptible (checkpointing) version of a PTX file made by `ptx::ckpt::transform`,
//! with a summary of each entry's points and save-area layout on stderr.
//!
//! `cargo run -p ptx --example ckpt -- [--restart] FILE.ptx [MAX_GAP] > out.ptx` (`--restart`:
//! idempotent entries in their restarting form, `Options::restart`), or
//! `cargo run -p ptx --example ckpt -- --print FILE.ptx` for the printer's round trip only.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    let print_only = args.get(1).is_some_and(|a| a == "--print");
    if print_only {
        args.remove(1);
    }
    let restart = args.get(1).is_some_and(|a| a == "--restart");
    if restart {
        args.remove(1);
    }
    let Some(path) = args.get(1) else {
        eprintln!("usage: ckpt [--print | --restart] FILE.ptx [MAX_GAP]");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if print_only {
        return match ptx::ckpt::print_module(&text, &ptx::LoadOptions::default()) {
            Ok(t) => {
                print!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{path}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut opts = ptx::ckpt::Options {
        restart,
        ..ptx::ckpt::Options::default()
    };
    if let Some(g) = args.get(2) {
        match g.parse() {
            Ok(v) => opts.max_gap = v,
            Err(_) => {
                eprintln!("MAX_GAP must be a number: {g}");
                return ExitCode::from(2);
            }
        }
    }
    match ptx::ckpt::transform(&text, &opts) {
        Ok(t) => {
            for e in &t.entries {
                eprintln!(
                    "{}: class {:?}, {}, record {} bytes/thread, shared static {} bytes, {} points",
                    e.name,
                    e.class,
                    if e.restart { "restarts" } else { "checkpoints" },
                    e.record_bytes,
                    e.shared_static_bytes,
                    e.points.len()
                );
                for p in &e.points {
                    eprintln!(
                        "  point {} ({:?}, line {}): {} regs, {} bytes full, {} bytes when resumed here",
                        p.id,
                        p.kind,
                        p.line,
                        p.live_regs,
                        p.live_bytes,
                        e.incremental_bytes(p.id, p.id)
                    );
                }
            }
            print!("{}", t.ptx);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            ExitCode::FAILURE
        }
    }
}
