//! `vgpu-bench snapshot`: how fast VRAM is checkpointed and restored (issue: snapshot, restore
//! and migration; target ≥ 10 GB/s each way on an H100, where cuda-checkpoint publishes about
//! 3 GB/s save and 7 GB/s restore). A partition of `--vram` bytes with `--fill` of its pages
//! non-zero (random bytes, runs of `--run-pages` pages at random places), on `--backend`; per
//! repetition (`snapshot_vram`): the non-zero page bitmap; save to host memory (bitmap + runs
//! read once); save to a file in `--out` without and with fsync; restore from memory and from
//! the file (page cache warm, then dropped with `POSIX_FADV_DONTNEED`); then (`snapshot_vgpu`,
//! unless `--no-device`) a whole virtual GPU with that VRAM saved to memory and to a file
//! (fsync included) and restored into a fresh device from each. Figures: seconds, GB/s of
//! VRAM bytes moved (the non-zero pages) and GB/s of partition size, median over
//! repetitions. Every restore of the first repetition is checked page by page.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use pgpu::EngineSnapshot;
use pgpu::sim::{SimConfig, SimEngine};
use vgpud::units::{f64_in, human, size_in};

use crate::backend::Backend;
use crate::error::BenchError;
use crate::report::{self, Percentiles};
use crate::{snapshot_vgpu, snapshot_vram};

