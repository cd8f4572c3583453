//! `vgpu-bench migrate`: snapshots, restore and migration of a GPU VM running kernels (issue
//! 17). The VM is the `fairness` guest with its outputs in VRAM (`out=vram`: kernels keep
//! rewriting VRAM, the copy engine copies each output to system memory for the check).
//! Measured, `--reps` times each: a paused snapshot (time, size on disk), restore to running
//! (the VMM's own figure; the restored guest must finish `ok=1`), stop-and-copy migration
//! (downtime = the time the VM is paused), live migration with RAM and VRAM pre-copy
//! (downtime, total time, bytes per round and bytes sent more than once), and the slowdown
//! of the running VM during a live snapshot and during the live migration (the GPU's kernel
//! launches per second before vs during it, `migrate_slowdown`). Every moved or restored guest
//! must end with `ok=1`.
//!
//! `--pool-mib N --dirty-mib-per-s R` give the guest a VRAM working set of N MiB, filled before
//! its kernels start and rewritten at R MiB per second of guest time while they run
//! (`guest_programs::vram_dirty`); at its end every guest — the restored one, each migration's
//! destination, the live snapshot's VM — compares the whole set byte for byte, so a page a
//! migration left stale fails the experiment.
//!
//! Writes `--out DIR/summary.json`, `migrate.csv` (one row per measurement and per pre-copy
//! round) and `migrate-rounds.svg` (RAM and VRAM bytes per round of a live migration and a live
//! snapshot). On `--backend cuda` the restores and migration destinations run on cuda too
//! (guest RAM copied into engine memory, docs/snapshot.md).
//!
//! This module holds the command line, the plan and the summary; one repetition's VMs and
//! measurements are `migrate_rep`'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::Backend;
use crate::chart::{self, Bar, BarChart, Series};
use crate::error::BenchError;
use crate::migrate_rep::{Rep, f, one_rep};
use crate::migrate_slowdown;
use crate::procs;
use crate::report;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU engine: sim, or cuda (a real GPU; restores and destinations on cuda too).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Output directory (summary.json, migrate.csv, migrate-rounds.svg).
    #[arg(long, default_value = "vgpu-bench-out/migrate")]
    pub out: PathBuf,
    /// Repetitions of every measurement; figures are medians.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub reps: usize,
    /// VRAM of the VM in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(64..=65536))]
    pub vram_mib: u64,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=65536))]
    pub memory_mib: u64,
    /// The guest's kernels: `blocks=` of 64 threads each (their outputs are rewritten in VRAM).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub blocks: u32,
    /// MiB of VRAM the guest fills and keeps rewriting (its working set; 0: none). The VM's
    /// VRAM (`--vram-mib`) must be at least this plus 64 MiB.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=65536))]
    pub pool_mib: u64,
    /// MiB per second of guest time of the working set rewritten while kernels run.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1048576))]
    pub dirty_mib_per_s: u64,
    /// CI mode: one repetition, 64 MiB of RAM and VRAM, shorter guests.
    #[arg(long)]
    pub short: bool,
    /// Live snapshots of the slowdown measurement per repetition, the VM's first included,
    /// each after a baseline window (default: 3 with `--short`, else 5).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub live_windows: Option<usize>,
    /// More `--gpu` options (e.g. `preempt=checkpoint`).
    #[arg(long, value_name = "OPTS")]
    pub gpu_extra: Option<String>,
    /// Guest milliseconds of kernels per VM (default 8000, 4000 with `--short`): the guest
    /// must outlive a live migration and the destination's window after it, so raise it where
    /// a migration takes seconds (a 1 GiB working set on the sim engine of a small host). At
    /// most 240 s: every VMM of a run stops at its `--timeout 300`.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1000..=240_000))]
    pub guest_ms: Option<u64>,
    /// Every VMM's `--copy-nice N` (source, destination, standby): how many nice steps the
    /// threads that copy and checksum the snapshot's data run below the VMM (default 0).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..=19))]
    pub copy_nice: Option<i32>,
    /// cuda: every VMM's `--gpu copy_slots=N` in MiB (1 to 64, a power of two; 0: none): the
    /// staging slots of the snapshot and migration copies made when the VM starts. Without
    /// them the first live copy makes them while the guest runs, and that allocation stalls
    /// the guest's copy jobs (docs/performance.md, session 19). Default 64; ignored on sim.
    /// A vgpu-vmm older than session 19 refuses the key: give it `--copy-slots 0`, which is
    /// also how runs of earlier sessions were made.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = copy_slots_mib)]
    pub copy_slots: u64,
    /// Every VMM's `--copy-threads N` (default: the VMM's, one per CPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub copy_threads: Option<u64>,
    /// cuda: run the migration destinations on this CUDA device of the host
    /// (`CUDA_VISIBLE_DEVICES=N` in their environment), not on the source's GPU, as a
    /// destination on another host's GPU would be; tells the destination's own GPU work (its
    /// context, slots and VRAM writes during the rounds) apart from what the copy costs the
    /// guest. Default: the source's GPU.
    #[arg(long, value_name = "N")]
    pub dest_gpu: Option<u32>,
    /// The migration destinations: `incoming` (`vgpu-vmm --incoming`: it makes its KVM VM,
    /// guest RAM and GPU engine, the cuda context, while the pre-copy rounds run) or `standby`
    /// (`vgpu-vmm --standby`, prepared before the migration starts, then `ctl incoming`: the
    /// rounds are written into the engine it made before; its preparation is reported apart,
    /// `dest_standby_prepared_ms`).
    #[arg(long, value_enum, default_value_t = Dest::Incoming)]
    pub dest: Dest,
    /// The vgpu-vmm binary (default: next to this one).
    #[arg(long)]
    pub vmm: Option<PathBuf>,
    /// Measure the live migrations only (their downtime and the guest's slowdown during
    /// them): no paused snapshot and restore, no stop-and-copy, no live snapshots, whose
    /// figures are then null. A rep takes about a quarter of the time, for more reps of the
    /// migration's slowdown.
    #[arg(long)]
    pub live_migration_only: bool,
}

