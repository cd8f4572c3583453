//! `--stats`: exit counters per vCPU and access counters per bus region, as JSON.

use serde::Serialize;

use crate::vcpu::ExitCounts;

/// The `--stats` document.
#[derive(Debug, Serialize)]
pub struct Stats {
    pub exit_reason: String,
    pub exit_code: i32,
    /// Wall time from the first vCPU start to the exit, in milliseconds.
    pub run_ms: f64,
    pub vcpus: Vec<VcpuStats>,
    pub pio: Vec<mmio::RegionStats>,
    pub mmio: Vec<mmio::RegionStats>,
    /// The virtual GPU's counters, with `--gpu`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<vgpu::GpuStats>,
}

/// One vCPU's exits.
#[derive(Debug, Serialize)]
pub struct VcpuStats {
    pub id: u8,
    #[serde(flatten)]
    pub exits: ExitCounts,
}

/// Where `--stats` goes.
#[derive(Debug, Clone)]
pub enum StatsTarget {
    Stderr,
    File(std::path::PathBuf),
}

impl Stats {
    /// Writes the document to `target`.
    pub fn emit(&self, target: &StatsTarget) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        match target {
            StatsTarget::Stderr => {
                eprintln!("{json}");
                Ok(())
            }
            StatsTarget::File(p) => std::fs::write(p, json + "\n"),
        }
    }
}
