//! matmul: C = A * B (n x n, f32), 16x16 shared-memory tiles with bar.sync.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Expect, Instance, Launch, Param, Rng, Size, Workload, f32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "matmul",
    include_str!("../../kernels/matmul.ptx"),
    "matmul",
    "C = A * B, n x n f32, tiled through shared memory",
    build,
);

/// Tile edge (the CTA is TILE x TILE threads); n is a multiple of it.
pub const TILE: u32 = 16;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.46 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.16 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 7;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let n: u32 = size.pick(16, 32, 128, 768);
    let nn = n as usize;
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let a: Vec<f32> = (0..nn * nn).map(|_| rng.scaled_f32(-2, 2)).collect();
    let b: Vec<f32> = (0..nn * nn).map(|_| rng.scaled_f32(-2, 2)).collect();
    let (c, abs) = reference(&a, &b, nn);
    let tiles = n / TILE;
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("A", f32_bytes(&a)),
            Buffer::input("B", f32_bytes(&b)),
            Buffer {
                name: "C",
                init: vec![0; nn * nn * 4],
                expect: Expect::F32 {
                    values: c,
                    abs,
                    rel: 0.0,
                },
            },
        ],
        launches: vec![Launch {
            entry: WORKLOAD.entry,
            grid: [tiles, tiles, 1],
            block: [TILE, TILE, 1],
            shared_bytes: 0,
            params: vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::Buffer(2),
                Param::U32(n),
            ],
        }],
        // ~40 setup + ~127 per tile step per thread.
        approx_thread_instrs: u64::from(n * n) * (40 + 127 * u64::from(tiles)),
    }
    .repeated(repeat)
}

/// C with fma.rn.f32 accumulation in k order (what the PTX does, so a faithful engine matches
/// to the bit), and the tolerance: any summation order with or without fused multiply-add is
/// within n * 2^-23 * max_ij sum_k |a_ik b_kj| (the standard gamma_n dot-product bound, doubled).
fn reference(a: &[f32], b: &[f32], n: usize) -> (Vec<f32>, f32) {
    let mut c = vec![0f32; n * n];
    let mut worst = 0f64;
    for r in 0..n {
        for col in 0..n {
            let mut acc = 0f32;
            let mut mag = 0f64;
            for k in 0..n {
                let (x, y) = (a[r * n + k], b[k * n + col]);
                acc = libm::fmaf(x, y, acc);
                mag += f64::from(x.abs()) * f64::from(y.abs());
            }
            c[r * n + col] = acc;
            worst = worst.max(mag);
        }
    }
    (c, (worst * n as f64 / 8_388_608.0) as f32)
}
