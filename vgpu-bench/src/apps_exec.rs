//! One run of one program of the CUDA application suite (apps/) in one configuration of
//! `vgpu-bench apps`: natively (NVIDIA's libraries on a GPU; the project's library in-process
//! on the software GPU), in-process over the project's library on a chosen engine, or in a
//! Linux VM (`vgpu-vmm --guest linux --gpu ... --run PROG`), and what it reports: the verdict
//! line, the whole run's time, the library's phases (`VGPU_CUDA_STATS=-`: one
//! `vgpu-cuda-stats: {json}` line on stderr at exit) and, in a VM, the guest's own times.
//! Under a preemption method (`--preempt`): a VM gets `--gpu preempt=M` and `--stats` (what its
//! engine did with the method), an in-process run `VGPU_CUDA_PREEMPT=M` (and, with
//! `--preempt-test`, `VGPU_CUDA_PREEMPT_TEST`: its launches preempted at random moments).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apps_preempt::Used;
use crate::backend::Backend;
use crate::error::BenchError;

/// Where a program runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Config {
    /// On cuda: NVIDIA's libcudart over the driver; on sim: the project's library in-process.
    Native,
    /// The project's library in-process over the engine (`VGPU_CUDA_BACKEND`).
    InProc,
    /// A Linux VM with `--gpu mode=MODE` (pt, full, para).
    Vm(String),
    /// A Linux VM sharing the GPU through a vgpud daemon (`--gpu host=SOCKET`, full mode).
    Vgpud,
}

impl Config {
    pub fn parse(s: &str) -> Result<Self, BenchError> {
        Ok(match s {
            "native" => Config::Native,
            "inproc" => Config::InProc,
            "pt" | "full" | "para" => Config::Vm(s.to_string()),
            "vgpud" => Config::Vgpud,
            _ => {
                return Err(BenchError::Invalid(format!(
                    "--configs: unknown configuration `{s}` (native, inproc, pt, full, para, vgpud)"
                )));
            }
        })
    }

    pub fn name(&self) -> String {
        match self {
            Config::Native => "native".into(),
            Config::InProc => "inproc".into(),
            Config::Vm(m) => m.clone(),
            Config::Vgpud => "vgpud".into(),
        }
    }

    pub fn is_vm(&self) -> bool {
        matches!(self, Config::Vm(_) | Config::Vgpud)
    }
}

/// The library's phases of one run, in milliseconds (absent with NVIDIA's library).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    pub init: f64,
    pub copies_in: f64,
    pub kernels: f64,
    pub copies_out: f64,
    pub close: f64,
    /// Mean library time per launch before the backend is called, in microseconds.
    pub launch_overhead_us: f64,
    pub launches: u64,
}

/// The last `vgpu-cuda-stats: {json}` report of `text`.
fn lib_report(text: &str) -> Option<serde_json::Value> {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("vgpu-cuda-stats: ").map(|(_, j)| j))?;
    serde_json::from_str(line.trim()).ok()
}

impl Phases {
    /// GPU-side time: copies, kernels and the synchronisation that waits for them.
    pub fn gpu_side(&self) -> f64 {
        self.copies_in + self.kernels + self.copies_out
    }

    /// The last `vgpu-cuda-stats: {json}` line of `text`.
    pub fn from_output(text: &str) -> Option<Phases> {
        let v = lib_report(text)?;
        let p = &v["phases_ns"];
        let ms = |k: &str| p[k].as_f64().map(|ns| ns / 1e6);
        let o = &v["launch_overhead_ns"];
        Some(Phases {
            init: ms("init")?,
            copies_in: ms("copies_in")?,
            kernels: ms("kernels")?,
            copies_out: ms("copies_out")?,
            close: ms("close")?,
            launch_overhead_us: o["mean"].as_f64().unwrap_or(0.0) / 1e3,
            launches: o["launches"].as_u64().unwrap_or(0),
        })
    }
}

