//! Polled output on the 8250 UART at COM1, and the `print!`/`println!` macros.

use crate::io::{inb, outb};
use guest_abi::ports::COM1;

const LSR: u16 = COM1 + 5;
const LSR_THR_EMPTY: u8 = 1 << 5;
/// Bytes the transmitter takes once it reports empty (16550 FIFO).
const TX_FIFO: usize = 16;

/// Enables the 16550 FIFOs (FCR: enable, clear receive and transmit).
pub(crate) fn init() {
    outb(COM1 + 2, 0x07);
}

/// Writes bytes, waiting for the transmitter to be empty before each FIFO-full (every port
/// access is a VM exit, so this halves them against a byte-at-a-time wait).
pub fn write_bytes(bytes: &[u8]) {
    for chunk in bytes.chunks(TX_FIFO) {
        while inb(LSR) & LSR_THR_EMPTY == 0 {
            core::hint::spin_loop();
        }
        chunk.iter().for_each(|b| outb(COM1, *b));
    }
}

/// The console as a `core::fmt::Write` sink.
pub struct Console;

impl core::fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        write_bytes(s.as_bytes());
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
