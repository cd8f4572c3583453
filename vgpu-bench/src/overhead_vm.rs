//! `overhead` under a VM: runs `vgpu-vmm --guest workloads` as a child process and reads its
//! `INIT`/`RESULT` lines (per-phase times and the driver's MMIO counts, init's parts, the
//! download phase's copy and read parts) and its `--stats` JSON (per-BAR MMIO exits, shadow
//! rebuilds, the device's copy timings by destination).

use std::path::Path;
use std::process::Command;

use gpu_driver::suite_run::Phase;

use crate::error::BenchError;

/// One workload's figures from one run.
#[derive(Debug, Clone, Default)]
pub struct Bench {
    pub name: String,
    pub ok: bool,
    pub gpu_ns: u64,
    /// upload, kernel, download, free.
    pub phases: [Phase; 4],
    /// The download phase's parts ([`DOWNLOAD_PARTS`]): the copies into system memory
    /// (submitted and waited for) and the CPU reading the results.
    pub download_parts: [Phase; 2],
    /// The same reads again right after the download phase (not part of it), ns; 0 when the
    /// guest did not report it.
    pub reread_ns: u64,
}

/// The download phase's parts, in the order of [`Bench::download_parts`].
pub const DOWNLOAD_PARTS: [&str; 2] = ["download_copy", "download_read"];

/// Init's parts (`gpu_driver::InitParts::named`), in the order of [`RunData::init_parts`].
pub fn init_part_names() -> [&'static str; 6] {
    gpu_driver::InitParts::default().named().map(|(n, _)| n)
}

/// Copy jobs of one kind on the device (`counters.path.copy_*`): runs, engine time, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCopies {
    pub n: u64,
    pub ns: u64,
    pub bytes: u64,
}

/// The device's copies by destination: system memory (downloads), VRAM (uploads), and those
/// it could not classify (`direct=off`).
pub const COPY_KINDS: [&str; 3] = ["to_sysmem", "to_vram", "unclassified"];

/// One run of the suite under one configuration.
#[derive(Debug, Clone, Default)]
pub struct RunData {
    pub init: Phase,
    /// Init's parts in ns ([`init_part_names`]).
    pub init_parts: [u64; 6],
    /// The device's copy jobs by destination ([`COPY_KINDS`]).
    pub copies: [DeviceCopies; 3],
    /// Time the device spent preparing launches (module loads included), ns in total.
    pub launch_prep_ns: u64,
    /// The guest's heap high-water mark (MiB; 0 natively or when not reported).
    pub heap_used_mib: u64,
    pub benches: Vec<Bench>,
    /// Device counters (`shadow_rebuilds`, `tlb_flushes`, `doorbells`).
    pub shadow_rebuilds: u64,
    pub tlb_flushes: u64,
    pub doorbells: u64,
    /// MMIO exits the VMM counted over the whole run (every BAR); 0 natively.
    pub vm_mmio_exits: u64,
    /// Para-virtual hypercalls and the entries they carried (0 outside para mode).
    pub hypercalls: u64,
    pub para_entries: u64,
    /// Kernel launches the device ran, and doorbells it took from the doorbell page.
    pub launches: u64,
    pub bell_polled: u64,
    /// Mean submission (doorbell noticed → engine start) and completion (engine end → fence
    /// written) latencies on the device, ns (`counters.path`).
    pub submit_ns: u64,
    pub complete_ns: u64,
}

impl RunData {
    /// MMIO exits per kernel launch over the whole run (0 without launches).
    pub fn exits_per_launch(&self) -> f64 {
        if self.launches == 0 {
            0.0
        } else {
            self.vm_mmio_exits as f64 / self.launches as f64
        }
    }
}

