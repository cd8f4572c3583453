//! reduction: sum of u32 values in u64 (grid-stride loads, shared-memory tree, global atomic add).

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, u32_bytes, u64_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "reduction",
    include_str!("../../kernels/reduction.ptx"),
    "reduction",
    "u64 sum of u32 values: per-CTA tree in dynamic shared memory, atom.global.add.u64",
    build,
);

/// CTA size (a power of two).
pub const BLOCK: u32 = 256;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.60 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.16 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 6;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let (n, grid): (u32, u32) = size.pick((8000, 4), (40_000, 8), (1 << 22, 64), (24 << 20, 264));
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let input: Vec<u32> = (0..n).map(|_| rng.next_u32()).collect();
    let stride = (grid * BLOCK) as usize;
    let mut partials = vec![0u64; grid as usize];
    for (i, &v) in input.iter().enumerate() {
        partials[(i % stride) / BLOCK as usize] += u64::from(v);
    }
    // Each launch writes the partials and adds its sum into the total (atom.global.add).
    let total: u64 = partials
        .iter()
        .sum::<u64>()
        .wrapping_mul(u64::from(repeat.max(1)));
    let per_thread = u64::from(n.div_ceil(grid * BLOCK));
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("in", u32_bytes(&input)),
            Buffer::exact_out("partials", Elem::U64, u64_bytes(&partials)),
            Buffer::exact_out("total", Elem::U64, u64_bytes(&[total])),
        ],
        launches: vec![Launch {
            entry: WORKLOAD.entry,
            grid: [grid, 1, 1],
            block: [BLOCK, 1, 1],
            shared_bytes: BLOCK * 8,
            params: vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::Buffer(2),
                Param::U32(n),
            ],
        }],
        // 9 per element loaded, ~11 per tree level (8 levels), ~30 fixed.
        approx_thread_instrs: u64::from(grid * BLOCK) * (9 * per_thread + 11 * 8 + 30),
    }
    .repeated(repeat)
}
