//! Integration tests of the `vgpu-bench` command line: numeric options out of range and bad
//! output directories are usage errors (exit 2) found before any work starts; help texts.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpu-bench"))
        .args(args)
        .output()
        .unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn out_of_range_numbers_are_usage_errors_naming_the_option() {
    for args in [
        &["ptx", "--seconds", "0"][..],
        &["ptx", "--workers", "0"],
        &["preempt", "--samples", "0"],
        &["preempt", "--workers", "100000"],
        &["overhead", "--reps", "0"],
        &["overhead", "--sys-mib", "0"],
        &["overhead", "--memory-mib", "1"],
        &["fairness", "--duration", "0"],
        &["fairness", "--vms", "0"],
        &["fairness", "--depth", "0"],
        &["fairness", "--threads", "0"],
        &["fairness", "--blocks", "0"],
        &["fairness", "--weights", "1,0"],
        &["fairness", "--kernel-us", "0"],
        &["fairness", "--ramp-ms=-1"],
        &["fairness", "--vm-memory", "0"],
        &["priority", "--lp", "0"],
        &["priority", "--duration", "0"],
        &["priority", "--kernels", "17"],
        &["priority", "--think-us=-1"],
        &["priority", "--kernel-us", "0,5"],
        &["priority", "--depth", "0"],
    ] {
        let o = bench(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
        let opt = args[1].split('=').next().unwrap();
        assert!(err(&o).contains(opt), "{args:?}: {}", err(&o));
        assert!(o.stdout.is_empty(), "{args:?}: it ran");
    }
}

#[test]
fn a_bad_request_path_choice_is_a_usage_error_naming_the_choices() {
    for v in ["fast", "adaptive:", "adaptive:1ms", "adaptive:10000001"] {
        let o = bench(&["preempt", "--backend", "cuda", "--ck-path", v]);
        assert_eq!(o.status.code(), Some(2), "{v}: {}", err(&o));
        assert!(
            err(&o).contains("--ck-path") && err(&o).contains("fixed|adaptive|adaptive:US"),
            "{v}: {}",
            err(&o)
        );
        assert!(o.stdout.is_empty(), "{v}: it ran");
    }
}

#[test]
fn a_bad_output_directory_is_refused_before_the_work() {
    let file = std::env::temp_dir().join(format!("vgpu-bench-cli-{}", std::process::id()));
    std::fs::write(&file, b"keep me\n").unwrap();
    for exp in ["ptx", "preempt", "overhead", "fairness", "priority"] {
        let o = bench(&[exp, "--out", file.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{exp}: {}", err(&o));
        assert!(err(&o).contains("--out"), "{exp}: {}", err(&o));
        assert!(o.stdout.is_empty(), "{exp}: it ran");
        let o = bench(&[exp, "--out", "/proc/vgpu-bench-cli/out"]);
        assert_eq!(o.status.code(), Some(2), "{exp}: {}", err(&o));
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me\n");
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn help_documents_every_option_of_every_subcommand() {
    for sub in [
        &["-h"][..],
        &["ptx", "-h"],
        &["preempt", "-h"],
        &["overhead", "-h"],
        &["fairness", "-h"],
        &["priority", "-h"],
        &["native-load", "-h"],
    ] {
        let o = bench(sub);
        assert_eq!(o.status.code(), Some(0));
        let help = String::from_utf8(o.stdout).unwrap();
        for line in help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
        {
            assert!(
                line.split("  ").skip(1).any(|s| !s.trim().is_empty()),
                "{sub:?}: undocumented option: {line:?}\n{help}"
            );
        }
        assert!(
            !help.contains("::") && !help.contains("CudaEngine"),
            "{sub:?}:\n{help}"
        );
    }
}

#[test]
fn native_load_runs_plain_cuda_or_says_there_is_no_driver() {
    let o = bench(&[
        "native-load",
        "--role",
        "lp",
        "--iters",
        "1000",
        "--ms",
        "50",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    match o.status.code() {
        // No GPU (CI): a clear exit code and message, nothing run.
        Some(12) => assert!(err(&o).contains("no CUDA driver"), "{}", err(&o)),
        // A GPU machine: kernels ran and were checked.
        Some(0) => assert!(
            out.contains("FAIRNESS end") && out.contains("ok=1"),
            "{out}"
        ),
        c => panic!("exit {c:?}: {out}\n{}", err(&o)),
    }
}
