//! `pcitest`: checks the VMM's PCI emulation from inside: finds the test device, sizes its
//! BARs, reads registers through each, relocates BAR0 and checks the old address no longer
//! decodes and the new one does, and turns memory decode off and on. Exits 0 if all held.
#![no_std]
#![no_main]

use guest_rt::abi::testdev;
use guest_rt::io::{inl, mmio_read32, mmio_write32};
use guest_rt::pci::{self, Bar};
use guest_rt::println;

guest_rt::entry!(main);

fn check(ok: bool, what: &str) -> bool {
    println!("pcitest: {} {what}", if ok { "ok  " } else { "FAIL" });
    ok
}

fn main() -> u8 {
    let Some(f) = pci::find(testdev::VENDOR_ID, testdev::DEVICE_ID) else {
        println!("pcitest: test device not found (run with --testdev)");
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    let mut ok = true;
    let (
        Some(Bar::Mem {
            addr: bar0,
            size: s0,
            ..
        }),
        Some(Bar::Io { port, size: s1 }),
        Some(Bar::Mem {
            addr: bar2,
            size: s2,
            is64,
        }),
    ) = (f.bars[0], f.bars[1], f.bars[2])
    else {
        println!("pcitest: unexpected BAR layout {:?}", f.bars);
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    ok &= check(
        s0 == 0x1000 && s1 == 16 && s2 == 0x4000 && is64,
        "BAR sizes 4K/16/16K(64-bit)",
    );
    // SAFETY: BAR0 and BAR2 are the test device's MMIO registers, identity-mapped.
    unsafe {
        ok &= check(mmio_read32(bar0) == testdev::ID_VALUE, "BAR0 id");
        ok &= check(inl(port) == testdev::ID_VALUE, "BAR1 id (port)");
        ok &= check(
            mmio_read32(bar2 + 0x10) == testdev::ID_VALUE,
            "BAR2 id (64-bit BAR)",
        );
        mmio_write32(bar0 + testdev::REG_SCRATCH, 0xdead_beef);
        ok &= check(
            mmio_read32(bar0 + testdev::REG_SCRATCH) == 0xdead_beef,
            "scratch write/read",
        );
        // Relocate BAR0 into free space above the other BARs.
        let new = (bar0 + 0x10_0000) & !0xfff;
        pci::write32(f.dev, f.func, 0x10, new as u32);
        ok &= check(
            mmio_read32(new) == testdev::ID_VALUE,
            "relocated BAR0 decodes at the new address",
        );
        ok &= check(
            mmio_read32(bar0) == 0xffff_ffff,
            "old BAR0 address reads all-ones",
        );
        ok &= check(
            mmio_read32(new + testdev::REG_SCRATCH) == 0xdead_beef,
            "device state kept across relocation",
        );
        let cmd = pci::read32(f.dev, f.func, 0x04);
        pci::write32(f.dev, f.func, 0x04, cmd & !0x2);
        ok &= check(
            mmio_read32(new) == 0xffff_ffff,
            "memory decode off: BAR0 silent",
        );
        pci::write32(f.dev, f.func, 0x04, cmd);
        ok &= check(
            mmio_read32(new) == testdev::ID_VALUE,
            "memory decode on again",
        );
    }
    if ok { 0 } else { 1 }
}