/// Phase names, in the order of [`Bench::phases`].
pub const PHASES: [&str; 4] = ["upload", "kernel", "download", "free"];

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Parses the guest's output.
pub fn parse_output(out: &str) -> Result<RunData, BenchError> {
    let bad = |what: &str| BenchError::Invalid(format!("workloads guest output: {what}"));
    let mut d = RunData::default();
    let init = out
        .lines()
        .find(|l| l.starts_with("INIT "))
        .ok_or_else(|| bad("no INIT line"))?;
    d.init = Phase {
        ns: field(init, "init_ns").ok_or_else(|| bad("INIT without init_ns"))?,
        mmio: field(init, "init_exits").ok_or_else(|| bad("INIT without init_exits"))?,
    };
    for (v, n) in d.init_parts.iter_mut().zip(init_part_names()) {
        *v = field(init, &format!("init_{n}_ns"))
            .ok_or_else(|| bad(&format!("INIT without init_{n}_ns")))?;
    }
    d.heap_used_mib = out
        .lines()
        .find(|l| l.starts_with("HEAP "))
        .and_then(|l| field(l, "used_mib"))
        .unwrap_or(0);
    for l in out.lines().filter(|l| l.starts_with("RESULT ")) {
        let name = l
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("name="))
            .ok_or_else(|| bad("RESULT without name"))?;
        let phase = |n: &str| -> Result<Phase, BenchError> {
            Ok(Phase {
                ns: field(l, &format!("{n}_ns")).ok_or_else(|| bad(&format!("{name}: {n}_ns")))?,
                mmio: field(l, &format!("{n}_exits"))
                    .ok_or_else(|| bad(&format!("{name}: {n}_exits")))?,
            })
        };
        let mut phases = [Phase::default(); 4];
        for (p, n) in phases.iter_mut().zip(PHASES) {
            *p = phase(n)?;
        }
        let mut download_parts = [Phase::default(); 2];
        for (p, n) in download_parts.iter_mut().zip(DOWNLOAD_PARTS) {
            *p = phase(n)?;
        }
        d.benches.push(Bench {
            name: name.to_string(),
            ok: field(l, "ok") == Some(1),
            gpu_ns: field(l, "gpu_us").unwrap_or(0) * 1000,
            phases,
            download_parts,
            reread_ns: field(l, "download_reread_ns").unwrap_or(0),
        });
    }
    if d.benches.is_empty() {
        return Err(bad("no RESULT lines"));
    }
    Ok(d)
}

/// Adds the `--stats` figures to `d`.
pub fn parse_stats(d: &mut RunData, stats: &serde_json::Value) -> Result<(), BenchError> {
    let c = &stats["gpu"]["counters"];
    let get = |k: &str| {
        c[k].as_u64()
            .ok_or_else(|| BenchError::Invalid(format!("--stats: no gpu.counters.{k}")))
    };
    d.shadow_rebuilds = get("shadow_rebuilds")?;
    d.tlb_flushes = get("tlb_flushes")?;
    d.doorbells = get("doorbells")?;
    d.vm_mmio_exits = stats["mmio"]
        .as_array()
        .ok_or_else(|| BenchError::Invalid("--stats: no mmio rows".into()))?
        .iter()
        .map(|r| r["reads"].as_u64().unwrap_or(0) + r["writes"].as_u64().unwrap_or(0))
        .sum();
    d.launches = get("launches")?;
    d.bell_polled = c["bell"]["polled"].as_u64().unwrap_or(0);
    let mean = |k: &str| {
        let p = &c["path"][k];
        p["total_ns"].as_u64().unwrap_or(0) / p["n"].as_u64().unwrap_or(0).max(1)
    };
    d.submit_ns = mean("submit");
    d.complete_ns = mean("complete");
    let path = &c["path"];
    for (k, name) in d.copies.iter_mut().zip(COPY_KINDS) {
        let l = &path[format!("copy_{name}")];
        *k = DeviceCopies {
            n: l["n"].as_u64().unwrap_or(0),
            ns: l["total_ns"].as_u64().unwrap_or(0),
            bytes: path[format!("copy_{name}_bytes")].as_u64().unwrap_or(0),
        };
    }
    d.launch_prep_ns = path["launch_prep"]["total_ns"].as_u64().unwrap_or(0);
    let para = &stats["gpu"]["para"];
    d.hypercalls = para["hypercalls"].as_u64().unwrap_or(0);
    d.para_entries = para["entries"].as_u64().unwrap_or(0);
    Ok(())
}

/// Whether `vmm` accepts `--gpu gpu_opts` (a run of the `exit` guest). `Ok(Some(why))` when it
/// refuses them as a usage error.
pub fn refuses(vmm: &Path, gpu_opts: &str) -> Result<Option<String>, BenchError> {
    let out = Command::new(vmm)
        .args(["--guest", "exit", "--timeout", "60", "--gpu", gpu_opts])
        .output()
        .map_err(|source| BenchError::Io {
            path: vmm.display().to_string(),
            source,
        })?;
    Ok(match out.status.code() {
        Some(0) => None,
        _ => Some(
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("refused")
                .to_string(),
        ),
    })
}

