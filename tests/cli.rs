//! Integration tests of the `vgpu-vmm` command line: what a new user meets first (option
//! validation and exit codes, output paths checked before the VM runs, help texts, the guest
//! list, console prefixes, logging of guest-caused GPU faults).

use std::process::{Command, Stdio};

fn vmm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"));
    c.stdin(Stdio::null()).env_remove("RUST_LOG");
    c
}

/// Runs vgpu-vmm with `args` (and a safety timeout) and returns (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = vmm()
        .args(args)
        .args(["--timeout", "60"])
        .output()
        .expect("run vgpu-vmm");
    (
        out.status.code().expect("vgpu-vmm exited by a signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vgpu-cli-{}-{name}", std::process::id()))
}

#[test]
fn unknown_log_levels_are_usage_errors() {
    let (code, out, err) = run(&["--guest", "hello", "--log-level", "loud"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--log-level") && err.contains("warn"), "{err}");
    assert!(!out.contains("hello"), "the guest must not run:\n{out}");
    let (code, out, err) = run(&["--guest", "hello", "--log-level", "off"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("hello"));
}

#[test]
fn out_of_range_numbers_are_usage_errors_naming_the_option_and_range() {
    for (opt, value, range) in [
        ("--cpus", "0", "1..=255"),
        ("--cpus", "1000", "1..=255"),
        ("--memory", "0", "2..=1048576"),
        ("--memory", "1", "2..=1048576"),
        ("--timeout", "0", "0.001"),
        ("--copy-nice", "20", "0..=19"),
        ("--copy-threads", "0", "1..=1024"),
    ] {
        let out = vmm()
            .args(["--guest", "hello", opt, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opt} {value}: {err}");
        assert!(
            err.contains(opt) && err.contains(range),
            "{opt} {value}: {err}"
        );
        assert!(out.stdout.is_empty(), "{opt} {value}: the guest ran");
    }
}

#[test]
fn stats_paths_are_checked_before_the_vm_runs() {
    let (code, out, err) = run(&["--guest", "hello", "--stats", "/nonexistent/dir/x.json"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--stats") && err.contains("/nonexistent/dir/x.json"),
        "{err}"
    );
    assert!(!out.contains("hello"), "the guest must not run:\n{out}");
    let dir = tmp("stats-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let (code, out, err) = run(&["--guest", "hello", "--stats", dir.to_str().unwrap()]);
    std::fs::remove_dir(&dir).unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(!out.contains("hello"), "{out}");
    // A failed set-up leaves no stats file behind that the run created.
    let path = tmp("stats-setup.json");
    let (code, _, err) = run(&[
        "--guest",
        "no-such-guest",
        "--stats",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(!path.exists());
}

#[test]
fn list_guests_describes_each_guest() {
    let out = vmm().arg("--list-guests").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = guest_images::names().collect();
    assert_eq!(text.lines().count(), names.len(), "{text}");
    for (line, name) in text.lines().zip(&names) {
        let rest = line.strip_prefix(name).unwrap_or_else(|| panic!("{line}"));
        assert!(
            rest.trim().len() > 10,
            "no description for {name}: {line:?}"
        );
    }
}

/// Every option of `-h` has a description, and none names crate internals.
pub fn assert_help_documents_every_option(help: &str) {
    let mut options = 0;
    for line in help.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') {
            continue;
        }
        options += 1;
        let described = t.split("  ").skip(1).any(|s| !s.trim().is_empty());
        assert!(described, "undocumented option: {line:?}\n{help}");
    }
    assert!(options > 3, "{help}");
    assert!(!help.contains("::"), "internal name in help:\n{help}");
}

/// `--copy-threads` and `--copy-nice`: the copy pool's threads are there from the start,
/// named, as many as asked, that many nice steps below the vCPU thread (the VMM's level).
#[test]
fn copy_threads_run_as_many_and_as_nice_as_asked() {
    let mut child = vmm()
        .args(["--guest", "idle", "--copy-threads", "3", "--copy-nice", "7"])
        .args(["--timeout", "30"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let tasks = format!("/proc/{}/task", child.id());
    let nice_of = |name: &str| -> Vec<i64> {
        let mut v = Vec::new();
        for t in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis: state is field 3, nice 19.
            let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let nice = after
                .split_whitespace()
                .nth(16)
                .and_then(|n| n.parse().ok());
            if comm.trim().starts_with(name)
                && let Some(n) = nice
            {
                v.push(n);
            }
        }
        v
    };
    // Relative to the VMM's own level (the test may run niced). A copy thread exists a moment
    // before its start handler lowers it: looked at until right, or for 20 s.
    let t0 = std::time::Instant::now();
    let (copy, vcpu, want) = loop {
        let (copy, vcpu) = (nice_of("vgpu-copy-"), nice_of("vcpu"));
        let want = vcpu.first().map(|v| (v + 7).min(19));
        let right = want.is_some_and(|w| copy == vec![w; 3]);
        if right || t0.elapsed() > std::time::Duration::from_secs(20) {
            break (copy, vcpu, want);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(vcpu.len(), 1, "one vCPU thread");
    assert_eq!(
        Some(copy),
        want.map(|w| vec![w; 3]),
        "the copy threads, vCPU at {vcpu:?}"
    );
}

#[test]
fn help_documents_every_option() {
    let out = vmm().arg("-h").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_help_documents_every_option(&String::from_utf8(out.stdout).unwrap());
}

#[test]
fn console_prefix_marks_every_line_of_guest_output() {
    let (code, out, err) = run(&["--guest", "hello", "--console-prefix", "[vm-a] "]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() > 3, "{out}");
    for line in out.lines() {
        assert!(line.starts_with("[vm-a] "), "{line:?} in\n{out}");
    }
    assert!(out.contains("[vm-a] hello"), "{out}");
    // Without the option, no prefix.
    let (_, out, _) = run(&["--guest", "hello"]);
    assert!(out.lines().any(|l| l.starts_with("hello")), "{out}");
}

#[test]
fn vram_beyond_a_gib_works_and_too_much_is_refused_up_front() {
    let (code, out, err) = run(&["--guest", "workloads", "--gpu", "vram=2G"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(out.matches(" ok=1").count(), 13, "{out}");
    for too_big in ["vram=8G", "vram=64G"] {
        let (code, out, err) = run(&["--guest", "workloads", "--gpu", too_big]);
        assert_eq!(code, 2, "{out}\n{err}");
        assert!(err.contains("vram") && err.contains("4096M"), "{err}");
        assert!(out.is_empty(), "{out}");
    }
}

#[test]
fn guest_failures_never_use_the_vmm_codes() {
    let (code, out, _) = run(&["--guest", "workloads", "--cmdline", "size=huge", "--gpu"]);
    assert_eq!(code, 11, "{out}");
    let (code, out, _) = run(&["--guest", "workloads"]);
    assert_eq!(code, 12, "{out}");
    let (code, out, _) = run(&["--guest", "exits"]);
    assert_eq!(code, 12, "{out}");
}

#[test]
fn large_workloads_say_what_they_need_and_pass_with_it() {
    let (code, out, _) = run(&["--guest", "workloads", "--gpu", "--cmdline", "size=large"]);
    assert_eq!(code, 11, "{out}");
    assert!(out.contains("size=large needs --memory 512"), "{out}");
    assert!(!out.contains("RESULT"), "{out}");
    let (code, out, err) = run(&[
        "--guest",
        "workloads",
        "--gpu",
        "--memory",
        "512",
        "--cmdline",
        "size=large",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(out.matches(" ok=1").count(), 13, "{out}");
}

#[test]
fn attack_faults_are_counted_and_not_warnings() {
    let path = tmp("attack.json");
    let (code, out, err) = run(&[
        "--guest",
        "attack",
        "--gpu",
        "--stats",
        path.to_str().unwrap(),
    ]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        !err.contains("WARN"),
        "guest-caused faults logged as warnings:\n{err}"
    );
    let counters = &json["gpu"]["counters"];
    let by_kind = counters["faults_by_kind"]
        .as_object()
        .expect("faults_by_kind");
    let sum: u64 = by_kind.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(sum, counters["faults"].as_u64().unwrap(), "{counters}");
    for kind in [
        "unmapped",
        "bad_channel",
        "bad_method",
        "ptx_error",
        "timeout",
    ] {
        assert!(
            by_kind[kind].as_u64().unwrap_or(0) > 0,
            "{kind}: {counters}"
        );
    }
}
