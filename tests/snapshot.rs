//! Pause, resume, snapshot and restore of real VMs through the control API (`--api-socket`,
//! `vgpu-vmm ctl`, `--restore`): a guest snapshotted at several moments and restored after
//! its original was stopped prints exactly what an uninterrupted run prints and exits the
//! same way; pausing keeps a guest correct; output-directory rules; hostile snapshot files
//! refused before the guest runs.

mod snapshot_support;

use snapshot_support::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mmio::pci::PciRoot;
use vmm::devices::testdev::TestDev;
use vmm::snapshot::state::MachineState;

#[test]
fn restored_snapshots_finish_like_an_uninterrupted_run() {
    let want = reference();
    let s = Scratch::new("moments");
    for step in [2, 13, 27] {
        let vm = Vm::start(&s, &format!("m{step}"), &GUEST);
        let marker = format!("COUNT step={step} ");
        vm.wait_for(|o| o.contains(&marker));
        let dir = s.path(&format!("snap{step}"));
        let (code, out, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
        assert_eq!(code, 0, "{err}");
        let done = json(&out);
        assert_eq!(done["state"], "paused");
        assert_eq!(done["ram_bytes"], 64 << 20);
        // The original is stopped: nothing after the snapshot may come from it.
        let (code, before) = vm.terminate();
        assert_eq!(code, 128 + libc::SIGTERM);
        assert!(
            before.contains(&marker) && !before.contains("done"),
            "{before}"
        );
        let (code, after, err) = restore(&dir, &[]);
        assert_eq!(code, 0, "step {step}: {err}");
        assert_eq!(
            format!("{before}{after}"),
            want,
            "snapshot after step {step}"
        );
    }
}

#[test]
fn a_vm_with_the_pci_test_device_restores_its_bars() {
    let mut args = GUEST.to_vec();
    args.push("--testdev");
    let (code, want, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let s = Scratch::new("testdev");
    let vm = Vm::start(&s, "t", &args);
    vm.wait_for(|o| o.contains("COUNT step=6 "));
    let dir = s.path("snap");
    assert_eq!(
        vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]).0,
        0
    );
    let (_, before) = vm.terminate();
    let m = json(&std::fs::read_to_string(dir.join("manifest.json")).unwrap());
    assert_eq!(m["testdev"], true);
    let st = MachineState::decode(&std::fs::read(dir.join("state.bin")).unwrap()).unwrap();
    let pci = st.device::<PciRoot>().unwrap().unwrap();
    let names: Vec<_> = pci.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["host-bridge", "testdev"]);
    assert!(st.device::<TestDev>().unwrap().is_some());
    let (code, after, err) = restore(&dir, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(format!("{before}{after}"), want);
}

