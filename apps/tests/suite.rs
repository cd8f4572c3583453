//! The project's CUDA application suite (apps/*.cu, built by apps/build.sh with NVIDIA's pinned
//! nvcc 13.0 and its default flags: compressed PTX for compute_80 and compute_90, `-cudart
//! shared`), every program run unmodified at its `small` size in-process on the software GPU:
//! `LD_LIBRARY_PATH=target/release`, where `cargo build --release` leaves the project's
//! `libcudart.so.13` and `libcuda.so.1`. Each program must exit 0 and print its PASS verdict
//! line (it checked its results against its CPU reference); run again with APPS_TAMPER=1 (one
//! value of its GPU result corrupted before the check) each must print FAIL and exit 1.
//!
//! Skipped, with the reason printed, only when the CUDA toolchain cannot be installed (apps/
//! build.sh exits 3: no python3 venv, no network to PyPI). A program that does not compile, a
//! missing library, a wrong result, a crash or a hang (bounded per program) is a failure.

mod common;

use common::{built_suite, profile_dir};
use std::time::{Duration, Instant};

#[test]
fn every_app_passes_on_the_software_gpu() {
    let lib = profile_dir();
    let started = Instant::now();
    let Some(suite) = built_suite(&lib) else {
        return;
    };
    eprintln!("apps/build.sh: {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        suite.programs.len() >= 15,
        "only {} programs in {}",
        suite.programs.len(),
        suite.dir.display()
    );
    for so in ["libcudart.so.13", "libcuda.so.1"] {
        assert!(
            lib.join(so).exists(),
            "{} is missing: `cargo build --release` builds the project's CUDA libraries (the \
             cudart and cuda crates), which the suite runs over",
            lib.join(so).display()
        );
    }

    // Small sizes take well under a second of interpreted GPU work each; the limit allows for a
    // loaded two-core machine.
    let limit = Duration::from_secs(180);
    let mut failures = Vec::new();
    for p in &suite.programs {
        let r =
            apps::run(&suite.dir.join(p), &["small"], &[], &lib, limit).expect("start the program");
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{p} ")))
            .unwrap_or("");
        eprintln!("{p:10} {:7.2} s  exit {:?}  {line}", r.seconds, r.code);
        if !r.passed(p) {
            failures.push(format!(
                "{p}: exit {:?}{} after {:.1} s\nstdout:\n{}\nstderr:\n{}",
                r.code,
                if r.timed_out {
                    " (killed at the time limit)"
                } else {
                    ""
                },
                r.seconds,
                r.stdout,
                r.stderr
            ));
        }
    }

    // Every program's check catches a wrong result: with APPS_TAMPER=1 it corrupts one value of
    // its GPU result before comparing, and must say FAIL with exit 1.
    for p in &suite.programs {
        let r = apps::run(
            &suite.dir.join(p),
            &["small"],
            &[("APPS_TAMPER", "1")],
            &lib,
            limit,
        )
        .expect("start the program");
        let v = r.verdict(p);
        if r.code != Some(1) || v.as_ref().is_none_or(|v| v.pass) {
            failures.push(format!(
                "{p} with a corrupted result: exit {:?}, verdict {v:?} (want FAIL, exit 1)\nstderr:\n{}",
                r.code, r.stderr
            ));
        }
    }

    // A bad argument is refused with a FAIL verdict and exit 2, before any GPU work.
    let r =
        apps::run(&suite.dir.join("matmul"), &["huge"], &[], &lib, limit).expect("start matmul");
    let v = r.verdict("matmul");
    if r.code != Some(2)
        || !v
            .as_ref()
            .is_some_and(|v| !v.pass && v.reason.contains("unknown size"))
    {
        failures.push(format!("matmul huge: exit {:?}, verdict {v:?}", r.code));
    }

    assert!(
        failures.is_empty(),
        "{} of {} checks failed:\n{}",
        failures.len(),
        2 * suite.programs.len() + 1,
        failures.join("\n")
    );
}
