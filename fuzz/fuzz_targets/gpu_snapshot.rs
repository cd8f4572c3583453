//! Fuzz target: see `vgpu::fuzzing::snapshot` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu::fuzzing::snapshot::run(data));
