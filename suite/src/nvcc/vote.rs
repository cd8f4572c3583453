//! vote: per-warp ballot, any, all and popc of a per-thread predicate.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, u32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "vote",
    include_str!("../../cuda/vote.ptx"),
    "vote",
    "vote.sync.ballot/any/all and popc, one result per warp",
    build,
);

/// CTA size.
pub const BLOCK: u32 = 128;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.59 ms (most of it the
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
    let input: Vec<u32> = (0..n)
        .map(|i| {
            let mut v = rng.next_u32();
            if rng.below(64) == 0 {
                v = 0; // makes "all nonzero" false for some warps
            }
            if (i / 32) % 3 == 0 {
                v &= 0x7fff_ffff; // makes "any above 2^31" false for some warps
            }
            v
        })
        .collect();
    let grid = n.div_ceil(BLOCK);
    let warps = (grid * BLOCK / 32) as usize;
    let lane = |w: usize, l: usize| input.get(w * 32 + l).copied().unwrap_or(0);
    let (mut ballots, mut counts, mut flags) = (Vec::new(), Vec::new(), Vec::new());
    for w in 0..warps {
        let ballot = (0..32)
            .filter(|&l| lane(w, l) & 1 != 0)
            .fold(0u32, |b, l| b | 1 << l);
        let any = (0..32).any(|l| lane(w, l) > 0x8000_0000);
        let all = (0..32).all(|l| lane(w, l) != 0);
        ballots.push(ballot);
        counts.push(ballot.count_ones() + lane(w, 0).count_ones());
        flags.push(u32::from(any) | u32::from(all) << 1);
    }
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("in", u32_bytes(&input)),
            Buffer::exact_out("ballots", Elem::U32, u32_bytes(&ballots)),
            Buffer::exact_out("counts", Elem::U32, u32_bytes(&counts)),
            Buffer::exact_out("flags", Elem::U32, u32_bytes(&flags)),
        ],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            grid,
            BLOCK,
            vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::Buffer(2),
                Param::Buffer(3),
                Param::U32(n),
            ],
        )],
        approx_thread_instrs: u64::from(grid * BLOCK) * 30,
    }
    .repeated(repeat)
}
