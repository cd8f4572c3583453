//! Prints the simulated results table of README.md: every standard scenario under every policy.
//! Usage: `cargo run -p scheduler --example simulate [-- key=value,...]` (scheduler configuration).

use scheduler::sim::simulate;
use scheduler::{Config, PolicyKind, scenarios};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let base = match Config::parse(&args.join(",")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bad configuration: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "| scenario | policy | Jain min / mean | share error max (run / window) | utilization (useful) | switches |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (name, spec) in scenarios::all() {
        for kind in PolicyKind::ALL {
            let config = Config {
                policy: kind,
                ..base.clone()
            };
            match simulate(&config, &spec) {
                Ok(r) => println!(
                    "| {name} | {kind} | {:.4} / {:.4} | {:.2}% / {:.2}% | {:.1}% ({:.1}%) | {} |",
                    r.jain_min(),
                    r.jain_mean(),
                    100.0 * r.share_error_max(),
                    100.0 * r.window_error_max(),
                    100.0 * r.utilization,
                    100.0 * r.useful,
                    r.switches
                ),
                Err(e) => println!("| {name} | {kind} | error: {e} | | | |"),
            }
        }
    }
}
