//! warp_reduce: per-warp int sums with shfl.sync.down (lane 0) and shfl.sync.bfly (all lanes).

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, i32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "warp_reduce",
    include_str!("../../cuda/warp_reduce.ptx"),
    "warp_reduce",
    "warp sums through shfl.sync.down and shfl.sync.bfly",
    build,
);

/// CTA size.
pub const BLOCK: u32 = 128;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.60 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.04 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 20;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let n: u32 = size.pick(1000, 16_000, 1 << 20, 10 << 20);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let input: Vec<i32> = (0..n).map(|_| rng.range_i32(-100_000, 100_000)).collect();
    let grid = n.div_ceil(BLOCK);
    let warps = (grid * BLOCK / 32) as usize;
    let mut warp_sum = vec![0i32; warps];
    for (i, &v) in input.iter().enumerate() {
        warp_sum[i / 32] = warp_sum[i / 32].wrapping_add(v);
    }
    let lane_sum: Vec<i32> = (0..n as usize).map(|i| warp_sum[i / 32]).collect();
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("in", i32_bytes(&input)),
            Buffer::exact_out("warp_sum", Elem::I32, i32_bytes(&warp_sum)),
            Buffer::exact_out("lane_sum", Elem::I32, i32_bytes(&lane_sum)),
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
        approx_thread_instrs: u64::from(grid * BLOCK) * 45,
    }
    .repeated(repeat)
}