/// What receives the migrations (`--dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dest {
    Incoming,
    Standby,
}

/// The run's shape, after `--short`.
pub(crate) struct Plan {
    pub(crate) reps: usize,
    pub(crate) vram_mib: u64,
    pub(crate) memory_mib: u64,
    /// Guest milliseconds of kernels per VM.
    pub(crate) guest_ms: u64,
    /// Host time the slowdown measurement looks at before the VM's first live snapshot, and
    /// before and after a live migration.
    pub(crate) window: Duration,
    /// Live snapshots of the slowdown measurement (each after a baseline window of
    /// `baseline`; `migrate_slowdown`).
    pub(crate) live_windows: usize,
    pub(crate) baseline: Duration,
}

impl Plan {
    pub(crate) fn of(a: &Args) -> Self {
        if a.short {
            Plan {
                reps: 1,
                vram_mib: 64,
                memory_mib: 64,
                guest_ms: a.guest_ms.unwrap_or(4000),
                window: Duration::from_millis(600),
                live_windows: a.live_windows.unwrap_or(3),
                baseline: Duration::from_millis(300),
            }
        } else {
            Plan {
                reps: a.reps,
                vram_mib: a.vram_mib,
                memory_mib: a.memory_mib,
                guest_ms: a.guest_ms.unwrap_or(8000),
                window: Duration::from_millis(1500),
                live_windows: a.live_windows.unwrap_or(5),
                baseline: Duration::from_millis(500),
            }
        }
    }
}

