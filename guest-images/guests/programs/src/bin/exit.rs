//! `exit`: ends the VM with the exit code given as `code=N` on the command line (default 0).
#![no_std]
#![no_main]

guest_rt::entry!(main);

fn main() -> u8 {
    let code = guest_rt::arg("code")
        .and_then(|c| c.parse::<u8>().ok())
        .unwrap_or(0);
    guest_rt::println!("exit: code {code}");
    code
}
