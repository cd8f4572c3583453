//! `vgpu-bench restore`: restore to running of one snapshot, cold (`vgpu-vmm --restore DIR`: a
//! new process makes its KVM VM, RAM slots, vCPUs and GPU engine after it starts) against a
//! standby (`vgpu-vmm --standby`, prepared before, then `restore DIR` on its API socket; issue
//! 24, docs/snapshot.md "Restoring into a standby") and a standby with the snapshot as its
//! template (`--template DIR`: its GPU modules loaded before the request; every module of the
//! restore must come from the engine's cache), `--reps` times each, alternating. The
//! figure is the VMM's own (`--stats`' `restore`: reading the snapshot, or the request's
//! arrival, to the vCPU threads started) with its parts; for the standby also the request's
//! round trip as the bench sees it on the socket (request written to answer read). Every
//! restored guest must run to its end: the `count` guest with the same console output in every
//! run, the `fairness` guest (a GPU VM) with `ok=1`.
//!
//! The guest: `count` (no GPU; the issue's 256 MiB `count` guest, default on sim) or
//! `fairness` (kernels running on the virtual GPU when snapshotted; default on cuda).
//! Writes `--out DIR/summary.json` (p50/p90/max of each, the parts' medians) and `restore.csv`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::BenchError;
use crate::migrate_vm::{self, Vm};
use crate::procs::{self, Proc};
use crate::report;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Guest {
    /// The `count` guest (no GPU): 40 steps of 20 ms, its memory checked.
    Count,
    /// The `fairness` guest: kernels always in flight on the virtual GPU.
    Fairness,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU engine of the `fairness` guest: sim, or cuda (a real GPU).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// The guest (default: count on sim, fairness on cuda).
    #[arg(long, value_enum)]
    pub guest: Option<Guest>,
    /// Output directory (summary.json, restore.csv).
    #[arg(long, default_value = "vgpu-bench-out/restore")]
    pub out: PathBuf,
    /// Restores of each kind (cold, standby), alternating.
    #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub reps: usize,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=65536))]
    pub memory_mib: u64,
    /// VRAM of the `fairness` guest in MiB.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(64..=65536))]
    pub vram_mib: u64,
    /// More `--gpu` options (e.g. `preempt=checkpoint`); the standby gets them too.
    #[arg(long, value_name = "OPTS")]
    pub gpu_extra: Option<String>,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
}

impl Args {
    fn guest(&self) -> Guest {
        self.guest.unwrap_or(match self.backend {
            Backend::Sim => Guest::Count,
            Backend::Cuda => Guest::Fairness,
        })
    }

    /// `--gpu` of the fairness guest (and its standby).
    fn gpu(&self) -> String {
        let mut g = format!("vram={}M,backend={}", self.vram_mib, self.backend.name());
        if let Some(x) = &self.gpu_extra {
            g.push(',');
            g.push_str(x);
        }
        g
    }

    /// The guest's command line (without the API socket).
    fn guest_args(&self) -> Vec<String> {
        let mut a: Vec<String> = match self.guest() {
            Guest::Count => vec!["--guest", "count", "--cmdline", "steps=40 ms=20"],
            Guest::Fairness => vec![
                "--guest",
                "fairness",
                "--cmdline",
                "iters=20000 threads=64 blocks=8 depth=3 ms=1000 report_ms=20",
            ],
        }
        .into_iter()
        .map(String::from)
        .collect();
        a.extend(["--memory".into(), self.memory_mib.to_string()]);
        a.extend(["--timeout".into(), "300".into()]);
        if self.guest() == Guest::Fairness {
            a.extend(["--gpu".into(), self.gpu()]);
        }
        a
    }

    /// What the standby prepares for.
    fn standby_args(&self) -> Vec<String> {
        let mut a = vec![
            "--standby".to_string(),
            "--memory".into(),
            self.memory_mib.to_string(),
            "--timeout".into(),
            "300".into(),
        ];
        if self.guest() == Guest::Fairness {
            a.extend(["--gpu".into(), self.gpu()]);
        }
        a
    }
}

