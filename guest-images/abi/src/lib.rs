//! The contract between `vgpu-vmm` and its bare-metal guests (`no_std`, shared by both sides):
//! the boot-info block the VMM writes and hands over in `rdi`, the port numbers of the
//! devices a guest talks to, the PCI test device's registers, and the runtime's exit codes.
#![no_std]

/// `BootInfo::magic`: "VGPUBOOT" in little-endian bytes.
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"VGPUBOOT");
/// Current `BootInfo::version`.
pub const BOOT_INFO_VERSION: u32 = 1;

/// Written by the VMM into guest memory (address in `rdi` at entry, see the VMM's layout.rs).
/// The guest treats every field as a hint to validate, not a promise.
///
/// Entry contract: 64-bit mode, paging on with the VMM's identity map (user-accessible), SSE
/// enabled, interrupts off, and all RAM that the image does not occupy (its .bss included)
/// reads as zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootInfo {
    pub magic: u64,
    pub version: u32,
    /// Number of vCPUs the VM has (only the boot vCPU runs the guest program).
    pub cpus: u32,
    /// Bytes of RAM starting at guest-physical 0 (below the PCI hole).
    pub mem_below_4g: u64,
    /// Bytes of RAM starting at 4 GiB.
    pub mem_above_4g: u64,
    /// Guest-physical address and length of the command line (UTF-8, not NUL-terminated).
    pub cmdline_addr: u64,
    pub cmdline_len: u64,
    /// TSC frequency in kHz as KVM reports it for this vCPU (0 if unknown).
    pub tsc_khz: u64,
}

/// Port I/O addresses.
/// The VMM identity-maps the start of the 64-bit PCI window (uncached) for bare-metal guests:
/// `[PCI_MMIO64_START, PCI_MMIO64_START + PCI_MMIO64_MAPPED)`.
pub const PCI_MMIO64_START: u64 = 0x100_0000_0000;
/// Bytes of the 64-bit PCI window identity-mapped (15 page directories of 1 GiB).
pub const PCI_MMIO64_MAPPED: u64 = 15 << 30;

pub mod ports {
    /// Debug exit: a 1-, 2- or 4-byte write ends the VM; the value (0..=255) is the exit code.
    pub const DEBUG_EXIT: u16 = 0xf4;
    /// 8250 UART, COM1.
    pub const COM1: u16 = 0x3f8;
    /// i8042 data and command/status ports.
    pub const I8042_DATA: u16 = 0x60;
    pub const I8042_COMMAND: u16 = 0x64;
    /// PCI configuration mechanism #1.
    pub const PCI_CONFIG_ADDRESS: u16 = 0xcf8;
    pub const PCI_CONFIG_DATA: u16 = 0xcfc;
}

/// The PCI test device (`vgpu-vmm --testdev`): registers for bus tests and exit benchmarks.
pub mod testdev {
    pub const VENDOR_ID: u16 = 0x1234;
    pub const DEVICE_ID: u16 = 0x7e57;
    /// BAR0: 4 KiB of MMIO registers. BAR1: 16 I/O ports with the same registers.
    /// BAR2: 16 KiB 64-bit MMIO, same registers repeated every 16 bytes.
    pub const REG_ID: u64 = 0x0;
    /// Read-write scratch register.
    pub const REG_SCRATCH: u64 = 0x4;
    /// Read-only: number of register reads the device has served (low 32 bits).
    pub const REG_READS: u64 = 0x8;
    /// Value of `REG_ID`.
    pub const ID_VALUE: u32 = 0x7e57_0001;
}

/// Exit codes the guest runtime uses on its own.
///
/// None is 1 to 4 (the VMM's own set-up, usage, triple-fault and KVM codes), so a guest-reported
/// failure cannot be mistaken for the VMM's; README.md "Exit status" has the whole table.
pub mod exit_codes {
    /// A check failed: a wrong GPU result, an attack not contained, no crash where one was due.
    pub const CHECK_FAILED: u8 = 10;
    /// A bad argument on the guest's command line.
    pub const BAD_ARGUMENT: u8 = 11;
    /// A device is missing or unusable (not found, BARs not mapped, the GPU driver's set-up).
    pub const NO_DEVICE: u8 = 12;
    /// The GPU reported a fault (or a channel could not be created).
    pub const GPU_FAULT: u8 = 13;
    /// A Rust panic in the guest.
    pub const PANIC: u8 = 101;
    /// An unexpected CPU exception in the guest.
    pub const EXCEPTION: u8 = 102;
    /// The boot info was missing or malformed.
    pub const BAD_BOOT_INFO: u8 = 103;
}
