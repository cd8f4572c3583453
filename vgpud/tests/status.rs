//! `vgpud status` against the real daemon binary with scripted VMs on its socket: per-GPU VRAM,
//! the VMs placed, shares 0 before any work and summing to 1 per GPU after, on a two-GPU sim
//! daemon; a daemon without the request refused clearly; and hostile status connections
//! (garbage, a hello after a status request, parts out of order, a flood of connections that
//! never read) that neither crash nor stall the daemon.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use vgpud::proto::{self, Hello, RunOutcome, ToDaemon, ToVm};
use vgpud::wire::{Conn, Listener, Received};
use vgpud::{Report, status};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vgpud-status-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("sock")
}

/// The daemon binary, killed when the test ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `vgpud --gpus 2` (sim: two software GPUs of 64 MiB) and waits until it answers.
fn start(socket: &Path) -> Daemon {
    let child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .arg("--socket")
        .arg(socket)
        .args([
            "--gpus",
            "2",
            "--vram",
            "64M",
            "--channels",
            "16",
            "--nice",
            "0",
        ])
        .args(["--sched", "policy=timeslice,slice=50ms,wake_preempt=false"])
        .args(["--log-level", "warn"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let t = Instant::now();
    while Conn::connect(socket).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "vgpud did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// `vgpud status --socket SOCKET`: its output, and the report it printed.
fn status_cli(socket: &Path) -> (Output, Option<Report>) {
    let o = Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .args(["status", "--socket"])
        .arg(socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let r = serde_json::from_slice(&o.stdout).ok();
    (o, r)
}

/// Waits for the next message on `conn` (fails after 2 s); `None`: closed.
fn recv(conn: &Conn) -> Option<ToVm> {
    assert!(
        conn.wait_readable_for(Some(Duration::from_secs(2)))
            .unwrap(),
        "no message within 2 s"
    );
    let mut buf = [0u8; proto::MAX_MESSAGE];
    match conn.recv(&mut buf).unwrap() {
        Received::Message(n, _) => Some(proto::decode(&buf[..n]).unwrap()),
        Received::Closed => None,
        Received::Empty => panic!("empty"),
    }
}

fn send(conn: &Conn, m: &ToDaemon) {
    conn.send(&proto::encode(m), None).unwrap();
}

/// A registered VM: its connection and id.
fn vm(socket: &Path, name: &str, weight: u32, vram_mib: u64) -> (Conn, u32) {
    let conn = Conn::connect(socket).unwrap();
    send(
        &conn,
        &ToDaemon::Hello(Hello {
            version: proto::VERSION,
            name: name.into(),
            weight,
            priority: 0,
            vram: vram_mib << 20,
            channels: 2,
            resume: None,
            gpu: None,
            word: false,
        }),
    );
    match recv(&conn) {
        Some(ToVm::Welcome { vm, .. }) => (conn, vm),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

/// One job of `gpu_ns` (the run lies inside the grant, so it counts in full).
fn job(conn: &Conn, gpu_ns: u64) {
    send(conn, &ToDaemon::Want { kernel: None });
    let seq = match recv(conn) {
        Some(ToVm::Grant { seq, .. }) => seq,
        other => panic!("expected a grant, got {other:?}"),
    };
    std::thread::sleep(Duration::from_nanos(gpu_ns) + Duration::from_millis(2));
    let end = proto::monotonic_ns();
    send(
        conn,
        &ToDaemon::Done {
            seq,
            outcome: RunOutcome::Completed,
            gpu_ns,
            start_ns: end - gpu_ns,
            end_ns: end,
            more: false,
        },
    );
}

#[test]
fn status_shows_each_gpu_its_vms_and_their_shares() {
    let socket = tmp("shares");
    let _d = start(&socket);
    let (o, r) = status_cli(&socket);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = r.expect("status prints a report");
    assert_eq!(r.gpus.len(), 2);
    assert!(r.vms.is_empty() && r.windows.is_empty());
    assert!(
        r.gpus
            .iter()
            .all(|g| g.vram == 64 << 20 && g.vram_free == 64 << 20)
    );
    // Placement: a on GPU 0, b on GPU 1, c on GPU 0 (equal free VRAM, then load).
    let (a, ia) = vm(&socket, "a", 2, 8);
    let (b, ib) = vm(&socket, "b", 1, 16);
    let (c, ic) = vm(&socket, "c", 1, 4);
    let (_, r) = status_cli(&socket);
    let r = r.unwrap();
    assert_eq!(r.gpus[0].vms, [ia, ic]);
    assert_eq!(r.gpus[1].vms, [ib]);
    assert_eq!(r.gpus[0].vram_free, (64 - 8 - 4) << 20);
    assert_eq!(r.gpus[1].vram_free, (64 - 16) << 20);
    assert_eq!((r.gpus[0].channels_used, r.gpus[1].channels_used), (4, 2));
    let names: Vec<(&str, u32, u32)> = r
        .vms
        .iter()
        .map(|v| (v.name.as_str(), v.gpu, v.weight))
        .collect();
    assert_eq!(names, [("a", 0, 2), ("b", 1, 1), ("c", 0, 1)]);
    assert!(r.vms.iter().all(|v| v.share == 0.0 && v.gone_ns.is_none()));
    assert_eq!(r.gpus[0].shares, [(ia, 0.0), (ic, 0.0)]);
    // Work: a 3 ms and c 1 ms on GPU 0, b 2 ms on GPU 1.
    job(&a, 3_000_000);
    job(&c, 1_000_000);
    job(&b, 2_000_000);
    // Past the snapshot's reuse time, and the last Done handled.
    std::thread::sleep(Duration::from_nanos(status::REUSE_MIN_NS) + Duration::from_millis(30));
    let (_, r) = status_cli(&socket);
    let r = r.unwrap();
    assert_eq!(r.gpus[0].shares, [(ia, 0.75), (ic, 0.25)]);
    assert_eq!(r.gpus[1].shares, [(ib, 1.0)]);
    for g in &r.gpus {
        let sum: f64 = g.shares.iter().map(|s| s.1).sum();
        assert!((sum - 1.0).abs() < 1e-9, "gpu {}: {sum}", g.index);
    }
    assert_eq!(
        (r.gpus[0].busy_ns, r.gpus[1].busy_ns),
        (4_000_000, 2_000_000)
    );
    assert_eq!((r.gpus[0].grants, r.gpus[1].grants, r.grants), (2, 1, 3));
    let share = |id| r.vms.iter().find(|v| v.id == id).unwrap().share;
    assert_eq!((share(ia), share(ib), share(ic)), (0.75, 1.0, 0.25));
    // The status connections were not VMs: nothing registered or refused for them.
    assert_eq!(r.vms.len(), 3);
    assert_eq!(r.refused, 0);
    // The library client reads the same.
    let (_, lib) = status::query(&socket, Duration::from_secs(2)).unwrap();
    assert_eq!(lib.vms.len(), 3);
    drop((a, b, c));
}

#[test]
fn a_daemon_without_status_and_no_daemon_are_refused_clearly() {
    // A daemon built before the request: it cannot decode it, and answers what serde says
    // of an unknown message type (here produced the same way).
    #[derive(Debug, serde::Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Old {
        Hello {},
        Bye {},
    }
    let socket = tmp("old");
    let listener = Listener::bind(&socket).unwrap();
    let old = std::thread::spawn(move || {
        let t = Instant::now();
        let conn = loop {
            if let Some(c) = listener.accept().unwrap() {
                break c;
            }
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(5));
        };
        conn.wait_readable().unwrap();
        let mut buf = [0u8; proto::MAX_MESSAGE];
        let Received::Message(n, _) = conn.recv(&mut buf).unwrap() else {
            panic!("no request")
        };
        let err = serde_json::from_slice::<Old>(&buf[..n]).unwrap_err();
        let message = format!("malformed message: {err}");
        conn.send(
            &proto::encode(&ToVm::Error {
                message,
                fatal: false,
            }),
            None,
        )
        .unwrap();
        // Kept open, as such a daemon does after a non-fatal refusal.
        std::thread::sleep(Duration::from_millis(500));
    });
    let (o, r) = status_cli(&socket);
    old.join().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(r.is_none() && o.stdout.is_empty());
    assert!(err.contains("this vgpud does not answer status"), "{err}");
    // Nobody at the socket.
    let (o, _) = status_cli(&tmp("none"));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect"));
}

#[test]
fn hostile_status_connections_neither_crash_nor_stall_the_daemon() {
    let socket = tmp("abuse");
    let mut d = start(&socket);
    let (a, ia) = vm(&socket, "a", 1, 8);
    // Idle VMs with long names: the status is several parts.
    let idle: Vec<(Conn, u32)> = (0..6)
        .map(|i| vm(&socket, &format!("{i}{}", "n".repeat(63)), 1, 2))
        .collect();
    let (_, full) = status_cli(&socket);
    assert_eq!(full.unwrap().vms.len(), 7);
    // A hello after a status request: refused, closed; the status connection never registers.
    let s = Conn::connect(&socket).unwrap();
    send(&s, &ToDaemon::Status { part: 0 });
    let hello = ToDaemon::Hello(Hello {
        version: proto::VERSION,
        name: "sneaky".into(),
        weight: 1,
        priority: 0,
        vram: 2 << 20,
        channels: 1,
        resume: None,
        gpu: None,
        word: false,
    });
    send(&s, &hello);
    match recv(&s) {
        Some(ToVm::StatusPart { part: 0, parts, .. }) => assert!(parts >= 2, "{parts}"),
        other => panic!("expected part 0, got {other:?}"),
    }
    match recv(&s) {
        Some(ToVm::Error { message, fatal }) => {
            assert!(
                fatal && message.contains("only status requests"),
                "{message}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(recv(&s).is_none(), "closed");
    // A part asked before part 0, a part past the end: refused and closed.
    for part in [1, u32::MAX] {
        let s = Conn::connect(&socket).unwrap();
        send(&s, &ToDaemon::Status { part });
        match recv(&s) {
            Some(ToVm::Error { message, fatal }) => {
                assert!(fatal && message.contains("before part 0"), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(recv(&s).is_none());
    }
    // A registered VM asking for status: refused, and it stays a working VM.
    send(&a, &ToDaemon::Status { part: 0 });
    match recv(&a) {
        Some(ToVm::Error { message, fatal }) => {
            assert!(
                !fatal && message.contains("connection of its own"),
                "{message}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    job(&a, 1_000_000);
    // Garbage and oversized datagrams on fresh connections.
    for bad in [
        &b"\xff\xfe"[..],
        b"{",
        br#"{"type":"status","part":"0"}"#,
        &[b'x'; 8192],
    ] {
        let g = Conn::connect(&socket).unwrap();
        g.send(bad, None).unwrap();
        assert!(matches!(recv(&g), Some(ToVm::Error { .. })));
    }
    // A flood: 200 status connections that ask and never read, held open.
    let flood: Vec<Conn> = (0..200)
        .map(|_| {
            let c = Conn::connect(&socket).unwrap();
            for part in 0..4 {
                // The daemon may close it first (a send into a full queue is its fault).
                let _ = c.send(&proto::encode(&ToDaemon::Status { part }), None);
            }
            c
        })
        .collect();
    // The daemon still schedules (a job round trip) and answers status promptly.
    let t = Instant::now();
    job(&a, 1_000_000);
    let (o, r) = status_cli(&socket);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let r = r.unwrap();
    assert_eq!(r.vms.len(), 7);
    assert_eq!(r.vms[0].id, ia);
    assert_eq!(r.vms[0].grants, 2);
    assert_eq!(r.vms[0].share, 1.0);
    assert!(r.refused >= 6, "{}", r.refused);
    drop((flood, idle));
    // Still alive: no crash.
    assert!(d.0.try_wait().unwrap().is_none(), "vgpud exited");
    let _ = a.as_fd().as_raw_fd();
}
