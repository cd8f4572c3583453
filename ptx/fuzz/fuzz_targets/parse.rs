//! Fuzz the PTX parser: any text must give a module or a typed error, never a panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ptx::parse(text);
    }
});