/// `--copy-slots`: MiB that `--gpu copy_slots=` takes (its key's own check: 0, or a power of
/// two from 1 to 64).
fn copy_slots_mib(v: &str) -> Result<u64, String> {
    let n: u64 = v.parse().map_err(|_| format!("{v}: not a number of MiB"))?;
    let size = if n == 0 { "0".into() } else { format!("{n}M") };
    vgpu::GpuConfig::parse(&format!("backend=cuda,copy_slots={size}"))
        .map(|_| n)
        .map_err(|e| e.to_string())
}

/// The guest's `--memory` and `--gpu` (what a standby destination prepares).
pub(crate) fn machine_args(a: &Args, p: &Plan) -> Vec<String> {
    let mut gpu = format!("vram={}M,backend={}", p.vram_mib, a.backend.name());
    if a.backend == Backend::Cuda && a.copy_slots > 0 {
        gpu.push_str(&format!(",copy_slots={}M", a.copy_slots));
    }
    if let Some(x) = &a.gpu_extra {
        gpu.push(',');
        gpu.push_str(x);
    }
    let mut v = vec![
        "--memory".into(),
        p.memory_mib.to_string(),
        "--gpu".into(),
        gpu,
    ];
    v.extend(copy_args(a));
    v
}

/// The copy pool's options every VMM of a run gets (`--copy-nice`, `--copy-threads`).
pub(crate) fn copy_args(a: &Args) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(n) = a.copy_nice {
        v.extend(["--copy-nice".into(), n.to_string()]);
    }
    if let Some(n) = a.copy_threads {
        v.extend(["--copy-threads".into(), n.to_string()]);
    }
    v
}

/// The VMM command line of the guest.
pub(crate) fn vm_args(a: &Args, p: &Plan) -> Vec<String> {
    let mut args = vec!["--guest".to_string(), "fairness".into()];
    args.extend([
        "--timeout".into(),
        "300".into(),
        "--cmdline".into(),
        format!(
            "iters=20000 threads=64 blocks={} depth=3 ms={} report_ms=20 out=vram{}",
            a.blocks,
            p.guest_ms,
            pool_args(a)
        ),
    ]);
    args.extend(machine_args(a, p));
    args
}

/// The guest's working-set arguments (with room for the driver's own VRAM pool buffers and its
/// staging buffers in system memory).
fn pool_args(a: &Args) -> String {
    match a.pool_mib {
        0 => String::new(),
        n => format!(
            " pool_mib={n} dirty_mib_s={} vpool_mib={} sys_mib=32",
            a.dirty_mib_per_s,
            n + 16
        ),
    }
}

/// The source's parts of a downtime (`src_*`), each the median over the reps.
fn src_parts(reps: &[Rep], of: impl Fn(&Rep) -> serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for key in SRC_KEYS {
        let v: Vec<f64> = reps.iter().filter_map(|r| of(r)[key].as_f64()).collect();
        if !v.is_empty() {
            out.insert(key.to_string(), median(v).into());
        }
    }
    serde_json::Value::Object(out)
}

