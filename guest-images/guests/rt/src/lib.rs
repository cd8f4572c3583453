//! Runtime for vgpu-vmm's bare-metal guests: 64-bit entry that sets the machine up at CPL0 and
//! runs the program at CPL3 (see [`cpu`]), an IDT that reports CPU exceptions, local-APIC
//! interrupts to sleep on a device's MSI ([`apic`]), serial console output, port and MMIO helpers, PCI
//! enumeration, a heap for `alloc` (talc), the command line, and `exit(code)` through the
//! debug-exit port. A program links this crate and names its main with [`entry!`].
#![no_std]

extern crate alloc;

pub mod apic;
pub mod boot;
pub mod cpu;
pub mod heap;
pub mod idt;
pub mod io;
mod mem;
pub mod pci;
pub mod serial;
pub mod time;

pub use boot::{arg, args, boot_info};
pub use guest_abi as abi;

/// Declares the program's main: `fn main() -> u8`, whose result is the exit code.
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[unsafe(no_mangle)]
        pub extern "Rust" fn __guest_main() -> u8 {
            $main()
        }
    };
}

unsafe extern "Rust" {
    fn __guest_main() -> u8;
}

/// Ends the VM with `code` through the debug-exit port. Never returns.
pub fn exit(code: u8) -> ! {
    io::outb(abi::ports::DEBUG_EXIT, code);
    // The VMM stops this vCPU at once; should it not, idle rather than spin.
    loop {
        cpu::halt();
    }
}

/// Where the program starts, at CPL3, with the boot-info pointer the VMM put in `rdi`.
extern "C" fn rt_start(info: u64) -> ! {
    serial::init();
    if boot::init(info).is_err() {
        println!("guest-rt: missing or malformed boot info at {info:#x}");
        exit(abi::exit_codes::BAD_BOOT_INFO);
    }
    heap::init();
    // SAFETY: the program defines __guest_main through `entry!`; it has the declared signature.
    let code = unsafe { __guest_main() };
    exit(code)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("guest panic: {info}");
    exit(abi::exit_codes::PANIC)
}
