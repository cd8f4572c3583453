//! Fuzz target: see `shadow::fuzzing` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shadow::fuzzing::run(data));