/// What one run gave.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub pass: bool,
    /// Why it did not pass (verdict, exit code, time limit).
    pub error: String,
    /// The whole run as the host saw it (process start to exit; for a VM, the VM's life).
    pub total_ms: f64,
    /// The program's own event-timed GPU section (`gpu_ms=` of its verdict line).
    pub app_gpu_ms: f64,
    /// The checksum of its PASS verdict (over the program's result).
    pub checksum: Option<u64>,
    pub phases: Option<Phases>,
    /// VM only: guest uptime when /init started, and the program's run in the guest (from
    /// /init's uptime lines, 10 ms resolution).
    pub boot_ms: Option<f64>,
    pub guest_prog_ms: Option<f64>,
    /// Under a preemption method: what the engine did with it.
    pub preempt: Option<Used>,
}

/// Everything a run needs besides the program.
pub struct Env<'a> {
    pub backend: Backend,
    /// The project's libcudart.so.13 / libcuda.so.1.
    pub lib: &'a Path,
    /// NVIDIA's libcudart.so.13 (cuda native).
    pub native_lib: Option<&'a Path>,
    pub vmm: &'a Path,
    /// vgpud's socket for `Config::Vgpud`.
    pub vgpud_socket: Option<&'a Path>,
    pub size: &'a str,
    pub memory_mib: u64,
    pub vram: &'a str,
    pub limit: Duration,
    /// `VGPU_CUDA_PREEMPT_TEST` of in-process runs under a method (forced preemptions).
    pub preempt_test: Option<&'a str>,
    /// Where a VM's `--stats` document goes (removed before every run).
    pub vm_stats: &'a Path,
}

