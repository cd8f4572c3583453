//! A restartable `vgpud`: real VM processes share the GPU through the real daemon binary
//! (`target/<profile>/vgpud`, built by `cargo test --workspace` or `cargo build -p vgpud`); the
//! daemon is killed with SIGKILL mid-run and started again on the same socket, and every VM
//! goes on (re-registers, its kernels' results all checked by the guest) without a fault. And
//! a daemon that does not come back within `reconnect_ms` is `GPU_LOST` for the guest, as a
//! lost daemon always was.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The vgpud binary beside vgpu-vmm.
fn vgpud_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_vgpu-vmm")).with_file_name("vgpud");
    assert!(
        p.exists(),
        "{} is missing: build it first (`cargo build --release -p vgpud`; `cargo test \
         --workspace --release` does)",
        p.display()
    );
    p
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vgpu-restart-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts vgpud on `socket` (its report at `report`, written at SIGTERM) and waits until it
/// accepts connections.
fn daemon(d: &Path, socket: &Path, report: &str) -> Child {
    let log = std::fs::File::create(d.join(format!("{report}.log"))).unwrap();
    let c = Command::new(vgpud_bin())
        .arg("--socket")
        .arg(socket)
        .args(["--vram", "1G", "--sched", "policy=timeslice,slice=2ms"])
        .args(["--adopt-ms", "1000", "--log-level", "info", "--report"])
        .arg(d.join(report))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start vgpud");
    let t = Instant::now();
    while vgpud::wire::Conn::connect(socket).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "vgpud did not listen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    c
}

/// Stops a daemon with SIGTERM (it writes its report) and reads the report.
fn stop(mut c: Child, d: &Path, report: &str) -> vgpud::Report {
    // SAFETY: SIGTERM to our own child process.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    assert!(c.wait().unwrap().success());
    let text = std::fs::read_to_string(d.join(report)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A VM running the fairness guest (every kernel's output checked) through the daemon, its
/// output collected by a thread (`lines`).
struct Vm {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

fn vm(socket: &Path, name: &str, reconnect_ms: u64, guest_ms: u64) -> Vm {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .args(["--guest", "fairness", "--timeout", "300", "--cmdline"])
        .arg(format!("iters=3000 depth=2 ms={guest_ms} report_ms=100"))
        .arg("--gpu")
        .arg(format!(
            "host={},name={name},vram=16M,reconnect_ms={reconnect_ms}",
            socket.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vgpu-vmm");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let readers = [
        Box::new(out) as Box<dyn std::io::Read + Send>,
        Box::new(err) as Box<dyn std::io::Read + Send>,
    ]
    .into_iter()
    .map(|r| {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    })
    .collect();
    Vm {
        child,
        lines,
        readers,
    }
}

impl Vm {
    fn has(&self, prefix: &str) -> bool {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with(prefix) || l.contains(prefix))
    }

    /// Waits for the guest's exit; its exit code and whole output.
    fn finish(mut self) -> (i32, String) {
        let status = self.child.wait().unwrap();
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        let out = self.lines.lock().unwrap().join("\n");
        (status.code().unwrap_or(-1), out)
    }
}

fn wait_until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn eight_vms_go_on_through_a_sigkilled_and_restarted_daemon() {
    const N: usize = 8;
    let d = dir("eight");
    let socket = d.join("vgpud.sock");
    let mut first = daemon(&d, &socket, "first.json");
    let vms: Vec<Vm> = (0..N)
        .map(|i| vm(&socket, &format!("vm{i}"), 20_000, 20_000))
        .collect();
    // All of them run kernels (and check their results) before the kill.
    wait_until("every VM running kernels", Duration::from_secs(120), || {
        vms.iter().all(|v| v.has("FAIRNESS t_ms="))
    });
    let done_before: Vec<usize> = vms.iter().map(|v| v.lines.lock().unwrap().len()).collect();
    // A guest runs for `guest_ms` from its own start: one that ended before the kill (VMs
    // started far apart on a loaded host) has nothing to re-register with.
    let ended: Vec<usize> = (0..N).filter(|&i| vms[i].has("FAIRNESS end")).collect();
    assert!(
        ended.is_empty(),
        "VMs {ended:?} ended before the daemon was killed: the host started them too far apart"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Again on the same socket (the killed instance left it behind: a stale socket).
    let second = daemon(&d, &socket, "second.json");
    let t = Instant::now();
    while !vms
        .iter()
        .all(|v| v.has("re-registered with the restarted vgpud"))
    {
        if t.elapsed() > Duration::from_secs(60) {
            let missing: Vec<String> = vms
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.has("re-registered with the restarted vgpud"))
                .map(|(i, v)| {
                    let l = v.lines.lock().unwrap();
                    let tail = l[l.len().saturating_sub(8)..].join("\n    ");
                    format!("vm{i}:\n    {tail}")
                })
                .collect();
            panic!(
                "not every VM re-registered within 60 s:\n{}",
                missing.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outs: Vec<(i32, String)> = vms.into_iter().map(Vm::finish).collect();
    let r = stop(second, &d, "second.json");
    for (i, (code, out)) in outs.iter().enumerate() {
        assert_eq!(*code, 0, "vm{i}:\n{out}");
        assert!(
            out.contains("FAIRNESS end") && out.contains("ok=1"),
            "vm{i}:\n{out}"
        );
        assert!(
            !out.contains("GPU_LOST") && !out.contains("fault"),
            "vm{i}:\n{out}"
        );
        assert!(
            out.lines().count() > done_before[i],
            "vm{i} went on:\n{out}"
        );
    }
    assert!(r.restart.stale_socket);
    assert_eq!(r.restart.adopted, N as u64, "{:?}", r.restart);
    assert_eq!(r.restart.claims_refused, 0);
    assert_eq!(r.vms.len(), N);
    for v in &r.vms {
        // Each VM's work went on under the new instance.
        assert!(
            v.resumed_from.is_some() && v.gpu_ns > 0 && !v.evicted,
            "{v:?}"
        );
    }
    let ms = |ns: Option<u64>| ns.map_or(f64::NAN, |n| n as f64 / 1e6);
    println!(
        "restart: {N} VMs re-registered; listening -> first grant {:.2} ms, -> first engine run \
         {:.2} ms",
        ms(r.restart.listen_to_first_grant_ns),
        ms(r.restart.listen_to_first_run_ns)
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_daemon_that_does_not_come_back_within_reconnect_ms_is_gpu_lost() {
    let d = dir("lost");
    let socket = d.join("vgpud.sock");
    let mut daemon = daemon(&d, &socket, "only.json");
    let v = vm(&socket, "alone", 1000, 30_000);
    wait_until("the VM running kernels", Duration::from_secs(60), || {
        v.has("FAIRNESS t_ms=")
    });
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let t = Instant::now();
    let (code, out) = v.finish();
    assert_eq!(code, i32::from(guest_abi::exit_codes::GPU_FAULT), "{out}");
    assert!(out.contains("GPU_LOST"), "{out}");
    assert!(out.contains("did not come back within 1000 ms"), "{out}");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    let _ = std::fs::remove_dir_all(&d);
}
