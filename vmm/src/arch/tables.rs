//! The GDT and the identity-mapping page tables written into guest memory before entry.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{
    GDT_ADDR, IDT_ADDR, MMIO_HOLE_START, PCI_MMIO64, PD_ADDR, PD_COUNT, PD_HIGH_ADDR,
    PD_HIGH_COUNT, PDPT_ADDR, PDPT_HIGH_ADDR, PML4_ADDR,
};

/// A GDT descriptor from flags, base and limit (Intel SDM vol. 3, 3.4.5).
pub(crate) const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
}

/// The boot GDT: null, 64-bit code, data, TSS.
pub(crate) const GDT: [u64; 4] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
/// User-accessible: the bare-metal runtime runs its program at CPL3 (see guest-rt).
const USER: u64 = 1 << 2;
const PWT: u64 = 1 << 3;
const PCD: u64 = 1 << 4;
const HUGE: u64 = 1 << 7;

/// Writes the GDT, an empty IDT and page tables identity-mapping 0..4 GiB and the first GiB
/// of the 64-bit PCI window.
pub fn write_boot_tables(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    for (i, e) in GDT.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))?;
    mem.write_obj(
        PDPT_ADDR | PRESENT | WRITABLE | USER,
        GuestAddress(PML4_ADDR),
    )?;
    for pd in 0..PD_COUNT {
        let pd_addr = PD_ADDR + pd * 0x1000;
        mem.write_obj(
            pd_addr | PRESENT | WRITABLE | USER,
            GuestAddress(PDPT_ADDR + pd * 8),
        )?;
        for i in 0..512u64 {
            let phys = (pd << 30) | (i << 21);
            let cache = if phys >= MMIO_HOLE_START {
                PWT | PCD
            } else {
                0
            };
            mem.write_obj(
                phys | PRESENT | WRITABLE | USER | HUGE | cache,
                GuestAddress(pd_addr + i * 8),
            )?;
        }
    }
    let slot = PCI_MMIO64.start >> 39;
    mem.write_obj(
        PDPT_HIGH_ADDR | PRESENT | WRITABLE | USER,
        GuestAddress(PML4_ADDR + slot * 8),
    )?;
    for pd in 0..PD_HIGH_COUNT {
        let pd_addr = PD_HIGH_ADDR + pd * 0x1000;
        mem.write_obj(
            pd_addr | PRESENT | WRITABLE | USER,
            GuestAddress(PDPT_HIGH_ADDR + pd * 8),
        )?;
        for i in 0..512u64 {
            let phys = PCI_MMIO64.start + (pd << 30) + (i << 21);
            mem.write_obj(
                phys | PRESENT | WRITABLE | USER | HUGE | PWT | PCD,
                GuestAddress(pd_addr + i * 8),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_match_the_sdm() {
        // The canonical flat 64-bit code and data descriptors.
        assert_eq!(GDT[1], 0x00af_9b00_0000_ffff);
        assert_eq!(GDT[2], 0x00cf_9300_0000_ffff);
    }

    #[test]
    fn identity_map() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_boot_tables(&mem).unwrap();
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_ADDR)).unwrap();
        assert_eq!(pml4 & !0xfff, PDPT_ADDR);
        let pdpt3: u64 = mem.read_obj(GuestAddress(PDPT_ADDR + 24)).unwrap();
        let last: u64 = mem
            .read_obj(GuestAddress((pdpt3 & !0xfff) + 511 * 8))
            .unwrap();
        assert_eq!(last & !0xfff, 0xffe0_0000);
        assert_ne!(last & PCD, 0, "device hole uncached");
        let first: u64 = mem.read_obj(GuestAddress(PD_ADDR)).unwrap();
        assert_eq!(first, PRESENT | WRITABLE | USER | HUGE);
        let pml4_high: u64 = mem.read_obj(GuestAddress(PML4_ADDR + 16)).unwrap();
        assert_eq!(pml4_high & !0xfff, PDPT_HIGH_ADDR);
        let high: u64 = mem.read_obj(GuestAddress(PD_HIGH_ADDR + 8)).unwrap();
        assert_eq!(high & !0xfff, PCI_MMIO64.start + (1 << 21));
    }
}