/// Runs `program` (in `dir`) once under `config`, with the preemption method `preempt` (the
/// configuration's default when `None`).
pub fn run(
    env: &Env,
    dir: &Path,
    program: &str,
    config: &Config,
    preempt: Option<&str>,
) -> Result<Sample, BenchError> {
    let exe = dir.join(program);
    let mut vars: Vec<(&str, String)> = vec![("VGPU_CUDA_STATS", "-".into())];
    if config.is_vm() {
        match std::fs::remove_file(env.vm_stats) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(BenchError::Io {
                    path: env.vm_stats.display().to_string(),
                    source,
                });
            }
        }
    }
    let (bin, args, lib): (PathBuf, Vec<String>, PathBuf) = match config {
        Config::Native | Config::InProc => {
            let native_cuda = *config == Config::Native && env.backend == Backend::Cuda;
            let lib = if native_cuda {
                env.native_lib
                    .ok_or_else(|| {
                        BenchError::Invalid(
                            "native on cuda needs --native-lib (NVIDIA's libcudart.so.13)".into(),
                        )
                    })?
                    .to_path_buf()
            } else {
                vars.push(("VGPU_CUDA_BACKEND", env.backend.name().into()));
                if let Some(m) = preempt {
                    vars.push(("VGPU_CUDA_PREEMPT", m.into()));
                    if let Some(t) = env.preempt_test {
                        vars.push(("VGPU_CUDA_PREEMPT_TEST", t.into()));
                    }
                }
                env.lib.to_path_buf()
            };
            (exe, vec![env.size.to_string()], lib)
        }
        Config::Vm(_) | Config::Vgpud => {
            let mut gpu = format!("backend={},vram={}", env.backend.name(), env.vram);
            if let Some(m) = preempt {
                gpu.push_str(&format!(",preempt={m}"));
            }
            match config {
                Config::Vm(mode) => gpu.push_str(&format!(",mode={mode}")),
                _ => {
                    let sock = env.vgpud_socket.ok_or_else(|| {
                        BenchError::Invalid("vgpud configuration without a daemon".into())
                    })?;
                    gpu.push_str(&format!(",host={},name={program}", sock.display()));
                }
            }
            let args = vec![
                "--guest".into(),
                "linux".into(),
                "--memory".into(),
                env.memory_mib.to_string(),
                "--gpu".into(),
                gpu,
                // Kernel command-line words of the form K=V reach /init's environment.
                "--cmdline".into(),
                "VGPU_CUDA_STATS=-".into(),
                "--timeout".into(),
                env.limit.as_secs().max(1).to_string(),
                "--stats".into(),
                env.vm_stats.display().to_string(),
                "--run".into(),
                exe.display().to_string(),
                "--".into(),
                env.size.to_string(),
            ];
            (env.vmm.to_path_buf(), args, env.lib.to_path_buf())
        }
    };
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let envs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = apps::run(&bin, &argv, &envs, &lib, env.limit).map_err(|e| BenchError::Io {
        path: bin.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut s = Sample {
        total_ms: r.seconds * 1e3,
        ..Sample::default()
    };
    let all = format!("{}\n{}", r.stdout, r.stderr);
    s.phases = Phases::from_output(&all);
    if config.is_vm() {
        (s.boot_ms, s.guest_prog_ms) = guest_times(&r.stdout);
        if let Some(m) = preempt {
            let doc = std::fs::read_to_string(env.vm_stats)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            s.preempt = doc.map(|d| Used::from_vm_stats(&d, m));
        }
    } else if preempt.is_some() {
        s.preempt = lib_report(&all).as_ref().and_then(Used::from_lib_report);
    }
    match r.verdict(program) {
        Some(v) if v.pass && r.code == Some(0) => {
            s.pass = true;
            s.app_gpu_ms = v.gpu_ms.unwrap_or(0.0);
            s.checksum = v.checksum;
        }
        Some(v) => s.error = format!("{} (exit {:?})", v.reason, r.code),
        None if r.timed_out => s.error = format!("time limit {:?}", env.limit),
        None => {
            let tail: String = all.lines().rev().take(4).collect::<Vec<_>>().join(" | ");
            s.error = format!("no verdict line (exit {:?}): {tail}", r.code);
        }
    }
    Ok(s)
}

/// (boot, program) in ms from the Linux guest's `/init running, uptime X s` and
/// `... exited RC, uptime Y s` lines.
pub fn guest_times(console: &str) -> (Option<f64>, Option<f64>) {
    let uptime = |l: &str| -> Option<f64> {
        let t = l.split("uptime ").nth(1)?;
        t.split_whitespace().next()?.parse::<f64>().ok()
    };
    let boot = console
        .lines()
        .find(|l| l.contains("/init running, uptime"))
        .and_then(uptime);
    let end = console
        .lines()
        .find(|l| l.contains("exited") && l.contains(", uptime"))
        .and_then(uptime);
    let prog = match (boot, end) {
        (Some(b), Some(e)) if e >= b => Some((e - b) * 1e3),
        _ => None,
    };
    (boot.map(|b| b * 1e3), prog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_come_from_the_last_stats_line() {
        let out = "x\nvgpu-cuda-stats: {\"phases_ns\":{\"init\":1000000,\"copies_in\":2000000,\
            \"kernels\":3000000,\"copies_out\":500000,\"close\":0},\"launch_overhead_ns\":\
            {\"launches\":4,\"mean\":2500}}\n";
        let p = Phases::from_output(out).expect("parsed");
        assert_eq!((p.init, p.copies_in, p.kernels), (1.0, 2.0, 3.0));
        assert_eq!(p.gpu_side(), 5.5);
        assert_eq!((p.launches, p.launch_overhead_us), (4, 2.5));
        assert!(Phases::from_output("vgpu-cuda-stats: {bad").is_none());
    }

    #[test]
    fn guest_times_from_init_lines() {
        let c = "vgpu-linux: /init running, uptime 1.50 s\nmatmul n=1: PASS\n\
                 vgpu-linux: 'matmul' exited 0, uptime 2.25 s\n";
        let (b, p) = guest_times(c);
        assert_eq!(b, Some(1500.0));
        assert!((p.unwrap() - 750.0).abs() < 1e-9);
        assert_eq!(guest_times("nothing"), (None, None));
    }

    #[test]
    fn configs_parse() {
        assert_eq!(Config::parse("para").unwrap(), Config::Vm("para".into()));
        assert!(Config::parse("bogus").is_err());
        assert!(Config::Vgpud.is_vm() && !Config::Native.is_vm());
    }
}