/// Runs the suite of `size` in a VM with `--gpu gpu_opts` and extra guest arguments
/// (`memory_mib`: the VM's `--memory`, None for vgpu-vmm's default).
pub fn run(
    vmm: &Path,
    gpu_opts: &str,
    size: &str,
    guest_args: &str,
    memory_mib: Option<u64>,
    stats_path: &Path,
) -> Result<RunData, BenchError> {
    let cmdline = format!("size={size} {guest_args}");
    let mut cmd = Command::new(vmm);
    if let Some(m) = memory_mib {
        cmd.args(["--memory", &m.to_string()]);
    }
    let out = cmd
        .args([
            "--guest",
            "workloads",
            "--timeout",
            "600",
            "--gpu",
            gpu_opts,
        ])
        .args(["--cmdline", cmdline.trim()])
        .arg(format!("--stats={}", stats_path.display()))
        .output()
        .map_err(|source| BenchError::Io {
            path: vmm.display().to_string(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Exit 10 (the guest's CHECK_FAILED) means "some workload failed": still figures (ok=0 is
    // reported). Anything else (usage error, crash, timeout) is no run.
    if !matches!(out.status.code(), Some(0 | 10)) {
        return Err(BenchError::Invalid(format!(
            "vgpu-vmm --gpu {gpu_opts} size={size}: {} ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut d = parse_output(&stdout)?;
    let text = std::fs::read_to_string(stats_path).map_err(|source| BenchError::Io {
        path: stats_path.display().to_string(),
        source,
    })?;
    let stats: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Invalid(format!("{}: {e}", stats_path.display())))?;
    parse_stats(&mut d, &stats)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_guest_lines_and_refuses_incomplete_ones() {
        let out = "workloads: gpu ...\nINIT init_ns=5000 init_exits=116 init_probe_ns=1 \
            init_tables_ns=2 init_pool_alloc_ns=3 init_pool_warm_ns=4 init_map_ns=5 init_channel_ns=6\n\
            RESULT name=vecadd ok=1 gpu_us=479 exits=3 upload_ns=10 kernel_ns=20 download_ns=30 \
            free_ns=40 upload_exits=1 kernel_exits=2 download_exits=3 free_exits=4 \
            download_copy_ns=12 download_read_ns=17 download_copy_exits=3 download_read_exits=0 \
            download_reread_ns=5\n\
            HEAP used_mib=77\n";
        let d = parse_output(out).unwrap();
        assert_eq!(
            d.init,
            Phase {
                ns: 5000,
                mmio: 116
            }
        );
        assert_eq!(d.benches.len(), 1);
        let b = &d.benches[0];
        assert!(b.ok);
        assert_eq!((b.name.as_str(), b.gpu_ns), ("vecadd", 479_000));
        assert_eq!(b.phases[2], Phase { ns: 30, mmio: 3 });
        assert_eq!(
            b.download_parts,
            [Phase { ns: 12, mmio: 3 }, Phase { ns: 17, mmio: 0 }]
        );
        assert_eq!(d.init_parts, [1, 2, 3, 4, 5, 6]);
        assert_eq!(b.reread_ns, 5);
        assert_eq!(d.heap_used_mib, 77);
        // A guest that does not split init or download is refused.
        assert!(parse_output(&out.replace(" init_map_ns=5", "")).is_err());
        assert!(parse_output(&out.replace(" download_read_ns=17", "")).is_err());
        assert!(parse_output("RESULT name=x ok=1\n").is_err());
        assert!(
            parse_output("INIT init_ns=1 init_exits=1\nRESULT name=x ok=1 upload_ns=1\n").is_err()
        );
        let stats = serde_json::json!({
            "mmio": [{"reads": 2, "writes": 3}, {"reads": 1, "writes": 0}],
            "gpu": {"counters": {"shadow_rebuilds": 7, "tlb_flushes": 8, "doorbells": 9,
                                 "launches": 4, "bell": {"polled": 5},
                                 "path": {"submit": {"n": 2, "total_ns": 60},
                                          "copy_to_sysmem": {"n": 3, "total_ns": 900},
                                          "copy_to_sysmem_bytes": 4096,
                                          "launch_prep": {"n": 1, "total_ns": 70}}},
                    "para": {"hypercalls": 3, "entries": 2}}
        });
        let mut d = RunData::default();
        parse_stats(&mut d, &stats).unwrap();
        assert_eq!((d.vm_mmio_exits, d.shadow_rebuilds, d.doorbells), (6, 7, 9));
        assert_eq!((d.hypercalls, d.para_entries), (3, 2));
        assert_eq!((d.launches, d.bell_polled, d.submit_ns), (4, 5, 30));
        assert!((d.exits_per_launch() - 1.5).abs() < 1e-9);
        assert_eq!(
            d.copies[0],
            DeviceCopies {
                n: 3,
                ns: 900,
                bytes: 4096
            }
        );
        assert_eq!(
            (d.copies[1], d.launch_prep_ns),
            (DeviceCopies::default(), 70)
        );
        assert!(parse_stats(&mut d, &serde_json::json!({})).is_err());
    }
}
