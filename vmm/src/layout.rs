//! Every guest-physical address and port the VMM uses, in one place.
//!
//! ```text
//! Guest-physical memory
//! 0x0000_0000 ─ 0x0000_04ff  real-mode IVT and BIOS data area (left zero)
//! 0x0000_0500                GDT: null, code64 (0x08), data (0x10), TSS (0x18)
//! 0x0000_0520                IDT placeholder (limit 0): guests install their own
//! 0x0000_6000                BootInfo for bare-metal guests (guest_abi::BootInfo), rdi at entry
//! 0x0000_7000                reserved for the Linux zero page (boot_params)
//! 0x0000_8ff0                initial stack pointer (grows down; guests switch to their own)
//! 0x0000_9000                PML4
//! 0x0000_a000                PDPT
//! 0x0000_b000 ─ 0x0000_efff  four page directories: 0..4 GiB identity-mapped with 2 MiB pages
//!                            (3..4 GiB, the device hole, is mapped uncached)
//! 0x0000_f000                PDPT for the 64-bit PCI window
//! 0x0001_0000 ─ 0x0001_efff  15 page directories: first 15 GiB of the 64-bit PCI window,
//!                            uncached (user-accessible: guest-rt runs programs at CPL3)
//! 0x0002_0000 ─ 0x0002_0fff  command line (at most CMDLINE_MAX bytes)
//! 0x0010_0000                ELF images load here or above (HIMEM_START)
//!      ...                   RAM up to min(--memory, 3 GiB)
//! 0xc000_0000 ─ 0xfeaf_ffff  PCI 32-bit MMIO window (BARs, assigned at start-up)
//! 0xfeb0_0000 ─ 0xfeb0_3fff  virtio-mmio disks (--disk, --run), 4 KiB each, IRQs 5, 6, 9, 10
//! 0xfec0_0000                IOAPIC (in-kernel)
//! 0xfee0_0000                local APIC (in-kernel)
//! 0xfffb_c000                KVM identity-map page (1 page), 0xfffb_d000 KVM TSS (3 pages)
//! 0x1_0000_0000              RAM above 3 GiB continues here
//! 0x100_0000_0000 ─ +1 TiB   PCI 64-bit MMIO window
//!
//! Ports
//! 0x0060, 0x0064             i8042 (reset = VM exit)
//! 0x0070 ─ 0x0071            CMOS/RTC index and data (Linux boots)
//! 0x0080                     POST/delay port (Linux boots)
//! 0x00f4                     debug exit (guest_abi::ports::DEBUG_EXIT)
//! 0x03f8 ─ 0x03ff            8250 UART COM1, IRQ 4
//! 0x0cf8 ─ 0x0cff            PCI configuration mechanism #1
//! 0x1000 ─ 0xffff            PCI I/O window (I/O BARs)
//! ```

use std::ops::Range;

/// GDT base and the selectors the boot vCPU uses.
pub const GDT_ADDR: u64 = 0x500;
pub const IDT_ADDR: u64 = 0x520;
pub const CODE_SELECTOR: u16 = 0x08;
pub const DATA_SELECTOR: u16 = 0x10;
pub const TSS_SELECTOR: u16 = 0x18;

/// Bare-metal boot info block (see `guest_abi::BootInfo`).
pub const BOOT_INFO_ADDR: u64 = 0x6000;
/// Linux zero page (reserved for the Linux boot path).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;

/// Identity page tables.
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
pub const PD_ADDR: u64 = 0xb000;
/// Number of page directories (1 GiB each) in the identity map.
pub const PD_COUNT: u64 = 4;
/// PDPT and page directories identity-mapping the first [`PD_HIGH_COUNT`] GiB of
/// [`PCI_MMIO64`] (`guest_abi::PCI_MMIO64_MAPPED`).
pub const PDPT_HIGH_ADDR: u64 = 0xf000;
pub const PD_HIGH_ADDR: u64 = 0x1_0000;
pub const PD_HIGH_COUNT: u64 = guest_abi::PCI_MMIO64_MAPPED >> 30;

/// Kernel command line.
pub const CMDLINE_ADDR: u64 = 0x2_0000;
pub const CMDLINE_MAX: usize = 4096;

/// Lowest address an image may load at.
pub const HIMEM_START: u64 = 0x10_0000;

/// RAM below the device hole ends here at most.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// RAM above the hole starts here.
pub const HIGH_RAM_START: u64 = 0x1_0000_0000;

