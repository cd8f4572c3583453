//! Fuzz saved-context restore: hostile bytes give a typed error or a launch that runs without
//! panicking.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use ptx::{FlatMemory, Launch, Limits, Module, RunControl};

const TEXT: &str = include_str!("../../../suite/kernels/reduction.ptx");

fn module() -> &'static Arc<Module> {
    static M: OnceLock<Arc<Module>> = OnceLock::new();
    M.get_or_init(|| Arc::new(ptx::parse(TEXT).expect("reduction.ptx parses")))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(mut l) = Launch::restore(module().clone(), data, &Limits::default()) {
        let mem = FlatMemory::new(0x1000, 1 << 16);
        let mut ctl = RunControl::new(1);
        ctl.step_limit = Some(10_000);
        let _ = l.run(&mem, &ctl);
    }
});
