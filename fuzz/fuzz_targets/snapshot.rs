//! Fuzz target: see `vmm::snapshot::fuzzing` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::snapshot::fuzzing::run(data));
