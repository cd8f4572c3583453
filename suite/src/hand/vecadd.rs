//! vecadd: c = a + b over f32 vectors (one thread per element, bounds-checked tail).

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, f32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "vecadd",
    include_str!("../../kernels/vecadd.ptx"),
    "vecadd",
    "c[i] = a[i] + b[i], f32",
    build,
);

/// CTA size used by every size.
pub const BLOCK: u32 = 256;
/// Thread-instructions per thread (in-range path of the PTX).
const INSTRS: u64 = 22;

/// Launches at [`Size::Xl`]: on an H100 one launch's kernel phase took 0.63 ms (most of it the
/// module's load and the engine's first sub-launch), each further launch 0.08 ms; this many make
/// the phase last over a millisecond (docs/performance.md, "A suite size for an H100").
const XL_REPEATS: u32 = 10;

fn build(size: Size) -> Instance {
    instance_repeated(size, size.pick(1, 1, 1, XL_REPEATS))
}

/// The instance of `size` with its kernel launched `repeat` times in a row (expected outputs
/// those of `repeat` runs); [`Size::Xl`] repeats it.
pub fn instance_repeated(size: Size, repeat: u32) -> Instance {
    let n: u32 = size.pick(4000, 16_391, 1 << 20, 1 << 23);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let a: Vec<f32> = (0..n).map(|_| rng.scaled_f32(-8, 8)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.scaled_f32(-8, 8)).collect();
    // add.rn.f32 is correctly rounded, as is Rust's f32 `+`: the result is exact to the bit.
    let c: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let grid = n.div_ceil(BLOCK);
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("a", f32_bytes(&a)),
            Buffer::input("b", f32_bytes(&b)),
            Buffer::exact_out("c", Elem::F32, f32_bytes(&c)),
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
        approx_thread_instrs: u64::from(grid * BLOCK) * INSTRS,
    }
    .repeated(repeat)
}
