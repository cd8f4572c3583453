//! `manifest.json`: what a snapshot is (format version, the vgpu-vmm version that wrote it) and
//! what VM it needs (memory, vCPUs, boot kind, devices), with the names, sizes and checksums
//! of its other files. Read with a size limit and checked before anything is built.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::format::{MAX_STATE_BYTES, VERSION};

/// The manifest's file name.
pub const FILE: &str = "manifest.json";
/// The state file's name.
pub const STATE_FILE: &str = "state.bin";
/// The RAM file's name.
pub const RAM_FILE: &str = "ram.bin";
/// The GPU image's name (snapshots of VMs with `--gpu`).
pub const GPU_FILE: &str = super::gpu::FILE;
/// The pre-copied VRAM of a live snapshot (`gpu_live`).
pub const VRAM_FILE: &str = "vram.bin";
/// Largest manifest read.
pub const MAX_MANIFEST: u64 = 64 << 10;
/// The `format` field.
pub const FORMAT: &str = "vgpu-vmm-snapshot";

/// How the guest was booted (a restore needs the same devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootKind {
    /// A bundled or ELF bare-metal guest.
    BareMetal,
    /// A Linux kernel (adds the CMOS and POST ports).
    Linux,
}

/// The manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version ([`VERSION`]).
    pub version: u32,
    /// The vgpu-vmm version that wrote the snapshot (informational).
    pub vmm_version: String,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// vCPUs.
    pub cpus: u8,
    pub boot: BootKind,
    /// What was booted (`--guest` name or `--kernel` path; informational).
    pub image: String,
    /// The PCI test device is attached.
    pub testdev: bool,
    /// The virtual GPU's configuration (`--gpu` syntax), if one is attached.
    pub gpu: Option<String>,
    /// TSC frequency of the vCPUs in kHz (0 if unknown).
    pub tsc_khz: u64,
    /// The MSRs saved per vCPU (those of KVM_GET_MSR_INDEX_LIST this KVM lets us read).
    pub msrs: usize,
    /// The state file: its length and CRC-32.
    pub state_bytes: u64,
    pub state_crc32: u32,
    /// The RAM file: its length (= memory_mib MiB) and the pages stored in it.
    pub ram_bytes: u64,
    pub ram_pages: u64,
    /// The GPU image (`gpu.bin`, with `gpu` only): its length and CRC-32; 0 without a GPU.
    #[serde(default)]
    pub gpu_bytes: u64,
    #[serde(default)]
    pub gpu_crc32: u32,
    /// A live snapshot of the GPU: its VRAM was pre-copied (into `vram.bin`, exactly the VRAM
    /// size, or a migration's VRAM frames) and `gpu.bin` holds the pages written since
    /// (`VDLT`). False otherwise (then `gpu.bin` holds all VRAM).
    #[serde(default)]
    pub gpu_live: bool,
    /// The disks attached (read-only: snapshots of writable disks are refused), in order;
    /// each reopened at restore, which fails if its size changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<crate::disk::DiskSpec>,
}

/// Why a manifest is refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("read {FILE}: {0}")]
    Read(std::io::Error),
    #[error("{FILE} is larger than {MAX_MANIFEST} bytes")]
    TooLarge,
    #[error("{FILE}: {0}")]
    Json(serde_json::Error),
    #[error("{FILE}: format {0:?} is not {FORMAT:?}")]
    Format(String),
    #[error("{FILE}: format version {found}, this build reads version {VERSION}")]
    Version { found: u32 },
    #[error("{FILE}: {0}")]
    Invalid(String),
}

/// The largest GPU image accepted for a GPU with `vram` bytes of VRAM: every VRAM page with
/// its run header, and room for the rest (registers, channels, module texts, contexts).
pub fn max_gpu_bytes(vram: u64) -> u64 {
    vram + vram / 4096 * 12 + MAX_STATE_BYTES
}