/// The target for VRAM save and restore on an H100/H200, GB/s.
const TARGET_GBPS: f64 = 10.0;
/// Issue 24's target for a whole-device snapshot to a file with fsync and its restore from
/// the file (VRAM 4 GiB, half filled), GB/s.
const DEVICE_FILE_TARGET_GBPS: f64 = 5.0;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output directory (summary.json, snapshot.csv; the data files are made there and removed
    /// at the end).
    #[arg(long, default_value = "vgpu-bench-out/snapshot")]
    pub out: PathBuf,
    /// The physical GPU: the software GPU or a real one through CUDA.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Partition size (K/M/G suffix; a power of two from 2M to 64G).
    #[arg(long, default_value = "256M", value_parser = size_in(2 << 20, 64 << 30, 2 << 20))]
    pub vram: u64,
    /// Fraction of the partition's pages that are not zero.
    #[arg(long, default_value_t = 0.5, value_parser = f64_in(0.0, 1.0))]
    pub fill: f64,
    /// Non-zero pages come in runs of this many 4 KiB pages (1: scattered single pages).
    #[arg(long, default_value_t = 64, value_parser = RangedU64ValueParser::<u64>::new().range(1..=1 << 24))]
    pub run_pages: u64,
    /// Repetitions.
    #[arg(long, default_value_t = 3, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub reps: usize,
    /// Skip the whole-device save/restore.
    #[arg(long)]
    pub no_device: bool,
    /// Seed of the random contents.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One measured phase of one repetition.
struct Row {
    rep: usize,
    phase: &'static str,
    seconds: f64,
    /// VRAM bytes moved (non-zero pages).
    moved: u64,
}

pub fn run(a: &Args) -> Result<String, BenchError> {
    if !a.vram.is_power_of_two() {
        return Err(BenchError::Invalid("--vram must be a power of two".into()));
    }
    // The data files: new files in the out directory (never someone else's), made before the
    // work starts and removed at the end.
    let vram_file = a.out.join("snapshot-vram.bin");
    let gpu_file = a.out.join("snapshot-gpu.bin");
    let mut made: Vec<&PathBuf> = Vec::new();
    for p in [&vram_file, &gpu_file] {
        if let Err(source) = std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(p)
        {
            for m in made {
                let _ = std::fs::remove_file(m);
            }
            return Err(BenchError::Io {
                path: p.display().to_string(),
                source,
            });
        }
        made.push(p);
    }
    let result = measure(a, &vram_file, &gpu_file);
    let _ = std::fs::remove_file(&vram_file);
    let _ = std::fs::remove_file(&gpu_file);
    result
}

fn measure(
    a: &Args,
    vram_file: &std::path::Path,
    gpu_file: &std::path::Path,
) -> Result<String, BenchError> {
    let cfg = vgpu::GpuConfig {
        vram: a.vram,
        backend: match a.backend {
            Backend::Sim => vgpu::config::Backend::Sim,
            Backend::Cuda => vgpu::config::Backend::Cuda,
        },
        ..vgpu::GpuConfig::default()
    };
    let (base, size) = (cfg.guard, cfg.vram);
    let physical = cfg.vram + 2 * cfg.guard;
    let (engine, device): (Arc<dyn EngineSnapshot>, String) = match a.backend {
        Backend::Sim => (
            Arc::new(SimEngine::new(SimConfig {
                vram_size: physical,
                ..SimConfig::default()
            })?),
            "sim".into(),
        ),
        Backend::Cuda => {
            let e = pgpu::cuda::CudaEngine::new(pgpu::cuda::CudaConfig {
                vram_size: physical,
                ..pgpu::cuda::CudaConfig::default()
            })?;
            let name = e.device_name();
            (Arc::new(e), name)
        }
    };
    let ram = if a.no_device {
        None
    } else {
        Some(snapshot_vgpu::Ram::new(&*engine)?)
    };
    let filled = snapshot_vram::fill(&*engine, base, size, a.fill, a.run_pages, a.seed)?;
    let mut mem = vec![0u8; filled.bytes as usize];
    for p in mem.chunks_mut(4096) {
        p[0] = 1;
    }
    let mut snap = Vec::with_capacity((filled.bytes + (16 << 20)) as usize);
    let mut rows = Vec::new();
    let mut image = 0u64;
    for rep in 0..a.reps {
        let t = snapshot_vram::repetition(
            &*engine,
            base,
            size,
            &filled,
            &mut mem,
            vram_file,
            rep == 0,
        )?;
        for (phase, d, moved) in [
            ("bitmap", t.bitmap, 0),
            ("save_mem", t.save_mem, filled.bytes),
            ("save_file", t.save_file, filled.bytes),
            ("save_file_fsync", t.save_file_fsync, filled.bytes),
            ("restore_mem", t.restore_mem, filled.bytes),
            ("restore_file", t.restore_file, filled.bytes),
            ("restore_file_cold", t.restore_file_cold, filled.bytes),
        ] {
            rows.push(Row {
                rep,
                phase,
                seconds: d.as_secs_f64(),
                moved,
            });
        }
        if let Some(ram) = &ram {
            if rep == 0 {
                // Warm the image buffer's pages once (not a snapshot cost).
                snap.resize(snap.capacity(), 1);
            }
            let t = snapshot_vgpu::repetition(
                &cfg,
                &engine,
                ram,
                &filled,
                &mut snap,
                gpu_file,
                rep == 0,
            )?;
            image = t.image_bytes;
            for (phase, d) in [
                ("device_save_mem", t.save_mem),
                ("device_save_file_fsync", t.save_file_fsync),
                ("device_save_stream_fsync", t.save_stream_fsync),
                ("device_restore_mem", t.restore_mem),
                ("device_restore_file", t.restore_file),
                ("device_restore_stream", t.restore_stream),
                ("file_write_fsync", t.file_write_fsync),
                ("file_read", t.file_read),
            ] {
                rows.push(Row {
                    rep,
                    phase,
                    seconds: d.as_secs_f64(),
                    moved: t.vram_bytes,
                });
            }
        }
    }
    // Guest RAM is the engine's memory: it goes first.
    drop(ram);
    drop(engine);
    output(a, &device, size, &filled, image, &rows)
}

fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-12) / 1e9
}

