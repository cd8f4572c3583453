//! Every `suite` workload (small size) on the sim engine: its CPU-reference check passes, and a
//! run preempted at random points and resumed from context bytes gives identical output bytes.

mod common;

use common::runner::{check, place, run};
use common::*;

fn run_all(workers: usize, preempt: bool) {
    let mut failures = Vec::new();
    let mut rng = Rng(0x5eed + workers as u64);
    let mut count = 0;
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        inst.validate().unwrap();
        let cfg = pgpu::sim::SimConfig {
            vram_size: 64 * MIB,
            workers,
            ..Default::default()
        };
        let e = pgpu::sim::SimEngine::new(cfg).unwrap();
        let p = place(&e, &inst, 0);
        let (outs, _) = match run(&e, &p, &inst, || None) {
            Ok(r) => r,
            Err(err) => {
                failures.push(format!("{}: {err}", w.name));
                continue;
            }
        };
        if let Err(err) = check(&inst, &outs) {
            failures.push(format!("{}: {err}", w.name));
            continue;
        }
        count += 1;
        if !preempt {
            continue;
        }
        // Same instance again, in a second space, preempted every 1..=max warp-instructions.
        let approx = inst.approx_thread_instrs / 32;
        let max = (approx / 8).clamp(2, 5000);
        let p2 = place(&e, &inst, 32 * MIB);
        match run(&e, &p2, &inst, || Some(1 + rng.below(max))) {
            Ok((outs2, n)) => {
                if let Err(err) = check(&inst, &outs2) {
                    failures.push(format!("{} (preempted): {err}", w.name));
                } else if w.name != "spin" && outs2 != outs {
                    failures.push(format!("{}: preempted run differs", w.name));
                } else if n == 0 {
                    failures.push(format!("{}: never preempted", w.name));
                }
            }
            Err(err) => failures.push(format!("{} (preempted): {err}", w.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(count, suite::all().count());
}

#[test]
fn every_workload_passes_its_check_one_worker() {
    run_all(1, false);
}

#[test]
fn every_workload_passes_its_check_two_workers() {
    run_all(2, false);
}

#[test]
fn preempted_and_resumed_runs_give_identical_bytes() {
    run_all(1, true);
}

#[test]
fn preempted_with_workers_gives_identical_bytes() {
    run_all(3, true);
}

/// `Size::Xl` launches nine workloads' kernels several times in a row: at the small size with
/// three launches, each one's expected outputs (those of three runs: in-place and atomic
/// kernels accumulate) match what the sim engine computes, and differ from one run's where the
/// kernel accumulates (so the test would catch a missing adjustment).
#[test]
fn repeated_launches_match_their_references() {
    use suite::Size::Small;
    type Build = fn(suite::Size, u32) -> suite::Instance;
    let repeated: [(&str, Build); 9] = [
        ("vecadd", suite::hand::vecadd::instance_repeated),
        ("saxpy", suite::hand::saxpy::instance_repeated),
        ("matmul", suite::hand::matmul::instance_repeated),
        ("reduction", suite::hand::reduction::instance_repeated),
        ("warp_reduce", suite::nvcc::warp_reduce::instance_repeated),
        ("histogram", suite::nvcc::histogram::instance_repeated),
        ("vote", suite::nvcc::vote::instance_repeated),
        ("scan", suite::nvcc::scan::instance_repeated),
        ("convert", suite::nvcc::convert::instance_repeated),
    ];
    let mut failures = Vec::new();
    for (name, build) in repeated {
        let inst = build(Small, 3);
        assert_eq!(inst.launches.len(), 3, "{name}");
        assert_eq!(inst.launches[0], inst.launches[2], "{name}");
        inst.validate().unwrap();
        let e = pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 64 * MIB,
            workers: 2,
            ..Default::default()
        })
        .unwrap();
        let p = place(&e, &inst, 0);
        match run(&e, &p, &inst, || None) {
            Ok((outs, _)) => {
                if let Err(err) = check(&inst, &outs) {
                    failures.push(format!("{name}: {err}"));
                }
                let once = build(Small, 1);
                let accumulates = matches!(name, "saxpy" | "reduction" | "histogram");
                if accumulates == check(&once, &outs).is_ok() {
                    failures.push(format!("{name}: three runs and one check alike"));
                }
            }
            Err(err) => failures.push(format!("{name}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
