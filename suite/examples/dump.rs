//! Writes every workload instance to OUTDIR/<name>.<size>.bin (format: suite::dump) for the CUDA harness.
//!
//! Usage: cargo run -p suite --example dump -- OUTDIR [small|medium|large ...]   (default: small)

use std::process::ExitCode;

use suite::Size;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!("usage: dump OUTDIR [small|medium|large ...]");
        return ExitCode::from(2);
    };
    let mut sizes = Vec::new();
    for a in &args[1..] {
        match Size::from_name(a) {
            Some(s) => sizes.push(s),
            None => {
                eprintln!("unknown size {a:?}");
                return ExitCode::from(2);
            }
        }
    }
    if sizes.is_empty() {
        sizes.push(Size::Small);
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("{dir}: {e}");
        return ExitCode::FAILURE;
    }
    for w in suite::all() {
        for &size in &sizes {
            let path = format!("{dir}/{}.{}.bin", w.name, size.name());
            let bytes = suite::dump::encode(&w.instance(size));
            if let Err(e) = std::fs::write(&path, &bytes) {
                eprintln!("{path}: {e}");
                return ExitCode::FAILURE;
            }
            println!("{path} {} bytes", bytes.len());
        }
    }
    ExitCode::SUCCESS
}
