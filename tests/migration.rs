//! Migration of real VMs (`vgpu-vmm --incoming URL`, `ctl migrate URL [--live]`; unix sockets and
//! loopback TCP): the guest finishes in
//! the destination exactly as an uninterrupted run, stop-and-copy or with pre-copy rounds, GPU
//! VMs (full and para-virtual) included while their kernels run; failed migrations leave the VM running; a bad stream is
//! refused.

mod snapshot_support;

use snapshot_support::*;
use std::process::{Command, Stdio};
use std::time::Duration;

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
    let (dest, incoming) = incoming(&s);
    let vm = Vm::start(&s, "src", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=8 "));
    let done = migrate(&vm, &incoming, live);
    let out = done.to_string();
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

/// A free loopback TCP port (bound, then let go).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn migration_over_loopback_tcp_and_unix_urls() {
    let want = reference();
    let s = Scratch::new("migrate-urls");
    // tcp:HOST:PORT (loopback), live; then unix:PATH, stop-and-copy.
    let port = free_port();
    let unix = s.path("in.sock");
    for (url, live) in [
        (format!("tcp:localhost:{port}"), true),
        (format!("unix:{}", unix.display()), false),
    ] {
        let dest = Command::new(BIN)
            .args(["--incoming", &url, "--timeout", "120"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let vm = Vm::start(&s, "src", &GUEST);
        vm.wait_for(|o| o.contains("COUNT step=8 "));
        let mut args = vec!["migrate", url.as_str()];
        if live {
            args.push("--live");
        }
        // Until the destination listens, the source is refused before it pauses.
        let start = std::time::Instant::now();
        let done = loop {
            let (code, out, err) = vm.ctl(&args);
            if code == 0 {
                break json(&out);
            }
            assert!(err.contains("migrate: connect: "), "{url}: {err}");
            assert!(start.elapsed() < Duration::from_secs(60), "{err}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(done["to"], url.as_str());
        assert_eq!(done["rounds"].as_array().unwrap().is_empty(), !live);
        let (code, before, err) = vm.finish();
        assert_eq!(code, 0, "{err}");
        let out = dest.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        let after = String::from_utf8(out.stdout).unwrap();
        assert_eq!(format!("{before}{after}"), want, "{url}");
    }
    assert!(!unix.exists(), "the incoming socket is removed");
}

#[test]
fn tcp_migration_is_refused_off_loopback_and_bad_urls_are_usage_errors() {
    // --incoming: an address that is not loopback, and one that is not a URL.
    for (url, want) in [
        ("tcp:0.0.0.0:4444", "not loopback"),
        ("tcp:127.0.0.1:http", "not a migration address"),
        ("host:4444", "not a migration address"),
        (
            "tls:localhost:4444",
            "needs --tls-cert, --tls-key and --tls-ca",
        ),
    ] {
        let (code, out, err) = run(&["--incoming", url]);
        assert_eq!(code, 2, "{url}: {err}");
        assert!(err.contains(want), "{url}: {err}");
        assert!(out.is_empty());
    }
    // TLS files are read and checked before the VM starts.
    let (code, out, err) = run(&[
        "--guest",
        "idle",
        "--tls-cert",
        "/nonexistent/vm.crt",
        "--tls-key",
        "/k",
        "--tls-ca",
        "/a",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/vm.crt"), "{err}");
    assert!(out.is_empty());
    // ctl migrate: refused by the VM (not loopback) or by the client (syntax); the VM runs on.
    let s = Scratch::new("migrate-tcp-bad");
    let vm = Vm::start(&s, "src", &["--guest", "idle"]);
    vm.wait_for(|o| o.contains("idle: halting"));
    let (code, _, err) = vm.ctl(&["migrate", "tcp:8.8.8.8:4444"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not loopback"), "{err}");
    let (code, _, err) = vm.ctl(&["migrate", "tcp:nowhere"]);
    assert_eq!(code, 2, "{err}");
    // tls: from a VM started without certificate files, or files for another kind of URL.
    let (code, _, err) = vm.ctl(&["migrate", "tls:localhost:4444"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("needs --tls-cert, --tls-key and --tls-ca"),
        "{err}"
    );
    let tls = ["--tls-cert", "/c", "--tls-key", "/k", "--tls-ca", "/a"];
    let (code, _, err) = vm.ctl(&[&["migrate", "tcp:localhost:4444"][..], &tls].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a tls: address"), "{err}");
    let (code, _, err) = vm.ctl(&["migrate", "tls:localhost:4444", "--tls-cert", "/c"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    vm.terminate();
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
    assert!(err.contains("migrate: connect: "), "{err}");
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
fn gpu_vms_migrate_while_kernels_run() {
    for live in [false, true] {
        gpu_migrate_once(
            &FAIRNESS,
            live,
            if live { "gpu-mig-live" } else { "gpu-mig" },
        );
    }
}

#[test]
fn para_gpu_vms_migrate_while_kernels_run() {
    // The fairness guest on a para-virtual GPU: its spaces were made by hypercalls.
    let mut args = FAIRNESS;
    args[5] = "iters=20000 threads=64 blocks=2 depth=3 ms=800 report_ms=100 mode=para";
    args[7] = "vram=64M,mode=para";
    gpu_migrate_once(&args, true, "para-mig");
}

/// Migrates the fairness guest (`args`) mid-run; it finishes in the destination with `ok=1`.
fn gpu_migrate_once(args: &[&str], live: bool, tag: &str) {
    {
        let s = Scratch::new(tag);
        let (dest, incoming) = incoming(&s);
        let vm = Vm::start(&s, "src", args);
        vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
        let done = migrate(&vm, &incoming, live);
        assert_eq!(done["rounds"].as_array().unwrap().is_empty(), !live);
        migrated_fairness_finishes(vm, dest);
    }
}
