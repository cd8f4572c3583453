//! Disks for Linux guests (`--disk PATH[,ro]`, and the image `--run` attaches): each a
//! virtio-blk device on the virtio-mmio transport at a fixed address and ISA interrupt
//! (`layout::VIRTIO_MMIO_BASE`, `layout::VIRTIO_IRQS`), declared to the kernel on its command
//! line (`virtio_mmio.device=SIZE@ADDR:IRQ`). Files are opened and checked before the VM is
//! built; the device's state is saved in snapshots ([`state`]: `crate::persist::Persist`, one
//! section per disk), its contents are not, so only VMs whose disks are all read-only can be
//! snapshotted or migrated.

pub mod device;
pub mod request;
pub mod state;

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use kvm_ioctls::VmFd;
use mmio::Bus;
use serde::{Deserialize, Serialize};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::layout;
use device::BlockDevice;

/// The most disks one VM takes (one ISA interrupt line each).
pub const MAX_DISKS: usize = layout::VIRTIO_IRQS.len();

/// Errors opening or attaching disks.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("--disk {0:?}: expected PATH or PATH,ro")]
    Syntax(String),
    #[error("at most {MAX_DISKS} disks (got {0})")]
    TooMany(usize),
    #[error("disk {path}: {err}")]
    Open { path: PathBuf, err: std::io::Error },
    #[error("disk {0}: not a regular file or block device")]
    NotAFile(PathBuf),
    #[error("disk {0}: smaller than one 512-byte sector")]
    Empty(PathBuf),
    #[error("disk {0}: in use by another process (locked)")]
    Locked(PathBuf),
    #[error("disk {path}: the snapshot recorded {want} bytes, the file has {got}")]
    SizeChanged { path: PathBuf, want: u64, got: u64 },
    #[error("disk interrupt: {0}")]
    Irq(std::io::Error),
    #[error("disk interrupt: {0}")]
    Irqfd(kvm_ioctls::Error),
    #[error("disk device: {0}")]
    Bus(#[from] mmio::BusError),
    #[error(
        "disk {0} is writable: snapshots and migration save no disk contents, so they need \
         every disk read-only (--disk PATH,ro)"
    )]
    Writable(PathBuf),
}

/// A disk as the manifest records it (and `--disk` names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub read_only: bool,
    /// Bytes of the file when it was opened.
    #[serde(default)]
    pub bytes: u64,
}

impl DiskSpec {
    /// Parses `PATH` or `PATH,ro`.
    pub fn parse(s: &str) -> Result<Self, DiskError> {
        let (path, read_only) = match s.rsplit_once(',') {
            Some((p, "ro")) => (p, true),
            Some((p, "rw")) => (p, false),
            Some(_) => return Err(DiskError::Syntax(s.into())),
            None => (s, false),
        };
        if path.is_empty() {
            return Err(DiskError::Syntax(s.into()));
        }
        Ok(DiskSpec {
            path: path.into(),
            read_only,
            bytes: 0,
        })
    }
}

/// An opened disk.
#[derive(Debug, Clone)]
pub struct Disk {
    pub spec: DiskSpec,
    pub file: Arc<File>,
}

impl Disk {
    /// Opens a disk: read-only files `O_RDONLY` with a shared lock, writable ones with an
    /// exclusive lock (two VMs never write one file, nor one writes what another reads).
    pub fn open(spec: &DiskSpec) -> Result<Self, DiskError> {
        let (file, bytes) = Self::open_file(spec)?;
        let path = &spec.path;
        let open_err = |err| DiskError::Open {
            path: path.clone(),
            err,
        };
        let op = if spec.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a file descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } != 0 {
            return Err(DiskError::Locked(path.clone()));
        }
        Ok(Disk {
            spec: DiskSpec {
                // Absolute: a restore may run in another directory.
                path: std::path::absolute(path).map_err(open_err)?,
                read_only: spec.read_only,
                bytes,
            },
            file: Arc::new(file),
        })
    }

    /// Opens `spec`'s file as [`Self::open`] does, without its lock: the file and its size.
    fn open_file(spec: &DiskSpec) -> Result<(File, u64), DiskError> {
        let path = &spec.path;
        let open_err = |err| DiskError::Open {
            path: path.clone(),
            err,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!spec.read_only)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let kind = meta.file_type();
        if !kind.is_file() && !kind.is_block_device() {
            return Err(DiskError::NotAFile(path.clone()));
        }
        let bytes = {
            use std::io::Seek;
            (&file).seek(std::io::SeekFrom::End(0)).map_err(open_err)?
        };
        if bytes < request::SECTOR {
            return Err(DiskError::Empty(path.clone()));
        }
        Ok((file, bytes))
    }

    /// Opens the disks a snapshot's manifest lists, each with the size recorded there.
    pub fn reopen(specs: &[DiskSpec]) -> Result<Vec<Disk>, DiskError> {
        specs
            .iter()
            .map(|s| {
                let d = Disk::open(s)?;
                same_size(s, d.spec.bytes)?;
                Ok(d)
            })
            .collect()
    }

    /// Whether [`Self::reopen`] would find the disks a manifest lists (at most [`MAX_DISKS`],
    /// each openable as recorded, with its recorded size), without taking their locks (the
    /// source may hold them until it ends): checked before any of a migration's state is
    /// read into a standby, which the stream would otherwise use up.
    pub fn check_reopen(specs: &[DiskSpec]) -> Result<(), DiskError> {
        if specs.len() > MAX_DISKS {
            return Err(DiskError::TooMany(specs.len()));
        }
        specs
            .iter()
            .try_for_each(|s| same_size(s, Self::open_file(s)?.1))
    }
}

