//! Helpers shared by the snapshot, migration and GPU snapshot tests (tests/snapshot.rs,
//! tests/migration.rs, tests/snapshot_gpu.rs): scratch directories, VMs started with an API
//! socket, `vgpu-vmm ctl`, runs to the end, snapshot directories to tamper with, and the guests'
//! command lines. Each test binary uses a part of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmm::snapshot::state::MachineState;

pub mod standby;

pub const BIN: &str = env!("CARGO_BIN_EXE_vgpu-vmm");

/// The vgpu-vmm binary: `VGPU_VMM` if set (a test binary run on another machine, such as the
/// GPU machine, which has no build tree), else the one Cargo built.
pub fn bin() -> String {
    std::env::var("VGPU_VMM").unwrap_or_else(|_| BIN.to_string())
}
/// The guest: 30 steps of 20 ms sleeps, 4 MiB of checked memory, two vCPUs.
pub const GUEST: [&str; 8] = [
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
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("vgpu-snap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A VM running with an API socket, its console going to a file.
pub struct Vm {
    pub child: Child,
    pub socket: PathBuf,
    pub out: PathBuf,
}

impl Vm {
    pub fn start(s: &Scratch, tag: &str, args: &[&str]) -> Vm {
        let socket = s.path(&format!("{tag}.sock"));
        let out = s.path(&format!("{tag}.out"));
        let child = Command::new(bin())
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

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits (up to a minute) until `done(output)` holds.
    pub fn wait_for(&self, done: impl Fn(&str) -> bool) {
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

    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        ctl(&self.socket, args)
    }

    /// Stops the VM with SIGTERM and returns (exit code, console output).
    pub fn terminate(mut self) -> (i32, String) {
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
        let r = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0);
        let code = self.child.wait().unwrap().code().unwrap();
        (code, self.output())
    }

    /// Waits for the VM's end; returns (exit code, console output, stderr).
    pub fn finish(self) -> (i32, String, String) {
        let out = self.child.wait_with_output().unwrap();
        let text = std::fs::read_to_string(&self.out).unwrap();
        (
            out.status.code().unwrap(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

pub fn ctl(socket: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
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
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
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

pub fn restore(dir: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["--restore", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(&args)
}

pub fn reference() -> String {
    let (code, out, err) = run(&GUEST);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with("COUNT done steps=30 f=2143.976087\n"),
        "{out}"
    );
    out
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

pub fn snapshot_for_tampering(s: &Scratch) -> PathBuf {
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

pub fn copy_snapshot(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for f in ["manifest.json", "state.bin", "ram.bin", "gpu.bin"] {
        if f != "gpu.bin" || from.join(f).exists() {
            std::fs::copy(from.join(f), to.join(f)).unwrap();
        }
    }
}

pub fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut m = json(&std::fs::read_to_string(&p).unwrap());
    edit(&mut m);
    std::fs::write(&p, serde_json::to_string(&m).unwrap()).unwrap();
}

/// Rewrites the state file through the decoder, with a manifest that vouches for it.
pub fn edit_state(dir: &Path, edit: impl FnOnce(&mut MachineState)) {
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

pub fn crc32(b: &[u8]) -> u32 {
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

/// The fairness guest: three lcg_spin kernels always in flight on the virtual GPU for 800 ms of
/// guest time, each completion checked against the recurrence in the guest.
pub const FAIRNESS: [&str; 8] = [
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
pub fn fairness_snapshot(
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

/// A `vgpu-vmm --incoming` process waiting on a socket in `s`; returns it and the socket path
/// once the socket exists.
pub fn incoming(s: &Scratch) -> (Child, PathBuf) {
    incoming_with(s, &[])
}

/// As `incoming`, with more options (`--gpu host=...`).
pub fn incoming_with(s: &Scratch, extra: &[&str]) -> (Child, PathBuf) {
    let path = s.path("in.sock");
    let dest = Command::new(bin())
        .arg("--incoming")
        .arg(&path)
        .args(extra)
        .args(["--timeout", "120"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while !path.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    (dest, path)
}

/// `ctl migrate` of `vm` to `to` (pre-copy rounds when `live`); returns the answer.
pub fn migrate(vm: &Vm, to: &Path, live: bool) -> serde_json::Value {
    let mut args = vec!["migrate", to.to_str().unwrap()];
    if live {
        args.push("--live");
    }
    let (code, out, err) = vm.ctl(&args);
    assert_eq!(code, 0, "{err}");
    json(&out)
}

/// After `vm` (the fairness guest) migrated to `dest`: the source exited 0 before the guest's
/// end, and the destination finished it with `ok=1` without starting it again. Returns the
/// destination's output.
pub fn migrated_fairness_finishes(vm: Vm, dest: Child) -> String {
    let (code, before, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    assert!(!before.contains("FAIRNESS end"), "{before}");
    let out = dest.wait_with_output().unwrap();
    let after = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{after} {err}");
    fairness_resumed_ok(&after);
    after
}

/// The output of a `fairness` guest that was moved (migrated, restored) mid-run: it ended
/// with `ok=1` and did not start again.
pub fn fairness_resumed_ok(after: &str) {
    let end = after
        .lines()
        .find(|l| l.starts_with("FAIRNESS end "))
        .unwrap_or_else(|| panic!("no end line:\n{after}"));
    assert!(end.ends_with(" ok=1"), "{end}");
    assert!(!after.contains("FAIRNESS start"), "{after}");
}

/// The destination made its engine during the rounds (a standby's: had it made before) and
/// wrote every VRAM page the rounds sent into it then; after the switch-over it wrote only the
/// paused round's pages (counters from its `--stats`, against the source's report).
pub fn destination_was_ready(report: &serde_json::Value, stats: &std::path::Path, standby: bool) {
    let st = json(&std::fs::read_to_string(stats).unwrap());
    let d = &st["incoming"];
    assert_eq!(d["dest_prepared"], true, "{d}");
    let rounds = report["rounds"].as_array().unwrap();
    let early: u64 = rounds
        .iter()
        .filter(|r| r["paused"] == false)
        .map(|r| r["vram_bytes"].as_u64().unwrap() / 4096)
        .sum();
    let paused = rounds.last().unwrap()["vram_bytes"].as_u64().unwrap() / 4096;
    assert!(early > 0, "{report}");
    assert_eq!(d["dest_vram_pages_early"], early, "{d} {report}");
    assert_eq!(d["dest_vram_pages_switch"], paused, "{d} {report}");
    for key in ["dest_engine_ms", "dest_switch_ms", "dest_gpu_restore_ms"] {
        assert!(d[key].as_f64().unwrap() > 0.0, "{key}: {d}");
    }
    // A standby's engine was made before the migration: the rounds only waited for the
    // thread that writes into it to start, and the time to prepare it is reported apart.
    let prepared = d["dest_standby_prepared_ms"].as_f64();
    if standby {
        assert!(d["dest_engine_ms"].as_f64().unwrap() < 5.0, "{d}");
        assert!(prepared.unwrap() > 0.0, "{d}");
        assert_eq!(st["restore"]["standby"], true, "{st}");
    } else {
        assert_eq!(prepared, None, "{d}");
    }
    assert!(
        d["dest_switch_ms"].as_f64().unwrap() >= d["dest_gpu_restore_ms"].as_f64().unwrap(),
        "{d}"
    );
    // The source heard the destination's engine was ready before it paused the guest
    // (docs/snapshot.md, "The source waits for the destination's engine"): the time the
    // destination's line gave is the one in its own figures.
    let w = &report["dest_ready"];
    assert_eq!(w["outcome"], "prepared", "{report}");
    assert_eq!(w["before_paused_round"], true, "{report}");
    assert!(w["src_wait_dest_ready_ms"].as_f64().unwrap() >= 0.0, "{w}");
    let (src, dest) = (
        w["dest_engine_ms"].as_f64().unwrap(),
        d["dest_engine_ms"].as_f64().unwrap(),
    );
    assert!((src - dest).abs() < 0.01, "{w} {d}");
}
