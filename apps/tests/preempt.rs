//! The application suite's kernels preempted and resumed under the transforming preemption
//! methods (issue 23), on the software GPU in-process: every program at its `small` size with
//! `VGPU_CUDA_PREEMPT=checkpoint` (threads polling at every point, `VGPU_CUDA_CKPT_POLL=1`, so
//! that they stop mid-kernel and save their registers and shared memory; and at the default
//! interval, where small kernels mostly stop at CTA entry) and `=auto`, with the library's test
//! knob `VGPU_CUDA_PREEMPT_TEST=SEED:N` (each launch stopped up to N times at seeded random
//! moments and resumed, every second time from the context's bytes). Each program must still pass its
//! own CPU check and print the same checksum as its unpreempted run (the interpreter is
//! deterministic with one worker), and the library's report (`VGPU_CUDA_STATS=-`) must show
//! that launches were preempted and resumed and that the engine ran them transformed (a knob or
//! a method that did nothing fails here, as does a method that corrupts a result).
//!
//! Skipped, with the reason printed, only when the CUDA toolchain cannot be installed (as
//! apps/tests/suite.rs).

mod common;

use common::{built_suite, profile_dir};
use std::time::{Duration, Instant};

/// The library's last `vgpu-cuda-stats: {json}` report in a run's output.
fn report(r: &apps::Run) -> Option<serde_json::Value> {
    let text = format!("{}\n{}", r.stdout, r.stderr);
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("vgpu-cuda-stats: ").map(|(_, j)| j))?;
    serde_json::from_str(line.trim()).ok()
}

fn n(v: &serde_json::Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0)
}

#[test]
fn every_app_passes_with_its_kernels_preempted_under_checkpoint_and_auto() {
    let lib = profile_dir();
    let started = Instant::now();
    let Some(suite) = built_suite(&lib) else {
        return;
    };
    assert!(suite.programs.len() >= 15, "{:?}", suite.programs);
    let limit = Duration::from_secs(120);
    // One interpreter worker: CTAs run in one order, so a float program's checksum is the
    // same on every run and a preempted run must reproduce its unpreempted one exactly.
    let base_env = [
        ("VGPU_CUDA_BACKEND", "sim"),
        ("VGPU_CUDA_SIM_WORKERS", "1"),
        ("VGPU_CUDA_STATS", "-"),
    ];
    let run = |p: &str, extra: &[(&str, &str)]| {
        let env: Vec<(&str, &str)> = base_env.iter().chain(extra).copied().collect();
        apps::run(&suite.dir.join(p), &["small"], &env, &lib, limit).expect("start the program")
    };
    let mut failures = Vec::new();
    let mut want = Vec::new();
    for p in &suite.programs {
        let r = run(p, &[]);
        let sum = r.verdict(p).and_then(|v| v.checksum);
        if !r.passed(p) {
            failures.push(format!("{p} unpreempted: exit {:?}\n{}", r.code, r.stdout));
        }
        want.push(sum);
    }
    for (method, poll, seed) in [
        ("checkpoint", "1", "11:4"),
        ("checkpoint", "64", "13:4"),
        ("auto", "1", "12:4"),
    ] {
        let (mut forced, mut transformed, mut engine_preemptions, mut saved) = (0, 0, 0, 0);
        for (p, want) in suite.programs.iter().zip(&want) {
            let r = run(
                p,
                &[
                    ("VGPU_CUDA_PREEMPT", method),
                    ("VGPU_CUDA_CKPT_POLL", poll),
                    ("VGPU_CUDA_PREEMPT_TEST", seed),
                ],
            );
            let j = report(&r).unwrap_or_default();
            let pre = &j["preempt"];
            let line = r
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("{p} ")))
                .unwrap_or("");
            eprintln!(
                "{method:10} poll {poll:2} {p:10} {:5.2} s  forced {:3}  transformed {:3} \
                 (restart {:3})  sliced {:3}  engine preemptions {:3}  saved threads {:4}  \
                 fallback modules {}  {line}",
                r.seconds,
                n(pre, &["forced", "preempted"]),
                n(pre, &["engine", "launches_transformed"]),
                n(pre, &["engine", "restart_launches"]),
                n(pre, &["engine", "sliced_launches"]),
                n(pre, &["engine", "preemptions"]),
                n(pre, &["engine", "saved_threads"]),
                n(pre, &["engine", "fallback_modules"]),
            );
            if !r.passed(p) {
                failures.push(format!(
                    "{p} under {method}, preempted: exit {:?}{}\nstdout:\n{}\nstderr:\n{}",
                    r.code,
                    if r.timed_out { " (time limit)" } else { "" },
                    r.stdout,
                    r.stderr
                ));
                continue;
            }
            let got = r.verdict(p).and_then(|v| v.checksum);
            if got != *want {
                failures.push(format!(
                    "{p} under {method}, preempted: checksum {got:x?}, unpreempted {want:x?}"
                ));
            }
            if pre["method"] != method {
                failures.push(format!("{p}: the library reports method {}", pre["method"]));
            }
            // The runtime's eager module loads prepared their runs under the method
            // (`VGPU_CUDA_PREPARE_MODULES`'s default): not the program's first timed launch.
            if n(pre, &["modules_prepared"]) == 0 {
                failures.push(format!("{p} under {method}: no module load prepared"));
            }
            if n(pre, &["forced", "armed"]) == 0 {
                failures.push(format!("{p} under {method}: no launch was armed"));
            }
            // A module the transformation refuses runs sliced (still preempted, by the
            // interpreter): counted, and said why.
            let refused = n(pre, &["engine", "fallback_modules"]);
            let reasons = pre["engine"]["fallback_reasons"]
                .as_array()
                .map_or(0, Vec::len);
            if refused > 0 {
                eprintln!("    refused: {}", pre["engine"]["fallback_reasons"]);
            }
            if refused as usize > reasons {
                failures.push(format!(
                    "{p} under {method}: {refused} modules refused, {reasons} reasons"
                ));
            }
            forced += n(pre, &["forced", "preempted"]);
            transformed += n(pre, &["engine", "launches_transformed"]);
            engine_preemptions += n(pre, &["engine", "preemptions"]);
            saved += n(pre, &["engine", "saved_threads"]);
        }
        eprintln!(
            "{method} poll {poll}: {forced} runs preempted and resumed, {transformed} launches \
             transformed, {engine_preemptions} preempted at checkpoints, {saved} threads saved"
        );
        // Real preemptions, of transformed kernels, happened across the suite.
        if forced < suite.programs.len() as u64 {
            failures.push(format!("{method}: only {forced} preemptions in all"));
        }
        if transformed == 0 || engine_preemptions == 0 {
            failures.push(format!(
                "{method}: {transformed} launches transformed, {engine_preemptions} of their runs preempted"
            ));
        }
        // Polling at every point, threads were stopped mid-kernel and saved their state.
        if poll == "1" && method == "checkpoint" && saved == 0 {
            failures.push(format!("{method} poll 1: no thread saved at a point"));
        }
    }

    // A method the library does not know is refused before any GPU work, not ignored.
    let r = run("matmul", &[("VGPU_CUDA_PREEMPT", "sometimes")]);
    if r.passed("matmul") || !format!("{}{}", r.stdout, r.stderr).contains("VGPU_CUDA_PREEMPT") {
        failures.push(format!(
            "VGPU_CUDA_PREEMPT=sometimes: exit {:?}\n{}\n{}",
            r.code, r.stdout, r.stderr
        ));
    }
    eprintln!("{:.1} s in all", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
