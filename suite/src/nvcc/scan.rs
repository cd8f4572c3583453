//! scan: inclusive prefix sum inside each CTA (shfl.sync.up per warp, warp totals in shared memory).

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, i32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "scan",
    include_str!("../../cuda/scan.ptx"),
    "scan",
    "per-CTA inclusive scan: shfl.sync.up, shared warp totals, bar.sync",
    build,
);

/// CTA size (a multiple of 32, at most 1024).
pub const BLOCK: u32 = 256;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.47 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.08 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 12;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let n: u32 = size.pick(1000, 12_000, 1 << 20, 10 << 20);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let input: Vec<i32> = (0..n).map(|_| rng.range_i32(-1000, 1000)).collect();
    let grid = n.div_ceil(BLOCK);
    let mut out = Vec::with_capacity(n as usize);
    let mut block_sums = vec![0i32; grid as usize];
    for (b, chunk) in input.chunks(BLOCK as usize).enumerate() {
        let mut acc = 0i32;
        for &v in chunk {
            acc = acc.wrapping_add(v);
            out.push(acc);
        }
        block_sums[b] = acc;
    }
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("in", i32_bytes(&input)),
            Buffer::exact_out("out", Elem::I32, i32_bytes(&out)),
            Buffer::exact_out("block_sums", Elem::I32, i32_bytes(&block_sums)),
        ],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            grid,
            BLOCK,
            vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::Buffer(2),
                Param::U32(n),
            ],
        )],
        approx_thread_instrs: u64::from(grid * BLOCK) * 90,
    }
    .repeated(repeat)
}
