//! `hello`: prints a greeting, what the VMM reported at boot, and every PCI function on bus 0.
#![no_std]
#![no_main]

use guest_rt::{boot_info, pci, println};

guest_rt::entry!(main);

fn main() -> u8 {
    let info = boot_info();
    println!("hello from a vgpu-vmm guest");
    println!(
        "boot: cpus={} mem={} MiB tsc={} kHz args=\"{}\"",
        info.cpus,
        (info.mem_below_4g + info.mem_above_4g) >> 20,
        info.tsc_khz,
        guest_rt::args()
    );
    let fns = pci::scan();
    for f in &fns {
        println!(
            "pci {:02x}:{:02x}.{} {:04x}:{:04x} class {:02x}{:02x}{:02x}",
            0, f.dev, f.func, f.vendor, f.device, f.class, f.subclass, f.prog_if
        );
        for (i, bar) in f.bars.iter().enumerate() {
            match bar {
                Some(pci::Bar::Mem { addr, size, is64 }) => {
                    println!(
                        "    BAR{i} mem{} {addr:#x} size {size:#x}",
                        if *is64 { "64" } else { "32" }
                    )
                }
                Some(pci::Bar::Io { port, size }) => {
                    println!("    BAR{i} io {port:#x} size {size:#x}")
                }
                None => {}
            }
        }
    }
    println!("pci: {} functions", fns.len());
    0
}
