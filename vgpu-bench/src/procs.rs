//! The processes an experiment starts — the `vgpud` daemon, `vgpu-vmm` VMs, native load
//! processes (fairness, priority, migrate): finding the binaries beside this one, starting them
//! (outputs to files in the run's directory), waiting for the daemon's socket, and stopping:
//! SIGTERM to the daemon (it writes its report), a kill for anything left.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::BenchError;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A binary of this workspace: `given`, else the one next to the running executable (the same
/// target directory: `cargo build --release -p vmm -p vgpud -p vgpu-bench`).
pub fn sibling(given: Option<&Path>, name: &str) -> Result<PathBuf, BenchError> {
    let p = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|source| BenchError::Io {
                path: "current_exe".into(),
                source,
            })?
            .with_file_name(name),
    };
    if !p.is_file() {
        return Err(BenchError::Invalid(format!(
            "{}: no {name} binary (build it: cargo build --release -p vmm -p vgpud, or pass --{})",
            p.display(),
            if name == "vgpud" { "vgpud" } else { "vmm" }
        )));
    }
    Ok(p)
}

/// A started process whose output goes to files.
pub struct Proc {
    pub name: String,
    pub child: Child,
    /// stdout (a VM's serial console) and stderr.
    pub out: PathBuf,
    pub err: PathBuf,
    pub status: Option<ExitStatus>,
    /// The command line, for the record.
    pub command: String,
}

impl Proc {
    /// Starts `bin args...` with stdout to `dir/<name>.log` and stderr to `dir/<name>.err`.
    pub fn spawn(dir: &Path, name: &str, bin: &Path, args: &[String]) -> Result<Self, BenchError> {
        Self::spawn_env(dir, name, bin, args, &[])
    }

    /// As [`Proc::spawn`], with `env` (NAME, value) added to the inherited environment (and
    /// written before the command in [`Proc::command`]).
    pub fn spawn_env(
        dir: &Path,
        name: &str,
        bin: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Self, BenchError> {
        Self::spawn_on(dir, name, bin, args, env, None)
    }

    /// As [`Proc::spawn_env`], on the CPUs `cpus` only (`crate::cpus::pin`) if given.
    pub fn spawn_on(
        dir: &Path,
        name: &str,
        bin: &Path,
        args: &[String],
        env: &[(String, String)],
        cpus: Option<&[usize]>,
    ) -> Result<Self, BenchError> {
        let out = dir.join(format!("{name}.log"));
        let err = dir.join(format!("{name}.err"));
        let fo = File::create(&out).map_err(io(&out))?;
        let fe = File::create(&err).map_err(io(&err))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(fo)
            .stderr(fe);
        if let Some(c) = cpus {
            crate::cpus::pin(&mut cmd, c);
        }
        let child = cmd.spawn().map_err(io(bin))?;
        let command = env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_quote(v)))
            .chain(std::iter::once(bin.display().to_string()))
            .chain(args.iter().map(|a| shell_quote(a)))
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Proc {
            name: name.to_string(),
            child,
            out,
            err,
            status: None,
            command,
        })
    }

    /// Whether it has exited (recording the status).
    pub fn poll(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.status = Some(s);
        }
        self.status.is_some()
    }

    /// The first lines of its stderr (for error messages).
    pub fn stderr_head(&self) -> String {
        std::fs::read_to_string(&self.err)
            .unwrap_or_default()
            .lines()
            .take(5)
            .collect::<Vec<_>>()
            .join(" / ")
    }

    /// Sends `sig`, then waits up to `grace` for the exit; kills it after that.
    pub fn stop(&mut self, sig: i32, grace: Duration) {
        if self.poll() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet (so the
            // pid cannot have been reused); no memory is involved.
            unsafe { libc::kill(pid, sig) };
        }
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if self.poll() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        if let Ok(s) = self.child.wait() {
            self.status = Some(s);
        }
    }

    /// Exit code (`None` while running or when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

impl Drop for Proc {
    /// A process still running when its handle goes (an error path) is killed, not left behind.
    fn drop(&mut self) {
        if !self.poll() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until `socket` exists (the daemon listens), or fails when the daemon exits first or
/// `timeout` passes.
pub fn wait_socket(daemon: &mut Proc, socket: &Path, timeout: Duration) -> Result<(), BenchError> {
    let until = Instant::now() + timeout;
    loop {
        if socket.exists() {
            return Ok(());
        }
        if daemon.poll() {
            return Err(BenchError::Invalid(format!(
                "vgpud exited ({}) before listening: {}",
                daemon.status.map_or(String::new(), |s| s.to_string()),
                daemon.stderr_head()
            )));
        }
        if Instant::now() >= until {
            return Err(BenchError::Invalid(format!(
                "vgpud: no socket {} after {timeout:?}",
                socket.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `s` quoted for a POSIX shell when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=,./:+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_a_short_lived_process() {
        assert_eq!(shell_quote("a=b,c"), "a=b,c");
        assert_eq!(shell_quote("iters=5 ms=1"), "'iters=5 ms=1'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let dir = std::env::temp_dir().join(format!("vgpu-bench-procs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = Proc::spawn(
            &dir,
            "sh",
            Path::new("/bin/sh"),
            &["-c".into(), "echo out; echo err >&2; sleep 30".into()],
        )
        .unwrap();
        assert!(!p.poll());
        let until = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&p.err)
            .unwrap_or_default()
            .is_empty()
            && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        p.stop(libc::SIGTERM, Duration::from_secs(5));
        assert!(p.status.is_some() && p.code().is_none());
        assert_eq!(std::fs::read_to_string(&p.out).unwrap(), "out\n");
        assert_eq!(p.stderr_head(), "err");
        let mut d = Proc::spawn(&dir, "f", Path::new("/bin/false"), &[]).unwrap();
        let e = wait_socket(&mut d, &dir.join("nope"), Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("exited"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
