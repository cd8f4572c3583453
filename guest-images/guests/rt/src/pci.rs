//! PCI enumeration of bus 0 through configuration mechanism #1, with BAR sizing.

use crate::io::{inl, outl};
use alloc::vec::Vec;
use guest_abi::ports::{PCI_CONFIG_ADDRESS, PCI_CONFIG_DATA};

/// A BAR as found by sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bar {
    Mem { addr: u64, size: u64, is64: bool },
    Io { port: u16, size: u32 },
}

/// A PCI function on bus 0.
#[derive(Debug, Clone)]
pub struct Function {
    pub dev: u8,
    pub func: u8,
    pub vendor: u16,
    pub device: u16,
    pub class: u8,
    pub subclass: u8,
    pub prog_if: u8,
    pub bars: [Option<Bar>; 6],
}

fn address(dev: u8, func: u8, reg: u8) -> u32 {
    0x8000_0000 | u32::from(dev) << 11 | u32::from(func) << 8 | u32::from(reg & 0xfc)
}

/// Reads a config dword.
pub fn read32(dev: u8, func: u8, reg: u8) -> u32 {
    outl(PCI_CONFIG_ADDRESS, address(dev, func, reg));
    inl(PCI_CONFIG_DATA)
}

/// Writes a config dword.
pub fn write32(dev: u8, func: u8, reg: u8, v: u32) {
    outl(PCI_CONFIG_ADDRESS, address(dev, func, reg));
    outl(PCI_CONFIG_DATA, v);
}

/// Sizes the BARs of one function (decode is off while probing, as on real systems).
fn bars(dev: u8, func: u8) -> [Option<Bar>; 6] {
    let mut out = [None; 6];
    let cmd = read32(dev, func, 0x04);
    write32(dev, func, 0x04, cmd & !0x3);
    let mut i = 0;
    while i < 6 {
        let reg = 0x10 + 4 * i as u8;
        let orig = read32(dev, func, reg);
        write32(dev, func, reg, 0xffff_ffff);
        let mask = read32(dev, func, reg);
        write32(dev, func, reg, orig);
        if mask == 0 {
            i += 1;
            continue;
        }
        if orig & 1 == 1 {
            let size = (!(mask & !0x3)).wrapping_add(1) & 0xffff;
            out[i] = Some(Bar::Io {
                port: (orig & !0x3) as u16,
                size,
            });
            i += 1;
        } else if orig & 0x6 == 0x4 && i < 5 {
            let hreg = reg + 4;
            let horig = read32(dev, func, hreg);
            write32(dev, func, hreg, 0xffff_ffff);
            let hmask = read32(dev, func, hreg);
            write32(dev, func, hreg, horig);
            let full = u64::from(hmask) << 32 | u64::from(mask & !0xf);
            let addr = u64::from(horig) << 32 | u64::from(orig & !0xf);
            out[i] = Some(Bar::Mem {
                addr,
                size: (!full).wrapping_add(1),
                is64: true,
            });
            i += 2;
        } else {
            let size = u64::from((!(mask & !0xf)).wrapping_add(1));
            out[i] = Some(Bar::Mem {
                addr: u64::from(orig & !0xf),
                size,
                is64: false,
            });
            i += 1;
        }
    }
    write32(dev, func, 0x04, cmd);
    out
}

/// Every function on bus 0.
pub fn scan() -> Vec<Function> {
    let mut found = Vec::new();
    for dev in 0..32u8 {
        for func in 0..8u8 {
            let id = read32(dev, func, 0);
            if id & 0xffff == 0xffff {
                if func == 0 {
                    break;
                }
                continue;
            }
            let class = read32(dev, func, 0x08);
            let header = (read32(dev, func, 0x0c) >> 16) as u8;
            found.push(Function {
                dev,
                func,
                vendor: id as u16,
                device: (id >> 16) as u16,
                class: (class >> 24) as u8,
                subclass: (class >> 16) as u8,
                prog_if: (class >> 8) as u8,
                bars: if header & 0x7f == 0 {
                    bars(dev, func)
                } else {
                    [None; 6]
                },
            });
            if func == 0 && header & 0x80 == 0 {
                break;
            }
        }
    }
    found
}

/// The first function with this vendor and device id.
pub fn find(vendor: u16, device: u16) -> Option<Function> {
    scan()
        .into_iter()
        .find(|f| f.vendor == vendor && f.device == device)
}

/// Sets a function's command register bits (memory decode, bus master, ...).
pub fn command_set(dev: u8, func: u8, bits: u16) {
    let v = read32(dev, func, 0x04);
    write32(dev, func, 0x04, (v & 0xffff) | u32::from(bits));
}

/// Finds capability `id` in the function's capability list: its config-space offset.
pub fn find_capability(dev: u8, func: u8, id: u8) -> Option<u8> {
    if read32(dev, func, 0x04) >> 16 & 0x10 == 0 {
        return None;
    }
    let mut ptr = (read32(dev, func, 0x34) & 0xfc) as u8;
    for _ in 0..48 {
        if ptr < 0x40 {
            return None;
        }
        let head = read32(dev, func, ptr);
        if head as u8 == id {
            return Some(ptr);
        }
        ptr = (head >> 8) as u8 & 0xfc;
    }
    None
}

/// Programs and enables the function's MSI capability to send `data` to `address`, and
/// disables INTx. False if it has no MSI capability.
pub fn enable_msi(dev: u8, func: u8, address: u64, data: u16) -> bool {
    const MSI: u8 = 0x05;
    let Some(cap) = find_capability(dev, func, MSI) else {
        return false;
    };
    let head = read32(dev, func, cap);
    let ctrl = (head >> 16) as u16;
    let is64 = ctrl & (1 << 7) != 0;
    write32(dev, func, cap + 4, address as u32);
    if is64 {
        write32(dev, func, cap + 8, (address >> 32) as u32);
        write32(dev, func, cap + 12, u32::from(data));
    } else {
        write32(dev, func, cap + 8, u32::from(data));
    }
    // Enable, one message (multiple message enable = 0).
    let new_ctrl = (ctrl & !(7 << 4)) | 1;
    write32(dev, func, cap, (head & 0xffff) | u32::from(new_ctrl) << 16);
    command_set(dev, func, 1 << 10);
    true
}
