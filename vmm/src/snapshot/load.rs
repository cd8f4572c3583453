//! Reading a snapshot directory for `--restore`: the manifest, the state file (bounded, its
//! length and CRC-32 as the manifest says, then decoded section by section) and the RAM file
//! (exactly the manifest's size) and, for a VM with a GPU, the GPU image's size, all checked
//! before any VM is built (the GPU image's checksum and content as the device reads it, before
//! the guest runs).

use std::io::Read;
use std::path::Path;

use super::format::{DecodeError, MAX_STATE_BYTES};
use super::manifest::{self, BootKind, Manifest, ManifestError};
use super::ram::{self, RamError};
use super::state::MachineState;

/// Why a snapshot cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}: not a directory")]
    NotADir(std::path::PathBuf),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{file}: {err}")]
    Open {
        file: &'static str,
        err: std::io::Error,
    },
    #[error("{file} is {found} bytes, the manifest says {want}")]
    StateSize {
        file: &'static str,
        found: u64,
        want: u64,
    },
    #[error("{file} is corrupted: CRC-32 {found:#010x}, the manifest says {want:#010x}")]
    StateChecksum {
        file: &'static str,
        found: u32,
        want: u32,
    },
    #[error("state.bin: {0}")]
    State(#[from] DecodeError),
    #[error("the state file has {found} vCPUs, the manifest {want}")]
    Vcpus { found: usize, want: u8 },
    #[error("the state file {has} CMOS state but the manifest's boot kind is {boot:?}")]
    Cmos { has: &'static str, boot: BootKind },
    #[error("the state file and the manifest disagree on the PCI test device")]
    Testdev,
    #[error("the state file holds {state} disk sections, the manifest lists {listed} disks")]
    Disks { state: usize, listed: usize },
    #[error("ram.bin: {0}")]
    Ram(#[from] RamError),
    #[error("the manifest has a virtual GPU ({0}) but its image ({file}) is missing", file = manifest::GPU_FILE)]
    Gpu(String),
    #[error(
        "the manifest's gpu_live and the pre-copied VRAM ({file}) disagree",
        file = manifest::VRAM_FILE
    )]
    VramBase,
    #[error("{file} is {found} bytes, the manifest says {want}")]
    GpuSize {
        file: &'static str,
        found: u64,
        want: u64,
    },
}

/// The GPU image of a snapshot: the file, its length and CRC-32 as the manifest says (the
/// checksum is checked while the device reads it, [`super::gpu::CheckedReader`]).
#[derive(Debug)]
pub struct GpuImage {
    pub file: std::fs::File,
    pub bytes: u64,
    pub crc32: u32,
    /// A live snapshot's pre-copied VRAM (the manifest's `gpu_live`); its size is checked by
    /// the device (`Vgpu::restore_live`).
    pub vram_base: Option<std::fs::File>,
    /// A migration's destination: the engine made during the pre-copy rounds, with
    /// `vram_base` written into it ([`super::incoming`]).
    pub prepared: Option<super::incoming::Prepared>,
}

/// A snapshot read and checked.
#[derive(Debug)]
pub struct Loaded {
    pub manifest: Manifest,
    pub state: MachineState,
    /// The RAM file, open for reading, of the manifest's size.
    pub ram: std::fs::File,
    /// The GPU image (exactly when the manifest has a `gpu`).
    pub gpu: Option<GpuImage>,
    /// A migration's destination: its figures so far, and when the stream's end arrived.
    pub incoming: Option<(super::incoming::IncomingReport, std::time::Instant)>,
}

/// Reads and checks the snapshot in `dir`.
pub fn load(dir: &Path) -> Result<Loaded, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::NotADir(dir.into()));
    }
    let manifest = Manifest::read(dir)?;
    let open = |file: &'static str| {
        std::fs::File::open(dir.join(file)).map_err(|err| LoadError::Open { file, err })
    };
    let state_file = open(manifest::STATE_FILE)?;
    let mut bytes = Vec::new();
    state_file
        .take(MAX_STATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| LoadError::Open {
            file: manifest::STATE_FILE,
            err,
        })?;
    let ram = open(manifest::RAM_FILE)?;
    let gpu = match &manifest.gpu {
        Some(_) => {
            let file = open(manifest::GPU_FILE)?;
            let found = file
                .metadata()
                .map_err(|err| LoadError::Open {
                    file: manifest::GPU_FILE,
                    err,
                })?
                .len();
            if found != manifest.gpu_bytes {
                return Err(LoadError::GpuSize {
                    file: manifest::GPU_FILE,
                    found,
                    want: manifest.gpu_bytes,
                });
            }
            let vram_base = if manifest.gpu_live {
                Some(open(manifest::VRAM_FILE)?)
            } else {
                None
            };
            Some(GpuImage {
                file,
                bytes: manifest.gpu_bytes,
                crc32: manifest.gpu_crc32,
                vram_base,
                prepared: None,
            })
        }
        None => None,
    };
    check(manifest, &bytes, ram, gpu)
}

/// Checks a snapshot's parts against each other (also for a migration stream, whose RAM is an
/// in-memory file): the state file's length and CRC-32 as the manifest says, its sections,
/// vCPU count, CMOS and test device as the manifest says, and the RAM file's size. A manifest
/// with a `gpu` needs its image (`gpu`; a migration stream has none).
pub fn check(
    manifest: Manifest,
    bytes: &[u8],
    ram: std::fs::File,
    gpu: Option<GpuImage>,
) -> Result<Loaded, LoadError> {
    if let (Some(g), None) = (&manifest.gpu, &gpu) {
        return Err(LoadError::Gpu(g.clone()));
    }
    if let Some(g) = &gpu
        && manifest.gpu_live != g.vram_base.is_some()
    {
        return Err(LoadError::VramBase);
    }
    if bytes.len() as u64 != manifest.state_bytes {
        return Err(LoadError::StateSize {
            file: manifest::STATE_FILE,
            found: bytes.len() as u64,
            want: manifest.state_bytes,
        });
    }
    let crc = crc32fast::hash(bytes);
    if crc != manifest.state_crc32 {
        return Err(LoadError::StateChecksum {
            file: manifest::STATE_FILE,
            found: crc,
            want: manifest.state_crc32,
        });
    }
    let state = MachineState::decode(bytes)?;
    if state.vcpus.len() != usize::from(manifest.cpus) {
        return Err(LoadError::Vcpus {
            found: state.vcpus.len(),
            want: manifest.cpus,
        });
    }
    match (state.has(super::format::tag::CMOS), manifest.boot) {
        (true, BootKind::BareMetal) => {
            return Err(LoadError::Cmos {
                has: "has",
                boot: manifest.boot,
            });
        }
        (false, BootKind::Linux) => {
            return Err(LoadError::Cmos {
                has: "lacks",
                boot: manifest.boot,
            });
        }
        _ => {}
    }
    if state.has(super::format::tag::TESTDEV) != manifest.testdev {
        return Err(LoadError::Testdev);
    }
    if state.count(super::format::tag::DISK) != manifest.disks.len() {
        return Err(LoadError::Disks {
            state: state.count(super::format::tag::DISK),
            listed: manifest.disks.len(),
        });
    }
    ram::check(&ram, manifest.ram_bytes)?;
    Ok(Loaded {
        manifest,
        state,
        ram,
        gpu,
        incoming: None,
    })
}
