//! The project's CUDA application suite seen from Rust: building it (apps/build.sh: NVIDIA's
//! pinned nvcc 13.0, default flags), running one of its programs with a chosen library
//! directory under a time limit, and reading the one verdict line every program prints
//! (`NAME PARAMS: PASS checksum=0x... gpu_ms=...`). The tests in apps/tests run the suite on
//! the software GPU; an experiment can run it in other configurations the same way.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The build script's exit status when the CUDA toolchain cannot be installed (no python3
/// venv, no network to PyPI), as opposed to a program that does not compile.
pub const NO_TOOLCHAIN: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the CUDA toolchain cannot be installed: {0}")]
    NoToolchain(String),
    #[error("apps/build.sh failed ({status}):\n{log}")]
    Build { status: String, log: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A built suite: the directory of its programs and their names (apps/build.sh's PROGRAMS).
#[derive(Debug, Clone)]
pub struct Suite {
    pub dir: PathBuf,
    pub programs: Vec<String>,
}

/// The repository's root (this crate is `<root>/apps`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the apps crate is inside the repository")
        .to_path_buf()
}

/// Runs apps/build.sh with the toolchain in `<target>/cuda-toolchain` and the programs in
/// `<target>/apps` (cached: a second build only checks timestamps).
pub fn build(target: &Path) -> Result<Suite, Error> {
    let dir = target.join("apps");
    let script = repo_root().join("apps/build.sh");
    let out = Command::new(&script)
        .env("VGPU_CUDA_TOOLCHAIN", target.join("cuda-toolchain"))
        .env("VGPU_APPS_OUT", &dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Io {
            path: script,
            source,
        })?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => {}
        Some(NO_TOOLCHAIN) => return Err(Error::NoToolchain(log)),
        _ => {
            return Err(Error::Build {
                status: out.status.to_string(),
                log,
            });
        }
    }
    let list = dir.join("PROGRAMS");
    let text = std::fs::read_to_string(&list).map_err(|source| Error::Io { path: list, source })?;
    let programs = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    Ok(Suite { dir, programs })
}

/// How one program run ended.
#[derive(Debug, Clone)]
pub struct Run {
    /// The exit code; `None` when killed by a signal or by the time limit.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub seconds: f64,
}

impl Run {
    /// The program's verdict line, if it printed one.
    pub fn verdict(&self, program: &str) -> Option<Verdict> {
        self.stdout.lines().find_map(|l| Verdict::parse(program, l))
    }

    /// Exit 0 and a PASS verdict.
    pub fn passed(&self, program: &str) -> bool {
        self.code == Some(0) && self.verdict(program).is_some_and(|v| v.pass)
    }
}

/// Runs `exe ARGS` with `LD_LIBRARY_PATH=lib` (nothing else preloaded) and the variables in
/// `env` (the suite's own, APPS_*, only from there), killed after `limit`.
pub fn run(
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    lib: &Path,
    limit: Duration,
) -> Result<Run, Error> {
    let started = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env_remove("LD_PRELOAD")
        .env_remove("APPS_SIZE")
        .env_remove("APPS_FATBIN")
        .env_remove("APPS_TAMPER")
        .envs(env.iter().copied());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Io {
            path: exe.to_path_buf(),
            source,
        })?;
    // Both pipes drained on threads: a chatty program cannot block on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let t_out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let t_err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let io = |source| Error::Io {
        path: exe.to_path_buf(),
        source,
    };
    let (status, timed_out) = loop {
        if let Some(st) = child.try_wait().map_err(io)? {
            break (Some(st), false);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Run {
        code: status.and_then(|s| s.code()),
        timed_out,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A program's verdict line: `NAME PARAMS: PASS checksum=0x<16 hex> gpu_ms=<ms>` or
/// `NAME PARAMS: FAIL <reason>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub params: String,
    pub pass: bool,
    pub checksum: Option<u64>,
    pub gpu_ms: Option<f64>,
    /// After FAIL: the reason.
    pub reason: String,
}

impl Verdict {
    /// Parses `line` as `program`'s verdict; `None` if it is not one.
    pub fn parse(program: &str, line: &str) -> Option<Verdict> {
        let rest = line.strip_prefix(program)?.strip_prefix(' ')?;
        // The params never contain ": " (key=value pairs); a FAIL reason may.
        let (params, outcome) = rest.split_once(": ")?;
        let (word, tail) = outcome.split_once(' ').unwrap_or((outcome, ""));
        match word {
            "PASS" => {
                let mut checksum = None;
                let mut gpu_ms = None;
                for kv in tail.split_whitespace() {
                    if let Some(h) = kv.strip_prefix("checksum=0x") {
                        checksum = u64::from_str_radix(h, 16).ok();
                    } else if let Some(ms) = kv.strip_prefix("gpu_ms=") {
                        gpu_ms = ms.parse().ok();
                    }
                }
                Some(Verdict {
                    params: params.to_string(),
                    pass: checksum.is_some() && gpu_ms.is_some(),
                    checksum,
                    gpu_ms,
                    reason: String::new(),
                })
            }
            "FAIL" => Some(Verdict {
                params: params.to_string(),
                pass: false,
                checksum: None,
                gpu_ms: None,
                reason: tail.to_string(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_line() {
        let v = Verdict::parse(
            "matmul",
            "matmul n=72 reps=1: PASS checksum=0x00000000deadbeef gpu_ms=0.125",
        )
        .unwrap();
        assert!(v.pass);
        assert_eq!(v.params, "n=72 reps=1");
        assert_eq!(v.checksum, Some(0xdead_beef));
        assert_eq!(v.gpu_ms, Some(0.125));
    }

    #[test]
    fn fail_line_keeps_the_reason() {
        let v = Verdict::parse("lu", "lu n=40: FAIL LU[3][4]=1 want 2").unwrap();
        assert!(!v.pass);
        assert_eq!(v.reason, "LU[3][4]=1 want 2");
    }

    #[test]
    fn other_lines_and_programs_are_not_verdicts() {
        assert!(Verdict::parse("scan", "scanner n=1: PASS checksum=0x1 gpu_ms=1").is_none());
        assert!(Verdict::parse("scan", "scan n=1: MAYBE").is_none());
        assert!(Verdict::parse("scan", "warning: something").is_none());
        // A PASS without its checksum or time is not a pass.
        assert!(!Verdict::parse("scan", "scan n=1: PASS").unwrap().pass);
    }
}
