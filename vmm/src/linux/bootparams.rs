//! The Linux zero page (`boot_params`): the image's setup header, the command line, the
//! initramfs and an e820 map built from the VMM's RAM layout.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::ByteValued;

use super::LinuxError;
use crate::layout::{CMDLINE_ADDR, HIMEM_START};

/// e820 entry types.
pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

/// End of conventional memory; the EBDA/BIOS area above it is reported reserved.
pub const EBDA_START: u64 = 0x9_fc00;

const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KEEP_SEGMENTS: u8 = 1 << 6;

/// `boot_params` as plain bytes for guest memory.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct ZeroPage(pub boot_params);

// SAFETY: boot_params is a repr(C, packed) struct of integers and arrays of integers (bindgen
// output): every bit pattern is valid and it has no padding.
unsafe impl ByteValued for ZeroPage {}

/// The e820 map for the RAM regions `ram` (start, length): conventional memory below the EBDA,
/// the BIOS area reserved, then RAM from 1 MiB on.
pub fn e820_map(ram: &[(u64, u64)]) -> Vec<boot_e820_entry> {
    let entry = |addr, size, type_| boot_e820_entry {
        addr,
        size,
        r#type: type_,
    };
    let mut map = Vec::new();
    for &(start, len) in ram {
        if start == 0 {
            map.push(entry(0, EBDA_START.min(len), E820_RAM));
            if len > EBDA_START {
                map.push(entry(
                    EBDA_START,
                    HIMEM_START.min(len) - EBDA_START,
                    E820_RESERVED,
                ));
            }
            if len > HIMEM_START {
                map.push(entry(HIMEM_START, len - HIMEM_START, E820_RAM));
            }
        } else {
            map.push(entry(start, len, E820_RAM));
        }
    }
    map
}

/// Where the initramfs goes and how long it is.
#[derive(Debug, Clone, Copy)]
pub struct Initrd {
    pub addr: u64,
    pub size: u64,
}

/// Builds the zero page from the image's setup header `hdr`.
pub fn build(
    hdr: setup_header,
    cmdline_len: usize,
    initrd: Option<Initrd>,
    ram: &[(u64, u64)],
) -> Result<ZeroPage, LinuxError> {
    let mut p = boot_params {
        hdr,
        ..Default::default()
    };
    p.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    p.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    p.hdr.loadflags |= KEEP_SEGMENTS;
    p.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    p.hdr.cmdline_size = cmdline_len as u32;
    if let Some(i) = initrd {
        // Callers place the initramfs below 4 GiB (initrd_addr_max is 32-bit).
        p.hdr.ramdisk_image = i.addr as u32;
        p.hdr.ramdisk_size = u32::try_from(i.size).map_err(|_| LinuxError::InitrdTooBig)?;
    }
    let map = e820_map(ram);
    if map.len() > p.e820_table.len() {
        return Err(LinuxError::TooManyE820);
    }
    for (slot, e) in p.e820_table.iter_mut().zip(&map) {
        *slot = *e;
    }
    p.e820_entries = map.len() as u8;
    Ok(ZeroPage(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_reserves_the_bios_area_and_keeps_high_ram() {
        let m = e820_map(&[(0, 3 << 30), (1 << 32, 1 << 30)]);
        let m: Vec<(u64, u64, u32)> = m.iter().map(|e| (e.addr, e.size, e.r#type)).collect();
        assert_eq!(
            m,
            vec![
                (0, EBDA_START, E820_RAM),
                (EBDA_START, HIMEM_START - EBDA_START, E820_RESERVED),
                (HIMEM_START, (3 << 30) - HIMEM_START, E820_RAM),
                (1 << 32, 1 << 30, E820_RAM),
            ]
        );
    }

    #[test]
    fn zero_page_is_one_page() {
        assert_eq!(size_of::<ZeroPage>(), 4096);
    }
}
