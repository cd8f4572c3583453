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
    /// The live snapshots and migrations made (`ctl ... --live`): per round the RAM and VRAM
    /// bytes sent and how many were sent more than once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub live: Vec<crate::snapshot::precopy::Report>,
    /// A migration's destination (`--incoming`): what it did when, its part of the downtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incoming: Option<crate::snapshot::incoming::IncomingReport>,
    /// A restored VM (`--restore`, `--incoming`, a standby's `restore`): the restore's parts
    /// and its restore-to-running time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::snapshot::restore_report::RestoreReport>,
}

/// One vCPU's exits.
#[derive(Debug, Serialize)]
pub struct VcpuStats {
    pub id: u8,
    #[serde(flatten)]
    pub exits: ExitCounts,
}

/// Where `--stats` goes: stderr, or a file opened (created if missing) before the VM starts,
/// so that a bad path is a usage error at once rather than a lost result after the run.
#[derive(Debug)]
pub enum StatsTarget {
    Stderr,
    File {
        path: std::path::PathBuf,
        file: std::fs::File,
        /// This run created the file (removed again if the VM never ran).
        created: bool,
    },
}

impl StatsTarget {
    /// `-` for stderr, else a file path: an existing regular file (not truncated until the
    /// document is written) or a new file in an existing directory.
    pub fn open(arg: &str) -> std::io::Result<Self> {
        use std::io::{Error, ErrorKind};
        if arg == "-" {
            return Ok(StatsTarget::Stderr);
        }
        let path = std::path::PathBuf::from(arg);
        let named = |e: Error| Error::new(e.kind(), format!("{arg}: {e}"));
        let existed = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => true,
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("{arg}: not a regular file"),
                ));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(named(e)),
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(named)?;
        Ok(StatsTarget::File {
            path,
            file,
            created: !existed,
        })
    }

    /// Writes `stats` (a file is truncated first).
    pub fn emit(self, stats: &Stats) -> std::io::Result<()> {
        use std::io::Write;
        let json = serde_json::to_string_pretty(stats).map_err(std::io::Error::other)?;
        match self {
            StatsTarget::Stderr => {
                eprintln!("{json}");
                Ok(())
            }
            StatsTarget::File { mut file, .. } => {
                file.set_len(0)?;
                file.write_all((json + "\n").as_bytes())?;
                file.sync_data()
            }
        }
    }

    /// Nothing will be written: removes the file if this run created it.
    pub fn discard(self) {
        if let StatsTarget::File {
            path,
            created: true,
            ..
        } = self
        {
            let _ = std::fs::remove_file(path);
        }
    }
}
