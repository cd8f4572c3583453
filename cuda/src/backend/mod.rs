//! The implementations of [`crate::device::Device`] and the choice between them
//! (`VGPU_CUDA_BACKEND=guest|sim|cuda`; without it: `guest` when the virtual GPU is present,
//! else `sim`).
//!
//! - `guest` ([`guest`]): inside a VM, over the guest GPU driver; its `open` is the hook the
//!   guest backend plugs into (no `#[cfg]`: the same library runs on the host and in a guest).
//! - `sim` / `cuda` ([`host`]): in-process over a `pgpu` engine (the software GPU, or an
//!   NVIDIA GPU through the real driver).

pub mod guest;
pub mod host;

use crate::device::{Device, DeviceError};

/// PCI ids of the virtual GPU (docs/hardware.md).
pub const VGPU_VENDOR: u16 = 0x1234;
pub const VGPU_DEVICE: u16 = 0x9a01;

/// Which implementation a process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Guest,
    Sim,
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Guest => "guest",
            BackendKind::Sim => "sim",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// The backend named by `VGPU_CUDA_BACKEND`, else `guest` when the virtual GPU's PCI
/// function exists, else `sim`.
pub fn choose() -> Result<BackendKind, DeviceError> {
    match std::env::var("VGPU_CUDA_BACKEND") {
        Ok(v) => parse_kind(&v),
        Err(_) => Ok(
            if vgpu_present(std::path::Path::new("/sys/bus/pci/devices")) {
                BackendKind::Guest
            } else {
                BackendKind::Sim
            },
        ),
    }
}

/// `guest`, `sim` or `cuda`.
pub fn parse_kind(v: &str) -> Result<BackendKind, DeviceError> {
    match v {
        "guest" => Ok(BackendKind::Guest),
        "sim" => Ok(BackendKind::Sim),
        "cuda" => Ok(BackendKind::Cuda),
        other => Err(DeviceError::NoDevice(format!(
            "VGPU_CUDA_BACKEND={other}: expected guest, sim or cuda"
        ))),
    }
}

/// Whether a PCI function with the virtual GPU's vendor and device ids is listed under `dir`
/// (`/sys/bus/pci/devices/*/{vendor,device}`, text such as `0x1234`).
pub fn vgpu_present(dir: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let id = |p: std::path::PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
    };
    entries.flatten().take(4096).any(|e| {
        id(e.path().join("vendor")) == Some(VGPU_VENDOR)
            && id(e.path().join("device")) == Some(VGPU_DEVICE)
    })
}

/// Opens one context's device on `kind`.
pub fn open(kind: BackendKind) -> Result<Box<dyn Device>, DeviceError> {
    match kind {
        BackendKind::Guest => guest::open(),
        BackendKind::Sim => host::open(host::EngineKind::Sim),
        BackendKind::Cuda => host::open(host::EngineKind::Cuda),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_the_vgpu_is_found_by_its_ids() {
        assert_eq!(parse_kind("sim").unwrap(), BackendKind::Sim);
        assert_eq!(parse_kind("cuda").unwrap(), BackendKind::Cuda);
        assert!(parse_kind("gpu").is_err());
        let dir = std::env::temp_dir().join(format!("vgpu-pci-{}", std::process::id()));
        let f = dir.join("0000:00:02.0");
        std::fs::create_dir_all(&f).unwrap();
        std::fs::write(f.join("vendor"), "0x1234\n").unwrap();
        std::fs::write(f.join("device"), "0x9a00\n").unwrap();
        assert!(!vgpu_present(&dir));
        std::fs::write(f.join("device"), "0x9a01\n").unwrap();
        assert!(vgpu_present(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!vgpu_present(&dir));
    }
}