/// One restore's figures: the VMM's report (`--stats`' `restore`) and, on a standby, the
/// request's round trip seen by the bench.
#[derive(Debug, Clone)]
struct One {
    report: serde_json::Value,
    request_ms: Option<f64>,
}

/// The parts of the VMM's report (`vmm::snapshot::restore_report::RestoreReport`; the GPU's
/// VRAM and modules are parts of `gpu_restore_ms`, with the modules' counts).
const PARTS: [&str; 15] = [
    "check_ms",
    "vm_ms",
    "engine_ms",
    "ram_ms",
    "vcpus_ms",
    "devices_ms",
    "state_ms",
    "gpu_restore_ms",
    "gpu_pause_ms",
    "gpu_vram_ms",
    "gpu_modules_ms",
    "modules_cached",
    "modules_cold",
    "gpu_apply_ms",
    "start_ms",
];

/// How a run restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cold,
    Standby,
    /// A standby with the snapshot as its template.
    Template,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Cold => "cold",
            Mode::Standby => "standby",
            Mode::Template => "template",
        }
    }
}

/// Makes the snapshot: the guest started, snapshotted (paused) once it runs, stopped.
fn snapshot(a: &Args, vmm: &Path, dir: &Path) -> Result<PathBuf, BenchError> {
    let mut vm = Vm::start(dir, "source", vmm, &a.guest_args())?;
    let text = |vm: &Vm| std::fs::read_to_string(&vm.proc.out).unwrap_or_default();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = match a.guest() {
            Guest::Count => text(&vm).contains("COUNT step=3 "),
            Guest::Fairness => vm.output().progress.len() >= 3,
        };
        if ready {
            break;
        }
        if vm.proc.poll() || Instant::now() > until {
            return Err(BenchError::Invalid(format!(
                "the guest did not start running: {}",
                vm.proc.stderr_head()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let snap = dir.join("snap");
    vm.ctl(vmm, &["snapshot", &snap.display().to_string(), "--paused"])?;
    vm.proc.stop(libc::SIGKILL, Duration::from_secs(5));
    Ok(snap)
}

/// Checks a restored run's end: exit 0 and, for `count`, the console output of the first
/// (`want`, set by the first run), for `fairness` `ok=1`.
fn check_run(
    a: &Args,
    what: &str,
    p: &mut Proc,
    want: &mut Option<String>,
) -> Result<(), BenchError> {
    let (code, g) = migrate_vm::wait_run(p, Duration::from_secs(300))?;
    let out = std::fs::read_to_string(&p.out).unwrap_or_default();
    let ok = match a.guest() {
        Guest::Count => out.contains("COUNT done") && want.as_ref().is_none_or(|w| *w == out),
        Guest::Fairness => g.ok(),
    };
    if code != Some(0) || !ok {
        return Err(BenchError::Invalid(format!(
            "{what}: the restored guest did not finish as it should (exit {code:?}): {}",
            p.stderr_head()
        )));
    }
    want.get_or_insert(out);
    Ok(())
}

fn stats_restore(path: &Path) -> Result<serde_json::Value, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", path.display())))?;
    match &v["restore"] {
        serde_json::Value::Null => Err(BenchError::Invalid(format!(
            "{}: no restore report (a vgpu-vmm older than the standby?)",
            path.display()
        ))),
        r => Ok(r.clone()),
    }
}

fn cold(
    a: &Args,
    vmm: &Path,
    dir: &Path,
    snap: &Path,
    i: usize,
    want: &mut Option<String>,
) -> Result<One, BenchError> {
    let stats = dir.join(format!("cold{i}.stats.json"));
    let mut p = Proc::spawn(
        dir,
        &format!("cold{i}"),
        vmm,
        &[
            "--restore".into(),
            snap.display().to_string(),
            format!("--stats={}", stats.display()),
            "--timeout".into(),
            "300".into(),
        ],
    )?;
    check_run(a, "cold restore", &mut p, want)?;
    Ok(One {
        report: stats_restore(&stats)?,
        request_ms: None,
    })
}

/// One request line on `socket` and its answer.
fn request(socket: &Path, line: &str) -> std::io::Result<serde_json::Value> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

/// A standby's restore (`template`: with the snapshot as its template).
fn standby(
    a: &Args,
    vmm: &Path,
    dir: &Path,
    snap: &Path,
    (i, template): (usize, bool),
    want: &mut Option<String>,
) -> Result<One, BenchError> {
    let name = format!("{}{i}", if template { "template" } else { "standby" });
    let socket = dir.join(format!("{name}.sock"));
    let stats = dir.join(format!("{name}.stats.json"));
    let mut args = a.standby_args();
    args.extend([
        "--api-socket".into(),
        socket.display().to_string(),
        format!("--stats={}", stats.display()),
    ]);
    if template {
        args.extend(["--template".into(), snap.display().to_string()]);
    }
    let mut p = Proc::spawn(dir, &name, vmm, &args)?;
    // Prepared once it answers `stats` (the socket is bound before preparing).
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(v) = request(&socket, r#"{"op":"stats"}"#)
            && v["result"]["state"] == "standby"
        {
            break;
        }
        if p.poll() || Instant::now() > until {
            return Err(BenchError::Invalid(format!(
                "{name}: not on standby: {}",
                p.stderr_head()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let line = serde_json::json!({"op": "restore", "dir": snap}).to_string();
    let t = Instant::now();
    let answer = request(&socket, &line).map_err(|source| BenchError::Io {
        path: socket.display().to_string(),
        source,
    })?;
    let request_ms = t.elapsed().as_secs_f64() * 1e3;
    if answer["ok"] != true {
        return Err(BenchError::Invalid(format!(
            "{name}: restore refused: {answer}"
        )));
    }
    check_run(a, "standby restore", &mut p, want)?;
    let report = stats_restore(&stats)?;
    if report != answer["result"] {
        return Err(BenchError::Invalid(format!(
            "{name}: --stats' restore differs from the answer: {report} / {answer}"
        )));
    }
    // The template's restore measures modules that are loaded already, or nothing.
    if template && report["modules_cold"].as_u64() != Some(0) {
        return Err(BenchError::Invalid(format!(
            "{name}: modules loaded cold although the template is the snapshot: {report}"
        )));
    }
    Ok(One {
        report,
        request_ms: Some(request_ms),
    })
}

/// p50 / p90 / max (nearest rank).
fn pct(v: &[f64]) -> serde_json::Value {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let n = v.len();
        if n == 0 {
            return 0.0;
        }
        v[((p * n as f64).ceil() as usize).clamp(1, n) - 1]
    };
    serde_json::json!({"p50": rank(0.5), "p90": rank(0.9), "max": v.last().copied().unwrap_or(0.0)})
}

fn summarize(runs: &[One]) -> serde_json::Value {
    let of = |k: &str| -> Vec<f64> { runs.iter().filter_map(|r| r.report[k].as_f64()).collect() };
    let mut parts = serde_json::Map::new();
    for k in PARTS {
        parts.insert(k.into(), report::median(&of(k)).into());
    }
    let req: Vec<f64> = runs.iter().filter_map(|r| r.request_ms).collect();
    let prepared = of("prepared_ms");
    let template = of("template_ms");
    serde_json::json!({
        "restore_to_running_ms": pct(&of("restore_to_running_ms")),
        "parts_median_ms": parts,
        "request_to_answer_ms": (!req.is_empty()).then(|| pct(&req)),
        "prepared_median_ms": (!prepared.is_empty()).then(|| report::median(&prepared)),
        "template_median_ms": (!template.is_empty()).then(|| report::median(&template)),
    })
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let vmm = procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    if a.guest() == Guest::Count && a.backend == Backend::Cuda {
        return Err(BenchError::Invalid(
            "--guest count has no GPU: --backend cuda needs --guest fairness".into(),
        ));
    }
    let dir = a.out.join(format!("runs-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let snap = snapshot(a, &vmm, &dir)?;
    let (mut cold_runs, mut standby_runs, mut template_runs) = (Vec::new(), Vec::new(), Vec::new());
    let mut want = None;
    let mut rows = Vec::new();
    for i in 0..a.reps {
        let c = cold(a, &vmm, &dir, &snap, i, &mut want)?;
        let s = standby(a, &vmm, &dir, &snap, (i, false), &mut want)?;
        let t = standby(a, &vmm, &dir, &snap, (i, true), &mut want)?;
        for (mode, r) in [(Mode::Cold, &c), (Mode::Standby, &s), (Mode::Template, &t)] {
            let mode = mode.name();
            let mut row = format!("{mode},{i},{}", r.report["restore_to_running_ms"]);
            for k in PARTS {
                row.push_str(&format!(",{}", r.report[k]));
            }
            row.push_str(&format!(
                ",{}",
                r.request_ms.map_or(String::new(), |m| format!("{m:.3}"))
            ));
            rows.push(row);
        }
        cold_runs.push(c);
        standby_runs.push(s);
        template_runs.push(t);
    }
    let guest = match a.guest() {
        Guest::Count => "count",
        Guest::Fairness => "fairness",
    };
    let summary = serde_json::json!({
        "experiment": "restore",
        "backend": a.backend.name(),
        "guest": guest,
        "guest_args": a.guest_args().join(" "),
        "standby_args": a.standby_args().join(" "),
        "reps": a.reps,
        "memory_mib": a.memory_mib,
        "snapshot_disk_bytes": migrate_vm::dir_bytes(&snap)?.0,
        "cold": summarize(&cold_runs),
        "standby": summarize(&standby_runs),
        "template": summarize(&template_runs),
    });
    report::write(
        &a.out,
        &summary,
        "restore.csv",
        &format!(
            "mode,rep,restore_to_running_ms,{},request_to_answer_ms",
            PARTS.join(",")
        ),
        &rows,
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    let p = |s: &str, k: &str| {
        summary[s]["restore_to_running_ms"][k]
            .as_f64()
            .unwrap_or(0.0)
    };
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let cp = &summary["cold"]["parts_median_ms"];
    // A standby's line: its percentiles and the medians of its parts.
    let line = |mode: &str| {
        let sp = &summary[mode]["parts_median_ms"];
        format!(
            "{mode} p50 {:.1} / p90 {:.1} ms (check {:.1}, RAM {:.1}, devices {:.1}, state {:.1}, \
             GPU {:.1}: pause {:.1}, VRAM {:.1}, modules {:.1} ({} cached, {} cold), apply {:.1}, \
             start {:.1}; \
             request to answer p50 {:.1} / p90 {:.1} ms; prepared in {:.1} ms before)",
            p(mode, "p50"),
            p(mode, "p90"),
            num(&sp["check_ms"]),
            num(&sp["ram_ms"]),
            num(&sp["devices_ms"]),
            num(&sp["state_ms"]),
            num(&sp["gpu_restore_ms"]),
            num(&sp["gpu_pause_ms"]),
            num(&sp["gpu_vram_ms"]),
            num(&sp["gpu_modules_ms"]),
            num(&sp["modules_cached"]),
            num(&sp["modules_cold"]),
            num(&sp["gpu_apply_ms"]),
            num(&sp["start_ms"]),
            num(&summary[mode]["request_to_answer_ms"]["p50"]),
            num(&summary[mode]["request_to_answer_ms"]["p90"]),
            num(&summary[mode]["prepared_median_ms"]),
        )
    };
    Ok(format!(
        "restore ({}, {guest} guest, {} MiB, {} reps): restore to running cold p50 {:.1} / p90 \
         {:.1} ms (VM {:.1}, engine {:.1}, RAM {:.1}, vCPUs {:.1}, GPU {:.1}: modules {:.1}); {}; \
         {}",
        a.backend.name(),
        a.memory_mib,
        a.reps,
        p("cold", "p50"),
        p("cold", "p90"),
        num(&cp["vm_ms"]),
        num(&cp["engine_ms"]),
        num(&cp["ram_ms"]),
        num(&cp["vcpus_ms"]),
        num(&cp["gpu_restore_ms"]),
        num(&cp["gpu_modules_ms"]),
        line("standby"),
        line("template"),
    ))
}