impl Manifest {
    /// Reads and checks `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Self, ManifestError> {
        use std::io::Read;
        let f = std::fs::File::open(dir.join(FILE)).map_err(ManifestError::Read)?;
        let mut text = String::new();
        f.take(MAX_MANIFEST + 1)
            .read_to_string(&mut text)
            .map_err(ManifestError::Read)?;
        Self::parse(text.as_bytes())
    }

    /// Parses and checks a manifest's text.
    pub fn parse(text: &[u8]) -> Result<Self, ManifestError> {
        if text.len() as u64 > MAX_MANIFEST {
            return Err(ManifestError::TooLarge);
        }
        let m: Manifest = serde_json::from_slice(text).map_err(ManifestError::Json)?;
        m.check()?;
        Ok(m)
    }

    /// Checks the fields against this build's limits.
    pub fn check(&self) -> Result<(), ManifestError> {
        if self.format != FORMAT {
            return Err(ManifestError::Format(self.format.clone()));
        }
        if self.version != VERSION {
            return Err(ManifestError::Version {
                found: self.version,
            });
        }
        let bad = |s: String| Err(ManifestError::Invalid(s));
        if !(2..=crate::memory::MAX_MEMORY_MIB).contains(&self.memory_mib) {
            return bad(format!(
                "memory_mib {} is outside 2..={}",
                self.memory_mib,
                crate::memory::MAX_MEMORY_MIB
            ));
        }
        if self.cpus == 0 {
            return bad("cpus is 0".into());
        }
        if self.disks.len() > crate::disk::MAX_DISKS {
            return bad(format!("more than {} disks", crate::disk::MAX_DISKS));
        }
        if let Some(d) = self.disks.iter().find(|d| !d.read_only) {
            return bad(format!("disk {} is writable", d.path.display()));
        }
        if !self.disks.is_empty() && self.boot != BootKind::Linux {
            return bad("disks on a bare-metal guest".into());
        }
        if self.ram_bytes != self.memory_mib << 20 {
            return bad(format!(
                "ram_bytes {} is not memory_mib {} MiB",
                self.ram_bytes, self.memory_mib
            ));
        }
        if self.ram_pages > self.ram_bytes / 4096 {
            return bad(format!("ram_pages {} exceeds the RAM", self.ram_pages));
        }
        if self.state_bytes > MAX_STATE_BYTES {
            return bad(format!(
                "state_bytes {} is more than the {MAX_STATE_BYTES} accepted",
                self.state_bytes
            ));
        }
        if self.gpu.is_none() && (self.gpu_bytes != 0 || self.gpu_crc32 != 0 || self.gpu_live) {
            return bad("gpu_bytes/gpu_crc32/gpu_live without a gpu".into());
        }
        if let Some(g) = &self.gpu {
            let vram = vgpu::GpuConfig::parse(g)
                .map_err(|e| ManifestError::Invalid(format!("gpu {g:?}: {e}")))?
                .vram;
            if self.gpu_bytes > max_gpu_bytes(vram) {
                return bad(format!(
                    "gpu_bytes {} is more than a {vram}-byte VRAM can need",
                    self.gpu_bytes
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Linux manifest with `disks` (a JSON array; None: the field left out).
    fn linux_with_disks(disks: Option<&str>) -> String {
        let field = disks.map_or(String::new(), |d| format!(r#","disks":{d}"#));
        format!(
            r#"{{"format":"{FORMAT}","version":{VERSION},"vmm_version":"0","memory_mib":256,"cpus":1,"boot":"linux","image":"linux","testdev":false,"gpu":null,"tsc_khz":0,"msrs":0,"state_bytes":0,"state_crc32":0,"ram_bytes":268435456,"ram_pages":0{field}}}"#
        )
    }

    #[test]
    fn disks_must_be_read_only_and_few() {
        let d = r#"{"path":"/a.img","read_only":true,"bytes":4096}"#;
        let one = format!("[{d}]");
        let m = Manifest::parse(linux_with_disks(Some(&one)).as_bytes()).unwrap();
        assert_eq!(m.disks.len(), 1);
        assert_eq!(m.disks[0].bytes, 4096);
        let rw = r#"[{"path":"/a.img","read_only":false,"bytes":4096}]"#;
        assert!(matches!(
            Manifest::parse(linux_with_disks(Some(rw)).as_bytes()),
            Err(ManifestError::Invalid(_))
        ));
        let five = format!("[{d},{d},{d},{d},{d}]");
        assert!(matches!(
            Manifest::parse(linux_with_disks(Some(&five)).as_bytes()),
            Err(ManifestError::Invalid(_))
        ));
        let bare =
            linux_with_disks(Some(&one)).replace(r#""boot":"linux""#, r#""boot":"bare-metal""#);
        assert!(matches!(
            Manifest::parse(bare.as_bytes()),
            Err(ManifestError::Invalid(_))
        ));
        // A manifest without the field (every older snapshot) has no disks.
        let none = linux_with_disks(None);
        assert!(!none.contains("disks"));
        assert!(Manifest::parse(none.as_bytes()).unwrap().disks.is_empty());
    }
}
