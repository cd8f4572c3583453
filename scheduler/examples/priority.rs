//! Prints the simulated priority experiment of README.md ("Filling"): one high-priority request
//! VM beside N backlogged low-priority VMs, under each mode; first job by job, then as vgpud
//! dispatches it to real VMs (`sim::turns`: turns of several jobs, grant and stop costs, the
//! `vgpu-bench priority` shapes).
//! Usage: `cargo run -p scheduler --example priority [-- N [key=value,...]]` (default N = 4).

use std::time::Duration;

use scheduler::sim::priority::{Mode, compare};
use scheduler::sim::turns::{self, TurnSpec};
use scheduler::{Config, scenarios};

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let lp: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(4);
    let base = match Config::parse(&args.iter().skip(1).cloned().collect::<Vec<_>>().join(",")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bad configuration: {e}");
            std::process::exit(2);
        }
    };
    let turns = turns::compare(&base, &TurnSpec::vgpu_bench(lp));
    let results = match compare(&base, &scenarios::inference_and_training(lp)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simulation failed: {e}");
            std::process::exit(1);
        }
    };
    let alone = results.iter().find(|r| r.mode == Mode::Exclusive).cloned();
    println!(
        "| mode | requests | p50 µs (vs alone) | p99 µs (vs alone) | LP progress / HP idle | utilization | overhead | preemptions |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &results {
        let (a50, a99, idle) = alone.as_ref().map_or((1.0, 1.0, 0.0), |a| {
            (
                us(a.p50),
                us(a.p99),
                a.measured.saturating_sub(a.hp_progress).as_secs_f64(),
            )
        });
        println!(
            "| {} | {} | {:.0} ({:.2}×) | {:.0} ({:.2}×) | {:.1}% | {:.1}% | {:.2}% | {} |",
            r.mode.name(),
            r.requests,
            us(r.p50),
            us(r.p50) / a50,
            us(r.p99),
            us(r.p99) / a99,
            if idle > 0.0 {
                100.0 * r.lp_progress.as_secs_f64() / idle
            } else {
                0.0
            },
            100.0 * r.utilization,
            100.0 * r.overhead,
            r.preemptions
        );
    }
    let turns = match turns {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simulation failed: {e}");
            std::process::exit(1);
        }
    };
    println!();
    println!("As vgpud dispatches it (turns; `vgpu-bench priority` shapes, sim::turns):");
    println!();
    println!(
        "| mode | requests | p50 µs (vs alone) | p99 µs (vs alone) | LP work / HP idle | utilization | grants | switches | preemptions | HP preempted |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let alone = turns.iter().find(|r| r.mode == Mode::Exclusive).cloned();
    for r in &turns {
        let (a50, a99, idle) = alone.as_ref().map_or((1.0, 1.0, 0.0), |a| {
            (
                us(a.latency(0.5)),
                us(a.latency(0.99)),
                a.measured.saturating_sub(a.hp_work).as_secs_f64(),
            )
        });
        println!(
            "| {} | {} | {:.0} ({:.2}×) | {:.0} ({:.2}×) | {:.1}% | {:.1}% | {} | {} | {} | {} |",
            r.mode.name(),
            r.latencies.len(),
            us(r.latency(0.5)),
            us(r.latency(0.5)) / a50,
            us(r.latency(0.99)),
            us(r.latency(0.99)) / a99,
            if idle > 0.0 {
                100.0 * r.lp_work.as_secs_f64() / idle
            } else {
                0.0
            },
            100.0 * r.utilization,
            r.grants,
            r.switches,
            r.preemptions,
            r.hp_preemptions
        );
    }
}