/// PCI windows.
pub const PCI_MMIO32: Range<u64> = 0xc000_0000..VIRTIO_MMIO_BASE;
pub const PCI_MMIO64: Range<u64> = 0x100_0000_0000..0x200_0000_0000;
pub const PCI_PIO: Range<u64> = 0x1000..0x1_0000;

/// KVM's private pages (must not overlap RAM or devices).
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xfffb_c000;
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;

/// Legacy ports.
pub const I8042_PORTS: Range<u64> = 0x60..0x65;
pub const SERIAL_PORTS: Range<u64> = 0x3f8..0x400;
/// The CMOS/RTC index and data ports (Linux boots only).
pub const CMOS_PORTS: Range<u64> = 0x70..0x72;
/// The POST/delay port (Linux boots only).
pub const POST_PORT: u64 = 0x80;
pub const SERIAL_IRQ: u32 = 4;
/// The virtual GPU's INTA line (the PCI interrupt line it reports).
pub const GPU_INTX_IRQ: u32 = 11;
/// virtio-mmio devices (the disks): one [`VIRTIO_MMIO_SIZE`] region each from here, above
/// the PCI window (the guest cannot move a BAR over them) and below the IOAPIC. Linux finds
/// them on its command line (`virtio_mmio.device=`; `disk::cmdline`).
pub const VIRTIO_MMIO_BASE: u64 = 0xfeb0_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// Their interrupts, one ISA line each (edge, through an irqfd; KVM's PIC delivers them: the
/// Linux guest has no ACPI or MP table, so no IOAPIC routing). 4 is the UART's, 11 the GPU's.
pub const VIRTIO_IRQS: [u32; 4] = [5, 6, 9, 10];
pub const DEBUG_EXIT_PORT: u64 = guest_abi::ports::DEBUG_EXIT as u64;

/// Where virtio-mmio device `index` (< `VIRTIO_IRQS.len()`) sits.
pub const fn virtio_mmio_base(index: usize) -> u64 {
    VIRTIO_MMIO_BASE + index as u64 * VIRTIO_MMIO_SIZE
}

// The layout's invariants, checked at compile time.
const _: () = assert!(
    virtio_mmio_base(VIRTIO_IRQS.len()) <= 0xfec0_0000,
    "the disks end below the IOAPIC"
);
const _: () =
    assert!(BOOT_STACK_POINTER < PML4_ADDR && BOOT_STACK_POINTER > ZERO_PAGE_ADDR + 0x1000);
const _: () = assert!(PCI_MMIO32.end <= 0xfec0_0000 && PCI_MMIO32.start >= MMIO_HOLE_START);
const _: () = assert!(PCI_MMIO64.start == guest_abi::PCI_MMIO64_START);
const _: () = assert!(PD_HIGH_ADDR + PD_HIGH_COUNT * 0x1000 <= CMDLINE_ADDR);
const _: () = assert!(
    PCI_MMIO64.start.is_multiple_of(512 << 30),
    "64-bit window starts a PML4 slot"
);

/// Guest RAM regions for `mem_bytes` of RAM: below the hole, then above 4 GiB.
pub fn ram_regions(mem_bytes: u64) -> Vec<(u64, u64)> {
    let low = mem_bytes.min(MMIO_HOLE_START);
    let mut regions = vec![(0, low)];
    if mem_bytes > low {
        regions.push((HIGH_RAM_START, mem_bytes - low));
    }
    regions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_areas_do_not_overlap_and_fit_below_the_image() {
        let areas = [
            (GDT_ADDR, 4 * 8),
            (IDT_ADDR, 8),
            (BOOT_INFO_ADDR, 0x1000),
            (ZERO_PAGE_ADDR, 0x1000),
            (PML4_ADDR, 0x1000),
            (PDPT_ADDR, 0x1000),
            (PD_ADDR, PD_COUNT * 0x1000),
            (PDPT_HIGH_ADDR, 0x1000),
            (PD_HIGH_ADDR, PD_HIGH_COUNT * 0x1000),
            (CMDLINE_ADDR, CMDLINE_MAX as u64),
        ];
        for (i, a) in areas.iter().enumerate() {
            assert!(a.0 + a.1 <= HIMEM_START);
            for b in &areas[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
        }
    }

    #[test]
    fn ram_split_around_the_hole() {
        assert_eq!(ram_regions(256 << 20), vec![(0, 256 << 20)]);
        assert_eq!(ram_regions(4 << 30), vec![(0, 3 << 30), (1 << 32, 1 << 30)]);
    }
}
