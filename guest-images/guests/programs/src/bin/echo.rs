//! `echo`: reads console input from the serial port (polling the line status) and echoes each
//! line back as `echo: <line>` until it reads a line `quit` or end of input (Ctrl-D), then
//! exits 0. Exercises the VMM's stdin → UART path.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::string::String;
use guest_rt::abi::ports::COM1;
use guest_rt::io::inb;
use guest_rt::println;

guest_rt::entry!(main);

const LSR_DATA_READY: u8 = 1;

fn read_byte() -> u8 {
    while inb(COM1 + 5) & LSR_DATA_READY == 0 {
        core::hint::spin_loop();
    }
    inb(COM1)
}

fn main() -> u8 {
    println!("echo: ready");
    let mut line = String::new();
    loop {
        match read_byte() {
            b'\r' | b'\n' => {
                if line == "quit" {
                    println!("echo: bye");
                    return 0;
                }
                println!("echo: {line}");
                line.clear();
            }
            0x04 => return 0,
            b => line.push(char::from(b)),
        }
    }
}
