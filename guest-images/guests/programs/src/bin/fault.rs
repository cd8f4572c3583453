//! `fault`: crashes on purpose, as `mode=` says: `ud` (invalid opcode, reported by the
//! runtime), `pf` (page fault on an unmapped address), `panic` (Rust panic), `triple` (an
//! exception with no IDT: the CPU shuts down, which the VMM must report).
#![no_std]
#![no_main]

use guest_rt::println;

guest_rt::entry!(main);

fn main() -> u8 {
    let mode = guest_rt::arg("mode").unwrap_or("ud");
    println!("fault: mode {mode}");
    match mode {
        // SAFETY: deliberately executes an invalid opcode.
        "ud" => unsafe { core::arch::asm!("ud2") },
        "pf" => {
            // SAFETY: deliberately reads an address the identity map does not cover.
            let v = unsafe { core::ptr::read_volatile(0x40_0000_0000 as *const u64) };
            println!("read {v}");
        }
        "panic" => panic!("requested by the command line"),
        "triple" => guest_rt::idt::triple_fault(),
        other => println!("unknown mode {other}"),
    }
    guest_rt::abi::exit_codes::CHECK_FAILED
}
