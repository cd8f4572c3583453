//! atomics64: 64-bit atomicAdd and an atomicCAS loop keeping a 64-bit maximum.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, u64_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "atomics64",
    include_str!("../../cuda/atomics64.ptx"),
    "atomics64",
    "atom.global.add.u64 sum and count, atom.global.cas.b64 loop for a max of hashes",
    build,
);

/// CTA size.
pub const BLOCK: u32 = 128;

/// The kernel's 64-bit mixer (MurmurHash3 finaliser).
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

fn build(size: Size) -> Instance {
    let n: u32 = size.pick(1000, 8000, 1 << 20, 1 << 21);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    // Large values: the sum wraps around 2^64, carries cross the 32-bit halves.
    let input: Vec<u64> = (0..n).map(|_| rng.next_u64() >> 2).collect();
    let sum = input.iter().fold(0u64, |s, &v| s.wrapping_add(v));
    let max = input.iter().map(|&v| mix64(v)).max().unwrap_or(0);
    let grid = n.div_ceil(BLOCK);
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("in", u64_bytes(&input)),
            Buffer::exact_out("out", Elem::U64, u64_bytes(&[sum, max, u64::from(n)])),
        ],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            grid,
            BLOCK,
            vec![Param::Buffer(0), Param::Buffer(1), Param::U32(n)],
        )],
        approx_thread_instrs: u64::from(grid * BLOCK) * 40,
    }
}
