//! Integration tests: boot the bundled guests in real KVM VMs through the `vgpu-vmm` binary and
//! check their output, their exit codes and the VMM's own error handling.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn vmm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"));
    c.stdin(Stdio::null()).env_remove("RUST_LOG");
    c
}

/// Runs vgpu-vmm with `args` (and a safety timeout) and returns (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out: Output = vmm()
        .args(args)
        .args(["--timeout", "30"])
        .output()
        .expect("run vgpu-vmm");
    let code = out.status.code().expect("vgpu-vmm exited by a signal");
    (
        code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn hello_prints_and_lists_pci() {
    let (code, out, err) = run(&["--guest", "hello", "--cmdline", "k=v"]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("hello"), "{out}");
    assert!(out.contains("args=\"k=v\""), "{out}");
    assert!(
        out.contains("pci 00:00.0 8086:0d57 class 060000"),
        "host bridge missing:\n{out}"
    );
    assert!(out.contains("pci: 1 functions"), "{out}");
}

#[test]
fn hello_sees_the_test_device_with_its_bars() {
    let (code, out, _) = run(&[
        "--guest",
        "hello",
        "--testdev",
        "--memory",
        "64",
        "--cpus",
        "2",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pci 00:01.0 1234:7e57 class ff0000"), "{out}");
    assert!(out.contains("BAR0 mem32 0xc0000000 size 0x1000"), "{out}");
    assert!(out.contains("BAR1 io 0x1000 size 0x10"), "{out}");
    assert!(
        out.contains("BAR2 mem64 0x10000000000 size 0x4000"),
        "{out}"
    );
    assert!(out.contains("cpus=2 mem=64 MiB"), "{out}");
}

#[test]
fn guest_exit_code_is_the_vmm_exit_code() {
    for code in [0, 7, 255] {
        let (got, out, _) = run(&["--guest", "exit", "--cmdline", &format!("code={code}")]);
        assert_eq!(got, code, "{out}");
    }
}

#[test]
fn pci_emulation_checked_from_inside_the_guest() {
    let (code, out, _) = run(&["--guest", "pcitest", "--testdev"]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert_eq!(out.matches("pcitest: ok").count(), 10, "{out}");
}

#[test]
fn guest_faults_are_reported_cleanly() {
    let (code, out, _) = run(&["--guest", "fault", "--cmdline", "mode=ud"]);
    assert_eq!(code, 102, "{out}");
    assert!(out.contains("#6 (invalid opcode)"), "{out}");
    let (code, out, _) = run(&["--guest", "fault", "--cmdline", "mode=pf"]);
    assert_eq!(code, 102, "{out}");
    assert!(
        out.contains("#14 (page fault)") && out.contains("cr2=0x4000000000"),
        "{out}"
    );
    let (code, out, _) = run(&["--guest", "fault", "--cmdline", "mode=panic"]);
    assert_eq!(code, 101, "{out}");
    assert!(
        out.contains("guest panic") && out.contains("requested by the command line"),
        "{out}"
    );
}

#[test]
fn triple_fault_ends_the_vm_with_a_message() {
    let (code, _, err) = run(&["--guest", "fault", "--cmdline", "mode=triple"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("guest crashed") && err.contains("triple fault"),
        "{err}"
    );
}

#[test]
fn bad_kernels_and_names_give_clear_errors() {
    let (code, _, err) = run(&["--kernel", "/nonexistent/kernel.elf"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read kernel /nonexistent/kernel.elf"),
        "{err}"
    );
    let not_elf = std::env::temp_dir().join(format!("vgpu-not-elf-{}", std::process::id()));
    std::fs::write(&not_elf, b"#!/bin/sh\necho this is not an ELF image\n").unwrap();
    let (code, _, err) = run(&["--kernel", not_elf.to_str().unwrap()]);
    std::fs::remove_file(&not_elf).ok();
    assert_eq!(code, 1);
    assert!(err.contains("is not a loadable 64-bit ELF image"), "{err}");
    let (code, _, err) = run(&["--guest", "no-such-guest"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no bundled guest named \"no-such-guest\"") && err.contains("hello"),
        "{err}"
    );
    // Sizes out of range are usage errors (tests/cli.rs has more).
    let (code, _, err) = run(&["--guest", "hello", "--memory", "1"]);
    assert_eq!(code, 2);
    assert!(err.contains("--memory"), "{err}");
    let (code, _, _) = run(&["--guest", "hello", "--cpus", "0"]);
    assert_eq!(code, 2);
}

#[test]
fn a_bundled_image_also_boots_from_a_file() {
    let path = std::env::temp_dir().join(format!("vgpu-exit-{}.elf", std::process::id()));
    std::fs::write(&path, guest_images::get("exit").unwrap()).unwrap();
    let (code, out, _) = run(&["--kernel", path.to_str().unwrap(), "--cmdline", "code=42"]);
    std::fs::remove_file(&path).ok();
    assert_eq!(code, 42, "{out}");
}

#[test]
fn timeout_stops_a_halted_guest() {
    let t = Instant::now();
    let out = vmm()
        .args(["--guest", "idle", "--timeout", "0.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
}

#[test]
fn sigterm_and_sigint_stop_the_vm() {
    for (sig, code) in [(libc::SIGTERM, 128 + 15), (libc::SIGINT, 128 + 2)] {
        let mut child = vmm()
            .args(["--guest", "idle", "--cpus", "2", "--timeout", "30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let t = Instant::now();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "signal {sig}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn stats_count_exits_per_device() {
    let path = std::env::temp_dir().join(format!("vgpu-stats-{}.json", std::process::id()));
    let (code, out, _) = run(&[
        "--guest",
        "exits",
        "--testdev",
        "--cmdline",
        "n=500",
        "--stats",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(json["exit_code"], 0);
    let region = |bus: &str, name: &str| {
        json[bus]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"].as_str().unwrap().ends_with(name))
            .cloned()
            .unwrap()
    };
    // The guest read the id register 500 times through each BAR, plus a few during probing.
    let bar0 = region("mmio", "testdev BAR0")["reads"].as_u64().unwrap();
    let bar1 = region("pio", "testdev BAR1")["reads"].as_u64().unwrap();
    assert!((500..520).contains(&bar0), "BAR0 reads {bar0}");
    assert!((500..520).contains(&bar1), "BAR1 reads {bar1}");
    assert!(region("pio", "serial")["writes"].as_u64().unwrap() > 40);
    assert!(json["vcpus"][0]["mmio_read"].as_u64().unwrap() >= 500);
    for line in out.lines().filter(|l| l.starts_with("EXITS")) {
        let ns: u64 = line.rsplit('=').next().unwrap().parse().unwrap();
        assert!(ns > 0, "{line}");
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("EXITS")).count(),
        2,
        "{out}"
    );
}

#[test]
fn console_input_reaches_the_guest() {
    use std::io::Write;
    let mut child = vmm()
        .args(["--guest", "echo", "--timeout", "30"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // More than the UART's 64-byte receive FIFO, so the held-back path is exercised too.
    let long = "x".repeat(300);
    let mut stdin = child.stdin.take().unwrap();
    write!(stdin, "first line\n{long}\nquit\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("echo: first line\n"), "{text}");
    assert!(
        text.contains(&format!("echo: {long}\n")),
        "long line lost bytes:\n{text}"
    );
    assert!(text.contains("echo: bye"), "{text}");
}
