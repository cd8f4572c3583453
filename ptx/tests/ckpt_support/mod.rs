//! Running `suite` workloads on the interpreter from a given PTX text (original, printed or
//! transformed), for the checkpoint tests.
#![allow(dead_code)]

use std::sync::Arc;

use ptx::{FlatMemory, Launch, LaunchConfig, Limits, RunControl, RunOutcome, Stats};

/// Base of the flat memory the tests use.
pub const BASE: u64 = 0x10_0000;

/// Buffers of an instance placed in one flat memory (256-byte aligned, in order).
pub struct Placed {
    pub mem: FlatMemory,
    pub addrs: Vec<u64>,
    /// First free address after the buffers (for save areas and flags).
    pub free: u64,
}

/// Place the buffers of `inst` plus `extra` free bytes.
pub fn place(inst: &suite::Instance, extra: usize) -> Placed {
    let mut addrs = Vec::new();
    let mut a = BASE;
    for b in &inst.buffers {
        addrs.push(a);
        a += (b.init.len() as u64).next_multiple_of(256).max(256);
    }
    let free = a;
    let size = (a - BASE) as usize + extra + 4096;
    let mem = FlatMemory::new(BASE, size);
    for (b, &addr) in inst.buffers.iter().zip(&addrs) {
        assert!(mem.write(addr, &b.init));
    }
    Placed { mem, addrs, free }
}

/// Read back every buffer of `inst`.
pub fn buffers(inst: &suite::Instance, p: &Placed) -> Vec<Vec<u8>> {
    inst.buffers
        .iter()
        .zip(&p.addrs)
        .map(|(b, &a)| p.mem.read(a, b.init.len()).expect("in memory"))
        .collect()
}

/// Check the outputs of `inst` against its reference.
pub fn check(inst: &suite::Instance, outs: &[Vec<u8>]) -> Result<(), String> {
    let read: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&read).map(|_| ()).map_err(|e| format!("{e:?}"))
}

/// Run every launch of `inst` with the module parsed from `text` to completion; returns the
/// buffers and the summed stats.
pub fn run_plain(inst: &suite::Instance, text: &str, workers: usize) -> (Vec<Vec<u8>>, Stats) {
    let module = Arc::new(ptx::parse(text).expect("parses"));
    let p = place(inst, 0);
    let mut total = Stats::default();
    for l in &inst.launches {
        let params = suite::layout_params(&l.params, &p.addrs).expect("params");
        let cfg = LaunchConfig {
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params,
        };
        let mut launch =
            Launch::new(module.clone(), l.entry, cfg, &Limits::default()).expect("launch");
        match launch.run(&p.mem, &RunControl::new(workers)) {
            RunOutcome::Completed(s) => add(&mut total, &s),
            other => panic!("{}: {other:?}", inst.workload),
        }
    }
    (buffers(inst, &p), total)
}

pub fn add(total: &mut Stats, s: &Stats) {
    total.thread_instructions += s.thread_instructions;
    total.warp_instructions += s.warp_instructions;
}

/// Deterministic xorshift.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
