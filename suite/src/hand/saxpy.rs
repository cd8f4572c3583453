//! saxpy: y = a * x + y over f32 vectors, with one fused multiply-add per element.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, f32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "saxpy",
    include_str!("../../kernels/saxpy.ptx"),
    "saxpy",
    "y[i] = fma(a, x[i], y[i]), f32",
    build,
);

/// CTA size used by every size.
pub const BLOCK: u32 = 128;
/// The scalar `a`.
pub const A: f32 = 1.703_125_3;
/// Thread-instructions per thread (in-range path).
const INSTRS: u64 = 20;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.57 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.05 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 16;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let n: u32 = size.pick(3000, 16_000, 1 << 20, 10 << 20);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let x: Vec<f32> = (0..n).map(|_| rng.scaled_f32(-6, 6)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.scaled_f32(-6, 6)).collect();
    // fma.rn.f32 rounds once, like libm's fmaf: exact to the bit. y is updated in place, so
    // each repeated launch applies the fma once more.
    let out: Vec<f32> = x
        .iter()
        .zip(&y)
        .map(|(&x, &y)| (0..repeat.max(1)).fold(y, |y, _| libm::fmaf(A, x, y)))
        .collect();
    let grid = n.div_ceil(BLOCK);
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("x", f32_bytes(&x)),
            Buffer::exact("y", f32_bytes(&y), Elem::F32, f32_bytes(&out)),
        ],
        launches: vec![Launch::linear(
            WORKLOAD.entry,
            grid,
            BLOCK,
            vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::F32(A),
                Param::U32(n),
            ],
        )],
        approx_thread_instrs: u64::from(grid * BLOCK) * INSTRS,
    }
    .repeated(repeat)
}
