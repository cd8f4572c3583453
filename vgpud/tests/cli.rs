//! Integration tests of the `vgpud` command line: the socket path (only a stale socket is ever
//! removed), output paths checked before start, option validation and exit codes, help texts.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn vgpud() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vgpud"));
    c.stdin(Stdio::null()).env_remove("RUST_LOG");
    // Small VRAM: these tests never run a VM.
    c.args(["--vram", "64M"]);
    c
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vgpud-cli-{}-{name}", std::process::id()))
}

/// Runs vgpud to completion; a daemon that started is stopped by the safety kill after 10 s.
fn run(args: &[&str]) -> Output {
    let mut child = vgpud()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A daemon started by a test; killed if the test fails before stopping it.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts a daemon on `socket` and waits until it accepts connections.
fn start(socket: &Path, extra: &[&str]) -> Running {
    let child = vgpud()
        .arg("--socket")
        .arg(socket)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Running(Some(child));
    let t = Instant::now();
    // Wait until the daemon answers (a stale socket file may exist before it binds; a signal
    // sent before then would find it without its handlers).
    while vgpud::wire::Conn::connect(socket).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "vgpud did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn stop(mut running: Running) -> i32 {
    let mut child = running.0.take().unwrap();
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap().code().expect("exit code")
}

#[test]
fn a_regular_file_directory_or_symlink_at_the_socket_path_is_never_removed() {
    let file = tmp("file");
    std::fs::write(&file, b"precious data\n").unwrap();
    let o = run(&["--socket", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a socket"), "{}", text(&o));
    assert_eq!(std::fs::read(&file).unwrap(), b"precious data\n");

    let dir = tmp("dir");
    std::fs::create_dir_all(&dir).unwrap();
    let o = run(&["--socket", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(dir.is_dir());
    std::fs::remove_dir(&dir).unwrap();

    let link = tmp("link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let o = run(&["--socket", link.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"precious data\n");
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let sock = tmp("live.sock");
    let _ = std::fs::remove_file(&sock);
    let first = start(&sock, &[]);
    let o = run(&["--socket", sock.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("in use"), "{}", text(&o));
    assert_eq!(stop(first), 0);

    // Another program's live stream socket is not ours to remove either.
    let other = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let o = run(&["--socket", sock.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    drop(other);
    // Now stale (nobody listens): replaced.
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let again = start(&sock, &[]);
    assert_eq!(stop(again), 0);
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn report_paths_are_checked_before_start() {
    let sock = tmp("report.sock");
    let o = run(&[
        "--socket",
        sock.to_str().unwrap(),
        "--report",
        "/nonexistent/dir/r.json",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--report"), "{}", text(&o));
    assert!(!sock.exists());
}

#[test]
fn bad_options_are_usage_errors_naming_the_option() {
    let sock = tmp("usage.sock");
    let s = sock.to_str().unwrap();
    for (opt, value) in [
        ("--log-level", "loud"),
        ("--channels", "0"),
        ("--revoke-after-ms", "0"),
        ("--max-run-ms", "-1"),
        ("--report-every-ms", "0"),
        ("--spin-us", "100000000"),
        ("--backstop-us", "100000000"),
        ("--gpus", "0"),
        ("--gpus", "65"),
        ("--gpus", "0,0"),
        ("--gpus", "a"),
    ] {
        let o = run(&["--socket", s, &format!("{opt}={value}")]);
        assert_eq!(o.status.code(), Some(2), "{opt} {value}: {}", text(&o));
        assert!(text(&o).contains(opt), "{opt} {value}: {}", text(&o));
        assert!(!sock.exists(), "{opt} {value}: the daemon started");
    }
}

#[test]
fn help_documents_every_option() {
    let o = Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .arg("-h")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8(o.stdout).unwrap();
    let mut options = 0;
    for line in help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
    {
        options += 1;
        assert!(
            line.split("  ").skip(1).any(|s| !s.trim().is_empty()),
            "undocumented option: {line:?}\n{help}"
        );
    }
    assert!(options > 5 && !help.contains("::"), "{help}");
}
