//! `idle`: prints a line and then halts forever (waiting for interrupts that never come), for
//! tests of how the VMM stops a VM from outside: `--timeout`, SIGINT, SIGTERM.
#![no_std]
#![no_main]

guest_rt::entry!(main);

fn main() -> u8 {
    guest_rt::println!("idle: halting");
    loop {
        guest_rt::cpu::halt();
    }
}