/// A reopened disk must have the size its manifest recorded.
fn same_size(s: &DiskSpec, got: u64) -> Result<(), DiskError> {
    match got == s.bytes {
        true => Ok(()),
        false => Err(DiskError::SizeChanged {
            path: s.path.clone(),
            want: s.bytes,
            got,
        }),
    }
}

/// Opens `--disk` arguments (at most [`MAX_DISKS`]).
pub fn open_all(specs: &[DiskSpec]) -> Result<Vec<Disk>, DiskError> {
    if specs.len() > MAX_DISKS {
        return Err(DiskError::TooMany(specs.len()));
    }
    specs.iter().map(Disk::open).collect()
}

/// The kernel command line's declaration of `count` disks, in order (the first is `vda`).
pub fn cmdline(count: usize) -> String {
    (0..count.min(MAX_DISKS))
        .map(|i| {
            format!(
                " virtio_mmio.device={}K@{:#x}:{}",
                layout::VIRTIO_MMIO_SIZE >> 10,
                layout::virtio_mmio_base(i),
                layout::VIRTIO_IRQS[i]
            )
        })
        .collect()
}

/// The attached disks.
#[derive(Default, Clone)]
pub struct Disks {
    devices: Vec<(DiskSpec, Arc<Mutex<BlockDevice>>)>,
}

impl Disks {
    /// Builds a device for each disk on `bus`, with its interrupt through an irqfd (a restored
    /// VM's device state goes back through [`Disks::devices`], `crate::persist`).
    pub fn attach(
        disks: &[Disk],
        vm: &VmFd,
        bus: &Bus,
        mem: &GuestMemoryMmap,
    ) -> Result<Disks, DiskError> {
        if disks.len() > MAX_DISKS {
            return Err(DiskError::TooMany(disks.len()));
        }
        let mut devices = Vec::new();
        for (i, d) in disks.iter().enumerate() {
            let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(DiskError::Irq)?;
            vm.register_irqfd(&irq, layout::VIRTIO_IRQS[i])
                .map_err(DiskError::Irqfd)?;
            let dev = BlockDevice::new(
                d.file.clone(),
                d.spec.bytes,
                d.spec.read_only,
                format!("vgpu-disk{i}"),
                mem.clone(),
                irq,
            );
            let dev = Arc::new(Mutex::new(dev));
            bus.insert(
                &format!("virtio-blk{i}"),
                layout::virtio_mmio_base(i),
                layout::VIRTIO_MMIO_SIZE,
                dev.clone(),
            )?;
            log::debug!(
                "disk {i}: {} ({} bytes{}) at {:#x}, IRQ {}",
                d.spec.path.display(),
                d.spec.bytes,
                if d.spec.read_only { ", read-only" } else { "" },
                layout::virtio_mmio_base(i),
                layout::VIRTIO_IRQS[i]
            );
            devices.push((d.spec.clone(), dev));
        }
        Ok(Disks { devices })
    }

    /// What the manifest records.
    pub fn specs(&self) -> Vec<DiskSpec> {
        self.devices.iter().map(|(s, _)| s.clone()).collect()
    }

    /// The devices, in disk order (each has a state-file section).
    pub fn devices(&self) -> impl Iterator<Item = &Arc<Mutex<BlockDevice>>> {
        self.devices.iter().map(|(_, d)| d)
    }

    /// Whether a snapshot or migration may be taken (every disk read-only): a writable disk's
    /// contents would have to be saved with the RAM for the snapshot to be consistent.
    pub fn check_snapshot(&self) -> Result<(), DiskError> {
        match self.devices.iter().find(|(s, _)| !s.read_only) {
            Some((s, _)) => Err(DiskError::Writable(s.path.clone())),
            None => Ok(()),
        }
    }

    /// Logs each disk's requests and time in the device (debug level), at the VM's end.
    pub fn log_counters(&self) {
        for (_, d) in &self.devices {
            d.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .log_counters();
        }
    }
}

