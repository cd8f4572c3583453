//! stencil: hotspot-like 2-D heat diffusion, several launches ping-ponging two grids.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Expect, Instance, Launch, Param, Rng, Size, Workload, f32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "stencil",
    include_str!("../../kernels/stencil.ptx"),
    "stencil",
    "2-D 5-point heat stencil with a power map, iterated, two buffers ping-pong",
    build,
);

/// Diffusion coefficient (<= 0.25 keeps the step a convex combination: errors do not grow).
pub const CC: f32 = 0.1875;
/// Power coefficient.
pub const CP: f32 = 0.05;
/// CTA edge (16 x 16 threads).
pub const TILE: u32 = 16;

/// One step, in the PTX's operation order (every op rounded to nearest, no fma).
pub fn step(src: &[f32], power: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for y in 0..rows {
        for x in 0..cols {
            let at = |yy: usize, xx: usize| src[yy * cols + xx];
            let c = at(y, x);
            let n = at(y.saturating_sub(1), x);
            let s = at((y + 1).min(rows - 1), x);
            let w = at(y, x.saturating_sub(1));
            let e = at(y, (x + 1).min(cols - 1));
            let lap = ((n + s) + (w + e)) - c * 4.0;
            out[y * cols + x] = (c + CC * lap) + CP * power[y * cols + x];
        }
    }
    out
}

fn build(size: Size) -> Instance {
    let (rows, cols, iters): (u32, u32, u32) =
        size.pick((20, 36, 4), (48, 64, 4), (256, 256, 8), (2048, 2048, 16));
    let (r, c) = (rows as usize, cols as usize);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let temp: Vec<f32> = (0..r * c).map(|_| 323.0 + 25.0 * rng.unit_f32()).collect();
    let power: Vec<f32> = (0..r * c).map(|_| 0.5 + 0.5 * rng.unit_f32()).collect();
    // grids[k % 2] holds step k's input; the last launch writes grids[iters % 2].
    let mut grids = [temp.clone(), temp.clone()];
    let mut launches = Vec::new();
    let shape = (
        [cols.div_ceil(TILE), rows.div_ceil(TILE), 1],
        [TILE, TILE, 1],
    );
    for k in 0..iters as usize {
        let next = step(&grids[k % 2], &power, r, c);
        grids[(k + 1) % 2] = next;
        launches.push(Launch {
            entry: WORKLOAD.entry,
            grid: shape.0,
            block: shape.1,
            shared_bytes: 0,
            params: vec![
                Param::Buffer(k % 2),
                Param::Buffer((k + 1) % 2),
                Param::Buffer(2),
                Param::U32(rows),
                Param::U32(cols),
                Param::F32(CC),
                Param::F32(CP),
            ],
        });
    }
    // The PTX repeats these operations exactly, so a faithful engine matches to the bit. The
    // tolerance admits drivers that contract mul+add into fma or reassociate the four
    // neighbours: each step then differs by a few ulps, and the step is a convex combination
    // (CC <= 0.25) plus a bounded source, so differences add up at most linearly: 16 ulps a step.
    let rel = 16.0 * iters as f32 / 16_777_216.0;
    let [a, b] = grids;
    let out = |name, init: &Vec<f32>, values| Buffer {
        name,
        init: f32_bytes(init),
        expect: Expect::F32 {
            values,
            abs: 0.0,
            rel,
        },
    };
    let grid_threads = u64::from(shape.0[0] * shape.0[1] * TILE * TILE);
    let active = u64::from(rows * cols);
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            out("temp_a", &temp, a),
            out("temp_b", &temp, b),
            Buffer::input("power", f32_bytes(&power)),
        ],
        launches,
        // ~75 per cell, ~22 per thread outside the grid.
        approx_thread_instrs: u64::from(iters) * (active * 75 + (grid_threads - active) * 22),
    }
}
