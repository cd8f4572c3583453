//! Print the preemptible (checkpointing) version of a PTX file made by `ptx::ckpt::transform`,
//! with a summary of each entry's points and save-area layout on stderr.
//!
//! `cargo run -p ptx --example ckpt -- FILE.ptx [MAX_GAP] > out.ptx`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: ckpt FILE.ptx [MAX_GAP]");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut opts = ptx::ckpt::Options::default();
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
                    "{}: class {:?}, record {} bytes/thread, shared static {} bytes, {} points",
                    e.name,
                    e.class,
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
