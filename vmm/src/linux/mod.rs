//! Booting a stock Linux kernel: a bzImage (or an uncompressed vmlinux ELF) loaded through
//! linux-loader, an optional initramfs, the zero page, and the 64-bit boot protocol's entry
//! state (rsi = zero page) plus the MSRs a kernel expects firmware to have set.

pub mod bootparams;
pub mod cmos;
pub mod guest;
pub mod run;

use std::io::Cursor;
use std::path::PathBuf;

use kvm_bindings::{Msrs, kvm_msr_entry};
use kvm_ioctls::VcpuFd;
use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{KernelLoader, bzimage::BzImage, elf::Elf};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{CMDLINE_ADDR, CMDLINE_MAX, HIMEM_START, ZERO_PAGE_ADDR};
use bootparams::Initrd;

/// Command line used when none is given. Under PVM the kernel's CPL0 code runs in KVM's
/// instruction emulator, which cannot run XSAVE, CMPXCHG16B, POPCNT, CLAC/STAC (SMAP),
/// RDFSBASE & co., INVPCID, RDRAND/RDSEED, RDPID/RDTSCP: the kernel is told not to use them
/// (KVM_SET_CPUID2 could not hide them there: PVM kept the host's bits). ERMS/FSRM are hidden
/// too: the kernel's byte-wise `rep movsb` is slow in the emulator (a page fault costs 2.5x
/// less with `rep movsq`). The VMM appends the TSC rate ([`guest::with_tsc`]). Without XSAVE
/// the kernel switches only x87/SSE state: the guest's /init keeps glibc off AVX registers
/// (guest-images/linux/init.sh, `GLIBC_TUNABLES`).
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=1 nokaslr noxsave \
    clearcpuid=cx16,popcnt,smap,fsgsbase,invpcid,pcid,rdrand,rdseed,rdpid,rdtscp,erms,fsrm";

/// The 64-bit entry point's offset from the protected-mode kernel's load address.
const ENTRY_64_OFFSET: u64 = 0x200;
/// xloadflags: the kernel has the 64-bit entry point at +0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// The first boot-protocol version with xloadflags.
const MIN_PROTOCOL: u16 = 0x020c;

/// Errors preparing a Linux boot.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    #[error("{path}: not a loadable Linux kernel: {err}")]
    Load {
        path: String,
        err: linux_loader::loader::Error,
    },
    #[error("{path}: boot protocol {version:#x} without a 64-bit entry point (need >= 2.12)")]
    No64BitEntry { path: String, version: u16 },
    #[error("cannot read initramfs {path}: {err}")]
    ReadInitrd { path: PathBuf, err: std::io::Error },
    #[error("initramfs of {size} bytes does not fit in RAM above the kernel (below {limit:#x})")]
    InitrdNoRoom { size: u64, limit: u64 },
    #[error("initramfs larger than 4 GiB")]
    InitrdTooBig,
    #[error("command line is {len} bytes; the kernel takes at most {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("command line contains a NUL byte")]
    CmdlineNul,
    #[error("more e820 entries than the zero page holds")]
    TooManyE820,
    #[error("write boot data into guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("set MSRs: {0}")]
    Msrs(kvm_ioctls::Error),
    #[error("vCPU registers: {0}")]
    Regs(kvm_ioctls::Error),
    #[error(
        "the Linux guest is not built in {0} (run guest-images/linux/build.sh, or set VGPU_LINUX_DIR)"
    )]
    GuestNotBuilt(PathBuf),
    #[error("the Linux guest needs --memory {need} or more (got {have})")]
    GuestMemory { have: u64, need: u64 },
}

/// Whether `bytes` start like a bzImage ("HdrS" at 0x202).
pub fn is_bzimage(bytes: &[u8]) -> bool {
    bytes.get(0x202..0x206) == Some(b"HdrS")
}

/// A loaded kernel: where to enter it and where its zero page is.
#[derive(Debug, Clone, Copy)]
pub struct LinuxBoot {
    pub entry: u64,
    pub zero_page: u64,
}

/// Loads the kernel `bytes` (a bzImage, or a vmlinux ELF entered at its ELF entry point), the
/// initramfs and the command line, and writes the zero page.
pub fn load(
    mem: &GuestMemoryMmap,
    ram: &[(u64, u64)],
    name: &str,
    bytes: &[u8],
    initramfs: Option<&PathBuf>,
    cmdline: &str,
) -> Result<LinuxBoot, LinuxError> {
    let load_err = |err| LinuxError::Load {
        path: name.to_string(),
        err,
    };
    let (entry, kernel_end, hdr) = if is_bzimage(bytes) {
        let r = BzImage::load(
            mem,
            None,
            &mut Cursor::new(bytes),
            Some(GuestAddress(HIMEM_START)),
        )
        .map_err(load_err)?;
        let hdr = r.setup_header.unwrap_or_default();
        let (version, xlf) = (hdr.version, hdr.xloadflags);
        if version < MIN_PROTOCOL || xlf & XLF_KERNEL_64 == 0 {
            return Err(LinuxError::No64BitEntry {
                path: name.to_string(),
                version,
            });
        }
        // The decompressor works in place up to init_size past the load address.
        let end = r
            .kernel_load
            .0
            .saturating_add(u64::from(hdr.init_size))
            .max(r.kernel_end);
        (r.kernel_load.0 + ENTRY_64_OFFSET, end, hdr)
    } else {
        let r = Elf::load(
            mem,
            None,
            &mut Cursor::new(bytes),
            Some(GuestAddress(HIMEM_START)),
        )
        .map_err(load_err)?;
        // A vmlinux has no setup header in the file; give the fields a bzImage would.
        let hdr = setup_header {
            header: 0x5372_6448,
            version: MIN_PROTOCOL,
            initrd_addr_max: 0x7fff_ffff,
            kernel_alignment: 0x100_0000,
            // COMMAND_LINE_SIZE of every x86-64 kernel since 2.6.22 (2048, NUL included).
            cmdline_size: 2047,
            ..Default::default()
        };
        (r.kernel_load.0, r.kernel_end, hdr)
    };

    let cmd_max = (hdr.cmdline_size as usize).clamp(255, CMDLINE_MAX - 1);
    if cmdline.len() > cmd_max {
        return Err(LinuxError::CmdlineTooLong {
            len: cmdline.len(),
            max: cmd_max,
        });
    }
    if cmdline.as_bytes().contains(&0) {
        return Err(LinuxError::CmdlineNul);
    }
    mem.write_slice(cmdline.as_bytes(), GuestAddress(CMDLINE_ADDR))?;
    mem.write_obj(0u8, GuestAddress(CMDLINE_ADDR + cmdline.len() as u64))?;

    let initrd = match initramfs {
        Some(path) => Some(load_initrd(
            mem,
            ram,
            path,
            kernel_end,
            hdr.initrd_addr_max,
        )?),
        None => None,
    };
    let zp = bootparams::build(hdr, cmdline.len(), initrd, ram)?;
    mem.write_obj(zp, GuestAddress(ZERO_PAGE_ADDR))?;
    log::info!(
        "linux: entry {entry:#x}, kernel ends {kernel_end:#x}, initrd {:x?}",
        initrd
    );
    Ok(LinuxBoot {
        entry,
        zero_page: ZERO_PAGE_ADDR,
    })
}