/// The source's parts of the downtime (`vmm::snapshot::source_report::SrcDowntime`).
const SRC_KEYS: [&str; 7] = [
    "src_pause_vcpus_ms",
    "src_pause_gpu_ms",
    "src_harvest_ms",
    "src_ram_ms",
    "src_state_ms",
    "src_gpu_image_ms",
    "src_end_ms",
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// CSV rows of a pre-copy report's rounds.
fn round_rows(what: &str, rep: usize, report: &serde_json::Value) -> Vec<String> {
    report["rounds"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    format!(
                        "{what},{rep},{},{:.3},{},{},{},{},{},",
                        r["round"],
                        f(r, "ms"),
                        if r["paused"] == true { f(r, "ms") } else { 0.0 },
                        r["ram_bytes"],
                        r["ram_resent_bytes"],
                        r["vram_bytes"],
                        r["vram_resent_bytes"]
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The chart: RAM and VRAM MiB per round of the first live migration (sim) and live snapshot.
fn draw_rounds(path: &Path, reps: &[Rep]) -> Result<(), BenchError> {
    let mut groups = Vec::new();
    let (mut ram, mut vram) = (Vec::new(), Vec::new());
    let mut add = |what: &str, report: &serde_json::Value| {
        for r in report["rounds"].as_array().into_iter().flatten() {
            let label = if r["paused"] == true {
                format!("{what} paused")
            } else {
                format!("{what} {}", r["round"])
            };
            groups.push(label);
            let mib = |k: &str| r[k].as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64;
            ram.push(Bar::with_range(mib("ram_bytes"), &[]));
            vram.push(Bar::with_range(mib("vram_bytes"), &[]));
        }
    };
    if let Some(r) = reps.first() {
        if let Some((_, _, report)) = &r.live {
            add("migrate", report);
        }
        add("snapshot", &r.live_snapshot);
    }
    let ram = Series {
        config: "RAM".into(),
        bars: ram,
    };
    let vram = Series {
        config: "VRAM".into(),
        bars: vram,
    };
    chart::draw(
        path,
        &BarChart {
            title: "Live migration and live snapshot: bytes sent per pre-copy round".into(),
            note: "Rounds 0..n run with the VM and its GPU running; 'paused' is the last round \
                   (VRAM: pages written since the previous round)."
                .into(),
            y_desc: "MiB sent".into(),
            groups,
            dividers: Vec::new(),
            reference: 0.0,
            series: vec![&ram, &vram],
        },
    )
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    let vmm = procs::sibling(a.vmm.as_deref(), "vgpu-vmm")?;
    let p = Plan::of(a);
    if a.dest_gpu.is_some() && a.backend != Backend::Cuda {
        return Err(BenchError::Invalid(
            "--dest-gpu is for --backend cuda (a sim engine has no device to choose)".into(),
        ));
    }
    if a.pool_mib > 0 && p.vram_mib < a.pool_mib + 64 {
        return Err(BenchError::Invalid(format!(
            "--pool-mib {} needs --vram-mib of at least {} (the VM's VRAM holds the working set, \
             the driver's tables and buffers)",
            a.pool_mib,
            a.pool_mib + 64
        )));
    }
    // The VMs' consoles, logs and snapshots: a directory of this run's own (removed at the
    // end; left for a look when the experiment fails).
    let dir = a.out.join(format!("runs-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|source| BenchError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut reps = Vec::new();
    for i in 0..p.reps {
        reps.push(one_rep(a, &p, &vmm, &dir, i)?);
    }
    let mut rows = Vec::new();
    let all = !a.live_migration_only;
    for (i, r) in reps.iter().enumerate() {
        if all {
            rows.push(format!(
                "snapshot,{i},,{:.3},{:.3},,,,,{}",
                r.snapshot_ms, r.snapshot_ms, r.snapshot_disk_bytes
            ));
        }
        if let Some(ms) = r.restore_ms {
            rows.push(format!("restore,{i},,{ms:.3},,,,,,"));
        }
        if let Some((ms, paused)) = r.stop_copy {
            rows.push(format!("stop_copy,{i},,{ms:.3},{paused:.3},,,,,"));
        }
        if let Some((ms, paused, report)) = &r.live {
            rows.push(format!(
                "live_migrate,{i},,{ms:.3},{paused:.3},{},{},{},{},",
                report["ram_bytes"],
                report["ram_resent_bytes"],
                report["vram_bytes"],
                report["vram_resent_bytes"]
            ));
            rows.extend(round_rows("live_migrate_round", i, report));
        }
        if !all {
            continue;
        }
        rows.push(format!(
            "live_snapshot,{i},,{:.3},{:.3},{},{},{},{},",
            r.live_snapshot_ms,
            r.live_snapshot_paused_ms,
            r.live_snapshot["ram_bytes"],
            r.live_snapshot["ram_resent_bytes"],
            r.live_snapshot["vram_bytes"],
            r.live_snapshot["vram_resent_bytes"]
        ));
        rows.extend(round_rows("live_snapshot_round", i, &r.live_snapshot));
    }
    let med = |g: &dyn Fn(&Rep) -> Option<f64>| {
        let v: Vec<f64> = reps.iter().filter_map(g).collect();
        (!v.is_empty()).then(|| median(v))
    };
    let progress_slowdown =
        med(&|r| (r.rate_before > 0.0).then(|| 1.0 - r.rate_during / r.rate_before));
    // The launch-counted windows of every rep together.
    let windows: Vec<_> = reps.iter().flat_map(|r| r.windows.clone()).collect();
    let mut counted = migrate_slowdown::summary(&windows);
    let per_rep: Vec<&[migrate_slowdown::Window]> =
        reps.iter().map(|r| r.windows.as_slice()).collect();
    let medians = migrate_slowdown::median_of(&per_rep);
    counted["slowdown_median_of_reps"] = medians["slowdown_median_of_reps"].clone();
    counted["slowdown_per_rep"] = medians["slowdown_per_rep"].clone();
    let slowdown = counted["slowdown"].as_f64();
    // The live migrations' windows (one per rep), and the median of the reps.
    let mig: Vec<_> = reps.iter().filter_map(|r| r.live_window.clone()).collect();
    let mut mig_counted = migrate_slowdown::migration_summary(&mig);
    let mig_per_rep: Vec<&[migrate_slowdown::Window]> = mig.chunks(1).collect();
    let mig_medians = migrate_slowdown::median_of(&mig_per_rep);
    mig_counted["slowdown_median_of_reps"] = mig_medians["slowdown_median_of_reps"].clone();
    mig_counted["slowdown_per_rep"] = mig_medians["slowdown_per_rep"].clone();
    // The destinations' parts of the downtime, each the median over the reps.
    let dest = |k: usize| {
        let mut out = serde_json::Map::new();
        for key in DEST_KEYS {
            let num = |v: &serde_json::Value| v.as_f64().or(v.as_bool().map(f64::from));
            if let Some(v) = med(&|r| num(&r.dest[k][key])) {
                out.insert(key.to_string(), v.into());
            }
        }
        serde_json::Value::Object(out)
    };
    let mut summary = serde_json::json!({
        "experiment": "migrate",
        "live_migration_only": a.live_migration_only,
        "backend": a.backend.name(),
        "reps": p.reps,
        "vram_mib": p.vram_mib,
        "memory_mib": p.memory_mib,
        "guest": vm_args(a, &p).join(" "),
        "dest_gpu": a.dest_gpu,
        "copy_slots_mib": (a.backend == Backend::Cuda).then_some(a.copy_slots),
        "dest": format!("{:?}", a.dest).to_lowercase(),
        "vram_working_set": {
            "mib": a.pool_mib,
            "dirty_mib_per_s": a.dirty_mib_per_s,
            "checked_byte_for_byte": a.pool_mib > 0,
        },
        "snapshot_paused": {
            "ms": med(&|r| Some(r.snapshot_ms)),
            "disk_bytes": med(&|r| Some(r.snapshot_disk_bytes as f64)),
            "apparent_bytes": med(&|r| Some(r.snapshot_apparent_bytes as f64)),
            "gpu_bytes": med(&|r| Some(r.snapshot_gpu_bytes as f64)),
        },
        "restore_to_running_ms": med(&|r| r.restore_ms),
        "stop_copy": {
            "downtime_ms": med(&|r| r.stop_copy.map(|s| s.1)),
            "total_ms": med(&|r| r.stop_copy.map(|s| s.0)),
            "dest": dest(0),
            "src": src_parts(&reps, |r| r.stop_downtime.clone()),
        },
        "live_migration": {
            "downtime_ms": med(&|r| r.live.as_ref().map(|s| s.1)),
            "total_ms": med(&|r| r.live.as_ref().map(|s| s.0)),
            "first_report": reps.first().and_then(|r| r.live.as_ref().map(|l| l.2.clone())),
            "dest": dest(1),
            "src": src_parts(&reps, |r| r.live_downtime.clone()),
            // The source's wait for the destination's engine before the paused round.
            "src_wait_dest_ready_ms": med(&|r| r
                .live
                .as_ref()
                .and_then(|l| l.2["dest_ready"]["src_wait_dest_ready_ms"].as_f64())),
            "dest_ready_outcomes": reps
                .iter()
                .filter_map(|r| r.live.as_ref().map(|l| l.2["dest_ready"]["outcome"].clone()))
                .collect::<Vec<_>>(),
            "slowdown": mig_counted["slowdown"],
            "launch_windows": mig_counted,
        },
        "live_snapshot": {
            "paused_ms": med(&|r| Some(r.live_snapshot_paused_ms)),
            "total_ms": med(&|r| Some(r.live_snapshot_ms)),
            "first_report": reps.first().map(|r| r.live_snapshot.clone()),
            "kernels_per_s_before": med(&|r| Some(r.rate_before)),
            "kernels_per_s_during": med(&|r| Some(r.rate_during)),
            "slowdown_guest_progress": progress_slowdown,
            "slowdown": slowdown,
            "launch_windows": counted,
            "downtime": reps.first().map(|r| r.live_snapshot["downtime"].clone()),
        },
    });
    if !all {
        // Not measured (`--live-migration-only`).
        summary["snapshot_paused"] = serde_json::Value::Null;
        summary["live_snapshot"] = serde_json::Value::Null;
    }
    report::write(
        &a.out,
        &summary,
        "migrate.csv",
        "measurement,rep,round,ms,paused_ms,ram_bytes,ram_resent_bytes,vram_bytes,vram_resent_bytes,disk_bytes",
        &rows,
    )?;
    draw_rounds(&a.out.join("migrate-rounds.svg"), &reps)?;
    let _ = std::fs::remove_dir_all(&dir);
    let ms = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |x| format!("{x:.1} ms"));
    let d = &summary["live_migration"]["dest"];
    Ok(format!(
        "migrate ({}{}): snapshot {} ({:.1} MiB on disk), restore {}, stop-and-copy downtime {}, \
         live migration downtime {} of {}, live snapshot paused {} of {}, slowdown {}; live \
         migration's destination: switch-over {} (drain {}, check {}, build {} of which RAM {}, \
         GPU restore {}, state {}), engine made in {} during the rounds: {}, VRAM pages written \
         during the rounds {} / after the switch-over {}; the source waited {} for it before \
         pausing ({})",
        a.backend.name(),
        a.dest_gpu
            .map_or(String::new(), |n| format!(", destinations on GPU {n}"))
            + &match a.dest {
                Dest::Incoming => String::new(),
                Dest::Standby => format!(
                    ", destinations standbys prepared in {} before the migration",
                    ms(&d["dest_standby_prepared_ms"])
                ),
            },
        ms(&summary["snapshot_paused"]["ms"]),
        summary["snapshot_paused"]["disk_bytes"]
            .as_f64()
            .unwrap_or(0.0)
            / (1u64 << 20) as f64,
        ms(&summary["restore_to_running_ms"]),
        ms(&summary["stop_copy"]["downtime_ms"]),
        ms(&summary["live_migration"]["downtime_ms"]),
        ms(&summary["live_migration"]["total_ms"]),
        ms(&summary["live_snapshot"]["paused_ms"]),
        ms(&summary["live_snapshot"]["total_ms"]),
        slowdown.map_or("-".into(), |s| format!("{:.1}%", s * 100.0)),
        ms(&d["dest_switch_ms"]),
        ms(&d["dest_drain_ms"]),
        ms(&d["dest_check_ms"]),
        ms(&d["dest_build_ms"]),
        ms(&d["dest_ram_ms"]),
        ms(&d["dest_gpu_restore_ms"]),
        ms(&d["dest_state_ms"]),
        ms(&d["dest_engine_ms"]),
        d["dest_prepared"].as_f64().is_some_and(|v| v > 0.0),
        d["dest_vram_pages_early"],
        d["dest_vram_pages_switch"],
        ms(&summary["live_migration"]["src_wait_dest_ready_ms"]),
        summary["live_migration"]["dest_ready_outcomes"],
    ) + &slowdown_line(&summary))
}

/// The tail of the printed line: how the slowdown was counted, and the source's parts of the
/// live migration's downtime.
fn slowdown_line(summary: &serde_json::Value) -> String {
    let c = &summary["live_snapshot"]["launch_windows"];
    let num = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |x| format!("{x:.1}"));
    let pct = |v: &serde_json::Value| {
        v.as_f64()
            .map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
    };
    let s = &summary["live_migration"]["src"];
    let m = &summary["live_migration"]["launch_windows"];
    format!(
        " (GPU launches over {} live windows: {}/s before, {}/s during, {} during the rounds \
         only, {} without the tails after the resume, {} over the VMs' first windows, {} over \
         the others, median of the reps {}, {} launches lost; guest progress lines: {}); live migration's source: pause vCPUs {} ms, \
         GPU {} ms, harvest {} ms, RAM {} ms, state {} ms, GPU image {} ms, end {} ms; live \
         migration's slowdown by GPU launches over {} migrations: {} (rounds only {}; median of \
         the reps {}), {}/s before, {}/s during, {} launches lost; the destination's first \
         window after the switch-over {}/s ({})",
        c["windows"],
        num(&c["launches_per_s_before"]),
        num(&c["launches_per_s_during"]),
        pct(&c["slowdown_rounds"]),
        pct(&c["slowdown_without_tail"]),
        pct(&c["slowdown_first_windows"]),
        pct(&c["slowdown_later_windows"]),
        pct(&c["slowdown_median_of_reps"]),
        num(&c["launches_lost"]),
        pct(&summary["live_snapshot"]["slowdown_guest_progress"]),
        num(&s["src_pause_vcpus_ms"]),
        num(&s["src_pause_gpu_ms"]),
        num(&s["src_harvest_ms"]),
        num(&s["src_ram_ms"]),
        num(&s["src_state_ms"]),
        num(&s["src_gpu_image_ms"]),
        num(&s["src_end_ms"]),
        m["windows"],
        pct(&m["slowdown"]),
        pct(&m["slowdown_rounds"]),
        pct(&m["slowdown_median_of_reps"]),
        num(&m["launches_per_s_before"]),
        num(&m["launches_per_s_during"]),
        num(&m["launches_lost"]),
        num(&m["dest_first_window"]["launches_per_s"]),
        pct(&m["dest_first_window"]["slowdown"]),
    )
}

/// The destination's figures (`vmm::snapshot::incoming::IncomingReport`, its `--stats`).
const DEST_KEYS: [&str; 12] = [
    "dest_standby_prepared_ms",
    "dest_switch_ms",
    "dest_drain_ms",
    "dest_check_ms",
    "dest_build_ms",
    "dest_ram_ms",
    "dest_gpu_restore_ms",
    "dest_state_ms",
    "dest_engine_ms",
    "dest_vram_pages_early",
    "dest_vram_pages_switch",
    "dest_prepared",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_slots_take_what_the_vmm_takes() {
        for ok in [0, 1, 2, 32, 64] {
            assert_eq!(copy_slots_mib(&ok.to_string()), Ok(ok));
        }
        for bad in ["3", "48", "128", "-1", "64M", ""] {
            assert!(copy_slots_mib(bad).is_err(), "{bad}");
        }
    }
}
