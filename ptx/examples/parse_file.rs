//! Parse PTX files and report entries and decode time: `cargo run -p ptx --release --example
//! parse_file -- FILE...` (a quick check that nvcc output is inside the supported subset).

use std::time::Instant;

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{path}: {e}");
                failed = true;
                continue;
            }
        };
        let t = Instant::now();
        match ptx::parse(&text) {
            Ok(m) => {
                let entries: Vec<String> = m
                    .entries()
                    .map(|e| format!("{} ({} instructions)", e.name, e.instructions))
                    .collect();
                println!(
                    "{path}: ok in {:.3}s: {}",
                    t.elapsed().as_secs_f64(),
                    entries.join(", ")
                );
            }
            Err(e) => {
                println!("{path}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
