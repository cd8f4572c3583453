//! Fuzz target: see `cuda_fatbin::fuzzing` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cuda_fatbin::fuzzing::run(data));
