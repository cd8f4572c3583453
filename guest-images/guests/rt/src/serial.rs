//! Polled output on the 8250 UART at COM1, and the `print!`/`println!` macros.

use crate::io::{inb, outb};
use guest_abi::ports::COM1;

const LSR: u16 = COM1 + 5;
const LSR_THR_EMPTY: u8 = 1 << 5;

/// Writes one byte, waiting for the transmitter holding register to be empty.
pub fn write_byte(b: u8) {
    while inb(LSR) & LSR_THR_EMPTY == 0 {
        core::hint::spin_loop();
    }
    outb(COM1, b);
}

/// The console as a `core::fmt::Write` sink.
pub struct Console;

impl core::fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        s.bytes().for_each(write_byte);
        Ok(())
    }
}

#[doc(hidden)]
pub fn _print(args: core::fmt::Arguments<'_>) {
    let _ = core::fmt::Write::write_fmt(&mut Console, args);
}

/// Prints to the serial console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::serial::_print(format_args!($($arg)*)) };
}

/// Prints a line to the serial console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => { $crate::serial::_print(format_args!("{}\n", format_args!($($arg)*))) };
}
