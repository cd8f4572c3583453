//! The VMs of `vgpu-bench migrate`: a `fairness` guest started with an API socket (its console
//! in a file that is read for its progress lines), `vgpu-vmm ctl` requests to it, a `--incoming`
//! destination or a standby one (`--standby`, then `ctl incoming`), and `--restore` of a
//! snapshot (its "restore to running" time from the VMM's debug log).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::BenchError;
use crate::fairness_guest::{self, GuestRun};
use crate::procs::Proc;

/// A VM with an API socket.
pub struct Vm {
    pub proc: Proc,
    pub socket: PathBuf,
}

impl Vm {
    /// Starts `vmm args...` with `--api-socket dir/<name>.sock`.
    pub fn start(dir: &Path, name: &str, vmm: &Path, args: &[String]) -> Result<Self, BenchError> {
        Self::start_env(dir, name, vmm, args, &[])
    }

    /// As [`Vm::start`], with `env` added to the VMM's environment.
    pub fn start_env(
        dir: &Path,
        name: &str,
        vmm: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Self, BenchError> {
        let socket = dir.join(format!("{name}.sock"));
        let mut a = args.to_vec();
        a.extend(["--api-socket".into(), socket.display().to_string()]);
        let proc = Proc::spawn_env(dir, name, vmm, &a, env)?;
        Ok(Vm { proc, socket })
    }

    /// What the guest printed so far.
    pub fn output(&self) -> GuestRun {
        fairness_guest::parse(&std::fs::read_to_string(&self.proc.out).unwrap_or_default())
    }

    /// Waits until `done` holds for the guest's output (the VM still running), at most
    /// `timeout`.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&GuestRun) -> bool,
    ) -> Result<GuestRun, BenchError> {
        let until = Instant::now() + timeout;
        loop {
            let g = self.output();
            if done(&g) {
                return Ok(g);
            }
            let exited = self.proc.poll();
            if exited || Instant::now() > until {
                return Err(BenchError::Invalid(format!(
                    "{}: no {what} ({}): {}",
                    self.proc.name,
                    if exited { "exited" } else { "timed out" },
                    self.proc.stderr_head()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `vgpu-vmm ctl SOCKET args...`: its JSON answer.
    pub fn ctl(&self, vmm: &Path, args: &[&str]) -> Result<serde_json::Value, BenchError> {
        let out = Command::new(vmm)
            .arg("ctl")
            .arg(&self.socket)
            .args(args)
            .output()
            .map_err(|source| BenchError::Io {
                path: vmm.display().to_string(),
                source,
            })?;
        if !out.status.success() {
            return Err(BenchError::Invalid(format!(
                "ctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| BenchError::Invalid(format!("ctl {}: answer: {e}", args.join(" "))))
    }

    /// Waits for the VM to exit (at most `timeout`, then it is killed); returns its guest run.
    pub fn finish(&mut self, timeout: Duration) -> Result<(Option<i32>, GuestRun), BenchError> {
        let until = Instant::now() + timeout;
        while !self.proc.poll() {
            if Instant::now() > until {
                self.proc.stop(libc::SIGKILL, Duration::ZERO);
                return Err(BenchError::Invalid(format!(
                    "{}: still running after {timeout:?}",
                    self.proc.name
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok((self.proc.code(), self.output()))
    }
}

/// The `--stats` file of the `--incoming` destination `name` in `dir`.
pub fn incoming_stats(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.stats.json"))
}

/// What a destination that ended did (its `--stats`' `incoming`: the `dest_*` figures);
/// null when it has none.
pub fn incoming_report(dir: &Path, name: &str) -> serde_json::Value {
    std::fs::read_to_string(incoming_stats(dir, name))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map_or(serde_json::Value::Null, |v| v["incoming"].clone())
}

/// A `--incoming` destination in `dir` (its `--stats` in [`incoming_stats`], an API socket
/// for `ctl` once the guest runs there), `env` added to its environment; returns once its
/// incoming socket exists.
pub fn incoming(
    dir: &Path,
    name: &str,
    vmm: &Path,
    extra: &[String],
    env: &[(String, String)],
) -> Result<(Vm, PathBuf), BenchError> {
    let socket = dir.join(format!("{name}.in"));
    let stats = format!("--stats={}", incoming_stats(dir, name).display());
    let mut args = vec![
        "--incoming".into(),
        socket.display().to_string(),
        "--timeout".into(),
        "300".into(),
        stats,
    ];
    args.extend_from_slice(extra);
    let mut vm = Vm::start_env(dir, name, vmm, &args, env)?;
    let until = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if vm.proc.poll() || Instant::now() > until {
            return Err(BenchError::Invalid(format!(
                "{name}: no incoming socket: {}",
                vm.proc.stderr_head()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok((vm, socket))
}

/// A standby destination in `dir` (`vgpu-vmm --standby` with `prepare`: the guest's
/// `--memory` and `--gpu`; its `--stats` in [`incoming_stats`]), `env` added to its
/// environment: once it is prepared (it answers `stats`), `ctl incoming` makes it listen on a
/// socket, returned with it and how long it took to prepare (its own figure, ms). Its API
/// socket is the migrated VM's after the switch-over.
pub fn standby_incoming(
    dir: &Path,
    name: &str,
    vmm: &Path,
    prepare: &[String],
    env: &[(String, String)],
) -> Result<(Vm, PathBuf, f64), BenchError> {
    let socket = dir.join(format!("{name}.in"));
    let mut args = vec![
        "--standby".to_string(),
        "--timeout".into(),
        "300".into(),
        format!("--stats={}", incoming_stats(dir, name).display()),
    ];
    args.extend_from_slice(prepare);
    let mut vm = Vm::start_env(dir, name, vmm, &args, env)?;
    let until = Instant::now() + Duration::from_secs(120);
    let prepared_ms = loop {
        // The API socket is bound before preparing, and answered once prepared.
        if let Ok(v) = vm.ctl(vmm, &["stats"])
            && v["state"] == "standby"
        {
            break v["prepared_ms"].as_f64().unwrap_or(0.0);
        }
        if vm.proc.poll() || Instant::now() > until {
            return Err(BenchError::Invalid(format!(
                "{name}: not on standby: {}",
                vm.proc.stderr_head()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The source starts after this (its guest must show progress first: up to 2 minutes).
    let answer = vm.ctl(
        vmm,
        &["incoming", &socket.display().to_string(), "--wait-s", "600"],
    )?;
    if answer["state"] != "incoming" {
        return Err(BenchError::Invalid(format!(
            "{name}: incoming answered {answer}"
        )));
    }
    Ok((vm, socket, prepared_ms))
}

/// Waits for a process to exit; its guest run (stdout) and its exit code.
pub fn wait_run(p: &mut Proc, timeout: Duration) -> Result<(Option<i32>, GuestRun), BenchError> {
    let until = Instant::now() + timeout;
    while !p.poll() {
        if Instant::now() > until {
            p.stop(libc::SIGKILL, Duration::ZERO);
            return Err(BenchError::Invalid(format!(
                "{}: still running after {timeout:?}",
                p.name
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = std::fs::read_to_string(&p.out).unwrap_or_default();
    Ok((p.code(), fairness_guest::parse(&text)))
}

/// `restore to running: N ms` of a `--log-level debug` VMM's stderr.
pub fn restore_ms(stderr: &str) -> Option<f64> {
    stderr.lines().find_map(|l| {
        let rest = l.split("restore to running: ").nth(1)?;
        rest.trim().strip_suffix(" ms")?.parse().ok()
    })
}

/// Bytes of the files in `dir` (what a snapshot takes on disk: allocated blocks, holes not
/// counted) and their apparent size.
pub fn dir_bytes(dir: &Path) -> Result<(u64, u64), BenchError> {
    use std::os::unix::fs::MetadataExt;
    let mut on_disk = 0;
    let mut apparent = 0;
    let entries = std::fs::read_dir(dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    for e in entries.flatten() {
        if let Ok(m) = e.metadata()
            && m.is_file()
        {
            on_disk += m.blocks() * 512;
            apparent += m.len();
        }
    }
    Ok((on_disk, apparent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_restore_time() {
        let log = "[x DEBUG vmm::vm] restore: GPU image of 1 bytes restored in 2.0 ms\n\
                   [x DEBUG vmm::vm] restore to running: 51.8 ms\n";
        assert_eq!(restore_ms(log), Some(51.8));
        assert_eq!(restore_ms("nothing"), None);
    }
}
