//! histogram: 256-bin byte histogram with shared-memory atomics, merged with global atomics.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, u32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "histogram",
    include_str!("../../cuda/histogram.ptx"),
    "histogram",
    "byte histogram: atom.shared.add per CTA, atom.global.add to merge",
    build,
);

/// CTA size.
pub const BLOCK: u32 = 256;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.69 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.26 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 5;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let (n, grid): (u32, u32) = size.pick((5000, 4), (50_000, 16), (1 << 22, 128), (80 << 20, 528));
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    // Skewed bytes (AND of two random bytes favours small values): contended bins.
    let data: Vec<u8> = (0..n)
        .map(|_| {
            let r = rng.next_u32();
            (r & (r >> 8)) as u8
        })
        .collect();
    let mut bins = vec![0u32; 256];
    for &b in &data {
        bins[b as usize] += 1;
    }
    // Each launch adds its counts into the bins (atom.global.add).
    for b in &mut bins {
        *b = b.wrapping_mul(repeat.max(1));
    }
    let per_thread = u64::from(n.div_ceil(grid * BLOCK));
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("data", data),
            Buffer::exact_out("bins", Elem::U32, u32_bytes(&bins)),
        ],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            grid,
            BLOCK,
            vec![Param::Buffer(0), Param::Buffer(1), Param::U32(n)],
        )],
        approx_thread_instrs: u64::from(grid * BLOCK) * (40 + 12 * per_thread),
    }
    .repeated(repeat)
}
