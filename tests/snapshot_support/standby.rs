//! A `vgpu-vmm --standby` process for the tests of restores and migrations into a standby
//! (tests/standby.rs, tests/migration_standby.rs).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Scratch, bin, ctl, json};

/// A standby process with its API socket and `--stats` file in `s`.
pub struct Standby {
    /// Taken by `finish`; killed when dropped (a standby waits for ever).
    child: Option<Child>,
    pub socket: std::path::PathBuf,
    pub stats: std::path::PathBuf,
}

impl Standby {
    /// Starts `vgpu-vmm --standby` with `args` and waits until it answers `stats` (prepared).
    pub fn start(s: &Scratch, tag: &str, args: &[&str]) -> Standby {
        let socket = s.path(&format!("{tag}.sock"));
        let stats = s.path(&format!("{tag}.stats.json"));
        let child = Command::new(bin())
            .arg("--standby")
            .arg("--api-socket")
            .arg(&socket)
            .arg(format!("--stats={}", stats.display()))
            .args(args)
            .args(["--timeout", "120"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let sb = Standby {
            child: Some(child),
            socket,
            stats,
        };
        let start = Instant::now();
        loop {
            let (code, out, _) = ctl(&sb.socket, &["stats"]);
            if code == 0 {
                assert_eq!(json(&out)["state"], "standby", "{out}");
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "no standby");
            std::thread::sleep(Duration::from_millis(10));
        }
        sb
    }

    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        ctl(&self.socket, args)
    }

    /// `restore DIR`, expected to be refused with `want` in the error; the standby waits on.
    pub fn refuses(&self, dir: &Path, want: &str) {
        let (code, out, err) = self.ctl(&["restore", dir.to_str().unwrap()]);
        assert_eq!(code, 1, "{}: {out} {err}", dir.display());
        assert!(err.contains(want), "{}: {err}", dir.display());
        let (code, out, _) = self.ctl(&["stats"]);
        assert_eq!(code, 0);
        assert_eq!(json(&out)["state"], "standby", "{out}");
    }

    /// `restore DIR` accepted: the answer (the restore's figures).
    pub fn restore(&self, dir: &Path) -> serde_json::Value {
        let (code, out, err) = self.ctl(&["restore", dir.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        json(&out)
    }

    /// Waits for the restored VM's end: (exit code, console output, stderr, `--stats`).
    pub fn finish(mut self) -> (i32, String, String, serde_json::Value) {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        let stats = json(&std::fs::read_to_string(&self.stats).unwrap());
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            stats,
        )
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
