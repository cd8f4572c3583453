//! spin: every thread busy-waits a requested number of nanoseconds on %globaltimer.

use alloc::vec;

use crate::{Buffer, Expect, Instance, Launch, Param, Size, Workload};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "spin",
    include_str!("../../kernels/spin.ptx"),
    "spin",
    "each thread spins until %globaltimer advanced by duration_ns, writes the elapsed ns",
    build,
);

/// An instance spinning `duration_ns` in `ctas` CTAs of `threads` threads each (for
/// experiments that need kernels of chosen lengths). `ctas` and `threads` of 0 count as 1;
/// `threads` is capped at 1024.
pub fn instance_with(duration_ns: u64, ctas: u32, threads: u32, size: Size) -> Instance {
    let (ctas, threads) = (ctas.max(1), threads.clamp(1, 1024));
    let count = (ctas * threads) as usize;
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![Buffer {
            name: "elapsed",
            init: vec![0; count * 8],
            expect: Expect::U64AtLeast {
                count,
                min: duration_ns,
            },
        }],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            ctas,
            threads,
            vec![Param::Buffer(0), Param::U64(duration_ns)],
        )],
        // Timing-bound: what an interpreter at 1e8 thread-instructions/s does in that time.
        approx_thread_instrs: duration_ns / 10,
    }
}

fn build(size: Size) -> Instance {
    let (ns, ctas, threads) = size.pick(
        (20_000, 2, 32),
        (1_000_000, 4, 64),
        (10_000_000, 132, 128),
        (20_000_000, 264, 128),
    );
    instance_with(ns, ctas, threads, size)
}
