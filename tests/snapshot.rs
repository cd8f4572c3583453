//! Pause, resume, snapshot and restore of real VMs through the control API (`--api-socket`,
//! `vgpu-vmm ctl`, `--restore`): a guest snapshotted at several moments and restored after
//! its original was stopped prints exactly what an uninterrupted run prints and exits the
//! same way; pausing keeps a guest correct; output-directory rules; hostile snapshot files
//! refused before the guest runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmm::snapshot::state::MachineState;

const BIN: &str = env!("CARGO_BIN_EXE_vgpu-vmm");
/// The guest: 30 steps of 20 ms sleeps, 4 MiB of checked memory, two vCPUs.
const GUEST: [&str; 8] = [
    "--guest",
    "count",
    "--cmdline",
    "steps=30 ms=20",
    "--cpus",
    "2",
    "--memory",
    "64",
];

/// A scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("vgpu-snap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A VM running with an API socket, its console going to a file.
struct Vm {
    child: Child,
    socket: PathBuf,
    out: PathBuf,
}

impl Vm {
    fn start(s: &Scratch, tag: &str, args: &[&str]) -> Vm {
        let socket = s.path(&format!("{tag}.sock"));
        let out = s.path(&format!("{tag}.out"));
        let child = Command::new(BIN)
            .args(args)
            .arg("--api-socket")
            .arg(&socket)
            .args(["--timeout", "120"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let vm = Vm { child, socket, out };
        vm.wait_for(|_| vm.socket.exists());
        vm
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits (up to a minute) until `done(output)` holds.
    fn wait_for(&self, done: impl Fn(&str) -> bool) {
        let start = Instant::now();
        while !done(&self.output()) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "waited too long; output so far:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        ctl(&self.socket, args)
    }

    /// Stops the VM with SIGTERM and returns (exit code, console output).
    fn terminate(mut self) -> (i32, String) {
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        let r = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0);
        let code = self.child.wait().unwrap().code().unwrap();
        (code, self.output())
    }

    /// Waits for the VM's end; returns (exit code, console output, stderr).
    fn finish(self) -> (i32, String, String) {
        let out = self.child.wait_with_output().unwrap();
        let text = std::fs::read_to_string(&self.out).unwrap();
        (
            out.status.code().unwrap(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn ctl(socket: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs vgpu-vmm to its end; returns (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .args(["--timeout", "120"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn restore(dir: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["--restore", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(&args)
}

fn reference() -> String {
    let (code, out, err) = run(&GUEST);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with("COUNT done steps=30 f=2143.976087\n"),
        "{out}"
    );
    out
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

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
    let names: Vec<_> = st.pci.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["host-bridge", "testdev"]);
    assert!(st.testdev.is_some());
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
fn snapshot_for_tampering(s: &Scratch) -> PathBuf {
    let vm = Vm::start(s, "t", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=4 "));
    let dir = s.path("good");
    assert_eq!(
        vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]).0,
        0
    );
    vm.terminate();
    dir
}

fn copy_snapshot(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for f in ["manifest.json", "state.bin", "ram.bin", "gpu.bin"] {
        if f != "gpu.bin" || from.join(f).exists() {
            std::fs::copy(from.join(f), to.join(f)).unwrap();
        }
    }
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut m = json(&std::fs::read_to_string(&p).unwrap());
    edit(&mut m);
    std::fs::write(&p, serde_json::to_string(&m).unwrap()).unwrap();
}

/// Rewrites the state file through the decoder, with a manifest that vouches for it.
fn edit_state(dir: &Path, edit: impl FnOnce(&mut MachineState)) {
    let p = dir.join("state.bin");
    let mut st = MachineState::decode(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut st);
    let bytes = st.encode();
    std::fs::write(&p, &bytes).unwrap();
    edit_manifest(dir, |m| {
        m["state_bytes"] = bytes.len().into();
        m["state_crc32"] = crc32(&bytes).into();
    });
}

fn crc32(b: &[u8]) -> u32 {
    // The IEEE CRC-32 (what the format uses), bit by bit.
    let mut c = !0u32;
    for &x in b {
        c ^= u32::from(x);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

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
            Box::new(|d| edit_manifest(d, |m| m["version"] = 2.into())),
            "format version 2",
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
                    let mut f = st.pci.functions[0].clone();
                    f.devfn = 8;
                    f.name = "testdev".into();
                    st.pci.functions.push(f);
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
fn migration_moves_the_vm_to_an_incoming_process() {
    for live in [false, true] {
        migrate_once(live);
    }
}

/// Migrates the guest at step 8, stop-and-copy or live (pre-copy rounds while it runs).
fn migrate_once(live: bool) {
    let want = reference();
    let s = Scratch::new(if live { "migrate-live" } else { "migrate" });
    let incoming = s.path("in.sock");
    let dest = Command::new(BIN)
        .arg("--incoming")
        .arg(&incoming)
        .args(["--timeout", "120"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let vm = Vm::start(&s, "src", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=8 "));
    while !incoming.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut args = vec!["migrate", incoming.to_str().unwrap()];
    if live {
        args.push("--live");
    }
    let (code, out, err) = vm.ctl(&args);
    assert_eq!(code, 0, "{err}");
    let done = json(&out);
    assert!(done["ram_pages"].as_u64().unwrap() > 0, "{out}");
    let rounds = done["rounds"].as_array().unwrap();
    if live {
        // The first pass sent the guest's 4 MiB buffer (and more) while it ran.
        assert!(rounds.len() >= 2, "{out}");
        assert!(rounds[0].as_u64().unwrap() >= 1024, "{out}");
    } else {
        assert!(rounds.is_empty(), "{out}");
    }
    // The source ends by itself (exit 0), the destination finishes the guest.
    let (code, before, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    let out = dest.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let after = String::from_utf8(out.stdout).unwrap();
    assert_eq!(format!("{before}{after}"), want);
    assert!(!incoming.exists(), "the incoming socket is removed");
}

#[test]
fn failed_migrations_leave_the_vm_running_here() {
    let want = reference();
    let s = Scratch::new("migrate-fail");
    let vm = Vm::start(&s, "src", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=3 "));
    // Nobody at the destination: refused before the VM is paused.
    let (code, _, err) = vm.ctl(&["migrate", s.path("nobody.sock").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("connect"), "{err}");
    // A destination that reads the whole stream and refuses the VM.
    let fake = s.path("fake.sock");
    let listener = std::os::unix::net::UnixListener::bind(&fake).unwrap();
    let t = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut c, _) = listener.accept().unwrap();
        // Frames (u32 kind, u64 length, payload) up to the end frame (kind 4).
        let mut total = 0;
        loop {
            let mut h = [0u8; 12];
            c.read_exact(&mut h).unwrap();
            let kind = u32::from_le_bytes(h[..4].try_into().unwrap());
            let len = u64::from_le_bytes(h[4..].try_into().unwrap());
            let mut payload = vec![0u8; len as usize];
            c.read_exact(&mut payload).unwrap();
            total += 12 + payload.len();
            if kind == 4 {
                break;
            }
        }
        c.write_all(b"error: no room here\n").unwrap();
        total
    });
    let (code, _, err) = vm.ctl(&["migrate", fake.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("no room here"), "{err}");
    assert!(
        t.join().unwrap() > 4 << 20,
        "the stream held the guest's 4 MiB buffer"
    );
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let (code, out, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, want);
}

#[test]
fn an_incoming_vm_refuses_a_bad_stream() {
    use std::io::{Read, Write};
    let s = Scratch::new("incoming-bad");
    let incoming = s.path("in.sock");
    let dest = Command::new(BIN)
        .arg("--incoming")
        .arg(&incoming)
        .args(["--timeout", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while !incoming.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut c = std::os::unix::net::UnixStream::connect(&incoming).unwrap();
    // A manifest frame claiming 1 TiB.
    c.write_all(&1u32.to_le_bytes()).unwrap();
    c.write_all(&(1u64 << 40).to_le_bytes()).unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("error: ") && answer.contains("manifest"),
        "{answer}"
    );
    let out = dest.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 65536 accepted"), "{err}");
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

/// The fairness guest: three lcg_spin kernels always in flight on the virtual GPU for 800 ms of
/// guest time, each completion checked against the recurrence in the guest.
const FAIRNESS: [&str; 8] = [
    "--guest",
    "fairness",
    "--memory",
    "64",
    "--cmdline",
    "iters=20000 threads=64 blocks=2 depth=3 ms=800 report_ms=100",
    "--gpu",
    "vram=64M",
];

/// Starts the fairness guest and snapshots it (left paused; `extra` ctl options) after its
/// `progress`th report; returns the snapshot's directory and answer.
fn fairness_snapshot(
    s: &Scratch,
    tag: &str,
    progress: usize,
    extra: &[&str],
) -> (PathBuf, serde_json::Value) {
    let vm = Vm::start(s, tag, &FAIRNESS);
    vm.wait_for(|o| o.matches("FAIRNESS t_ms=").count() >= progress);
    let dir = s.path(&format!("{tag}.snap"));
    let mut args = vec!["snapshot", dir.to_str().unwrap(), "--paused"];
    args.extend_from_slice(extra);
    let (code, out, err) = vm.ctl(&args);
    assert_eq!(code, 0, "{err}");
    let done = json(&out);
    let (code, before) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
    assert!(!before.contains("FAIRNESS end"), "{before}");
    (dir, done)
}

#[test]
fn gpu_vms_snapshotted_while_kernels_run_finish_after_restore() {
    let s = Scratch::new("gpu-fair");
    let mut preempted = 0;
    for (progress, extra) in [(1, &[][..]), (4, &[][..]), (2, &["--drain"][..])] {
        let drain = !extra.is_empty();
        let (dir, done) = fairness_snapshot(&s, &format!("f{progress}"), progress, extra);
        assert_eq!(done["state"], "paused");
        let gpu_bytes = done["gpu_bytes"].as_u64().unwrap();
        assert!(gpu_bytes > 0, "{done}");
        assert_eq!(
            std::fs::metadata(dir.join("gpu.bin")).unwrap().len(),
            gpu_bytes
        );
        let m = json(&std::fs::read_to_string(dir.join("manifest.json")).unwrap());
        assert_eq!(m["gpu_bytes"], gpu_bytes);
        let spec = m["gpu"].as_str().unwrap();
        assert!(
            spec.contains("mode=full") && spec.contains("vram=65536K"),
            "{spec}"
        );
        if drain {
            // Drained: the running kernels finished first, no engine context is saved.
            assert_eq!(done["gpu_preempted"], 0, "{done}");
        } else {
            preempted += done["gpu_preempted"].as_u64().unwrap();
        }
        let (code, after, err) = restore(&dir, &[]);
        assert_eq!(code, 0, "progress {progress}: {err}\n{after}");
        let end = after
            .lines()
            .find(|l| l.starts_with("FAIRNESS end "))
            .unwrap_or_else(|| panic!("no end line:\n{after}"));
        assert!(end.ends_with(" ok=1"), "{end}");
        assert!(
            !after.contains("FAIRNESS start"),
            "resumed, not rebooted: {after}"
        );
    }
    // With three kernels always queued, the pauses caught kernels mid-run: their contexts
    // went into gpu.bin and resumed after the restore.
    assert!(preempted >= 1, "no snapshot caught a running kernel");
}

#[test]
fn a_restored_gpu_vm_snapshots_again() {
    let s = Scratch::new("gpu-again");
    // The fairness guest's clock (the TSC) is seen to run on between a snapshot and its
    // restore on the development host (docs/snapshot.md, "PVM"), so this chain gives the
    // guest 1.5 s to be still running at its second snapshot.
    let mut args = FAIRNESS;
    args[5] = "iters=20000 threads=64 blocks=2 depth=3 ms=1500 report_ms=100";
    let vm = Vm::start(&s, "first", &args);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let first = s.path("first.snap");
    let (code, _, err) = vm.ctl(&["snapshot", first.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    vm.terminate();
    // Restored (RAM a file mapping, the GPU restored), then snapshotted again.
    let vm = Vm::start(&s, "again", &["--restore", first.to_str().unwrap()]);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let second = s.path("again.snap");
    let (code, _, err) = vm.ctl(&["snapshot", second.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    let (_, before) = vm.terminate();
    assert!(!before.contains("FAIRNESS end"), "{before}");
    let (code, after, err) = restore(&second, &[]);
    assert_eq!(code, 0, "{err}\n{after}");
    assert!(after.contains(" ok=1\n"), "{after}");
}

/// `RESULT name=X ok=Y` of every workload, in order (timings left out).
fn workload_results(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("RESULT "))
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn gpu_workloads_snapshotted_at_two_moments_verify_like_an_uninterrupted_run() {
    let guest = [
        "--guest",
        "workloads",
        "--cmdline",
        "size=medium",
        "--gpu",
        "vram=64M",
    ];
    let (code, want, err) = run(&guest);
    assert_eq!(code, 0, "{err}");
    let want = workload_results(&want);
    assert_eq!(want.len(), 13, "{want:?}");
    assert!(want.iter().all(|r| r.ends_with("ok=1")), "{want:?}");
    let s = Scratch::new("gpu-workloads");
    for (i, marker) in ["INIT ", "name=matmul "].into_iter().enumerate() {
        let vm = Vm::start(&s, &format!("w{i}"), &guest);
        vm.wait_for(|o| o.contains(marker));
        let dir = s.path(&format!("w{i}.snap"));
        let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
        assert_eq!(code, 0, "{err}");
        let (_, before) = vm.terminate();
        assert!(
            !before.contains("13/13"),
            "snapshot before the end: {before}"
        );
        let (code, after, err) = restore(&dir, &[]);
        assert_eq!(code, 0, "{marker}: {err}\n{after}");
        assert!(after.contains("workloads: 13/13 ok"), "{after}");
        assert_eq!(
            workload_results(&format!("{before}{after}")),
            want,
            "snapshot at {marker}"
        );
    }
}

#[test]
fn corrupted_or_mismatched_gpu_images_are_refused_before_the_guest_runs() {
    let s = Scratch::new("gpu-bad");
    let (good, _) = fairness_snapshot(&s, "b", 1, &[]);
    let gpu_len = std::fs::metadata(good.join("gpu.bin")).unwrap().len() as usize;
    let refused =
        |name: &str, extra: &[&str], want_code: i32, tamper: &dyn Fn(&Path), want: &str| {
            let dir = s.path(name);
            copy_snapshot(&good, &dir);
            tamper(&dir);
            let (code, out, err) = restore(&dir, extra);
            assert_eq!(code, want_code, "{name}: {err}");
            assert!(err.contains(want), "{name}: {err}");
            assert!(out.is_empty(), "{name}: the guest must not run: {out}");
        };
    let flip = |dir: &Path, at: usize| {
        let p = dir.join("gpu.bin");
        let mut b = std::fs::read(&p).unwrap();
        b[at] ^= 0x40;
        std::fs::write(&p, b).unwrap();
    };
    // A flipped byte: the manifest's CRC-32 catches it.
    refused(
        "flip",
        &[],
        1,
        &|d| flip(d, gpu_len / 2),
        "gpu.bin is corrupted",
    );
    // ... and with the CRC-32 forged to match, the image's own checksum.
    refused(
        "forged",
        &[],
        1,
        &|d| {
            flip(d, gpu_len / 2);
            let crc = crc32(&std::fs::read(d.join("gpu.bin")).unwrap());
            edit_manifest(d, |m| m["gpu_crc32"] = crc.into());
        },
        "checksum mismatch",
    );
    refused(
        "short",
        &[],
        1,
        &|d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("gpu.bin"))
                .unwrap();
            f.set_len(gpu_len as u64 - 1).unwrap();
        },
        "gpu.bin is",
    );
    refused(
        "missing",
        &[],
        1,
        &|d| std::fs::remove_file(d.join("gpu.bin")).unwrap(),
        "gpu.bin",
    );
    // Another VRAM size in the manifest than in the image.
    refused(
        "vram",
        &[],
        1,
        &|d| {
            edit_manifest(d, |m| {
                let spec = m["gpu"]
                    .as_str()
                    .unwrap()
                    .replace("vram=65536K", "vram=131072K");
                m["gpu"] = spec.into();
            })
        },
        "VRAM",
    );
    // --gpu with --restore chooses the backend only.
    refused(
        "override",
        &["--gpu", "vram=128M"],
        2,
        &|_| {},
        "only choose the backend",
    );
    // The untouched copy restores.
    let (code, out, err) = restore(&good, &["--gpu", "backend=sim"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("FAIRNESS end"), "{out}");
}

#[test]
fn para_gpus_refuse_snapshots_and_migration_and_run_on() {
    let s = Scratch::new("gpu");
    let vm = Vm::start(&s, "p", &["--guest", "idle", "--gpu", "mode=para"]);
    vm.wait_for(|o| o.contains("idle: halting"));
    let dir = s.path("snap");
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("virtual GPU") && err.contains("mode=para"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing left behind");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    // Migration: the destination gets nothing it could run (its connection just closes).
    let incoming = s.path("in.sock");
    let listener = std::os::unix::net::UnixListener::bind(&incoming).unwrap();
    let (code, _, err) = vm.ctl(&["migrate", incoming.to_str().unwrap()]);
    drop(listener);
    assert_eq!(code, 1);
    assert!(
        err.contains("virtual GPU") && err.contains("mode=para"),
        "{err}"
    );
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let (code, _) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);

    // A full-mode GPU: pause and resume work; a snapshot left paused resumes with its GPU.
    let vm = Vm::start(&s, "g", &["--guest", "idle", "--gpu"]);
    vm.wait_for(|o| o.contains("idle: halting"));
    assert_eq!(vm.ctl(&["pause"]).0, 0);
    assert_eq!(vm.ctl(&["resume"]).0, 0);
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "paused");
    assert_eq!(vm.ctl(&["resume"]).0, 0);
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let (code, _) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
}

#[test]
fn gpu_vms_migrate_while_kernels_run() {
    for live in [false, true] {
        let s = Scratch::new(if live { "gpu-mig-live" } else { "gpu-mig" });
        let incoming = s.path("in.sock");
        let dest = Command::new(BIN)
            .arg("--incoming")
            .arg(&incoming)
            .args(["--timeout", "120"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let vm = Vm::start(&s, "src", &FAIRNESS);
        vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
        while !incoming.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut args = vec!["migrate", incoming.to_str().unwrap()];
        if live {
            args.push("--live");
        }
        let (code, out, err) = vm.ctl(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(json(&out)["rounds"].as_array().unwrap().is_empty(), !live);
        let (code, before, err) = vm.finish();
        assert_eq!(code, 0, "{err}");
        assert!(!before.contains("FAIRNESS end"), "{before}");
        let out = dest.wait_with_output().unwrap();
        let after = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "live {live}: {after} {err}");
        let end = after
            .lines()
            .find(|l| l.starts_with("FAIRNESS end "))
            .unwrap_or_else(|| panic!("no end line:\n{after}"));
        assert!(end.ends_with(" ok=1"), "{end}");
        assert!(!after.contains("FAIRNESS start"), "{after}");
    }
}