#[test]
fn a_restored_vm_can_be_snapshotted_again() {
    let want = reference();
    let s = Scratch::new("chain");
    let vm = Vm::start(&s, "a", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=5 "));
    let first = s.path("first");
    assert_eq!(
        vm.ctl(&["snapshot", first.to_str().unwrap(), "--paused"]).0,
        0
    );
    let (_, part1) = vm.terminate();
    // The restored VM's RAM is a private file mapping: pages it never touched since the
    // restore must reach the second snapshot too.
    let args = ["--restore", first.to_str().unwrap()];
    let vm = Vm::start(&s, "b", &args);
    vm.wait_for(|o| o.contains("COUNT step=15 "));
    let second = s.path("second");
    let (code, _, err) = vm.ctl(&["snapshot", second.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    let (_, part2) = vm.terminate();
    let (code, part3, err) = restore(&second, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(format!("{part1}{part2}{part3}"), want);
}

#[test]
fn pause_and_resume_keep_the_guest_correct() {
    let want = reference();
    let s = Scratch::new("pause");
    let vm = Vm::start(&s, "p", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=3 "));
    let (code, out, err) = vm.ctl(&["pause"]);
    assert_eq!(
        (code, json(&out)["state"].as_str()),
        (0, Some("paused")),
        "{err}"
    );
    // Paused twice is refused, with exit code 1.
    let (code, _, err) = vm.ctl(&["pause"]);
    assert_eq!(code, 1);
    assert!(err.contains("already paused"), "{err}");
    // While paused the guest neither prints nor exits: counters stand still.
    let (_, a, _) = vm.ctl(&["stats"]);
    let printed = vm.output();
    std::thread::sleep(Duration::from_millis(300));
    let (code, b, _) = vm.ctl(&["stats"]);
    assert_eq!(code, 0);
    let (a, b) = (json(&a), json(&b));
    assert_eq!(b["state"], "paused");
    assert_eq!(a["vcpus"], b["vcpus"], "a paused guest made exits");
    assert_eq!(vm.output(), printed);
    // A snapshot of a paused VM leaves it paused.
    let dir = s.path("while-paused");
    let (code, out, err) = vm.ctl(&["snapshot", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["state"], "paused");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "paused");
    let (code, _, _) = vm.ctl(&["resume"]);
    assert_eq!(code, 0);
    let (code, _, err) = vm.ctl(&["resume"]);
    assert_eq!(code, 1, "resume of a running VM is refused");
    assert!(err.contains("not paused"), "{err}");
    // Several pause/resume rounds while it runs; the counters keep counting across them.
    for _ in 0..5 {
        assert_eq!(vm.ctl(&["pause"]).0, 0);
        assert_eq!(vm.ctl(&["resume"]).0, 0);
    }
    let (code, out, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, want);
    // The snapshot taken while paused restores to the same end.
    let (code, after, err) = restore(&dir, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(format!("{printed}{after}"), want);
}

#[test]
fn snapshot_directories_must_be_new_or_empty_and_are_checked_first() {
    let s = Scratch::new("dirs");
    let vm = Vm::start(&s, "d", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=2 "));
    // A directory with a user's file in it: refused, the file untouched.
    let full = s.path("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("mine.txt"), "keep me").unwrap();
    let (code, _, err) = vm.ctl(&["snapshot", full.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(
        std::fs::read_to_string(full.join("mine.txt")).unwrap(),
        "keep me"
    );
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1);
    // A file, a symbolic link to an empty directory, a directory in a missing parent.
    let file = s.path("file");
    std::fs::write(&file, "x").unwrap();
    let (code, _, err) = vm.ctl(&["snapshot", file.to_str().unwrap()]);
    assert!(code == 1 && err.contains("not a directory"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    let empty = s.path("empty");
    std::fs::create_dir(&empty).unwrap();
    let link = s.path("link");
    std::os::unix::fs::symlink(&empty, &link).unwrap();
    let (code, _, err) = vm.ctl(&["snapshot", link.to_str().unwrap()]);
    assert!(code == 1 && err.contains("symbolic link"), "{err}");
    let (code, _, err) = vm.ctl(&["snapshot", s.path("no/such").to_str().unwrap()]);
    assert!(code == 1 && err.contains("No such file"), "{err}");
    // None of that paused the VM; an existing empty directory is fine.
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let (code, _, err) = vm.ctl(&["snapshot", empty.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let mut names: Vec<_> = std::fs::read_dir(&empty)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["manifest.json", "ram.bin", "state.bin"]);
    // The RAM file is sparse: 64 MiB long, only the touched pages allocated.
    let ram = std::fs::metadata(empty.join("ram.bin")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(ram.len(), 64 << 20);
    assert!(ram.blocks() * 512 < 16 << 20, "{} blocks", ram.blocks());
    let (code, out, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("COUNT done"));
}

#[test]
fn api_socket_paths_are_checked_before_the_vm_runs() {
    let s = Scratch::new("sock");
    let file = s.path("file");
    std::fs::write(&file, "mine").unwrap();
    let (code, out, err) = run(&["--guest", "hello", "--api-socket", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--api-socket") && err.contains("not a socket"),
        "{err}"
    );
    assert!(out.is_empty(), "the guest ran: {out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    // A live socket is refused; a stale one is replaced and removed at exit.
    let live = s.path("live.sock");
    let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let (code, _, err) = run(&["--guest", "hello", "--api-socket", live.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("live socket"), "{err}");
    drop(listener);
    let (code, out, err) = run(&["--guest", "hello", "--api-socket", live.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("hello"));
    assert!(!live.exists(), "the socket is removed at exit");
    // ctl without a VM: exit 3.
    let (code, _, err) = ctl(&live, &["stats"]);
    assert_eq!(code, 3, "{err}");
}

/// A snapshot to tamper with, taken at step 4 of the guest.
#[test]
fn hostile_snapshots_are_refused_before_the_guest_runs() {
    let s = Scratch::new("hostile");
    let good = snapshot_for_tampering(&s);
    type Tamper = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Tamper, &str)> = vec![
        (
            "truncated state",
            Box::new(|d| {
                let b = std::fs::read(d.join("state.bin")).unwrap();
                std::fs::write(d.join("state.bin"), &b[..b.len() / 2]).unwrap();
            }),
            "bytes, the manifest says",
        ),
        (
            "corrupted state",
            Box::new(|d| {
                let mut b = std::fs::read(d.join("state.bin")).unwrap();
                b[100] ^= 1;
                std::fs::write(d.join("state.bin"), &b).unwrap();
            }),
            "corrupted: CRC-32",
        ),
        (
            "corrupted section, manifest fixed up",
            Box::new(|d| {
                let mut b = std::fs::read(d.join("state.bin")).unwrap();
                b[100] ^= 1;
                std::fs::write(d.join("state.bin"), &b).unwrap();
                edit_manifest(d, |m| m["state_crc32"] = crc32(&b).into());
            }),
            "is corrupted: CRC-32",
        ),
        (
            "wrong version",
            Box::new(|d| edit_manifest(d, |m| m["version"] = 99.into())),
            "format version 99",
        ),
        (
            "not a snapshot",
            Box::new(|d| edit_manifest(d, |m| m["format"] = "tarball".into())),
            "is not \"vgpu-vmm-snapshot\"",
        ),
        (
            "RAM file too small",
            Box::new(|d| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("ram.bin"))
                    .unwrap();
                f.set_len((64 << 20) - 4096).unwrap();
            }),
            "RAM file is 67104768 bytes, the manifest says 67108864",
        ),
        (
            "RAM file too large",
            Box::new(|d| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("ram.bin"))
                    .unwrap();
                f.set_len((64 << 20) + 1).unwrap();
            }),
            "the manifest says 67108864",
        ),
        (
            "absurd memory",
            Box::new(|d| {
                edit_manifest(d, |m| {
                    m["memory_mib"] = (1u64 << 40).into();
                    m["ram_bytes"] = (1u64 << 60).into();
                })
            }),
            "memory_mib 1099511627776 is outside",
        ),
        (
            "absurd state size",
            Box::new(|d| edit_manifest(d, |m| m["state_bytes"] = u64::MAX.into())),
            "more than the 67108864 accepted",
        ),
        (
            "vCPU count differs",
            Box::new(|d| edit_manifest(d, |m| m["cpus"] = 3.into())),
            "the state file has 2 vCPUs, the manifest 3",
        ),
        (
            "unknown manifest field",
            Box::new(|d| edit_manifest(d, |m| m["extra"] = 1.into())),
            "unknown field",
        ),
        (
            "MSR KVM refuses",
            Box::new(|d| {
                edit_state(d, |st| {
                    st.vcpus[1].msrs[0].index = 0x4b56_4dff;
                })
            }),
            "KVM refused MSR 0x4b564dff",
        ),
        (
            "control registers KVM refuses",
            Box::new(|d| {
                // Paging without protected mode.
                edit_state(d, |st| st.vcpus[0].sregs.cr0 = 1 << 31)
            }),
            "vCPU 0: set special registers",
        ),
        (
            "no vCPUs",
            Box::new(|d| edit_manifest(d, |m| m["cpus"] = 0.into())),
            "cpus is 0",
        ),
        (
            "PCI device that is not there",
            Box::new(|d| {
                edit_state(d, |st| {
                    let mut pci = st.device::<PciRoot>().unwrap().unwrap();
                    let mut f = pci.functions[0].clone();
                    f.devfn = 8;
                    f.name = "testdev".into();
                    pci.functions.push(f);
                    st.set_device::<PciRoot>(&pci);
                })
            }),
            "the snapshot has PCI functions",
        ),
        (
            "a virtual GPU without its image",
            Box::new(|d| edit_manifest(d, |m| m["gpu"] = "mode=full".into())),
            "gpu.bin",
        ),
        (
            "a GPU image without a virtual GPU",
            Box::new(|d| edit_manifest(d, |m| m["gpu_bytes"] = 4096.into())),
            "without a gpu",
        ),
        (
            "an unparsable GPU configuration",
            Box::new(|d| edit_manifest(d, |m| m["gpu"] = "vram=3M".into())),
            "vram=3M",
        ),
        (
            "a GPU image larger than its VRAM can need",
            Box::new(|d| {
                edit_manifest(d, |m| {
                    m["gpu"] = "vram=2M".into();
                    m["gpu_bytes"] = (1u64 << 40).into();
                })
            }),
            "more than a",
        ),
        (
            "missing RAM file",
            Box::new(|d| std::fs::remove_file(d.join("ram.bin")).unwrap()),
            "ram.bin",
        ),
    ];
    for (i, (what, tamper, expect)) in cases.iter().enumerate() {
        let dir = s.path(&format!("bad{i}"));
        copy_snapshot(&good, &dir);
        tamper(&dir);
        let (code, out, err) = restore(&dir, &[]);
        assert_eq!(code, 1, "{what}: {err}");
        eprintln!("{what}: {}", err.trim());
        assert!(err.contains(expect), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(out.is_empty(), "{what}: the guest ran: {out}");
    }
    // The untouched copy still restores.
    let (code, out, err) = restore(&good, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with("COUNT done steps=30 f=2143.976087\n"),
        "{out}"
    );
    // --restore takes everything from the snapshot.
    let (code, _, err) = restore(&good, &["--memory", "128"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--memory"), "{err}");
}

#[test]
fn ctl_help_documents_its_operations_and_exit_codes() {
    let out = Command::new(BIN).args(["ctl", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    for s in [
        "pause",
        "resume",
        "stats",
        "snapshot",
        "Exit status",
        "3 no VM answers",
    ] {
        assert!(help.contains(s), "{s}:\n{help}");
    }
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for s in ["--restore <DIR>", "--api-socket <PATH>", "ctl"] {
        assert!(help.contains(s), "{s}:\n{help}");
    }
}

#[test]
fn an_idle_api_client_does_not_hold_the_vm_at_exit() {
    let s = Scratch::new("idle-client");
    let vm = Vm::start(&s, "i", &["--guest", "count", "--cmdline", "steps=5 ms=20"]);
    let _idle = std::os::unix::net::UnixStream::connect(&vm.socket).unwrap();
    let start = Instant::now();
    let (code, out, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("COUNT done"));
    // The server's idle limit is 30 s; the VM ends with its guest.
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}
