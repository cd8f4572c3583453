//! `exits`: the unit costs of trapping. Reads the test device's id register `n=` times (default
//! 100000) through MMIO (BAR0) and through port I/O (BAR1), timing each loop with the TSC, and
//! prints `EXITS kind=<mmio|pio> n=<n> ns_per_exit=<ns>` lines.
#![no_std]
#![no_main]

use guest_rt::abi::testdev;
use guest_rt::io::{inl, mmio_read32};
use guest_rt::pci::{self, Bar};
use guest_rt::{println, time};

guest_rt::entry!(main);

fn main() -> u8 {
    let n: u64 = guest_rt::arg("n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
        .max(1);
    let Some(f) = pci::find(testdev::VENDOR_ID, testdev::DEVICE_ID) else {
        println!("exits: test device not found (run with --testdev)");
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    let (Some(Bar::Mem { addr, .. }), Some(Bar::Io { port, .. })) = (f.bars[0], f.bars[1]) else {
        return guest_rt::abi::exit_codes::NO_DEVICE;
    };
    let mut bad = 0u64;
    let t0 = time::rdtsc();
    for _ in 0..n {
        // SAFETY: BAR0 is the test device's MMIO register block.
        bad += u64::from(unsafe { mmio_read32(addr) } != testdev::ID_VALUE);
    }
    let t1 = time::rdtsc();
    for _ in 0..n {
        bad += u64::from(inl(port) != testdev::ID_VALUE);
    }
    let t2 = time::rdtsc();
    for (kind, ticks) in [("mmio", t1 - t0), ("pio", t2 - t1)] {
        println!(
            "EXITS kind={kind} n={n} ns_per_exit={}",
            time::ticks_to_ns(ticks) / n
        );
    }
    if bad != 0 {
        println!("exits: {bad} reads returned a wrong value");
        return guest_rt::abi::exit_codes::CHECK_FAILED;
    }
    0
}