fn output(
    a: &Args,
    device: &str,
    size: u64,
    f: &snapshot_vram::Filled,
    image: u64,
    rows: &[Row],
) -> Result<String, BenchError> {
    let csv: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{},{},{:.6},{},{},{:.3},{:.3}",
                r.rep,
                r.phase,
                r.seconds,
                r.moved,
                size,
                gbps(r.moved, r.seconds),
                gbps(size, r.seconds)
            )
        })
        .collect();
    let mut phases = serde_json::Map::new();
    let mut median = std::collections::HashMap::new();
    let mut order: Vec<&'static str> = Vec::new();
    for r in rows {
        if !order.contains(&r.phase) {
            order.push(r.phase);
        }
    }
    for &p in &order {
        let secs: Vec<f64> = rows
            .iter()
            .filter(|r| r.phase == p)
            .map(|r| r.seconds)
            .collect();
        let moved = rows.iter().find(|r| r.phase == p).map_or(0, |r| r.moved);
        let pc = Percentiles::of(&secs);
        median.insert(p, pc.p50);
        phases.insert(
            p.into(),
            serde_json::json!({
                "seconds": pc.json(),
                "vram_bytes_moved": moved,
                "gb_per_s_moved_p50": gbps(moved, pc.p50),
                "gb_per_s_partition_p50": gbps(size, pc.p50),
            }),
        );
    }
    let m = |p: &str| median.get(p).copied().unwrap_or(0.0);
    let save = gbps(f.bytes, m("save_mem"));
    let restore = gbps(f.bytes, m("restore_mem"));
    // Where the data files were written: the file figures depend on it (tmpfs and its `huge=`).
    let out_fs = crate::mounts::of(&a.out);
    let summary = serde_json::json!({
        "experiment": "snapshot",
        "backend": a.backend.name(),
        "device": device,
        "vram_bytes": size,
        "fill": a.fill,
        "run_pages": a.run_pages,
        "nonzero_bytes": f.bytes,
        "runs": f.runs.len(),
        "reps": a.reps,
        "device_image_bytes": image,
        "notes": "save = non-zero page bitmap + each non-zero run read once; restore = zero the \
                  partition + write the pages; *_mem: to/from a host buffer touched beforehand, \
                  copied on up to 8 threads; \
                  save_file: written, not fsynced (page cache); *_fsync: fsync included; \
                  restore_file: file in the page cache; restore_file_cold: after \
                  POSIX_FADV_DONTNEED; device_*: vgpu::Vgpu save_report/restore (framing, \
                  checksum, validation) of a drained device, *_file: save_file/restore_file \
                  (lanes at offsets on several threads), *_stream: through one BufWriter or \
                  BufReader; file_*: the image's bytes written from memory by as many threads \
                  plus fsync and read back, the file system's own ceiling; GB/s are 1e9 \
                  bytes/s of VRAM bytes moved (non-zero pages) and of partition size, medians",
        "target_gb_per_s": TARGET_GBPS,
        "meets_target": a.backend == Backend::Cuda && save >= TARGET_GBPS && restore >= TARGET_GBPS,
        "device_file_target_gb_per_s": DEVICE_FILE_TARGET_GBPS,
        "out_fs": out_fs.as_ref().map(crate::mounts::Mount::json),
        "phases": phases,
    });
    report::write(
        &a.out,
        &summary,
        "snapshot.csv",
        "rep,phase,seconds,vram_bytes_moved,partition_bytes,gb_per_s_moved,gb_per_s_partition",
        &csv,
    )?;
    let g = |p: &str| gbps(f.bytes, m(p));
    let mut line = format!(
        "snapshot: {} {}, {} non-zero in {} runs: bitmap {:.2} ms; save to memory {:.2} GB/s \
         ({:.2} of partition), to a file {:.2} (fsync {:.2}); restore from memory {:.2} GB/s \
         ({:.2} of partition), from a file {:.2} (cold {:.2})",
        device,
        human(size),
        human(f.bytes),
        f.runs.len(),
        Duration::from_secs_f64(m("bitmap")).as_secs_f64() * 1e3,
        save,
        gbps(size, m("save_mem")),
        g("save_file"),
        g("save_file_fsync"),
        restore,
        gbps(size, m("restore_mem")),
        g("restore_file"),
        g("restore_file_cold"),
    );
    if !a.no_device {
        line.push_str(&format!(
            "; device save {:.2} GB/s (file+fsync {:.2}, through one writer {:.2}), restore {:.2} \
             (file {:.2}, through one reader {:.2}); the file alone: write+fsync {:.2}, read {:.2} \
             (device file target {DEVICE_FILE_TARGET_GBPS} GB/s each way; files on {})",
            g("device_save_mem"),
            g("device_save_file_fsync"),
            g("device_save_stream_fsync"),
            g("device_restore_mem"),
            g("device_restore_file"),
            g("device_restore_stream"),
            g("file_write_fsync"),
            g("file_read"),
            out_fs.as_ref().map_or_else(
                || "an unknown file system".into(),
                crate::mounts::Mount::describe
            ),
        ));
    }
    if a.backend == Backend::Cuda {
        line.push_str(&format!(
            " (target {TARGET_GBPS} GB/s each way: {})",
            if save >= TARGET_GBPS && restore >= TARGET_GBPS {
                "met"
            } else {
                "missed"
            }
        ));
    }
    Ok(line)
}
