//! `--guest linux`: the Linux guest that guest-images/linux/build.sh builds (a minimal Linux
//! 6.1 and a read-only ext2 root image with busybox and the vGPU tools), found in the build's
//! cache, with the command line it needs. The root image is the VM's last disk (after
//! `--run`'s image and the user's `--disk`s), named on the command line; not an initramfs,
//! whose every byte the kernel would copy in PVM's CPL0 emulator at boot (~12 s for 3.3 MB).

use std::path::{Path, PathBuf};

use super::{DEFAULT_CMDLINE, LinuxError};

/// The name `--guest` takes.
pub const NAME: &str = "linux";
/// Environment variable naming the directory with `vmlinux` and `rootfs.ext2` (default:
/// the build script's cache, `target/linux-guest` of this source tree).
pub const DIR_ENV: &str = "VGPU_LINUX_DIR";
/// Guest RAM the guest kernel never manages, for the GPU driver's DMA pool (gpu-driver in user
/// space maps it through /dev/mem: vgpu-linux-tools' `dma` module): 64 MiB at 128 MiB.
pub const DMA_RESERVE: &str = "memmap=64M$0x8000000";
/// Guest RAM the reservation and the kernel need.
pub const MIN_MEMORY_MIB: u64 = 256;

/// What `--guest linux` boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxGuest {
    pub vmlinux: PathBuf,
    /// The root image, its link resolved: the file a snapshot's manifest then names (build.sh
    /// never rewrites one; a changed root is a new file).
    pub rootfs: PathBuf,
    pub cmdline: String,
}

/// Where the build script leaves the guest.
pub fn dir() -> PathBuf {
    std::env::var_os(DIR_ENV).map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/linux-guest"),
        PathBuf::from,
    )
}

/// The guest in `dir`, its command line: the Linux default, the DMA reservation, the root
/// (disk number `root_disk` of the VM, counting from 0: `/dev/vda`), then `extra` (the user's
/// `--cmdline`, e.g. `vgpu_run="vgpu-run suite"`).
pub fn resolve(
    dir: &Path,
    memory_mib: u64,
    root_disk: usize,
    extra: &str,
) -> Result<LinuxGuest, LinuxError> {
    let vmlinux = dir.join("vmlinux");
    let rootfs = match std::fs::canonicalize(dir.join("rootfs.ext2")) {
        Ok(p) if vmlinux.is_file() && p.is_file() => p,
        _ => return Err(LinuxError::GuestNotBuilt(dir.to_path_buf())),
    };
    if memory_mib < MIN_MEMORY_MIB {
        return Err(LinuxError::GuestMemory {
            have: memory_mib,
            need: MIN_MEMORY_MIB,
        });
    }
    let mut cmdline = format!("{DEFAULT_CMDLINE} {DMA_RESERVE} {}", root_args(root_disk));
    if !extra.trim().is_empty() {
        cmdline.push(' ');
        cmdline.push_str(extra.trim());
    }
    Ok(LinuxGuest {
        vmlinux,
        rootfs,
        cmdline,
    })
}

/// The kernel's root: virtio disk `index` (`vda` first, in the order the VMM declares them,
/// `crate::disk::cmdline`), ext2, read-only, `/init` its first process.
pub fn root_args(index: usize) -> String {
    let letter = char::from(b'a' + (index % 26) as u8);
    format!("root=/dev/vd{letter} ro rootfstype=ext2 init=/init")
}

/// `cmdline` with the TSC rate appended (`tsc_early_khz=` and `tsc=reliable`: the TSC becomes
/// the clocksource at once, without calibrating against the PIT in the emulator, and user
/// space reads the time through the vDSO without system calls), unless it sets one already
/// or the rate is unknown.
pub fn with_tsc(cmdline: &str, tsc_khz: u64) -> String {
    if tsc_khz == 0 || cmdline.contains("tsc_early_khz=") {
        return cmdline.to_string();
    }
    format!("{cmdline} tsc_early_khz={tsc_khz} tsc=reliable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_needs_the_built_files_and_memory() {
        let d = std::env::temp_dir().join(format!("vgpu-linux-guest-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(matches!(
            resolve(&d, 256, 0, ""),
            Err(LinuxError::GuestNotBuilt(_))
        ));
        std::fs::write(d.join("vmlinux"), b"x").unwrap();
        std::fs::write(d.join("rootfs-1.ext2"), b"x").unwrap();
        // A dangling link is no guest; the link's target is what the VM opens.
        std::os::unix::fs::symlink("rootfs-0.ext2", d.join("rootfs.ext2")).unwrap();
        assert!(matches!(
            resolve(&d, 256, 0, ""),
            Err(LinuxError::GuestNotBuilt(_))
        ));
        std::fs::remove_file(d.join("rootfs.ext2")).unwrap();
        std::os::unix::fs::symlink("rootfs-1.ext2", d.join("rootfs.ext2")).unwrap();
        assert!(matches!(
            resolve(&d, 128, 0, ""),
            Err(LinuxError::GuestMemory { .. })
        ));
        let g = resolve(&d, 256, 2, " vgpu_run=\"vgpu-smi\" ").unwrap();
        assert_eq!(g.rootfs, d.canonicalize().unwrap().join("rootfs-1.ext2"));
        assert!(g.cmdline.starts_with(DEFAULT_CMDLINE));
        assert!(g.cmdline.ends_with(
            " memmap=64M$0x8000000 root=/dev/vdc ro rootfstype=ext2 init=/init vgpu_run=\"vgpu-smi\""
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn tsc_rate_is_appended_once() {
        assert_eq!(with_tsc("a", 0), "a");
        assert_eq!(
            with_tsc("a", 2_000_000),
            "a tsc_early_khz=2000000 tsc=reliable"
        );
        assert_eq!(with_tsc("a tsc_early_khz=1", 2), "a tsc_early_khz=1");
    }
}