/// Places the initramfs page-aligned at the top of low RAM, below `addr_max`, above the kernel.
fn load_initrd(
    mem: &GuestMemoryMmap,
    ram: &[(u64, u64)],
    path: &PathBuf,
    kernel_end: u64,
    addr_max: u32,
) -> Result<Initrd, LinuxError> {
    let data = std::fs::read(path).map_err(|err| LinuxError::ReadInitrd {
        path: path.clone(),
        err,
    })?;
    let size = data.len() as u64;
    let low_end = ram
        .iter()
        .find(|r| r.0 == 0)
        .map_or(0, |r| r.1)
        .min(u64::from(addr_max).saturating_add(1));
    let no_room = LinuxError::InitrdNoRoom {
        size,
        limit: low_end,
    };
    let addr = low_end.checked_sub(size).ok_or(no_room)? & !0xfff;
    if addr < kernel_end.next_multiple_of(0x1000) {
        return Err(LinuxError::InitrdNoRoom {
            size,
            limit: low_end,
        });
    }
    mem.write_slice(&data, GuestAddress(addr))?;
    Ok(Initrd { addr, size })
}

/// Sets `rsi` to the zero page (the 64-bit boot protocol) and the MSRs firmware leaves for
/// the kernel; call after the common 64-bit entry state is in place.
pub fn setup_vcpu(vcpu: &VcpuFd, boot: &LinuxBoot) -> Result<(), LinuxError> {
    let mut regs = vcpu.get_regs().map_err(LinuxError::Regs)?;
    regs.rsi = boot.zero_page;
    regs.rdi = 0;
    vcpu.set_regs(&regs).map_err(LinuxError::Regs)?;
    set_msrs(vcpu)
}

/// Boot MSRs as Firecracker sets them: SYSENTER/SYSCALL zeroed, TSC zero, fast strings on.
fn set_msrs(vcpu: &VcpuFd) -> Result<(), LinuxError> {
    const MSRS: [(u32, u64); 10] = [
        (0x174, 0),       // IA32_SYSENTER_CS
        (0x175, 0),       // IA32_SYSENTER_ESP
        (0x176, 0),       // IA32_SYSENTER_EIP
        (0xc000_0081, 0), // STAR
        (0xc000_0082, 0), // LSTAR
        (0xc000_0083, 0), // CSTAR
        (0xc000_0084, 0), // SYSCALL_MASK
        (0xc000_0102, 0), // KERNEL_GS_BASE
        (0x10, 0),        // TSC
        (0x1a0, 1),       // IA32_MISC_ENABLE: fast strings
    ];
    let entries: Vec<kvm_msr_entry> = MSRS
        .iter()
        .map(|&(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
    let msrs = Msrs::from_entries(&entries)
        .map_err(|_| LinuxError::Msrs(kvm_ioctls::Error::new(libc::EINVAL)))?;
    let set = vcpu.set_msrs(&msrs).map_err(LinuxError::Msrs)?;
    if set != entries.len() {
        let failed = MSRS.get(set).map_or(0, |m| m.0);
        log::warn!(
            "linux: KVM set {set} of {} boot MSRs (stopped at {failed:#x})",
            entries.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bzimage_magic() {
        let mut b = vec![0u8; 0x300];
        assert!(!is_bzimage(&b));
        b[0x202..0x206].copy_from_slice(b"HdrS");
        assert!(is_bzimage(&b));
        assert!(!is_bzimage(&b[..0x204]));
    }

    #[test]
    fn hostile_bzimage_is_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let ram = [(0, 16 << 20)];
        let mut b = vec![0u8; 0x1000];
        b[0x202..0x206].copy_from_slice(b"HdrS");
        // Protocol 2.00 without LOADED_HIGH.
        assert!(load(&mem, &ram, "x", &b, None, "").is_err());
        b[0x206..0x208].copy_from_slice(&0x0200u16.to_le_bytes());
        b[0x211] = 1;
        b[0x1f1] = 0xff; // 255 setup sectors: past the end of the file
        assert!(load(&mem, &ram, "x", &b, None, "").is_err());
        assert!(load(&mem, &ram, "x", b"garbage", None, "").is_err());
    }
}