/// Whether `path` names the same file as one of `disks` (never attach a file twice).
pub fn duplicate(disks: &[Disk]) -> Option<&Path> {
    use std::os::unix::fs::MetadataExt;
    let ids: Vec<_> = disks
        .iter()
        .map(|d| d.file.metadata().map(|m| (m.dev(), m.ino())).ok())
        .collect();
    for (i, a) in ids.iter().enumerate() {
        if a.is_some() && ids[..i].contains(a) {
            return Some(&disks[i].spec.path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::DeviceSnapshot;

    #[test]
    fn spec_syntax() {
        let s = DiskSpec::parse("/a/b.img,ro").unwrap();
        assert_eq!(
            (s.path.as_path(), s.read_only),
            (Path::new("/a/b.img"), true)
        );
        let s = DiskSpec::parse("x,y.img").unwrap_err();
        assert!(matches!(s, DiskError::Syntax(_)));
        assert!(!DiskSpec::parse("d.img").unwrap().read_only);
        assert!(!DiskSpec::parse("d.img,rw").unwrap().read_only);
        assert!(DiskSpec::parse(",ro").is_err());
    }

    #[test]
    fn check_reopen_sees_what_reopen_would_without_the_locks() {
        let dir = std::env::temp_dir().join(format!("vgpu-disk-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.img");
        std::fs::write(&f, [0u8; 1024]).unwrap();
        let spec = |bytes| DiskSpec {
            path: f.clone(),
            read_only: false,
            bytes,
        };
        // Held for writing by another (as a migration's source holds it): still checkable.
        let held = Disk::open(&spec(0)).unwrap();
        assert!(Disk::check_reopen(&[spec(1024)]).is_ok());
        assert!(matches!(
            Disk::check_reopen(&[spec(2048)]),
            Err(DiskError::SizeChanged {
                want: 2048,
                got: 1024,
                ..
            })
        ));
        drop(held);
        std::fs::remove_file(&f).unwrap();
        assert!(matches!(
            Disk::check_reopen(&[spec(1024)]),
            Err(DiskError::Open { .. })
        ));
        let many = vec![spec(1024); MAX_DISKS + 1];
        assert!(matches!(
            Disk::check_reopen(&many),
            Err(DiskError::TooMany(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn open_checks_the_file() {
        let dir = std::env::temp_dir().join(format!("vgpu-disk-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.img");
        std::fs::write(&f, [0u8; 100]).unwrap();
        let spec = |p: &Path, ro| DiskSpec {
            path: p.into(),
            read_only: ro,
            bytes: 0,
        };
        assert!(matches!(
            Disk::open(&spec(&f, true)),
            Err(DiskError::Empty(_))
        ));
        std::fs::write(&f, [0u8; 1024]).unwrap();
        let d = Disk::open(&spec(&f, true)).unwrap();
        assert_eq!(d.spec.bytes, 1024);
        // A second reader may share it; a writer may not.
        let d2 = Disk::open(&spec(&f, true)).unwrap();
        assert!(matches!(
            Disk::open(&spec(&f, false)),
            Err(DiskError::Locked(_))
        ));
        assert_eq!(duplicate(&[d.clone(), d2]), Some(f.as_path()));
        drop(d);
        assert!(matches!(
            Disk::open(&spec(&dir, true)),
            Err(DiskError::NotAFile(_))
        ));
        assert!(matches!(
            Disk::open(&spec(&dir.join("none"), true)),
            Err(DiskError::Open { .. })
        ));
        let mut s = spec(&f, true);
        s.bytes = 4096;
        assert!(matches!(
            Disk::reopen(&[s]),
            Err(DiskError::SizeChanged { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn snapshots_need_read_only_disks() {
        let mem = GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap();
        let disks = |read_only| {
            let f = tempfile();
            let dev = BlockDevice::new(
                Arc::new(f),
                4096,
                read_only,
                "t".into(),
                mem.clone(),
                EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            );
            let spec = DiskSpec {
                path: "/d.img".into(),
                read_only,
                bytes: 4096,
            };
            Disks {
                devices: vec![(spec, Arc::new(Mutex::new(dev)))],
            }
        };
        assert!(matches!(
            disks(false).check_snapshot(),
            Err(DiskError::Writable(_))
        ));
        assert!(disks(true).check_snapshot().is_ok());
        let ro = disks(true);
        let saved: Vec<_> = ro.devices().map(|d| d.save_section()).collect();
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[0].id, crate::snapshot::format::tag::DISK);
        assert_eq!(saved[0].payload.len(), state::BYTES);
        assert_eq!(ro.specs()[0].bytes, 4096);
    }

    fn tempfile() -> File {
        let p = std::env::temp_dir().join(format!("vgpu-disks-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }

    #[test]
    fn cmdline_declares_each_disk() {
        assert_eq!(cmdline(0), "");
        let c = cmdline(2);
        assert_eq!(c.matches("virtio_mmio.device=4K@0x").count(), 2);
        assert!(c.contains(&format!(":{}", layout::VIRTIO_IRQS[1])));
    }
}
