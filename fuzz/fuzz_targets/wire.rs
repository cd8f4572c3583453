//! Fuzz target: see `vgpu_proto::fuzzing` for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_proto::fuzzing::run(data));
